"""Log compaction for topics whose cleanup.policy has `compact`: the cleaner service (cleaner.py) picks partitions
and installs rewrites; the work itself (rewrite.py) runs in a process of its own."""
