"""One module per API area, each declaring ROUTES = [(api_key, min_version, max_version, handler)]."""
from kop.handlers import (acls, api_versions, client_quotas, configs, consumer_groups, describe_cluster,
                          describe_quorum, describe_topic_partitions, fetch, find_coordinator, groups,
                          init_producer_id, list_offsets, metadata, offsets, produce, replicas, replicated_groups,
                          replication, sasl, scram_users, topics_admin, transaction_admin, transactions)
from kop.handlers.registry import ApiRouter

HANDLER_MODULES = [api_versions, metadata, produce, fetch, list_offsets, topics_admin, configs, describe_cluster,
                   describe_quorum, describe_topic_partitions, init_producer_id, find_coordinator, groups,
                   consumer_groups, offsets, replicas, replication, replicated_groups, transactions, transaction_admin,
                   sasl, scram_users, acls, client_quotas]


def build_api_router() -> ApiRouter:
    router = ApiRouter()
    for module in HANDLER_MODULES:
        router.add_module(module)
    return router
