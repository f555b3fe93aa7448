"""The Kafka API router: API key -> handler, each registered with the version range it serves. ApiVersions is
derived from what is registered, so the broker never advertises an API it does not serve."""
import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any, NamedTuple, TypeAlias

from kafka.protocol.api_message import ApiMessage

from kop.handlers.context import RequestContext
from protocol.api import PreEncoded

Response: TypeAlias = ApiMessage | PreEncoded


class Deferred(NamedTuple):
    """A response built once `future` is done, by `build()`: what a handler answers when an awaitable of the
    response would cost a future (or a task) more per request than the one it waits for (Produce)."""

    future: asyncio.Future
    build: Callable[[], Response]


# A handler's ordered phase (a coroutine, or a plain function when it never waits) returns the response, or an
# awaitable of it (or a Deferred one) for what must wait (durability, a long-poll fetch, a rebalance), or None when no
# response is sent (acks=0). The request is the API's decoded message.
Answer: TypeAlias = Response | Awaitable[Response | None] | Deferred | None
Handler = Callable[[RequestContext, Any], Awaitable[Answer] | Answer]


@dataclass(frozen=True)
class Route:
    api_key: int
    min_version: int
    max_version: int
    handler: Handler
    # A coroutine handler's ordered phase runs as a task; a plain function (Produce) runs inline, with no task.
    is_async: bool = True


class ApiRouter:
    def __init__(self) -> None:
        self.routes: dict[int, Route] = {}
        self._versions: dict[int, tuple[int, int]] = {}
        self._versions_view = MappingProxyType(self._versions)  # read for every request: one view, kept

    def add(self, api_key: int, min_version: int, max_version: int, handler: Handler) -> None:
        if api_key in self.routes:
            raise ValueError(f"api key {api_key} is already routed")
        self.routes[api_key] = Route(api_key, min_version, max_version, handler,
                                     inspect.iscoroutinefunction(handler))
        self._versions[api_key] = (min_version, max_version)

    def add_module(self, module: ModuleType) -> None:
        """A handler module declares ROUTES = [(api_key, min_version, max_version, handler), ...]."""
        for api_key, low, high, handler in module.ROUTES:
            self.add(api_key, low, high, handler)

    @property
    def versions(self) -> Mapping[int, tuple[int, int]]:
        return self._versions_view
