"""ListOffsets by timestamp and max timestamp over many ledgers of compressed batches whose timestamps step back now
and then: Kafka's answer (the first record in offset order at or after the time), live and after a restart, when
the ledgers' max timestamps come from ledgers.info and their batch indexes are rebuilt on demand."""
import random

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

from integration.idem_raw import RawKafka
from protocol.compression import LZ4, NONE, ZSTD
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch

VERSION = 7  # MAX_TIMESTAMP (-3) needs v7
MAX_TIMESTAMP = -3


def list_offsets(port: int, topic: str, timestamps: list[int]) -> list[tuple[int, int]]:
    """(timestamp, offset) answered for each timestamp, one request each."""
    out = []
    with RawKafka(port) as kafka:
        for timestamp in timestamps:
            request = ListOffsetsRequest[VERSION](
                replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
                    name=topic, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=timestamp)])])
            (answer,) = kafka.call(request, ListOffsetsResponse, VERSION).topics[0].partitions
            assert answer.error_code == ErrorCode.NONE
            out.append((answer.timestamp, answer.offset))
    return out


def expected(stamps: list[int], target: int) -> tuple[int, int]:
    if target == MAX_TIMESTAMP:
        target = max(stamps)
    return next(((ts, offset) for offset, ts in enumerate(stamps) if ts >= target), (-1, -1))


def test_offsets_for_times_across_ledgers_and_a_restart(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("times", 1, 1, config={"segment.bytes": "4000"})])["times"].result(10)
    rng = random.Random(11)
    clock, stamps = 1_700_000_000_000, []
    with RawKafka(broker.port) as kafka:
        for n in range(60):
            clock += rng.randrange(0, 2000)
            records = [Record(i, clock + rng.randrange(-5000, 1000), None, b"r%d" % rng.randrange(10**6) * 20)
                       for i in range(rng.randrange(1, 8))]
            batch = build_batch(records, compression=(NONE, LZ4, ZSTD)[n % 3])
            assert kafka.produce("times", 0, batch).error_code == ErrorCode.NONE
            stamps.extend(r.timestamp for r in records)
    targets = [MAX_TIMESTAMP, min(stamps) - 1, max(stamps), max(stamps) + 1]
    targets += sorted(rng.sample(sorted(set(stamps)), 25))
    targets += [rng.randrange(min(stamps), max(stamps)) for _ in range(25)]
    want = [expected(stamps, t) for t in targets]
    assert list_offsets(broker.port, "times", targets) == want
    broker.restart()
    assert list_offsets(broker.port, "times", targets) == want
    broker.restart(hard=True)
    assert list_offsets(broker.port, "times", targets) == want
