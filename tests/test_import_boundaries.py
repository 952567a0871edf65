"""What each process imports (issue 16 item 13): shared memory never imports the management package, and only
the management process loads PyJWT. Every worker and the resolver are forked from the supervisor, so whatever
the supervisor imported before forking they hold too; it used to import PyJWT twice (the CLI's token helpers,
and ``shm/mgmt_refusals.py`` -> ``sentin8.mgmt.auth``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import REPO, one_web_service
from tests.pqclient import PQClient

_LOADED = (
    "import json, sys\n"
    "print(json.dumps(sorted(m for m in sys.modules if m == 'jwt' or m.startswith(('jwt.', 'sentin8.mgmt')))))"
)


def _loaded_after(imports: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{imports}\n{_LOADED}"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_importing_shared_memory_imports_neither_the_management_package_nor_jwt():
    assert _loaded_after("import sentin8.shm.state") == []


def test_the_supervisor_and_the_data_plane_modules_do_not_import_jwt():
    loaded = _loaded_after(
        "import supervisor.cli, supervisor.arbiter, supervisor.resolver, supervisor.mgmt, workers.worker\n"
        "try:\n"  # every subcommand's parser is built for `run` too; this config does not exist: exit 2
        "    supervisor.cli.main(['run', '--config', '/nonexistent/proxy.toml'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 2\n"
    )
    assert "jwt" not in loaded and "sentin8.mgmt.auth" not in loaded, loaded


# Records the pid of every process that imports jwt itself (a forked child that inherits it imports nothing).
_WATCH = """
import os, sys

class _JwtWatch:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "jwt":
            with open(os.environ["SENTIN8_TEST_JWT_LOG"], "a") as f:
                f.write(f"{os.getpid()}\\n")
        return None

sys.meta_path.insert(0, _JwtWatch)
"""


def test_in_a_running_fleet_only_the_management_process_imports_jwt(
    external_host, fleet_factory, web, tmp_path, monkeypatch  # noqa: F811
):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(_WATCH))
    log = tmp_path / "jwt-imports"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("SENTIN8_TEST_JWT_LOG", str(log))
    fleet = fleet_factory(one_web_service(web.port), host="0.0.0.0", mgmt=True)
    for _ in range(4):  # requests through the workers (both, most likely): whatever they import on the way
        client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
        client.handshake()
        assert client.request(b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n").startswith(b"HTTP/1.1 200")
        client.close()
    assert fleet.stats()["requests"] == 4
    children = fleet.children()
    mgmt = [pid for pid, title in children.items() if title.endswith(": mgmt")]
    data_plane = [pid for pid, title in children.items() if ": worker " in title or title.endswith(": resolver")]
    assert len(mgmt) == 1 and len(data_plane) == 3, children
    importers = {int(line) for line in Path(log).read_text().split()}
    assert importers == set(mgmt), (importers, children, fleet.proc.pid)  # not the supervisor, no worker
