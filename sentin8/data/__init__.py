"""Files shipped inside the package (the wheel carries them; ``importlib.resources`` finds them installed or not).

- ``sentin8.example.toml``: the annotated example configuration, every key at its default with its comment,
  generated from ``sentin8/config.py`` (``python -m sentin8.docgen``; a test fails when it is stale).
  ``sentin8-proxy check-config --print-defaults`` prints it.
- ``systemd/``: the unit and the sysctl drop-in (links to the repository's ``systemd/`` files, which the wheel
  holds as plain files), so an install from the wheel alone has them.
"""

from __future__ import annotations

from importlib import resources

EXAMPLE_CONFIG = "sentin8.example.toml"
SYSTEMD_FILES = ("systemd/sentin8-proxy.service", "systemd/99-sentin8-proxy.conf")


def read_text(name: str) -> str:
    """One shipped file's text, by its path under ``sentin8/data``."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
