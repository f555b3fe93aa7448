"""What a handler gets besides its request: the broker, the request header and the connection."""
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.api import RequestHeader

if TYPE_CHECKING:
    from kop.broker import Broker


@dataclass(frozen=True, slots=True)
class RequestContext:
    broker: "Broker"
    header: RequestHeader
    peer: str
    connection_id: int

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def client_id(self) -> str:
        return self.header.client_id or ""
