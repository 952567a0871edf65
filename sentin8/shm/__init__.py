"""Shared-memory structures, created by the supervisor before it forks and inherited by every child.

Each structure owns a slice of one anonymous MAP_SHARED mapping. Shared 8-byte words are always written
through ``memoryview(...).cast("Q")[i] = v``: ``struct.pack_into`` zeroes the bytes before it writes them,
so a reader in another process can see a value that was never written (ARCHITECTURE.md §4).
"""
