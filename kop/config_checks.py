"""The checks BrokerConfig's fields declare next to their defaults. Each is a small frozen callable that returns
quietly or raises ValueError saying what the field accepts."""
import ipaddress
import re
from dataclasses import dataclass

INT32_MAX = 2**31 - 1  # Kafka's int-typed settings
INT64_MAX = 2**63 - 1  # ... and its long-typed ones (milliseconds, bytes of a log)

# A DNS name (underscores allowed: container and compose service names carry them) or an IP address literal.
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?")
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


@dataclass(frozen=True)
class Range:
    low: int
    high: int = INT32_MAX
    unbounded: int | None = None  # a value below `low` that means "no limit" (Kafka's -1)

    def __call__(self, value: int) -> None:
        if value == self.unbounded or self.low <= value <= self.high:
            return
        if value > self.high:
            raise ValueError(f"must be at most {self.high}, got {value}")
        no_limit = f", or {self.unbounded} for no limit" if self.unbounded is not None else ""
        raise ValueError(f"must be at least {self.low}{no_limit}, got {value}")


@dataclass(frozen=True)
class HostName:
    empty_ok: bool = False  # "": fall back to another setting
    wildcard_ok: bool = True  # 0.0.0.0 and :: can be listened on, but a client cannot connect to them

    def __call__(self, value: str) -> None:
        if value == "" and self.empty_ok:
            return
        if value in WILDCARD_HOSTS and not self.wildcard_ok:
            raise ValueError(f"{value} means every interface: clients need an address they can connect to")
        if _HOST_NAME.fullmatch(value):
            return
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"not a host name or IP address: {value!r}") from None


@dataclass(frozen=True)
class Matches:
    pattern: str  # the whole value must match
    description: str

    def __call__(self, value: str) -> None:
        if not re.fullmatch(self.pattern, value):
            raise ValueError(f"must be {self.description}, got {value!r}")


@dataclass(frozen=True)
class OneOf:
    """One of a few words, in any case (as Kafka reads its enumerated settings)."""
    choices: tuple[str, ...]

    @property
    def description(self) -> str:
        return ", ".join(self.choices)

    def __call__(self, value: str) -> None:
        if value.strip().lower() not in self.choices:
            raise ValueError(f"must be one of {self.description}, got {value!r}")


@dataclass(frozen=True)
class ListOf:
    """A comma-separated list of at least one name, each one of `names` (or an alias that names one), no repeats."""
    names: tuple[str, ...]
    aliases: tuple[tuple[str, str], ...] = ()  # (alias, name)

    @property
    def description(self) -> str:
        return "a list of " + ", ".join(self.names)

    def parse(self, value: str) -> tuple[str, ...]:
        aliases = dict(self.aliases)
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not items:
            raise ValueError(f"must be {self.description}, got an empty list")
        out = []
        for item in items:
            name = aliases.get(item, item)
            if name not in self.names:
                raise ValueError(f"{item!r} is not one of {', '.join(self.names)}")
            if name in out:
                raise ValueError(f"{item!r} is listed twice")
            out.append(name)
        return tuple(out)

    def __call__(self, value: str) -> None:
        self.parse(value)
