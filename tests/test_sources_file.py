"""The file source's re-read (``sentin8.sources.files.FileRunner``) on a real file: only a whole, settled
version of the config is ever served. A writer that rewrites the file in place truncates it first; a table
read in that moment is empty, and served it closes every SNI as unknown on every worker (CI saw it as a
reset on the L4 path after ``Path.write_text`` of the config)."""

from __future__ import annotations

from pathlib import Path

from sentin8.config import load_file
from sentin8.routing import RoutingTable
from sentin8.sources.files import FileRunner


def body(*hostnames: str) -> str:
    text = '[[instances]]\nservice = "web"\nid = "web-1"\nhost = "127.0.0.1"\nport = 9\n'
    return text + "".join(f'[[domains]]\nhostname = "{h}"\nservice = "web"\n' for h in hostnames)


class Published:
    def __init__(self) -> None:
        self.tables: list[RoutingTable] = []

    def __call__(self, table: RoutingTable) -> None:
        self.tables.append(table)

    def routes(self, sni: str) -> list[bool]:
        return [t.resolve(sni) is not None for t in self.tables]


def runner(path: Path, text: str) -> FileRunner:
    path.write_text(text)
    return FileRunner(load_file(str(path)), str(path))


def test_a_change_is_read_once_it_stood_still_for_one_whole_check(tmp_path):
    path = tmp_path / "proxy.toml"
    r, out = runner(path, body("a.test")), Published()
    r.check(out)
    assert out.tables == []  # unchanged
    path.write_text(body("a.test", "b.test"))
    r.check(out)
    assert out.tables == []  # just changed: the writer may not be done
    path.write_text(body("a.test", "b.test", "c.test"))
    r.check(out)
    assert out.tables == []  # changed again since the last check: still not settled
    r.check(out)
    assert out.routes("c.test") == [True]
    r.check(out)
    assert len(out.tables) == 1  # read once per version


def test_an_empty_file_is_never_served_and_the_whole_one_after_it_is(tmp_path):
    path = tmp_path / "proxy.toml"
    r, out = runner(path, body("a.test")), Published()
    with open(path, "w") as writer:  # truncated: the moment between a writer's O_TRUNC and its write
        r.check(out)
        r.check(out)  # it stood still for a whole check, and it is empty
        assert out.tables == []
        assert r.last_error is not None and "empty" in r.last_error
        writer.write(body("a.test", "b.test"))
    r.check(out)
    r.check(out)
    assert out.routes("b.test") == [True] and r.last_error is None


def test_a_sighup_reads_at_once_but_never_an_empty_file(tmp_path):
    path = tmp_path / "proxy.toml"
    r, out = runner(path, body("a.test")), Published()
    path.write_text(body("b.test"))
    r.check(out, forced=True)  # the supervisor has just checked this file whole
    assert out.routes("b.test") == [True]
    path.write_text("")
    r.check(out, forced=True)
    assert len(out.tables) == 1 and "empty" in (r.last_error or "")


def test_a_broken_edit_keeps_the_last_table_and_is_not_retried_until_it_changes(tmp_path):
    path = tmp_path / "proxy.toml"
    r, out = runner(path, body("a.test")), Published()
    path.write_text(body("a.test") + "[[domains]]\nhostname = 3\n")
    r.check(out)
    r.check(out)
    assert out.tables == [] and r.last_error is not None
    r.check(out)
    assert out.tables == []
    path.write_text(body("a.test", "b.test"))
    r.check(out)
    r.check(out)
    assert out.routes("b.test") == [True] and r.last_error is None
