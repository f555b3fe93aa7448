"""Where kop listens, as written by users: `HOST:PORT` (`--listen`) and Kafka's listener lists (`listeners`,
`advertised.listeners`: `NAME://HOST:PORT,...`, with `listener.security.protocol.map` giving each name its security
protocol, `NAME:PROTOCOL,...`; a name absent from the map must be a protocol's own name, as in Kafka).

The first listener's address is the broker's `host` and `port` (so `--listen` moves it); the others keep theirs.
"""
import re
from dataclasses import dataclass

PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
EVERY_INTERFACE = "0.0.0.0"  # what Kafka's empty listener host means

_LISTENER = re.compile(r"(?P<name>[A-Za-z0-9_]+)://(?P<address>.*)")


@dataclass(frozen=True)
class Listener:
    name: str  # upper case, as Kafka compares names
    host: str  # "" when the listener leaves it out
    port: int


@dataclass(frozen=True)
class ListenerSpec:
    """One socket the broker serves: its name, security protocol, where it binds and what clients are told."""

    name: str
    protocol: str
    host: str
    port: int
    advertised_host: str
    advertised_port: int  # 0: the port bound

    @property
    def tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS

    @property
    def sasl(self) -> bool:
        return self.protocol in SASL_PROTOCOLS


def split_host_port(value: str) -> tuple[str, int]:
    """`host:port`, `[v6 address]:port`, `v6:address:port` or `:port` (host "")."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def parse_listeners(value: str) -> list[Listener]:
    """Kafka's listener list; names must be distinct."""
    written = [part.strip() for part in value.split(",") if part.strip()]
    if not written:
        raise ValueError("no listener given")
    listeners = []
    for text in written:
        match = _LISTENER.fullmatch(text)
        if match is None:
            raise ValueError(f"expected NAME://HOST:PORT, got {text!r}")
        host, port = split_host_port(match["address"])
        listeners.append(Listener(match["name"].upper(), host, port))
    names = [listener.name for listener in listeners]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"listener name {name} appears twice")
    return listeners


def parse_protocol_map(value: str) -> dict[str, str]:
    """`NAME:PROTOCOL,...`, over Kafka's default map (each protocol's own name stands for it)."""
    protocols = {protocol: protocol for protocol in PROTOCOLS}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        name, sep, protocol = (s.strip().upper() for s in part.partition(":"))
        if not sep or not name:
            raise ValueError(f"expected NAME:PROTOCOL, got {part!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"listener {name}: unknown security protocol {protocol!r} "
                             f"(one of {', '.join(sorted(PROTOCOLS))})")
        protocols[name] = protocol
    return protocols


def resolve_listeners(listeners: str, advertised: str, protocol_map: str, host: str, port: int,
                      advertised_host: str, advertised_port: int) -> list[ListenerSpec]:
    """The sockets to serve. `listeners` empty: one PLAINTEXT listener at host:port. The first listener binds at
    host:port and is advertised as advertised_host:advertised_port unless `advertised` names it."""
    protocols = parse_protocol_map(protocol_map)
    written = parse_listeners(listeners) if listeners else [Listener("PLAINTEXT", host, port)]
    told = {listener.name: listener for listener in parse_listeners(advertised)} if advertised else {}
    for name in told:
        if name not in {listener.name for listener in written}:
            raise ValueError(f"advertised listener {name} is not in listeners")
    specs = []
    for index, listener in enumerate(written):
        if listener.name not in protocols:
            raise ValueError(f"listener name {listener.name} has no security protocol: add it to "
                             f"listener.security.protocol.map")
        bind_host, bind_port = (host, port) if index == 0 else (listener.host or EVERY_INTERFACE, listener.port)
        if listener.name in told:
            shown_host, shown_port = told[listener.name].host, told[listener.name].port
        elif index == 0:
            shown_host, shown_port = advertised_host, advertised_port
        else:
            shown_host, shown_port = "", 0
        if not shown_host and bind_host in ("0.0.0.0", "::") and index > 0:
            raise ValueError(f"listener {listener.name} listens on every interface: name the address clients "
                             f"connect to in advertised.listeners")
        specs.append(ListenerSpec(listener.name, protocols[listener.name], bind_host, bind_port,
                                  shown_host or bind_host, shown_port))
    ports = [spec.port for spec in specs if spec.port]
    if len(set(ports)) != len(ports):
        raise ValueError("two listeners on one port")
    return specs
