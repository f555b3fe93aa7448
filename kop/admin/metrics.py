"""Prometheus metrics of one broker, served at `/metrics` on the admin port (docs/metrics.md lists them all).

Each broker has its own CollectorRegistry, so several brokers in one process (tests) count apart. Two kinds:

* Observed on the way: requests, their errors and latency per API, produce batch sizes, and the ledgers' fsyncs.
  These are plain counts (`Buckets`: a list of bucket counts and a sum, no lock; each API's series kept), turned into
  Prometheus histograms and counters at scrape time: prometheus-client's own histogram, with a lock and a value
  object per bucket, cost more than the rest of a small produce request's metrics together.
* Read at scrape time (`BrokerCollector`): what the broker already counts or can read cheaply (bytes in and out and
  dedup decisions per partition, sequence-id drops, dedup snapshots and recovery, connections, partitions,
  rebalances, and each group's committed offset and lag), so the hot path keeps plain integer counts.
"""
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.data_container import DataContainer
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.utils import floatToGoString
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.api import REQUEST_CLASSES
from protocol.errors import ErrorCode
from protocol.fetch_response import FetchResponse
from protocol.produce_response import ProduceResponse

if TYPE_CHECKING:
    from kop.broker import Broker

# The `_created` series (when each counter began) double a scrape for nothing a dashboard uses; a library-wide setting.
disable_created_metrics()

LATENCY_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
FSYNC_BUCKETS = (.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5)
BYTES_BUCKETS = tuple(float(4 ** n) for n in range(3, 12))  # 64 B .. 4 MiB
COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


def api_name(api_key: int) -> str:
    cls = REQUEST_CLASSES.get(api_key)
    return cls.__name__.removesuffix("Request") if cls is not None else str(api_key)


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def response_errors(response: object) -> Iterator[int]:
    """The error codes other than NONE in a response, one per occurrence (Kafka's ErrorsPerSec counts them so).
    Produce and Fetch, whose answers can name thousands of partitions, are read where their codes are; any other
    answer is walked field by field (a walk that cost a tenth of a 10,000-partition Fetch)."""
    if isinstance(response, ProduceResponse):
        for _, partitions in response.responses:
            for partition in partitions:
                if partition.error_code:
                    yield partition.error_code
    elif isinstance(response, FetchResponse):
        if getattr(response, "error_code", 0):  # the whole request's, from v7
            yield response.error_code
        for topic in response.responses:
            for partition in topic.partitions:
                if partition.error_code:
                    yield partition.error_code
    elif isinstance(response, ApiMessage):
        yield from _message_errors(response)


def _message_errors(message: DataContainer) -> Iterator[int]:
    for name in message.fields:
        value = getattr(message, name, None)
        if name == "error_code":
            if value:
                yield value
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, DataContainer):  # a struct, not a plain value
                    yield from _message_errors(item)
        elif isinstance(value, DataContainer):
            yield from _message_errors(value)


class Buckets:
    """One histogram's counts: what an observation costs is a bisect and two additions (the event loop is the only
    writer; a scrape reads a copy)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # Prometheus buckets count values <= their bound
        self.sum += value

    def samples(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative (le, count) pairs, +Inf last, and the sum: HistogramMetricFamily's form."""
        counts, total = list(self.counts), self.sum
        cumulative, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), counts):
            running += count
            cumulative.append((floatToGoString(bound), running))
        return cumulative, total




class RequestSeries:
    """One API's request count, latency histogram and error counts."""

    __slots__ = ("api", "count", "latency", "errors")

    def __init__(self, api_key: int) -> None:
        self.api = api_name(api_key)
        self.count = 0
        self.latency = Buckets(LATENCY_BUCKETS)
        self.errors: dict[int, int] = {}  # error code -> occurrences

    def answered(self, started: float, response: object) -> None:
        """A request that began at `started` (perf_counter) is answered with `response` (None: no response)."""
        self.latency.observe(time.perf_counter() - started)
        self.count += 1
        for code in response_errors(response):
            self.errors[code] = self.errors.get(code, 0) + 1


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        registry = self.registry
        self.batch_bytes = Buckets(BYTES_BUCKETS)  # produce batches as sent, before deduplication
        self.batch_records = Buckets(COUNT_BUCKETS)
        self.fsync_latency = Buckets(FSYNC_BUCKETS)  # each group commit of a partition's ledger
        self.fsync_entries = Buckets(COUNT_BUCKETS)
        self._series: dict[int, RequestSeries] = {}
        registry.register(_ObservedCollector(self))
        self.compaction_runs = Counter("kop_compaction_runs", "Partitions compacted by the log cleaner (passes)",
                                       registry=registry)
        self.compaction_records_removed = Counter("kop_compaction_records_removed", "Records the log cleaner "
                                                  "removed (older versions of a key, expired tombstones, aborted "
                                                  "transactions' records)", registry=registry)
        self.compaction_bytes_reclaimed = Counter("kop_compaction_bytes_reclaimed", "Bytes of ledgers the log "
                                                  "cleaner's rewrites freed", registry=registry)
        self.compaction_dirty_ratio = Gauge("kop_compaction_dirty_ratio", "A compacted partition's dirty bytes / "
                                            "cleanable bytes at the cleaner's last look", ["topic", "partition"],
                                            registry=registry)
        self.compaction_lag = Gauge("kop_compaction_lag_seconds", "How long a compacted partition's oldest "
                                    "uncleaned closed ledger has waited, at the cleaner's last look (0: none)",
                                    ["topic", "partition"], registry=registry)

    def request_series(self, api_key: int) -> RequestSeries:
        series = self._series.get(api_key)
        if series is None:
            series = self._series[api_key] = RequestSeries(api_key)
        return series

    def observe_batch(self, size_bytes: int, records: int) -> None:
        sizes, counts = self.batch_bytes, self.batch_records  # Buckets.observe inline: every batch observes both
        sizes.counts[bisect_left(sizes.bounds, size_bytes)] += 1
        sizes.sum += size_bytes
        counts.counts[bisect_left(counts.bounds, records)] += 1
        counts.sum += records

    def observe_flush(self, seconds: float, entries: int) -> None:
        """A ledger's group commit made `entries` durable with one fsync taking `seconds`."""
        self.fsync_latency.observe(seconds)
        self.fsync_entries.observe(entries)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric, as a scrape gets it."""
        return generate_latest(self.registry)

    def series(self) -> list[RequestSeries]:
        return list(self._series.values())


class _ObservedCollector(Collector):
    """The counts observed on the way, as Prometheus families."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        series = m.series()  # in the order of first use
        requests = CounterMetricFamily("kop_requests", "Kafka requests answered, per API", labels=["api"])
        errors = CounterMetricFamily("kop_request_errors", "Error codes other than NONE in Kafka responses, one per "
                                     "occurrence (a partition's or the request's)", labels=["api", "error"])
        latency = HistogramMetricFamily("kop_request_latency_seconds", "From a request read to its response ready, "
                                        "per API", labels=["api"])
        for s in series:
            requests.add_metric([s.api], s.count)
            for code, count in sorted(s.errors.items()):
                errors.add_metric([s.api, error_name(code)], count)
            latency.add_metric([s.api], *s.latency.samples())
        yield requests
        yield errors
        yield latency
        for name, documentation, buckets in (
                ("kop_produce_batch_size_bytes", "Size of each record batch produced (as sent, before "
                                                 "deduplication)", m.batch_bytes),
                ("kop_produce_batch_size_records", "Records in each record batch produced", m.batch_records),
                ("kop_ledger_fsync_latency_seconds", "Duration of each group commit of a partition's ledger (its "
                                                     "fsync, or its PostgreSQL commit)", m.fsync_latency),
                ("kop_ledger_fsync_entries", "Entries made durable by each group commit's fsync (the group-commit "
                                             "size)", m.fsync_entries)):
            family = HistogramMetricFamily(name, documentation)
            family.add_metric([], *buckets.samples())
            yield family


class BrokerCollector(Collector):
    """The metrics read from the broker's own state at each scrape."""

    def __init__(self, broker: "Broker") -> None:
        self._broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        topics = sorted(broker.topics.topics.values(), key=lambda t: t.name)
        yield _gauge("kop_partitions_loaded", "Partitions loaded and serving",
                     sum(len(t.partitions) for t in topics))
        yield _gauge("kop_connections_open", "Kafka client connections open", broker.open_connections)
        files = broker.topics.file_pool
        yield _gauge("kop_ledger_files_open", "Ledger files (.log, .idx) holding a descriptor now", files.open_count)
        yield _gauge("kop_ledger_files_open_max", "Descriptors the ledger file pool keeps at most (pinned ones aside)",
                     files.capacity)
        yield CounterMetricFamily("kop_ledger_file_opens", "Ledger files opened, again after the pool closed them too",
                                  value=files.opens)
        yield from _fetch_session_families(broker)
        yield from _transaction_index_families(broker, topics)
        yield from _entry_cache_families(broker)
        yield from _topic_families(topics)
        yield from _dedup_partition_families(topics)
        yield from _group_families(broker)
        yield from _replication_families(broker)


def _replication_families(broker: "Broker") -> Iterator[Metric]:
    labels = ["topic", "partition", "remote"]
    backlog = GaugeMetricFamily("kop_replication_backlog_entries", "Entries after the replicator's cursor: not yet "
                                "durable in the remote cluster", labels=labels)
    backlog_bytes = GaugeMetricFamily("kop_replication_backlog_bytes", "Their bytes (the cursor's ledger prorated)",
                                      labels=labels)
    replicated = CounterMetricFamily("kop_replication_entries", "Entries the remote answered as durable (stored, or "
                                     "stored before)", labels=labels)
    failing = GaugeMetricFamily("kop_replication_failing", "1 while the replicator's last attempt failed",
                                labels=labels)
    for (topic, index, remote), replicator in sorted(broker.replication.replicators.items()):
        values = [topic, str(index), remote]
        entries, size = replicator.backlog()
        backlog.add_metric(values, entries)
        backlog_bytes.add_metric(values, size)
        replicated.add_metric(values, replicator.stats.entries_sent)
        failing.add_metric(values, 1 if replicator.stats.last_error else 0)
    yield from (backlog, backlog_bytes, replicated, failing)


def _fetch_session_families(broker: "Broker") -> Iterator[Metric]:
    sessions = broker.fetch_sessions
    yield _gauge("kop_fetch_sessions", "Fetch sessions (KIP-227) cached", len(sessions))
    yield _gauge("kop_fetch_session_partitions", "Partitions the cached fetch sessions hold", sessions.partitions)
    yield CounterMetricFamily("kop_fetch_session_evictions", "Fetch sessions evicted to make room for new ones",
                              value=sessions.stats.evicted)
    fetches = CounterMetricFamily("kop_fetch_session_requests", "Fetch requests by how they named their partitions: "
                                  "full (every one), incremental (a session's changes), session_error (refused: an "
                                  "unknown session or a wrong epoch)", labels=["kind"])
    stats = sessions.stats
    for kind, count in (("full", stats.full_fetches), ("incremental", stats.incremental_fetches),
                        ("session_error", stats.errors)):
        fetches.add_metric([kind], count)
    yield fetches


def _transaction_index_families(broker: "Broker", topics: list) -> Iterator[Metric]:
    cache = broker.topics.index_cache
    yield _gauge("kop_txn_index_memory_aborted", "Aborted transactions held in memory by the aborted-transaction "
                 "indexes not stored yet (open ledgers', and closed ones' being written), all partitions",
                 sum(len(aborts) for t in topics for p in t.partitions
                     for aborts in p.transactions.indexes.in_memory().values()))
    yield _gauge("kop_txn_index_cache_bytes", "Bytes of stored aborted-transaction indexes cached for fetches",
                 cache.bytes)
    yield CounterMetricFamily("kop_txn_index_cache_hits", "Lookups of a stored aborted-transaction index served "
                              "from the cache", value=cache.hits)
    yield CounterMetricFamily("kop_txn_index_cache_misses", "Lookups of a stored aborted-transaction index that "
                              "read it from the storage engine", value=cache.misses)


def _entry_cache_families(broker: "Broker") -> Iterator[Metric]:
    cache = broker.topics.entry_cache
    if cache is None:  # the file engine reads its files through the page cache
        return
    yield _gauge("kop_managed_ledger_cache_bytes", "Bytes of entries the PostgreSQL engine holds in memory for "
                 "reads, all partitions (at most managed.ledger.cache.bytes, plus the one entry just read)", cache.size)
    yield _gauge("kop_managed_ledger_cache_entries", "Entries whose bytes the PostgreSQL engine holds in memory",
                 len(cache))
    yield _gauge("kop_managed_ledger_cache_max_bytes", "The bound of the entry cache (managed.ledger.cache.bytes); "
                 "-1: none", -1 if cache.max_bytes is None else cache.max_bytes)
    yield CounterMetricFamily("kop_managed_ledger_cache_misses", "Reads that found entries' bytes not held and read "
                              "them back from PostgreSQL", value=cache.misses)
    yield CounterMetricFamily("kop_managed_ledger_cache_evictions", "Entries whose bytes were dropped from memory "
                              "to keep within the bound", value=cache.evictions)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _topic_families(topics: list) -> Iterator[Metric]:
    bytes_in = CounterMetricFamily("kop_topic_bytes_in", "Bytes of record batches stored (durable), per topic",
                                   labels=["topic"])
    bytes_out = CounterMetricFamily("kop_topic_bytes_out", "Bytes of record batches served to fetches, per topic",
                                    labels=["topic"])
    decisions = CounterMetricFamily("kop_dedup_decisions", "PIP-6 decisions on idempotent producers' batches, per "
                                    "topic: stored (NotDup), duplicate (Dup), unknown (a retry of a write in "
                                    "flight, or refused while the state is recovered)", labels=["topic", "decision"])
    dropped = CounterMetricFamily("kop_sequence_id_records_dropped", "Records with kop.sequence.id headers dropped "
                                  "as duplicates, per topic", labels=["topic"])
    dropped_plain = CounterMetricFamily("kop_sequence_id_records_dropped_without_idempotence", "... of them sent "
                                        "by producers without idempotence (which may have reordered them)",
                                        labels=["topic"])
    snapshots = CounterMetricFamily("kop_dedup_snapshots", "Dedup snapshots stored on the pulsar.dedup cursor, per "
                                    "topic", labels=["topic"])
    for topic in topics:
        parts = topic.partitions
        bytes_in.add_metric([topic.name], sum(p.bytes_in for p in parts))
        bytes_out.add_metric([topic.name], sum(p.bytes_out for p in parts))
        for decision in ("stored", "duplicate", "unknown"):
            decisions.add_metric([topic.name, decision], sum(getattr(p.dedup_decisions, decision) for p in parts))
        dropped.add_metric([topic.name], sum(p.sequences.dropped for p in parts))
        dropped_plain.add_metric([topic.name], sum(p.sequences.dropped_without_idempotence for p in parts))
        snapshots.add_metric([topic.name], sum(p.dedup.snapshots_stored for p in parts))
    yield from (bytes_in, bytes_out, decisions, dropped, dropped_plain, snapshots)


def _dedup_partition_families(topics: list) -> Iterator[Metric]:
    seconds = GaugeMetricFamily("kop_dedup_recovery_seconds", "Duration of the partition's last dedup recovery "
                                "(snapshot read and replay)", labels=["topic", "partition"])
    replayed = GaugeMetricFamily("kop_dedup_recovery_replayed_entries", "Entries replayed by the partition's last "
                                 "dedup recovery", labels=["topic", "partition"])
    for topic in topics:
        for p in topic.partitions:
            recovery = p.dedup.last_recovery
            if recovery is not None:
                labels = [topic.name, str(p.partition)]
                seconds.add_metric(labels, recovery.seconds)
                replayed.add_metric(labels, recovery.replayed)
    yield from (seconds, replayed)


def _group_families(broker: "Broker") -> Iterator[Metric]:
    rebalances = CounterMetricFamily("kop_consumer_group_rebalances", "Rebalances completed (generations begun; "
                                     "for KIP-848 groups, target assignments computed) since the group was loaded",
                                     labels=["group"])
    counts = {g.group_id: g.rebalances for g in broker.groups.groups.values()}
    counts.update((g.group_id, g.epoch) for g in broker.groups.consumer.groups.values())
    for group_id, count in sorted(counts.items()):
        rebalances.add_metric([group_id], count)
    committed = GaugeMetricFamily("kop_consumer_group_committed_offset", "The group's committed offset",
                                  labels=["group", "topic", "partition"])
    lag = GaugeMetricFamily("kop_consumer_group_lag", "Offsets between the group's committed offset and the "
                            "partition's end (high watermark)", labels=["group", "topic", "partition"])
    # The groups this broker coordinates (all of them on one broker), of both protocols, as their coordinator knows
    # their offsets; the lag where this broker also serves the partition.
    for group_id in sorted(set(broker.groups.group_ids())):
        for (topic, index), offset in broker.groups.offsets.fetch_all(group_id).items():
            labels = [group_id, topic, str(index)]
            committed.add_metric(labels, offset.offset)
            partition = broker.topics.partition(topic, index)
            if partition is not None:
                lag.add_metric(labels, max(0, partition.high_watermark - offset.offset))
    yield from (rebalances, committed, lag)
