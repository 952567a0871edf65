"""The management plane: JWT gate, read models over shared memory, the Starlette app and its dashboard."""
