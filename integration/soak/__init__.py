"""The nemesis soak: real clients produce idempotently and consume in one group (a member per client library), and a
transactional producer commits and aborts, while a seeded schedule of faults (connection cuts, kill -9, SIGSTOP
pauses, a full disk, a restart onto a full disk, failing cursor-log flushes, appends torn by EIO, deduplication
turned off and on) runs against one broker (or two clusters that replicate, or three brokers on PostgreSQL, each with
faults of its own); checkers then count, per producing client, acknowledged records lost, duplicates, order
violations, stuck consumers and committed offsets that went backwards, per consuming client what it left behind,
committed backwards or committed in a generation with another member, and for the transactions what read_committed
shows that it must not or misses. `python -m integration.soak --seconds N --seed S` (or `make soak`) runs it; a
failure prints the seed that replays the same schedule. Modules, one job each: producers (one paced idempotent
producer per client library), consumers (group members and the committed-offset watcher), transactions (the
transactional producer and its verdict), faults (one function per fault kind), storage_faults (the storage and policy
fault kinds, and the excusing of copies stored while deduplication was off), schedule (the seeded plan), checker (the
verdicts on the idempotent streams and the group), deployment (what a soak runs against: where clients connect, how
the checker reads, the fault kinds and their controls), single (one broker), geo (two clusters that replicate; the
replicas' and the group failover's verdicts), cluster (three brokers on a PostgreSQL it starts), run (wiring the
clients and the checker to a deployment). `--topology geo|cluster` picks the other deployments."""
