"""The worker processes' I/O shells. Importing ``sentin8`` first settles which build of the compiled modules
runs (``sentin8.native``) before any of ``workers``' compiled modules is found: all compiled or all pure."""

import sentin8  # noqa: F401
