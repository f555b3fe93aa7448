"""PIP-33 in a cluster of brokers: a partition's owner reaches the replicated groups that other brokers coordinate
(kop/replication/group_positions.py says why), through kop/cluster/peers.py.

- ReplicatedGroupOffsets (kop's own request) to every other live broker, once per snapshot period: the committed
  offsets of the replicated groups it coordinates on the partitions this broker owns;
- MoveReplicatedGroup (kop's own request) to a group's coordinator: where the group is, and the move an UPDATE
  asks for."""
import asyncio
import logging
from collections.abc import Callable

from kop.cluster import groups
from kop.cluster.membership import Member
from kop.cluster.peers import PeerUnreachable, Peers
from kop.replication.group_positions import GroupPosition, Seen, Wanted
from protocol.errors import ErrorCode
from protocol.replicated_groups import (MoveReplicatedGroupRequest, MoveReplicatedGroupResponse,
                                        ReplicatedGroupOffsetsRequest, ReplicatedGroupOffsetsResponse)

log = logging.getLogger(__name__)


class ViaCoordinators:
    """kop/replication/group_positions.py's Coordinators over the peer connections."""

    def __init__(self, peers: Peers, me: int, members: Callable[[], list[Member]], leader: Callable[[str, int], int],
                 fresh: Callable[[], bool]) -> None:
        self._peers = peers
        self._me = me
        self._members = members
        self._leader = leader
        self._fresh = fresh

    async def offsets_on(self, wanted: Wanted, previous: dict[int, Seen]) -> dict[int, Seen]:
        Topic = ReplicatedGroupOffsetsRequest.ReplicatedGroupOffsetsTopic
        request = ReplicatedGroupOffsetsRequest[0](topics=[
            Topic(name=topic, every_group=every, partitions=partitions)
            for topic, (every, partitions) in sorted(wanted.items())])
        nodes = [m.node_id for m in self._members() if m.node_id != self._me]
        answers = await asyncio.gather(*(self._offsets_of(node, request) for node in nodes))
        found = {}
        for node, answer in zip(nodes, answers):
            if answer is not None:
                found[node] = answer
            elif node in previous:  # durable offsets, only older: they still let a group pass a snapshot
                found[node] = previous[node]
        return found

    async def _offsets_of(self, node: int, request: ReplicatedGroupOffsetsRequest) -> Seen | None:
        try:
            answer = await self._peers.call(node, request, ReplicatedGroupOffsetsResponse)
        except PeerUnreachable as exc:
            log.debug("replicated groups of broker %d not read: %s", node, exc)
            return None
        if answer.error_code:
            log.debug("replicated groups of broker %d not read: %s", node, ErrorCode(answer.error_code).name)
            return None
        return {(t.name, p.partition_index): {g.group_id: g.committed_offset for g in p.groups}
                for t in answer.topics for p in t.partitions}

    async def move(self, group: str, topic: str, partition: int, offset: int | None,
                   expected: int | None) -> GroupPosition:
        node = self._leader(groups.SHARD_TOPIC, groups.shard_of(group))
        if not self._fresh() or node in (self._me, -1):  # a view too old to route by, or this broker's own
            return GroupPosition(ErrorCode.NOT_COORDINATOR)
        request = MoveReplicatedGroupRequest[0](group_id=group, topic=topic, partition_index=partition,
                                                offset=-1 if offset is None else offset,
                                                expected_offset=-1 if expected is None else expected)
        try:
            answer = await self._peers.call(node, request, MoveReplicatedGroupResponse)
        except PeerUnreachable as exc:
            log.debug("group %s not reached at broker %d: %s", group, node, exc)
            return GroupPosition(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return GroupPosition(ErrorCode(answer.error_code),
                             None if answer.committed_offset < 0 else answer.committed_offset, answer.moved)
