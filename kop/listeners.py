"""Where kop listens, as written by users: `HOST:PORT` (`--listen`) and Kafka's listener lists
(`listeners`, `advertised.listeners`: `PROTOCOL://HOST:PORT,...`).

kop serves one listener, over the protocols in SERVED_PROTOCOLS. A list it cannot serve as written (several
listeners, an unsupported protocol) is refused with the reason, never served differently from what it says.
"""
import re
from dataclasses import dataclass

SERVED_PROTOCOLS = frozenset({"PLAINTEXT"})
KAFKA_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
EVERY_INTERFACE = "0.0.0.0"  # what Kafka's empty listener host means

_LISTENER = re.compile(r"(?P<name>[A-Za-z0-9_]+)://(?P<address>.*)")


@dataclass(frozen=True)
class Listener:
    protocol: str
    host: str  # "" when the listener leaves it out
    port: int


def split_host_port(value: str) -> tuple[str, int]:
    """`host:port`, `[v6 address]:port`, `v6:address:port` or `:port` (host "")."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def parse_listener(value: str) -> Listener:
    """Kafka's listener syntax for the one listener kop serves (several are refused, as they would not be served)."""
    written = [part.strip() for part in value.split(",") if part.strip()]
    if len(written) != 1:
        raise ValueError(f"kop serves one listener, got {len(written)}")
    match = _LISTENER.fullmatch(written[0])
    if match is None:
        raise ValueError(f"expected PROTOCOL://HOST:PORT, got {written[0]!r}")
    protocol = match["name"].upper()
    served = ", ".join(sorted(SERVED_PROTOCOLS))
    if protocol in KAFKA_PROTOCOLS - SERVED_PROTOCOLS:
        raise ValueError(f"{protocol} listeners are not supported yet: kop serves {served}")
    if protocol not in SERVED_PROTOCOLS:  # a name listener.security.protocol.map would define
        raise ValueError(f"listener name {protocol}: kop serves {served} listeners named after their protocol "
                         f"(listener.security.protocol.map is not read)")
    host, port = split_host_port(match["address"])
    return Listener(protocol, host, port)
