"""Which broker configs AlterConfigs may set, at which level, and the checks a level's configs pass before they are
stored. Sans-IO: values in, checked values or a refusal out.

Kafka's rules (DynamicBrokerConfig, ConfigAdminManager): a key that cannot change at run time is refused with
INVALID_REQUEST ("Cannot update these configs dynamically"), as is a per-broker key set on the cluster-wide default
or a value the key does not accept; an APPEND or SUBTRACT on a key that is not a list is INVALID_CONFIG. The keys kop
changes at run time are the BrokerConfig fields whose update mode is not read-only (kop/config.py); a few of them are
static in Kafka, which kop applies at run time all the same (docs/compatibility.md names them).

Kafka's Kerberos (GSSAPI) keys are per-broker dynamic configs in Kafka. kop offers no GSSAPI, as a Kafka broker
without a GSSAPI listener does not, and like that broker it accepts them, stores them and reports them: there is
nothing in kop for them to change (STORED_ONLY).
"""
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kop.config import FIELDS, PER_BROKER, READ_ONLY, BrokerConfig, parse_integer, parse_setting, setting_key
from kop.config_checks import INT64_MAX, Range
from protocol.errors import ErrorCode


class BrokerConfigError(Exception):
    """A change of broker configs refused, with the Kafka error code its resource is answered with."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def refused(message: str) -> BrokerConfigError:
    return BrokerConfigError(ErrorCode.INVALID_REQUEST, message)


def setting_text(value: Any) -> str:
    """A value as a config is written: Kafka's spelling of booleans, integers in decimal."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# Kafka's key -> the BrokerConfig field it sets, for every field that may change at run time.
DYNAMIC_FIELDS: dict[str, str] = {setting_key(name): name for name, f in FIELDS.items()
                                  if f.metadata["update"] != READ_ONLY}


def _double(raw: str) -> str:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"not a number: {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {raw!r}")
    return repr(value)


def _long(raw: str) -> str:
    value = parse_integer(raw)
    Range(-(INT64_MAX + 1), INT64_MAX)(value)
    return str(value)


def _text(raw: str) -> str:
    return raw


@dataclass(frozen=True)
class StoredOnly:
    """A Kafka key kop accepts, stores and reports without anything acting on it."""

    kind: str  # Kafka's config type: STRING, LONG, DOUBLE, LIST
    canonical: Callable[[str], str]  # the written value -> as stored; ValueError if it is not one of the kind's
    default: str | None  # Kafka's default, reported as the DEFAULT_CONFIG synonym


STORED_ONLY: dict[str, StoredOnly] = {
    "sasl.kerberos.service.name": StoredOnly("STRING", _text, None),
    "sasl.kerberos.kinit.cmd": StoredOnly("STRING", _text, "/usr/bin/kinit"),
    "sasl.kerberos.ticket.renew.window.factor": StoredOnly("DOUBLE", _double, "0.8"),
    "sasl.kerberos.ticket.renew.jitter": StoredOnly("DOUBLE", _double, "0.05"),
    "sasl.kerberos.min.time.before.relogin": StoredOnly("LONG", _long, "60000"),
    "sasl.kerberos.principal.to.local.rules": StoredOnly("LIST", _text, "DEFAULT"),
}


def update_mode(key: str) -> str:
    """Kafka's update mode of a key: read-only, per-broker or cluster-wide (an unknown key is read-only)."""
    if key in STORED_ONLY:
        return PER_BROKER  # Kafka's listener configs
    name = DYNAMIC_FIELDS.get(key)
    return FIELDS[name].metadata["update"] if name is not None else READ_ONLY


def canonical(key: str, raw: str) -> str:
    """The value of a dynamic key as it is stored: checked as the properties file checks it, in one spelling."""
    stored_only = STORED_ONLY.get(key)
    if stored_only is not None:
        return stored_only.canonical(raw.strip())
    return setting_text(parse_setting(DYNAMIC_FIELDS[key], raw))


def check_level(configs: Mapping[str, str], per_broker: bool) -> dict[str, str]:
    """A level's configs as they are stored, or BrokerConfigError saying why they cannot be: keys that cannot change
    at run time, per-broker keys on the cluster-wide default, values a key does not accept."""
    static = sorted(key for key in configs if update_mode(key) == READ_ONLY)
    if static:  # Kafka's words; kop also refuses keys it does not know, which Kafka keeps for plugins
        raise refused(f"Cannot update these configs dynamically: {', '.join(static)}")
    if not per_broker:
        only_per_broker = sorted(key for key in configs if update_mode(key) == PER_BROKER)
        if only_per_broker:
            raise refused("Cannot update these configs at default cluster level, broker id must be specified: "
                          + ", ".join(only_per_broker))
    checked = {}
    for key, raw in configs.items():
        try:
            checked[key] = canonical(key, raw)
        except ValueError as exc:
            raise refused(f"Invalid value {raw} for configuration {key}: {exc}") from None
    return checked



def overlay(static: BrokerConfig, *levels: Mapping[str, str]) -> BrokerConfig:
    """The settings in force: the static ones with each level's dynamic values over them, later levels winning.
    ValueError when the result breaks a rule between settings (kop/config.py's RULES)."""
    values = {DYNAMIC_FIELDS[key]: parse_setting(DYNAMIC_FIELDS[key], text)
              for level in levels for key, text in level.items() if key in DYNAMIC_FIELDS}
    return replace(static, **values) if values else static

