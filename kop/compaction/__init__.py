"""Log compaction for topics whose cleanup.policy has `compact`: the cleaner service (cleaner.py) picks partitions
and has the storage engine install rewrites; the work itself (rewrite.py) runs off the event loop (a process of its
own for the file engine's files, a thread for the PostgreSQL engine's entries in memory)."""
