"""Cluster mode: several proxy hosts sharing state through Valkey (docs/cluster.md).

Sans-IO parts live here (the replicated bucket's arithmetic, the Valkey script's text and key names, the
operator secret); the syncer that talks to Valkey is an I/O shell in ``supervisor/cluster_sync.py``. Workers
reach only the arithmetic (through ``shm/ratelimit.py``): a request never waits on Valkey.
"""
