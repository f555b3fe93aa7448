"""The `--config` properties file: `key=value` lines (`#` or `!` comments) onto BrokerConfig fields.

A key is a field's name (with dots or underscores), one of the Kafka or Pulsar keys the field declares
(kop/config.py), or one of Kafka's keys in KAFKA_KEYS, which set several fields or convert units. When several keys
set one field, Kafka's precedence decides (log.retention.ms over .minutes over .hours, log.dirs over log.dir); keys
of equal standing must agree. A repeated key takes its last value, as Java properties do, so a line appended to
override another works. A key kop does not know is returned for a warning, with the nearest known key when one is
close (a typo), and ignored: configs copied from Kafka or Pulsar carry many keys kop does not implement.
"""
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from kop.config import BrokerConfig, check_setting, parse_integer, parse_setting
from kop.security.listeners import EVERY_INTERFACE, parse_listeners

# A typo is close to a known key in letters (difflib's ratio) and in length: Kafka's and Pulsar's own keys that extend
# a known one (queued.max.requests, webServicePortTls) differ more in length and get no suggestion.
SUGGESTION_CUTOFF = 0.8
SUGGESTION_MAX_LENGTH_DIFFERENCE = 2


@dataclass(frozen=True)
class Key:
    parse: Callable[[str], dict[str, Any]]  # the written value -> the checked values of the fields it sets
    rank: int = 0  # Kafka's precedence among keys that set the same field: the higher one wins
    doc: str = ""  # what it sets, for docs/operations.md (the keys of KAFKA_KEYS)


def _field(name: str) -> Key:
    return Key(lambda raw: {name: parse_setting(name, raw)})


def _checked(values: dict[str, Any]) -> dict[str, Any]:
    for name, value in values.items():
        check_setting(name, value)
    return values


def _in_units(name: str, millis_per_unit: int, rank: int, doc: str) -> Key:
    def parse(raw: str) -> dict[str, Any]:
        count = parse_integer(raw)
        return _checked({name: count * millis_per_unit if count >= 0 else count})  # -1 stays "no limit"
    return Key(parse, rank, doc)


def _listener(list_field: str, host_field: str, port_field: str, empty_host: str, doc: str) -> Key:
    """The whole list, and the first listener's address in the fields `--listen` and `--advertised-*` also set."""
    def parse(raw: str) -> dict[str, Any]:
        first = parse_listeners(raw)[0]
        return _checked({list_field: raw.strip(), host_field: first.host or empty_host, port_field: first.port})
    return Key(parse, doc=doc)


def _log_dirs(rank: int, doc: str) -> Key:
    def parse(raw: str) -> dict[str, Any]:
        dirs = [d.strip() for d in raw.split(",") if d.strip()]
        if len(dirs) != 1:
            raise ValueError(f"kop keeps its data in one directory, got {len(dirs)}")
        return _checked({"data_dir": dirs[0]})
    return Key(parse, rank, doc)


_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')


def _jaas(rank: int, doc: str) -> Key:
    """A JAAS login module entry (`<class> required username="..." password="...";`): its username and password
    are this broker's own credentials for the requests it sends the others; an entry without them sets nothing."""
    def parse(raw: str) -> dict[str, Any]:
        options = {name: re.sub(r"\\(.)", r"\1", value[1:-1]) if value.startswith('"') else value
                   for name, value in _JAAS_OPTION.findall(raw)}
        if "username" not in options or "password" not in options:
            return {}
        return _checked({"inter_broker_sasl_username": options["username"],
                         "inter_broker_sasl_password": options["password"]})
    return Key(parse, rank, doc)


# Kafka's per-listener, per-mechanism JAAS entry: listener.name.<listener>.<mechanism>.sasl.jaas.config
LISTENER_JAAS = re.compile(r"listener\.name\.[^.]+\.[^.]+\.sasl\.jaas\.config", re.IGNORECASE)
LISTENER_JAAS_KEY = _jaas(1, "a listener's JAAS entry: its username and password set `inter.broker.sasl.username` "
                             "and `inter.broker.sasl.password` (over `sasl.jaas.config`'s)")

KAFKA_KEYS = {
    "sasl.jaas.config": _jaas(0, "a JAAS entry: its username and password set `inter.broker.sasl.username` and "
                                 "`inter.broker.sasl.password`"),
    # Kafka binds every interface for an empty host
    "listeners": _listener("listeners", "host", "port", EVERY_INTERFACE,
                           "`NAME://HOST:PORT,...`: the listeners; the first one's address sets `host` and `port` "
                           "(an empty host is every interface, as in Kafka)"),
    "advertised.listeners": _listener("advertised_listeners", "advertised_host", "advertised_port", "",
                                      "`NAME://HOST:PORT,...`: what clients are told per listener; the first one's "
                                      "address sets `advertised.host` and `advertised.port`"),
    "log.dirs": _log_dirs(0, "one directory: sets `data.dir` (wins over `log.dir`)"),
    "log.dir": _log_dirs(-1, "one directory: sets `data.dir`"),
    "log.retention.minutes": _in_units("retention_ms", 60_000, -1,
                                       "sets `log.retention.ms` (which wins over it); -1: no limit"),
    "log.retention.hours": _in_units("retention_ms", 3_600_000, -2,
                                     "sets `log.retention.ms` (`.ms` and `.minutes` win over it); -1: no limit"),
    "log.roll.hours": _in_units("ledger_max_age_ms", 3_600_000, -2, "sets `log.roll.ms` (which wins over it)"),
}

KEYS: dict[str, Key] = {
    **{key: _field(f.name) for f in fields(BrokerConfig) for key in (f.name.replace("_", "."), *f.metadata["keys"])},
    **KAFKA_KEYS,
}


@dataclass(frozen=True)
class Properties:
    values: dict[str, Any]  # BrokerConfig field -> checked value
    unknown: dict[str, str | None]  # a key kop does not know -> the nearest known key, when one is close


@dataclass(frozen=True)
class _Assignment:
    value: Any
    key: str
    raw: str
    lineno: int
    rank: int


def read_properties(path: str) -> Properties:
    """Raises ValueError naming the file, line and key of the first value kop cannot run with."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"config file {path} is not UTF-8 text") from None
    assigned: dict[str, _Assignment] = {}
    unknown: dict[str, str | None] = {}
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, raw = (part.strip() for part in line.partition("="))
        if not sep or not key:
            raise ValueError(f"{path}:{lineno}: expected key=value, got {line!r}")
        spec = KEYS.get(key) or KEYS.get(key.replace("_", ".")) or (LISTENER_JAAS_KEY if LISTENER_JAAS.fullmatch(key)
                                                                     else None)
        if spec is None:
            unknown[key] = nearest_key(key)
            continue
        try:
            values = spec.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: {key}={raw}: {exc}") from None
        for name, value in values.items():
            _assign(assigned, name, _Assignment(value, key, raw, lineno, spec.rank), path)
    return Properties({name: a.value for name, a in assigned.items()}, unknown)


def _assign(assigned: dict[str, _Assignment], name: str, new: _Assignment, path: str) -> None:
    old = assigned.get(name)
    if old is None or old.key == new.key or old.rank < new.rank:
        assigned[name] = new
    elif old.rank == new.rank and old.value != new.value:
        raise ValueError(f"{path}:{new.lineno}: {new.key}={new.raw} contradicts line {old.lineno}: "
                         f"{old.key}={old.raw}")


def nearest_key(key: str) -> str | None:
    by_lower = {known.lower(): known for known in KEYS}
    for close in difflib.get_close_matches(key.lower(), by_lower, n=3, cutoff=SUGGESTION_CUTOFF):
        if abs(len(close) - len(key)) <= SUGGESTION_MAX_LENGTH_DIFFERENCE:
            return by_lower[close]
    return None


def unknown_key_warnings(path: str, properties: Properties) -> list[str]:
    return [f"{path}: unknown key {key} is ignored" + (f"; did you mean {near}?" if near else "")
            for key, near in sorted(properties.unknown.items())]
