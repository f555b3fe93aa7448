"""Topic listing, stats and internal stats, on Pulsar's REST paths, and the last stored sequence id of a name.

`GET /admin/v2/persistent/{tenant}/{namespace}` lists partitions as Pulsar does (`...-partition-N`);
`.../partitioned` lists the Kafka topics themselves. Stats and internal stats take a topic (all its partitions) or a
partition name `T-partition-N` (that partition alone). `GET .../{topic}/sequences?producer=NAME` answers the highest
`kop.sequence.id` stored for the producer name on each partition, null where it is not known (Pulsar's
getLastSequenceId, per partition), and 503 while a partition's deduplication state is being recovered.
"""
from typing import TYPE_CHECKING

from kop.admin import views
from kop.admin.http import HttpError, Request, Response, json_response
from kop.admin.parsing import check_namespace, find_topic
from kop.admin.router import AdminRouter
from kop.partition import DedupRecovering

if TYPE_CHECKING:
    from kop.broker import Broker

NAMESPACE = "/admin/v2/persistent/{tenant}/{namespace}"
TOPIC = f"{NAMESPACE}/{{topic}}"


class TopicRoutes:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def register(self, router: AdminRouter) -> None:
        router.add("GET", NAMESPACE, self.list_partitions)
        router.add("GET", f"{NAMESPACE}/partitioned", self.list_topics)
        router.add("GET", f"{TOPIC}/stats", self.stats)
        router.add("GET", f"{TOPIC}/internalStats", self.internal_stats)
        router.add("GET", f"{TOPIC}/sequences", self.last_sequence_ids)

    def _topics(self) -> list:
        return sorted(self.broker.topics.topics.values(), key=lambda t: t.name)

    async def list_partitions(self, request: Request, tenant: str, namespace: str) -> Response:
        ns = check_namespace(self.broker, tenant, namespace)
        return json_response([views.partition_topic_name(ns, t.name, p.partition)
                              for t in self._topics() for p in t.partitions])

    async def list_topics(self, request: Request, tenant: str, namespace: str) -> Response:
        ns = check_namespace(self.broker, tenant, namespace)
        return json_response([views.topic_name(ns, t.name) for t in self._topics()])

    async def stats(self, request: Request, tenant: str, namespace: str, topic: str) -> Response:
        ref = find_topic(self.broker, tenant, namespace, topic, partition_names=True)
        replication = self._replication
        groups = views.GroupView(self.broker.groups.committed_on, self.broker.groups.offsets.replicated)
        if ref.single_partition:
            return json_response(self._with_snapshots(views.partition_stats(ref.partitions[0], replication, groups),
                                                      ref.partitions[0]))
        stats = views.topic_stats(ref.namespace, ref.topic, ref.partitions, replication, groups)
        for partition in ref.partitions:
            self._with_snapshots(stats["partitions"][views.partition_topic_name(ref.namespace, ref.topic,
                                                                                partition.partition)], partition)
        return json_response(stats)

    def _with_snapshots(self, stats: dict, partition) -> dict:
        """The partition's PIP-33 snapshot controller, where it replicates."""
        controller = self.broker.replication.controller_of(partition)
        if controller is not None:
            stats["replicatedSubscriptionSnapshots"] = controller.to_json()
        return stats

    def _replication(self, partition) -> dict:
        return {remote: replicator.to_json()
                for remote, replicator in sorted(self.broker.replication.replicators_of(partition).items())}

    async def internal_stats(self, request: Request, tenant: str, namespace: str, topic: str) -> Response:
        ref = find_topic(self.broker, tenant, namespace, topic, partition_names=True)
        if ref.single_partition:
            return json_response(views.partition_internal_stats(ref.partitions[0]))
        return json_response(views.topic_internal_stats(ref.namespace, ref.topic, ref.partitions))

    async def last_sequence_ids(self, request: Request, tenant: str, namespace: str, topic: str) -> Response:
        producer = request.query.get("producer")
        if not producer:
            raise HttpError(400, "query parameter producer (the kop.producer.name) is required")
        ref = find_topic(self.broker, tenant, namespace, topic, partition_names=True)
        try:
            last = {str(p.partition): p.last_sequence_id(producer) for p in ref.partitions}
        except DedupRecovering as exc:
            raise HttpError(503, f"{exc}; retry") from None
        return json_response({"producer": producer, "partitions": last})
