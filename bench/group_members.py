"""Live classic consumer groups over the raw Kafka protocol: one asyncio connection per group, whose one member
joins (JoinGroup v5, asking for a member id first as a modern client does), syncs its own assignment, commits an
offset under its generation and heartbeats until it leaves, with Kafka's consumer defaults (session 45 s, a heartbeat
every 3 s). A member the coordinator dropped (its session ran out on a loaded machine) joins again, as a consumer
does, and is counted.

`GroupLoad` runs them on an event loop in a thread of its own, so a benchmark can hold 1,000 groups live while its
main thread opens connections and reads the broker's memory.
"""
import asyncio
import struct
import threading
import time
from dataclasses import dataclass

from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES
from protocol.errors import ErrorCode

OFFSET_COMMIT, HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS = 8, 12, 11, 13, 14, 15
VERSIONS = {OFFSET_COMMIT: 8, HEARTBEAT: 4, JOIN_GROUP: 5, LEAVE_GROUP: 4, SYNC_GROUP: 5, DESCRIBE_GROUPS: 5}
CLIENT_ID = "kop-bench-member"
_I32 = struct.Struct(">i")


class GroupError(RuntimeError):
    def __init__(self, api: str, code: int) -> None:
        super().__init__(f"{api} answered error code {code}")
        self.code = code


REJOIN = {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.REBALANCE_IN_PROGRESS}


@dataclass
class MemberStats:
    heartbeats: int = 0
    rejoins: int = 0
    slowest_heartbeat_s: float = 0.0  # request to answer, as the member saw it


class GroupMember:
    """The one member of group `group_id`, on its own connection; one request in flight at a time."""

    def __init__(self, port: int, group_id: str, topic: str, session_ms: int, heartbeat_ms: int,
                 stats: MemberStats) -> None:
        self.port, self.group_id, self.topic, self.session_ms = port, group_id, topic, session_ms
        self.heartbeat_ms = heartbeat_ms
        self.stats = stats
        self.member_id = ""
        self.generation = -1
        self._correlation_id = 0
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def call(self, api_key: int, **fields):
        version = VERSIONS[api_key]
        request = REQUEST_CLASSES[api_key][version](**fields)
        async with self._lock:
            self._correlation_id += 1
            request.with_header(correlation_id=self._correlation_id, client_id=CLIENT_ID)
            self._writer.write(request.encode(header=True, framed=True))
            size = _I32.unpack(await self._reader.readexactly(4))[0]
            response = RESPONSE_CLASSES[api_key].decode(await self._reader.readexactly(size), version=version,
                                                        header=True)
        if response.header.correlation_id != self._correlation_id:
            raise ConnectionError(f"answer to {response.header.correlation_id}, expected {self._correlation_id}")
        return response

    async def join(self) -> None:
        """Connect, join (twice: the first JoinGroup only hands out the member id), sync and commit offset 1."""
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        await self._join_and_sync()

    async def _join_and_sync(self) -> None:
        Join = REQUEST_CLASSES[JOIN_GROUP][VERSIONS[JOIN_GROUP]]
        for _ in range(2):
            joined = await self.call(JOIN_GROUP, group_id=self.group_id, session_timeout_ms=self.session_ms,
                                     rebalance_timeout_ms=self.session_ms, member_id=self.member_id,
                                     group_instance_id=None, protocol_type="consumer",
                                     protocols=[Join.JoinGroupRequestProtocol(name="range", metadata=b"")])
            self.member_id = joined.member_id
            if joined.error_code != ErrorCode.MEMBER_ID_REQUIRED:
                break
        if joined.error_code != ErrorCode.NONE:
            raise GroupError("JoinGroup", joined.error_code)
        self.generation = joined.generation_id
        Sync = REQUEST_CLASSES[SYNC_GROUP][VERSIONS[SYNC_GROUP]]
        synced = await self.call(SYNC_GROUP, group_id=self.group_id, generation_id=self.generation,
                                 member_id=self.member_id, group_instance_id=None, protocol_type="consumer",
                                 protocol_name="range", assignments=[Sync.SyncGroupRequestAssignment(
                                     member_id=self.member_id, assignment=b"all")])
        if synced.error_code != ErrorCode.NONE:
            raise GroupError("SyncGroup", synced.error_code)
        await self.commit(1)

    async def commit(self, offset: int) -> None:
        Req = REQUEST_CLASSES[OFFSET_COMMIT][VERSIONS[OFFSET_COMMIT]]
        Part = Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition
        answer = await self.call(OFFSET_COMMIT, group_id=self.group_id, generation_id_or_member_epoch=self.generation,
                                 member_id=self.member_id, group_instance_id=None,
                                 topics=[Req.OffsetCommitRequestTopic(name=self.topic, partitions=[
                                     Part(partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                                          committed_metadata="")])])
        code = answer.topics[0].partitions[0].error_code
        if code != ErrorCode.NONE:
            raise GroupError("OffsetCommit", code)

    async def heartbeat_until(self, stop: asyncio.Event) -> None:
        """A heartbeat every `heartbeat_ms` until `stop`; dropped from the group, join it again."""
        while True:
            try:
                await asyncio.wait_for(stop.wait(), self.heartbeat_ms / 1000)
                return
            except asyncio.TimeoutError:
                pass
            sent = time.monotonic()
            answer = await self.call(HEARTBEAT, group_id=self.group_id, generation_id=self.generation,
                                     member_id=self.member_id, group_instance_id=None)
            self.stats.slowest_heartbeat_s = max(self.stats.slowest_heartbeat_s, time.monotonic() - sent)
            self.stats.heartbeats += 1
            if answer.error_code in REJOIN:
                self.stats.rejoins += 1
                if answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                await self._join_and_sync()
            elif answer.error_code != ErrorCode.NONE:
                raise GroupError("Heartbeat", answer.error_code)

    async def leave(self) -> None:
        Req = REQUEST_CLASSES[LEAVE_GROUP][VERSIONS[LEAVE_GROUP]]
        answer = await self.call(LEAVE_GROUP, group_id=self.group_id, members=[
            Req.MemberIdentity(member_id=self.member_id, group_instance_id=None)])
        if answer.error_code != ErrorCode.NONE:
            raise GroupError("LeaveGroup", answer.error_code)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class GroupLoad:
    """`count` groups named `prefix-0` ... with one live member each, on a thread's event loop. start() returns
    once every member has joined, synced and committed; stop() makes each leave its group and close."""

    def __init__(self, port: int, topic: str, count: int, session_ms: int = 45_000, heartbeat_ms: int = 3_000,
                 prefix: str = "bench-group", concurrency: int = 100) -> None:
        self.stats = MemberStats()
        self.members = [GroupMember(port, f"{prefix}-{i}", topic, session_ms, heartbeat_ms, self.stats)
                        for i in range(count)]
        self._concurrency = concurrency
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="group-load", daemon=True)
        self._stop: asyncio.Event | None = None
        self._heartbeats: list[asyncio.Task] = []

    @property
    def group_ids(self) -> list[str]:
        return [m.group_id for m in self.members]

    def start(self, timeout_s: float = 300.0) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout_s)

    async def _start(self) -> None:
        self._stop = asyncio.Event()
        gate = asyncio.Semaphore(self._concurrency)

        async def join(member: GroupMember) -> None:
            async with gate:
                await member.join()

        await asyncio.gather(*(join(m) for m in self.members))
        self._heartbeats = [asyncio.create_task(m.heartbeat_until(self._stop)) for m in self.members]

    def check(self) -> None:
        """Raise what a member's heartbeat loop failed with (an unexpected error code, a lost connection)."""
        for task in self._heartbeats:
            if task.done() and task.exception() is not None:
                raise task.exception()

    def stop(self, timeout_s: float = 300.0) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop_all(), self._loop).result(timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
            self._loop.close()

    async def _stop_all(self) -> None:
        self._stop.set()
        try:
            await asyncio.gather(*self._heartbeats)
            await asyncio.gather(*(m.leave() for m in self.members))
        finally:
            for m in self.members:
                m.close()
