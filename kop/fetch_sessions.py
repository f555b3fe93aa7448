"""Fetch sessions (KIP-227): the broker remembers, per session, the partitions a consumer fetches and what it last
told it about each, so the consumer's next ("incremental") Fetch names only the partitions whose position changed
and the answer carries only the partitions with something new. A consumer of thousands of idle partitions then
costs a loop over them instead of decoding, building and encoding thousands of entries per poll.

The rules are Kafka's (its FetchSession and FetchManager):
- A Fetch carries (session id, epoch). Epoch 0 is a full fetch that asks for a new session (closing the one named,
  if any); epoch -1 is a full fetch without a session (closing the one named): librdkafka always sends (0, -1).
  Any other epoch is an incremental fetch of the named session, which must be the epoch the broker expects next:
  else FETCH_SESSION_ID_NOT_FOUND (no such session) or INVALID_FETCH_SESSION_EPOCH. A session made by a request
  naming topics by id (v13+) serves only such requests, and the other way round (FETCH_SESSION_TOPIC_ID_ERROR).
- An incremental fetch adds or updates the partitions it names, drops the forgotten ones, and reads every partition
  of the session; its answer holds a partition only if it has records, its high watermark or log start offset
  changed since last told, or it has an error (and then is told again once the error clears). A partition that
  returned records moves to the end of the session's order, so a byte-limited answer serves partitions in turn. A
  session left with no partition is closed.
- The cache holds at most `max.incremental.fetch.session.cache.slots` sessions (0: none is made). When it is full, a
  new session may take the place of one unused for EVICTION_S, else of the smallest one that has lived longer than
  EVICTION_S and holds fewer partitions than the new one; otherwise the full fetch is answered without a session.
  Kafka's privileged sessions (a follower's) do not apply: kop has no followers.

This module keeps the sessions; kop/handlers/fetch.py reads the partitions and builds the answers."""
from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from protocol.errors import ErrorCode

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0  # a full fetch that asks for a session
FINAL_EPOCH = -1  # a full fetch that wants none
MAX_EPOCH = 0x7FFFFFFF
EVICTION_S = 120.0  # Kafka's fixed minimum idle time (and age) before a session may be evicted

TopicKey = str | bytes  # how a session names a topic: its name (Fetch v7-v12) or its 16-byte id (v13+)
PartitionKey = tuple[TopicKey, int]


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == MAX_EPOCH else epoch + 1


class RequestedPartition(Protocol):
    """A partition as a Fetch names it (kafka-python's FetchPartition), or as a session remembers it (Wanted)."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int


# The partitions to read, topic by topic, in the order they are answered.
Groups = list[tuple[TopicKey, Sequence[RequestedPartition]]]


@dataclass(slots=True)
class Wanted:
    """A partition a session holds: where the consumer is and what the session last told it (-1 before the first
    answer, and after an error)."""

    topic: TopicKey
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    high_watermark: int = -1
    log_start_offset: int = -1

    def must_answer(self, records: bool, error: int, high_watermark: int, log_start_offset: int) -> bool:
        """Whether an incremental answer includes this partition; remembers what it is told."""
        changed = high_watermark != self.high_watermark or log_start_offset != self.log_start_offset
        self.high_watermark = -1 if error else high_watermark
        self.log_start_offset = log_start_offset
        return records or changed or error != 0


@dataclass(eq=False, slots=True)
class FetchSession:
    id: int
    uses_topic_ids: bool
    created: float
    partitions: dict[PartitionKey, Wanted]  # in the order they are read and answered
    epoch: int = 1  # the epoch the next incremental fetch must carry
    last_used: float = 0.0
    cached_size: int = 0  # the size eviction judges by: as of the last use, as Kafka's cache keeps it
    _groups: Groups | None = None  # groups(), until the partitions or their order change

    def update(self, named: Groups, forgotten: Iterable[PartitionKey]) -> None:
        if named or forgotten:
            self._groups = None
        for topic, partitions in named:
            for p in partitions:
                cached = self.partitions.get((topic, p.partition))
                if cached is None:
                    self.partitions[(topic, p.partition)] = Wanted(topic, p.partition, p.fetch_offset,
                                                                   p.partition_max_bytes)
                else:
                    cached.fetch_offset, cached.partition_max_bytes = p.fetch_offset, p.partition_max_bytes
        for key in forgotten:
            self.partitions.pop(key, None)

    def groups(self) -> Groups:
        """Its partitions, topic by topic in its order (a topic recurs where its partitions are not together)."""
        if self._groups is not None:
            return self._groups
        groups: Groups = []
        self._groups = groups
        key: TopicKey | None = None
        parts: list[Wanted] = []
        for wanted in self.partitions.values():
            if wanted.topic != key:
                key, parts = wanted.topic, []
                groups.append((key, parts))
            parts.append(wanted)
        return groups

    def served_records(self, wanted: Wanted) -> None:
        """The partition returned records: it goes to the end of the order."""
        key = (wanted.topic, wanted.partition)
        self.partitions[key] = self.partitions.pop(key)
        self._groups = None


@dataclass(slots=True)
class CacheStats:
    created: int = 0
    evicted: int = 0
    incremental_fetches: int = 0
    full_fetches: int = 0
    errors: int = 0  # incremental fetches refused with a session error


class FetchSessionCache:
    """The broker's sessions, bounded by `slots`, with Kafka's eviction rules."""

    def __init__(self, slots: int, eviction_s: float = EVICTION_S, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.slots = slots
        self.eviction_s = eviction_s
        self.clock = clock
        self._rng = rng or random.Random()
        self.sessions: dict[int, FetchSession] = {}
        self._by_last_use: OrderedDict[int, FetchSession] = OrderedDict()  # least recently used first
        self._evictable: dict[int, FetchSession] = {}  # older than eviction_s when last used
        self.partitions = 0  # held by all sessions, as of each one's last use
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self._by_last_use.pop(session_id, None)
            self._evictable.pop(session_id, None)
            self.partitions -= session.cached_size
        return session

    def admits(self, size: int) -> bool:
        """Whether a new session of `size` partitions may be made: there is room, or a session was evicted for it
        (Kafka decides this before it builds the session's partitions)."""
        return len(self.sessions) < self.slots or self._evict_for(size, self.clock())

    def create(self, uses_topic_ids: bool, partitions: dict[PartitionKey, Wanted]) -> int:
        """A new session holding `partitions` when admitted; its id, else 0."""
        if not self.admits(len(partitions)):
            return INVALID_SESSION_ID
        return self.add(uses_topic_ids, partitions)

    def add(self, uses_topic_ids: bool, partitions: dict[PartitionKey, Wanted]) -> int:
        """A new session, once admitted; its id."""
        now = self.clock()
        session_id = self._new_id()
        session = FetchSession(session_id, uses_topic_ids, now, partitions, epoch=next_epoch(INITIAL_EPOCH))
        self.sessions[session_id] = session
        self.touch(session)
        self.stats.created += 1
        return session_id

    def touch(self, session: FetchSession) -> None:
        """The session was used now: it is the most recently used, and its size and age are taken again."""
        now = self.clock()
        session.last_used = now
        self._by_last_use[session.id] = session
        self._by_last_use.move_to_end(session.id)
        self.partitions += len(session.partitions) - session.cached_size
        session.cached_size = len(session.partitions)
        if now - session.created > self.eviction_s:
            self._evictable[session.id] = session

    def _evict_for(self, size: int, now: float) -> bool:
        """Kafka's rule: evict the least recently used session if it is stale, else the smallest evictable one
        if it is smaller than the newcomer (at equal size the one already there stays)."""
        if not self._by_last_use:
            return False
        oldest = next(iter(self._by_last_use.values()))
        if now - oldest.last_used > self.eviction_s:
            victim = oldest
        else:
            victim = min(self._evictable.values(), key=lambda s: (s.cached_size, s.id), default=None)
            if victim is None or size <= victim.cached_size:
                return False
        self.remove(victim.id)
        self.stats.evicted += 1
        return True

    def _new_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, MAX_EPOCH - 1)
            if session_id not in self.sessions:
                return session_id


@dataclass(slots=True)
class FetchPlan:
    """How one Fetch is served: what to read, and how its answer is made.

    kind: "sessionless" (answer everything, session id 0), "full" (answer everything, then make a session of it),
    "incremental" (answer what changed, in `session`), or "error" (answer `error` alone)."""

    kind: str
    groups: Groups
    session: FetchSession | None = None
    expected_epoch: int = 0  # for an incremental fetch: the session's epoch once this request is counted
    uses_topic_ids: bool = False
    error: int = ErrorCode.NONE

    @property
    def size(self) -> int:
        return sum(len(partitions) for _topic, partitions in self.groups)


def plan_fetch(cache: FetchSessionCache, session_id: int, epoch: int, uses_topic_ids: bool, named: Groups,
               forgotten: list[PartitionKey]) -> FetchPlan:
    """What a Fetch with session metadata (session_id, epoch) asks for: the request's partitions `named` (in its
    order) and its `forgotten` ones."""
    if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
        if session_id != INVALID_SESSION_ID:
            cache.remove(session_id)  # a full fetch closes the session it names
        cache.stats.full_fetches += 1
        kind = "full" if epoch == INITIAL_EPOCH else "sessionless"
        return FetchPlan(kind, named, uses_topic_ids=uses_topic_ids)
    session = cache.get(session_id)
    error = ErrorCode.NONE
    if session is None:
        error = ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    elif session.epoch != epoch:
        error = ErrorCode.INVALID_FETCH_SESSION_EPOCH
    elif session.uses_topic_ids != uses_topic_ids:
        error = ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    if error:
        cache.stats.errors += 1
        return FetchPlan("error", [], error=error)
    assert session is not None
    session.update(named, forgotten)
    if not session.partitions:
        cache.remove(session.id)
        return FetchPlan("sessionless", named, uses_topic_ids=uses_topic_ids)
    cache.touch(session)
    session.epoch = next_epoch(session.epoch)
    cache.stats.incremental_fetches += 1
    return FetchPlan("incremental", session.groups(), session, session.epoch, uses_topic_ids)


def outdated(plan: FetchPlan) -> bool:
    """An incremental fetch whose session moved on while it was read (the same epoch sent twice): Kafka answers it
    INVALID_FETCH_SESSION_EPOCH and leaves the session as it is."""
    return plan.kind == "incremental" and plan.session is not None and plan.session.epoch != plan.expected_epoch
