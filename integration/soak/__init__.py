"""The nemesis soak: real clients produce idempotently and consume in a group while a seeded schedule of faults
(connection cuts, kill -9, SIGSTOP pauses, a full disk, deduplication policy flips) runs against one broker; a
checker then counts, per client, acknowledged records lost, duplicates, order violations, stuck consumers and
committed offsets that went backwards. `python -m integration.soak --seconds N --seed S` (or `make soak`) runs it;
a failure prints the seed that replays the same schedule.

Modules, one job each: producers (one paced idempotent producer per client library), consumers (group members and
the committed-offset watcher), faults (one function per fault kind), schedule (the seeded plan), checker (the
verdict), run (wiring them to a broker)."""
