"""The aborted-transaction index kept with each ledger, as real read_committed consumers see it. Three confluent-kafka
transactional producers interleave transactions, committed and aborted, over many ledger rolls (on size, and on the
aborts a ledger holds); confluent-kafka and the Java client read the topic read_committed, and raw Fetch requests
sweep it offset by offset, with small and large byte limits. Every answer is checked against the aborted
transactions read from the log itself, and must be the same after kill -9 and a restart: once with the index writes
of the ledgers closed last failing before the kill (the restart rebuilds them from those ledgers), once with one
stored index removed and another damaged while the broker was down (rebuilt from the log at load and when a fetch
reads it), once with the open ledger's index only in memory and in the snapshot."""
import asyncio
import os
import random
import time

import pytest
from confluent_kafka import Producer
from kafka.protocol.consumer import FetchResponse

from integration.broker_process import storage_options
from integration.fetch_requests import FETCH_VERSION, fetch_request
from integration.idem_raw import RawKafka
from integration.java_client import java_available, java_read_to_end, java_unavailable_reason
from integration.test_dedup_policies import internal_stats
from integration.test_dedup_recovery import failpoint
from integration.txn_clients import READ_COMMITTED, ck_read_to_end, values
from kop.transactions.aborted_index import DamagedIndex, LedgerAborts
from protocol.errors import ErrorCode
from protocol.records import control_marker, iter_records, split_batches

TOPIC = "txn-index"
LEDGER = f"public/default/{TOPIC}-partition-0"  # its managed ledger's name (under ledgers/ on the file engine)
BROKER_CONFIG = {"adminFailpointsEnabled": "true", "transaction.index.max.aborted.per.ledger": "2"}
TOPIC_CONFIGS = {"segment.bytes": "400"}  # a few entries a ledger
FETCH_LIMITS = (1, 1 << 20)  # one batch (KIP-74: the first is returned whatever its size), or to the end


class InterleavedTransactions:
    """Three transactional producers; each round one of them writes a few records in its transaction (opening one
    if needed, each batch flushed so it is stored between the others'), or ends its transaction, aborting most."""

    def __init__(self, bootstrap: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.producers: dict[str, Producer] = {}
        for name in "abc":
            producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{TOPIC}-{name}"})
            producer.init_transactions(15)
            self.producers[name] = producer
        self.open: dict[str, list[bytes]] = {}
        self.committed: set[bytes] = set()
        self.written = 0

    def rounds(self, count: int) -> None:
        for _ in range(count):
            name = self.rng.choice("abc")
            producer = self.producers[name]
            if name in self.open and self.rng.random() < 0.4:
                self.end(name, commit=self.rng.random() < 0.35)
                continue
            if name not in self.open:
                producer.begin_transaction()
                self.open[name] = []
            for _ in range(self.rng.randint(1, 3)):
                value = b"%s-%d" % (name.encode(), self.written)
                self.written += 1
                producer.produce(TOPIC, value, partition=0)
                self.open[name].append(value)
            assert producer.flush(15) == 0

    def end(self, name: str, commit: bool) -> None:
        producer = self.producers[name]
        producer.commit_transaction(15) if commit else producer.abort_transaction(15)
        records = self.open.pop(name)
        if commit:
            self.committed.update(records)

    def end_all(self) -> None:
        for name in list(self.open):
            self.end(name, commit=False)


def log_batches(kafka: RawKafka, records: bool = False) -> list[tuple]:
    """(base offset, last offset, producer id, transactional, control, commit) of every batch, read_uncommitted;
    records: (header, records) of each data batch instead."""
    batches, offset = [], 0
    end = kafka.end_offsets(TOPIC, [0])[0]
    while offset < end:
        data = fetch(kafka, offset, 1 << 20, isolation_level=0)
        for header, view in split_batches(bytes(data.records)):
            offset = header.base_offset + header.last_offset_delta + 1
            if records:
                if not header.is_control:
                    batches.append((header, list(iter_records(view))))
                continue
            commit = control_marker(next(iter_records(view))).commit if header.is_control else None
            batches.append((header.base_offset, offset - 1, header.producer_id, header.is_transactional,
                            header.is_control, commit))
    return batches


def aborted_in_log(batches: list[tuple]) -> list[tuple[int, int, int]]:
    """(producer id, first offset, ABORT marker offset) of each aborted transaction, in marker order."""
    opened, aborted = {}, []
    for base, _last, producer_id, transactional, control, commit in batches:
        if control:
            first = opened.pop(producer_id, None)
            if first is not None and not commit:
                aborted.append((producer_id, first, base))
        elif transactional:
            opened.setdefault(producer_id, base)
    return aborted


def fetch(kafka: RawKafka, offset: int, limit: int, isolation_level: int = 1):
    request = fetch_request([(TOPIC, 0, offset)], isolation_level=isolation_level, partition_max_bytes=limit)
    data = kafka.call(request, FetchResponse, FETCH_VERSION).responses[0].partitions[0]
    assert data.error_code == ErrorCode.NONE
    return data


def sweep(broker) -> dict[tuple[int, int], tuple[tuple[int, ...], tuple[tuple[int, int], ...]]]:
    """For a read_committed fetch at every offset, with each byte limit: the base offsets of the batches returned
    and the aborted transactions listed, (producer id, first offset)."""
    answers = {}
    with RawKafka(broker.port) as kafka:
        end = kafka.end_offsets(TOPIC, [0], committed=True)[0]
        for offset in range(end):
            for limit in FETCH_LIMITS:
                data = fetch(kafka, offset, limit)
                bases = tuple(header.base_offset for header, _ in split_batches(bytes(data.records or b"")))
                answers[(offset, limit)] = (bases, tuple((t.producer_id, t.first_offset)
                                                         for t in data.aborted_transactions))
    return answers


def check_against_log(broker, answers) -> None:
    """Each answer lists exactly the aborted transactions whose marker is at or after the fetch offset and whose
    first offset is below the end of the batches returned, in marker order: what Kafka's index lookup gives."""
    with RawKafka(broker.port) as kafka:
        batches = log_batches(kafka)
    last_offset = {base: last for base, last, *_ in batches}
    aborted = aborted_in_log(batches)
    for (offset, _limit), (bases, listed) in answers.items():
        upper = last_offset[bases[-1]] + 1
        assert listed == tuple((p, f) for p, f, marker in aborted if marker >= offset and f < upper), offset


def readers_see_only_committed(broker, writer: InterleavedTransactions, java: bool) -> None:
    with RawKafka(broker.port) as kafka:
        everything = [record.value for header, view in log_batches(kafka, records=True) for record in view]
    expected = [value for value in everything if value in writer.committed]
    assert len(everything) == writer.written and len(expected) < writer.written  # control: aborted ones to skip
    assert values(ck_read_to_end(broker.bootstrap, TOPIC, isolation=READ_COMMITTED)) == expected
    if java:
        records, _ = java_read_to_end(broker.bootstrap, TOPIC, extra_props={"isolation.level": READ_COMMITTED})
        assert [r.value.encode() for r in records] == expected


def index_state(broker) -> dict:
    stats = internal_stats(broker, TOPIC)
    return {"ledgers": [ledger["ledgerId"] for ledger in stats["ledgers"]], **stats["transactionIndex"]}


def check_after_restart(broker, before: dict, answers: dict, writer: InterleavedTransactions, java: bool) -> None:
    """The same answers, and every closed ledger's index stored: none left in memory (the restart closed them)."""
    state = index_state(broker)
    assert state["abortedInMemory"] == {}
    assert set(state["storedLedgers"]) == set(before["storedLedgers"]) | {int(i) for i in before["abortedInMemory"]}
    assert sweep(broker) == answers
    readers_see_only_committed(broker, writer, java)


class StoredIndexes:
    """The partition's stored indexes as the broker's engine keeps them (read and replaced while it is down): the
    .txnindex files, or the txn_index column of its kop_ledger rows."""

    def __init__(self, broker) -> None:
        options = storage_options(broker.data_dir)
        self.url = options[1] if options else None
        self.directory = os.path.join(broker.data_dir, "ledgers", LEDGER)

    def get(self, ledger_id: int) -> bytes | None:
        if self.url is None:
            path = os.path.join(self.directory, f"{ledger_id}.txnindex")
            return open(path, "rb").read() if os.path.exists(path) else None
        return self._sql("SELECT txn_index FROM kop_ledger WHERE name = $1 AND ledger_id = $2", ledger_id)

    def put(self, ledger_id: int, data: bytes | None) -> None:
        if self.url is None:
            path = os.path.join(self.directory, f"{ledger_id}.txnindex")
            if data is None:
                os.unlink(path)
            else:
                with open(path, "wb") as f:
                    f.write(data)
        else:
            self._sql("UPDATE kop_ledger SET txn_index = $3 WHERE name = $1 AND ledger_id = $2", ledger_id, data)

    def _sql(self, query: str, *args):
        import asyncpg

        async def run():
            conn = await asyncpg.connect(self.url)
            try:
                return await conn.fetchval(query, LEDGER, *args)
            finally:
                await conn.close()
        return asyncio.run(run())


def listed(data: bytes) -> list[tuple[int, int, int]]:
    """A stored index's transactions: (producer id, first offset, marker offset) (a rebuild may note lower last
    stable offsets)."""
    return [(t.producer_id, t.first_offset, t.last_offset) for t in LedgerAborts.decode(data)]


def damage_two_indexes_and_check_rebuilt(broker, answers: dict, writer: InterleavedTransactions) -> None:
    """Down, one stored index removed and another damaged: the restart rebuilds the first at load, a fetch that
    reads the second rebuilds it, both stored again; every answer is the same."""
    stored_ledgers = index_state(broker)["storedLedgers"]
    broker.kill()
    indexes = StoredIndexes(broker)
    missing, damaged = stored_ledgers[1], stored_ledgers[-2]
    good = {ledger_id: indexes.get(ledger_id) for ledger_id in (missing, damaged)}
    indexes.put(missing, None)
    flipped = bytearray(good[damaged])
    flipped[len(flipped) // 2] ^= 1
    indexes.put(damaged, bytes(flipped))
    assert indexes.get(missing) is None  # control: the faults are in place
    with pytest.raises(DamagedIndex):
        LedgerAborts.decode(indexes.get(damaged))
    broker.start()
    assert listed(indexes.get(missing)) == listed(good[missing])  # rebuilt at load
    assert sweep(broker) == answers
    for _ in range(100):  # the rebuilt index is stored in the background
        if (data := indexes.get(damaged)) != bytes(flipped):
            break
        time.sleep(0.1)
    assert listed(data) == listed(good[damaged])  # rebuilt when read, stored again
    assert index_state(broker)["storedLedgers"] == stored_ledgers
    readers_see_only_committed(broker, writer, java=False)


def run_scenario(start_broker, java: bool) -> None:
    broker = start_broker(BROKER_CONFIG)
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(TOPIC, configs=TOPIC_CONFIGS) == ErrorCode.NONE
    writer = InterleavedTransactions(broker.bootstrap, seed=14)
    writer.rounds(40)
    failpoint(broker, TOPIC, txn_index_write_failures=1_000_000)  # every closed ledger's index stays in memory
    writer.rounds(25)
    writer.end_all()
    before = index_state(broker)
    # Control: ledgers rolled and some of their indexes were stored, then the failing writes kept several closed
    # ledgers' indexes in memory only (the open ledger's is one at most).
    assert len(before["ledgers"]) >= 10 and len(before["storedLedgers"]) >= 3, before
    assert len(before["abortedInMemory"]) >= 3, before
    answers = sweep(broker)
    check_against_log(broker, answers)
    if java:  # the quick run has the consumers read after the restart only: the sweeps compare before and after
        readers_see_only_committed(broker, writer, java)

    broker.kill()
    broker.start()
    check_after_restart(broker, before, answers, writer, java)
    if not java:
        damage_two_indexes_and_check_rebuilt(broker, answers, writer)
        return

    writer.rounds(30)  # the same producers, reconnected
    writer.end_all()
    before = index_state(broker)
    assert before["abortedInMemory"]  # control: the open ledger's index is in memory (and in the snapshot) only
    answers = sweep(broker)
    check_against_log(broker, answers)
    broker.kill()
    broker.start()
    check_after_restart(broker, before, answers, writer, java)


@pytest.mark.slow  # restarts and moves between brokers: 20-30 s in a loaded make test
def test_read_committed_answers_across_ledger_rolls_are_the_logs_and_survive_kill_9(start_broker):
    run_scenario(start_broker, java=False)


@pytest.mark.slow  # two kill -9s, four sweeps and the Java client: ~30 s
@pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())
def test_java_and_confluent_read_committed_across_ledger_rolls_and_two_kill_9s(start_broker):
    run_scenario(start_broker, java=True)
