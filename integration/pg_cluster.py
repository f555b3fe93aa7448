"""Several real `kop standalone` processes on one PostgreSQL database, and how a test asks them who leads what.

Leases are short here (3 s, renewed every 0.5 s) so that a dead broker's partitions move within seconds."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse

from integration.broker_process import BrokerProcess
from integration.fault_proxy import CutPolicy, FaultProxy
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

from integration.idem_raw import LATEST, LIST_OFFSETS_VERSION, RawKafka, StoredRecord
from integration.waiting import wait_for
from protocol.errors import ErrorCode

LEASE = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
METADATA_VERSION = 9


def metadata(port: int, topic: str | None = None):
    with RawKafka(port, timeout=5) as kafka:
        request = MetadataRequest[METADATA_VERSION](
            topics=None if topic is None else [MetadataRequest.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False)
        return kafka.call(request, MetadataResponse, METADATA_VERSION)


def leaders(port: int, topic: str) -> dict[int, int]:
    """partition -> leader node id, as the broker on `port` tells it."""
    answer = metadata(port, topic)
    return {p.partition_index: p.leader_id for p in answer.topics[0].partitions}


def answering(port: int, topic: str, partitions: Iterable[int]) -> set[int]:
    """The partitions the broker on `port` serves now (it answers ListOffsets for them), in one request."""
    with RawKafka(port, timeout=10) as kafka:
        request = ListOffsetsRequest[LIST_OFFSETS_VERSION](replica_id=-1, isolation_level=0, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1,
                                                                         timestamp=LATEST) for p in partitions])])
        answer = kafka.call(request, ListOffsetsResponse, LIST_OFFSETS_VERSION)
    return {p.partition_index for t in answer.topics for p in t.partitions if p.error_code == ErrorCode.NONE}


def coordinator(port: int, group: str) -> int:
    """The node id the broker on `port` names as the group's coordinator (-1: none now)."""
    with RawKafka(port, timeout=5) as kafka:
        answer = kafka.call(FindCoordinatorRequest[1](key=group, key_type=0), FindCoordinatorResponse, 1)
    return answer.node_id if answer.error_code == ErrorCode.NONE else -1


@dataclass
class PgCluster:
    root: str
    url: str
    cuts: CutPolicy | None = None  # clients go through a proxy per broker that cuts connections so
    brokers: dict[int, BrokerProcess] = field(default_factory=dict)  # node id -> its process
    proxies: dict[int, FaultProxy] = field(default_factory=dict)  # node id -> its proxy (with `cuts`)
    paused: set[int] = field(default_factory=set)

    def start(self, count: int, config: dict[str, str] | None = None) -> PgCluster:
        for node in range(1, count + 1):
            self.add(node, config)
        self.wait_for_members(set(self.brokers))
        return self

    def add(self, node: int, config: dict[str, str] | None = None, port: int = 0) -> BrokerProcess:
        """Start broker `node` (it joins the running ones), on `port` (0: a free one). With `cuts`, clients reach it
        through a FaultProxy of its own, which it advertises (tests still reach it directly on `port(node)`)."""
        config = {"node.id": str(node), **LEASE, **(config or {})}
        proxy = None
        if self.cuts is not None:
            proxy = self.proxies[node] = FaultProxy(policy=self.cuts).start()
            config["advertised.port"] = str(proxy.port)
        proc = BrokerProcess(os.path.join(self.root, f"node{node}"), port=port, config=config,
                             options=("--storage", self.url), admin_port=0)
        self.brokers[node] = proc.start()
        if proxy is not None:
            proxy.upstream_port = proc.port  # kept across restarts: the broker listens on the same port again
        return proc

    def wait_for_members(self, nodes: set[int], timeout: float = 30.0) -> None:
        """Until every running broker in `nodes` lists exactly `nodes` as the live brokers."""
        def agreed() -> bool:
            return all({b.node_id for b in metadata(self.brokers[n].port).brokers} == nodes for n in nodes)
        wait_for(agreed, f"brokers {sorted(nodes)} to see each other", timeout)

    def port(self, node: int) -> int:
        return self.brokers[node].port

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def running(self) -> list[int]:
        return [n for n, b in self.brokers.items() if b.proc is not None and b.proc.poll() is None
                and n not in self.paused]

    def leaders(self, topic: str, asking: int | None = None) -> dict[int, int]:
        return leaders(self.port(asking if asking is not None else self.running()[0]), topic)

    def pause(self, node: int) -> None:
        os.kill(self.brokers[node].proc.pid, signal.SIGSTOP)
        self.paused.add(node)

    def resume(self, node: int) -> None:
        os.kill(self.brokers[node].proc.pid, signal.SIGCONT)
        self.paused.discard(node)

    def serving(self, topic: str, partition: int) -> int | None:
        """The running broker that answers ListOffsets for the partition (it has the partition open), if any."""
        return next((node for node in self.running() if answering(self.port(node), topic, [partition])), None)

    def read(self, topic: str, partitions: range) -> list[StoredRecord]:
        """Everything stored in the partitions, each read from the broker that owns it now."""
        out = []
        for p in partitions:
            node = wait_for(lambda: self.serving(topic, p), f"a broker serving {topic}-{p}")
            with RawKafka(self.port(node)) as kafka:
                out.extend(kafka.read_partition(topic, p))
        return out

    def stop(self) -> None:
        for node in list(self.paused):
            self.resume(node)
        for proc in self.brokers.values():
            proc.stop()
        for proxy in self.proxies.values():
            proxy.stop()
