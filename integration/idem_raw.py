"""A raw-socket Kafka client for one broker, built on kafka-python's protocol classes.

The idempotence tests use it twice: to read back what a broker stored, straight from the broker's own port (no
client library and no fault proxy in between), and to send hand-made Produce and InitProducerId requests whose
producer id, epoch and sequence numbers the test chooses.
"""
from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kafka.protocol.admin.topics import (CreateTopicsRequest, CreateTopicsResponse, DeleteRecordsRequest,
                                         DeleteRecordsResponse)
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from integration.fetch_requests import FETCH_VERSION, fetch_request
from protocol.records import Record, build_batch, iter_records, split_batches

LIST_OFFSETS_VERSION = 5
MAX_TIMESTAMP_VERSION = 7  # ListOffsets answering MAX_TIMESTAMP (-3)
DELETE_RECORDS_VERSION = 2
LATEST = -1
EARLIEST = -2
PRODUCE_VERSION = 9
CREATE_TOPICS_VERSION = 5
MAX_FRAME = 64 * 1024 * 1024
BASE_TIMESTAMP = 1_700_000_000_000
# Fetch errors a client retries: the broker is loading the partition, or is not sure it still owns it.
RETRIABLE_READ_ERRORS = frozenset({5, 6})  # LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER
OFFSET_OUT_OF_RANGE = 1


class OffsetOutOfRange(RuntimeError):
    """A fetch below the log start offset (retention or DeleteRecords moved it) or past the end."""


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record as the broker stores it, with the header fields of the batch that holds it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    producer_id: int
    base_sequence: int
    producer_epoch: int = -1
    sequence: int = -1  # this record's own sequence (base sequence + offset delta), -1 without a producer id


@dataclass(frozen=True, slots=True)
class ProduceAnswer:
    error_code: int
    base_offset: int
    error_message: str | None
    log_append_time_ms: int = -1


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    error_code: int
    producer_id: int
    producer_epoch: int


class RawKafka:
    """One blocking connection; every call is one request and its response, each bounded by `timeout`."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.settimeout(timeout)
        self._correlation_id = 0

    def close(self) -> None:
        self._sock.close()

    def fileno(self) -> int:
        """The socket's descriptor: select() can tell whether an answer is waiting."""
        return self._sock.fileno()

    def __enter__(self) -> "RawKafka":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, request, response_cls, version: int):
        return self.receive(self.send(request), response_cls, version)

    def send(self, request) -> int:
        """Send one request without waiting; returns its correlation id (for pipelining and acks=0)."""
        self._correlation_id += 1
        request.with_header(correlation_id=self._correlation_id, client_id="kop-idem-test")
        self._sock.sendall(request.encode(header=True, framed=True))
        return self._correlation_id

    def send_frame(self, frame: bytes) -> None:
        """Send a request someone else encoded, whole: size prefix, header (its own correlation id) and body."""
        self._sock.sendall(frame)

    def receive(self, correlation_id: int, response_cls, version: int):
        """The next response, which must answer `correlation_id` (a broker answers in request order)."""
        size = struct.unpack(">i", self._recv_exact(4))[0]
        if not 0 < size <= MAX_FRAME:
            raise ConnectionError(f"absurd response frame size {size}")
        response = response_cls.decode(self._recv_exact(size), version=version, header=True)
        if response.header.correlation_id != correlation_id:
            raise ConnectionError(f"response for correlation id {response.header.correlation_id}, "
                                  f"expected {correlation_id}")
        return response

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    # ---- topics

    def create_topic(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> int:
        """CreateTopics; returns the error code (NONE, or TOPIC_ALREADY_EXISTS)."""
        v = CREATE_TOPICS_VERSION
        creatable = [CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name=k, value=val)
                     for k, val in (configs or {}).items()]
        request = CreateTopicsRequest[v](
            topics=[CreateTopicsRequest.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                                       assignments=[], configs=creatable)],
            timeout_ms=10_000, validate_only=False)
        response = self.call(request, CreateTopicsResponse, v)
        return response.topics[0].error_code

    # ---- producing

    def init_producer_id(self, version: int = 4) -> ProducerIdentity:
        """InitProducerId for an idempotent (non-transactional) producer."""
        fields = {"transactional_id": None, "transaction_timeout_ms": 60_000}
        if version >= 3:
            fields.update(producer_id=-1, producer_epoch=-1)
        response = self.call(InitProducerIdRequest[version](**fields), InitProducerIdResponse, version)
        return ProducerIdentity(response.error_code, response.producer_id, response.producer_epoch)

    def produce(self, topic: str, partition: int, batch: bytes, *, acks: int = -1, timeout_ms: int = 10_000,
                version: int = PRODUCE_VERSION) -> ProduceAnswer | None:
        """One Produce request and its answer; None for acks=0, which gets no response."""
        correlation_id = self.send_produce(topic, partition, batch, acks=acks, timeout_ms=timeout_ms,
                                           version=version)
        return None if acks == 0 else self.receive_produce(correlation_id, version)

    def send_produce(self, topic: str, partition: int, batch: bytes, *, acks: int = -1, timeout_ms: int = 10_000,
                     version: int = PRODUCE_VERSION) -> int:
        request = ProduceRequest[version](
            transactional_id=None, acks=acks, timeout_ms=timeout_ms,
            topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=batch)])])
        return self.send(request)

    def receive_produce(self, correlation_id: int, version: int = PRODUCE_VERSION) -> ProduceAnswer:
        response = self.receive(correlation_id, ProduceResponse, version)
        answer = response.responses[0].partition_responses[0]
        return ProduceAnswer(answer.error_code, answer.base_offset, getattr(answer, "error_message", None),
                             answer.log_append_time_ms)

    # ---- reading

    def end_offsets(self, topic: str, partitions: Iterable[int], committed: bool = False) -> dict[int, int]:
        """ListOffsets LATEST: the offset after the last stored record, per partition; committed: the last stable
        offset instead (what a read_committed consumer reads up to)."""
        return self.list_offsets(topic, partitions, LATEST, committed)

    def start_offsets(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """ListOffsets EARLIEST: the log start offset, per partition."""
        return self.list_offsets(topic, partitions, EARLIEST)

    def list_offsets(self, topic: str, partitions: Iterable[int], timestamp: int,
                     committed: bool = False) -> dict[int, int]:
        out = {}
        for (_topic, partition), (error_code, _timestamp, offset) in self.offsets_for(
                [(topic, p, timestamp) for p in partitions], committed, LIST_OFFSETS_VERSION).items():
            if error_code:
                raise RuntimeError(f"ListOffsets {topic}-{partition} failed: {error_code}")
            out[partition] = offset
        return out

    def offsets_for(self, wanted: Iterable[tuple[str, int, int]], committed: bool = False,
                    version: int = MAX_TIMESTAMP_VERSION) -> dict[tuple[str, int], tuple[int, int, int]]:
        """One ListOffsets asking, for each (topic, partition, timestamp), its (error code, timestamp, offset)."""
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for topic, partition, timestamp in wanted:
            by_topic.setdefault(topic, []).append((partition, timestamp))
        Topic = ListOffsetsRequest.ListOffsetsTopic
        request = ListOffsetsRequest[version](replica_id=-1, isolation_level=int(committed), topics=[
            Topic(name=topic, partitions=[Topic.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1,
                                                                     timestamp=timestamp) for p, timestamp in asked])
            for topic, asked in by_topic.items()])
        response = self.call(request, ListOffsetsResponse, version)
        return {(t.name, a.partition_index): (a.error_code, a.timestamp, a.offset)
                for t in response.topics for a in t.partitions}

    def delete_records(self, topic: str, partition: int, before: int) -> tuple[int, int]:
        """DeleteRecords of one partition below offset `before`: (error code, low watermark)."""
        Topic = DeleteRecordsRequest.DeleteRecordsTopic
        request = DeleteRecordsRequest[DELETE_RECORDS_VERSION](timeout_ms=10_000, topics=[
            Topic(name=topic, partitions=[Topic.DeleteRecordsPartition(partition_index=partition, offset=before)])])
        answer = self.call(request, DeleteRecordsResponse, DELETE_RECORDS_VERSION).topics[0].partitions[0]
        return answer.error_code, answer.low_watermark

    def fetch_once(self, topic: str, partition: int, offset: int,
                   max_bytes: int = 4 * 1024 * 1024) -> tuple[int, int, bytes]:
        """One Fetch (no long poll); returns (error code, high watermark, records bytes)."""
        request = fetch_request([(topic, partition, offset)], max_bytes=max_bytes, partition_max_bytes=max_bytes)
        response = self.call(request, FetchResponse, FETCH_VERSION)
        data = response.responses[0].partitions[0]
        records = data.records if isinstance(data.records, (bytes, bytearray)) else bytes(data.records or b"")
        return data.error_code, data.high_watermark, bytes(records)

    def read_partition(self, topic: str, partition: int, timeout: float = 30.0,
                       start: int = 0) -> list[StoredRecord]:
        """Every record of one partition from `start` up to the high watermark seen at the first fetch."""
        out: list[StoredRecord] = []
        offset = start
        end = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            error, high_watermark, records = self.fetch_once(topic, partition, offset)
            if error in RETRIABLE_READ_ERRORS:  # as a client does: the broker is (re)gaining the partition
                time.sleep(0.2)
                continue
            if error == OFFSET_OUT_OF_RANGE:
                raise OffsetOutOfRange(f"fetch {topic}-{partition}@{offset} is out of range")
            if error:
                raise RuntimeError(f"fetch {topic}-{partition}@{offset} failed with error {error}")
            end = high_watermark if end is None else end
            for header, view in split_batches(records) if records else ():
                for record in iter_records(view):
                    if offset <= record.offset < end:
                        sequence = -1 if header.base_sequence < 0 else \
                            header.base_sequence + record.offset - header.base_offset
                        out.append(StoredRecord(partition, record.offset, record.key, record.value,
                                                header.producer_id, header.base_sequence, header.producer_epoch,
                                                sequence))
                offset = max(offset, header.last_offset + 1)
            if offset >= end:
                return out
            if not records:  # as a client does: a read the PostgreSQL engine's entry cache missed comes back
                time.sleep(0.05)  # short while the entries are read back (a broker that never answers times out)
        raise TimeoutError(f"reading {topic}-{partition} did not reach {end} within {timeout}s (at {offset})")


def read_topic(port: int, topic: str, partitions: Iterable[int], timeout: float = 60.0) -> list[StoredRecord]:
    """Everything stored in the given partitions, each in offset order, read directly from the broker's port."""
    with RawKafka(port) as kafka:
        return [r for p in partitions for r in kafka.read_partition(topic, p, timeout)]


def idempotent_batch(values: list[bytes], *, producer_id: int, epoch: int, base_sequence: int,
                     compression: int = 0) -> bytes:
    """A batch as an idempotent producer writes it: one record per value, sequences from base_sequence."""
    records = [Record(offset=i, timestamp=BASE_TIMESTAMP + i, key=None, value=v) for i, v in enumerate(values)]
    return build_batch(records, producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence,
                       compression=compression)


def plain_batch(values: list[bytes]) -> bytes:
    """A batch without a producer id (a non-idempotent producer's)."""
    records = [Record(offset=i, timestamp=BASE_TIMESTAMP + i, key=None, value=v) for i, v in enumerate(values)]
    return build_batch(records)
