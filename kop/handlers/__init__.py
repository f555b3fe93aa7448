"""One module per API area, each declaring ROUTES = [(api_key, min_version, max_version, handler)]."""
from kop.handlers import (api_versions, cluster, fetch, find_coordinator, groups, init_producer_id, list_offsets,
                          metadata, offsets, produce, replicas, topics_admin)
from kop.handlers.registry import Router

HANDLER_MODULES = [api_versions, metadata, produce, fetch, list_offsets, topics_admin, cluster, init_producer_id,
                   find_coordinator, groups, offsets, replicas]


def build_router() -> Router:
    router = Router()
    for module in HANDLER_MODULES:
        router.add_module(module)
    return router
