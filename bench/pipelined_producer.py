"""Many single-record idempotent batches, fast: a raw Kafka-protocol producer for loading a partition with ~1M
entries (one entry per batch), which a client library would take far too long to write one batch at a time.

Each connection is one idempotent producer (its own InitProducerId) with up to `window` Produce requests in flight,
as a Kafka idempotent producer allows 5. Requests are encoded once with kafka-python's ProduceRequest; after that
only the correlation id, the batch's baseSequence and its CRC change, so they are patched into a copy of the bytes.
Every response is checked (error code and correlation id) before its window slot is reused.
"""
import asyncio
import struct
import time
from dataclasses import dataclass

import crc32c
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

PRODUCE_VERSION = 7  # not flexible: the response's error code sits at a fixed offset
INIT_PRODUCER_ID_VERSION = 4
CLIENT_ID = "kop-bench"
# Record batch v2 header offsets (Kafka's DefaultRecordBatch)
CRC_AT = 17
ATTRIBUTES_AT = 21  # the CRC covers everything from here on
BASE_SEQUENCE_AT = 53
_I32 = struct.Struct(">i")


class ProduceFailed(Exception):
    def __init__(self, error_code: int, sequence: int) -> None:
        super().__init__(f"produce of sequence {sequence} failed with error code {error_code}")
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    producer_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class LoadResult:
    entries: int
    seconds: float
    connections: int

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds


class BatchTemplate:
    """One record, one batch; batch(sequence) gives the bytes with that baseSequence and a correct CRC."""

    def __init__(self, identity: ProducerIdentity, value: bytes) -> None:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                            producer_id=identity.producer_id, producer_epoch=identity.epoch,
                                            base_sequence=0, batch_size=1 << 20)
        builder.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
        self._bytes = bytes(builder.build())

    def batch(self, sequence: int) -> bytearray:
        out = bytearray(self._bytes)
        _I32.pack_into(out, BASE_SEQUENCE_AT, sequence)
        struct.pack_into(">I", out, CRC_AT, crc32c.crc32c(memoryview(out)[ATTRIBUTES_AT:]))
        return out


class RequestTemplate:
    """A framed ProduceRequest for one partition whose batch is swapped per request."""

    def __init__(self, topic: str, partition: int, sample_batch: bytes, timeout_ms: int = 30_000) -> None:
        request = ProduceRequest[PRODUCE_VERSION](
            transactional_id=None, acks=-1, timeout_ms=timeout_ms,
            topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=sample_batch)])])
        request.with_header(correlation_id=0, client_id=CLIENT_ID)
        framed = bytes(request.encode(header=True, framed=True))
        at = framed.index(sample_batch)
        self._prefix, self._suffix = framed[:at], framed[at + len(sample_batch):]
        self._batch_size = len(sample_batch)
        # response v7: correlation id, [topic: name, [partition: index, error_code, base_offset, ...]]
        self.error_code_at = 4 + 4 + 2 + len(topic.encode()) + 4 + 4

    def request(self, correlation_id: int, batch: bytes) -> bytes:
        if len(batch) != self._batch_size:
            raise ValueError("every batch must have the sample's size")
        prefix = bytearray(self._prefix)
        _I32.pack_into(prefix, 8, correlation_id)  # after frame size, api key, api version
        return bytes(prefix) + batch + self._suffix


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = _I32.unpack(await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def init_producer_id(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> ProducerIdentity:
    request = InitProducerIdRequest[INIT_PRODUCER_ID_VERSION](transactional_id=None, transaction_timeout_ms=60_000,
                                                              producer_id=-1, producer_epoch=-1)
    request.with_header(correlation_id=1, client_id=CLIENT_ID)
    writer.write(request.encode(header=True, framed=True))
    response = InitProducerIdResponse.decode(await _read_frame(reader), version=INIT_PRODUCER_ID_VERSION, header=True)
    if response.error_code:
        raise RuntimeError(f"InitProducerId failed with error code {response.error_code}")
    return ProducerIdentity(response.producer_id, response.producer_epoch)


class PipelinedProducer:
    """One connection, one idempotent producer, `window` requests in flight, all to one partition."""

    def __init__(self, host: str, port: int, topic: str, partition: int = 0, window: int = 5,
                 value: bytes = b"x" * 32) -> None:
        self.host, self.port, self.topic, self.partition = host, port, topic, partition
        self.window = window
        self.value = value
        self.identity: ProducerIdentity | None = None
        self.next_sequence = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._batches: BatchTemplate | None = None
        self._requests: RequestTemplate | None = None
        self._correlation_id = 1

    async def connect(self, identity: ProducerIdentity | None = None) -> None:
        """Connect; a new producer id unless identity is given (a producer resuming after a broker restart)."""
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self.identity = identity or await init_producer_id(self._reader, self._writer)
        self._batches = BatchTemplate(self.identity, self.value)
        self._requests = RequestTemplate(self.topic, self.partition, bytes(self._batches.batch(0)))
        self._verify_layout()

    def _verify_layout(self) -> None:
        """The fixed response offsets assume this topic name encoding; check once against kafka-python."""
        sample = ProduceResponse[PRODUCE_VERSION](responses=[ProduceResponse.TopicProduceResponse(
            name=self.topic, partition_responses=[ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                index=self.partition, error_code=0x1234, base_offset=0, log_append_time_ms=-1, log_start_offset=0,
                record_errors=[], error_message=None)])], throttle_time_ms=0)
        sample.with_header(correlation_id=9)
        body = bytes(sample.encode(header=True))
        if struct.unpack_from(">h", body, self._requests.error_code_at)[0] != 0x1234:
            raise AssertionError("unexpected ProduceResponse layout")

    async def produce(self, count: int) -> None:
        """Send `count` single-record batches with the next sequences; returns when all are acknowledged."""
        slots = asyncio.Semaphore(self.window)
        sent: asyncio.Queue = asyncio.Queue()

        async def read_responses() -> None:
            for _ in range(count):
                correlation_id, sequence = await sent.get()
                frame = await _read_frame(self._reader)
                got = _I32.unpack_from(frame, 0)[0]
                if got != correlation_id:
                    raise ConnectionError(f"response for correlation id {got}, expected {correlation_id}")
                error = struct.unpack_from(">h", frame, self._requests.error_code_at)[0]
                if error:
                    raise ProduceFailed(error, sequence)
                slots.release()

        reader_task = asyncio.create_task(read_responses())
        try:
            for _ in range(count):
                await slots.acquire()
                if reader_task.done():
                    break  # failed: its exception is raised below
                self._correlation_id += 1
                sequence = self.next_sequence
                self.next_sequence += 1
                self._writer.write(self._requests.request(self._correlation_id, self._batches.batch(sequence)))
                sent.put_nowait((self._correlation_id, sequence))
                if self._writer.transport.get_write_buffer_size() > 1 << 16:
                    await self._writer.drain()
            await reader_task
        finally:
            reader_task.cancel()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass


async def load_partition(host: str, port: int, topic: str, partition: int, entries: int, connections: int = 8,
                         window: int = 5, producers: list[PipelinedProducer] | None = None) -> LoadResult:
    """Write `entries` single-record batches spread over `connections` producers (new ones unless given, in which
    case they continue their sequences). Returns when every batch is acknowledged."""
    own = producers is None
    if own:
        producers = [PipelinedProducer(host, port, topic, partition, window) for _ in range(connections)]
        await asyncio.gather(*(p.connect() for p in producers))
    start = time.perf_counter()
    share, extra = divmod(entries, len(producers))
    try:
        await asyncio.gather(*(p.produce(share + (1 if i < extra else 0)) for i, p in enumerate(producers)))
    finally:
        if own:
            await asyncio.gather(*(p.close() for p in producers))
    return LoadResult(entries, time.perf_counter() - start, len(producers))
