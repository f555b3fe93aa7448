"""Request decoding and response encoding on top of kafka-python's schema-driven message classes.

A frame is `[i32 size][request header][body]`. The header's api key and version pick the message class; its
flexible versions decide the header version (v2 with tagged fields) and the body encoding. Responses are built as
`Cls[version](...)` and encoded with their header and frame; kafka-python leaves tagged fields that hold their
default value out, which older librdkafka (Debian's kcat) needs.
"""
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import kafka.protocol.admin  # noqa: F401  (importing registers the message classes)
import kafka.protocol.consumer  # noqa: F401
import kafka.protocol.metadata  # noqa: F401
import kafka.protocol.producer  # noqa: F401
import protocol.consumer_groups  # noqa: F401  (KIP-848's APIs, which kafka-python lacks)
import protocol.replication  # noqa: F401  (kop's own API, registered the same way)
import protocol.txn_offsets  # noqa: F401  (kop's own, between the brokers of a cluster)
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.codecs import Bytes, String

from protocol.produce_request import MalformedRequest, ProduceRequest, decode_produce_request

_FIXED = struct.Struct(">hhih")  # api key, api version, correlation id, client id length


class ProtocolError(Exception):
    """The request cannot be understood; the connection is closed."""


class UnsupportedVersion(Exception):
    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"api key {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(slots=True)  # not frozen: built for every request, and a frozen dataclass's __init__ costs several times more
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def _primary_classes(kind: str) -> dict[int, type[ApiMessage]]:
    found: dict[int, type[ApiMessage]] = {}
    for cls in _all_subclasses(ApiMessage):
        if getattr(cls, "_class_version", None) is not None or getattr(cls, "_json", None) is None:
            continue
        if cls.type == kind:
            found.setdefault(cls.API_KEY, cls)
    return found


REQUEST_CLASSES = _primary_classes("request")
RESPONSE_CLASSES = _primary_classes("response")
# api key -> the first flexible version of its requests (a request header v2, with tagged fields), read per request
def _flexible_from(cls: type[ApiMessage]) -> int:
    versions = cls._flexible_versions  # (first, last), or (-1, -1) / None for an API never flexible
    if versions is None or versions[1] < max(versions[0], 0):
        return 1 << 15
    return max(versions[0], 0)


_FLEXIBLE_FROM = {key: _flexible_from(cls) for key, cls in REQUEST_CLASSES.items()}


def read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """Unsigned varint (as in tagged-field headers)."""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtocolError("truncated varint in request header")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("varint too long in request header")


def parse_header(frame: bytes | memoryview,
                 served_versions: Mapping[int, tuple[int, int]]) -> tuple[RequestHeader, int]:
    """Parse the request header; returns it and the body's offset. `served_versions` maps each served api key to
    its (min, max) version. Raises UnsupportedVersion for a known key at a version we do not serve, ProtocolError
    for anything malformed or an unknown key."""
    size = len(frame)
    if size < _FIXED.size:
        raise ProtocolError(f"request of {size} bytes is shorter than a request header")
    api_key, api_version, correlation_id, client_len = _FIXED.unpack_from(frame, 0)
    pos = _FIXED.size
    client_id = None
    if client_len >= 0:
        if pos + client_len > size:
            raise ProtocolError("truncated client id")
        client_id = str(frame[pos:pos + client_len], "utf-8", "replace")
        pos += client_len
    header = RequestHeader(api_key, api_version, correlation_id, client_id)
    flexible_from = _FLEXIBLE_FROM.get(api_key)
    served = served_versions.get(api_key)
    if flexible_from is None or served is None:
        raise ProtocolError(f"unknown or unserved api key {api_key}")
    if not served[0] <= api_version <= served[1]:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    if api_version >= flexible_from:
        if pos < size and frame[pos] == 0:  # no tagged fields: the usual header v2
            return header, pos + 1
        view = memoryview(frame)
        count, pos = read_varint(view, pos)
        for _ in range(count):
            _tag, pos = read_varint(view, pos)
            length, pos = read_varint(view, pos)
            pos += length
        if pos > len(view):
            raise ProtocolError("truncated tagged fields in request header")
    return header, pos


# The request every producer sends, decoded by hand (no message objects; records stay views of the frame).
_DIRECT_DECODERS = {ProduceRequest.API_KEY: decode_produce_request}


def decode_body(header: RequestHeader, frame: bytes | memoryview, body_offset: int):
    """The request: kafka-python's message, or for Produce protocol.produce_request's. ProtocolError when its bytes
    do not decode, or decode to null where the schema allows none (as Kafka's readers refuse it: kafka-python reads
    any length -1 as null, and a handler would trip on it)."""
    direct = _DIRECT_DECODERS.get(header.api_key)
    if direct is not None:
        try:
            return direct(memoryview(frame)[body_offset:], header.api_version)
        except MalformedRequest as exc:
            raise ProtocolError(f"malformed ProduceRequest v{header.api_version}: {exc}") from None
    cls = REQUEST_CLASSES[header.api_key]
    try:
        request = cls.decode(memoryview(frame)[body_offset:], version=header.api_version)
    except Exception as exc:  # kafka-python raises assorted errors on malformed bodies
        raise ProtocolError(f"malformed {cls.__name__} v{header.api_version}: {exc!r}") from None
    checks = _NULL_CHECKS.get((header.api_key, header.api_version))
    if checks is None:
        checks = _NULL_CHECKS[header.api_key, header.api_version] = _null_checks(cls._struct, header.api_version)
    null = _first_null(request, checks)
    if null is not None:
        raise ProtocolError(f"malformed {cls.__name__} v{header.api_version}: {null} is null, which it may not be")
    return request


# Per field that decodes to None when its length is -1 (strings, bytes, arrays, structs) and may not be null, or that
# holds such fields: (name, nullable, is an array, the checks of its elements or ELEMENTS, or of its fields).
NullChecks = tuple[tuple[str, bool, bool, "NullChecks | str | None"], ...]
ELEMENTS = "elements"  # an array of strings or bytes: no element may be null
_NULL_CHECKS: dict[tuple[int, int], NullChecks] = {}


def _may_decode_null(field) -> bool:
    kind = getattr(field, "_type", None)
    return isinstance(kind, String) or kind is Bytes


def _null_checks(struct, version: int) -> NullChecks:
    checks = []
    for field in struct.untagged_fields(version):
        inner: NullChecks | str | None = None
        if field.is_array():
            element = field.array_of
            inner = _null_checks(element, version) if element.is_struct() else \
                ELEMENTS if _may_decode_null(element) else None
        elif field.is_struct():
            inner = _null_checks(field, version)
        elif not _may_decode_null(field):
            continue
        nullable = field.nullable_for_version_q(version)
        if not nullable or inner:
            checks.append((field.name, nullable, field.is_array(), inner or None))
    return tuple(checks)


def _first_null(value, checks: NullChecks) -> str | None:
    """The path of the first field that is null where it may not be, or None. Runs for every request: kept lean."""
    for name, nullable, is_array, inner in checks:
        field = getattr(value, name)
        if field is None:
            if not nullable:
                return name
        elif inner is None:
            continue
        elif inner is ELEMENTS:
            if None in field:
                return f"{name}[{field.index(None)}]"
        elif is_array:
            for item in field:
                found = _first_null(item, inner)
                if found is not None:
                    return f"{name}[{field.index(item)}].{found}"
        else:
            found = _first_null(field, inner)
            if found is not None:
                return f"{name}.{found}"
    return None


NO_ID = bytes(16)


def id_bytes(value: uuid.UUID | None) -> bytes:
    """A topic id's 16 bytes; kafka-python decodes the zero UUID (no id) as None."""
    return NO_ID if value is None else value.bytes


def response_class(api_key: int, version: int) -> type[ApiMessage]:
    return RESPONSE_CLASSES[api_key][version]


class PreEncoded(Protocol):
    """A response that frames itself (a hand-tuned hot path, tested byte for byte against kafka-python)."""

    def frame(self, correlation_id: int) -> bytes: ...


def encode_response(response: ApiMessage | PreEncoded, correlation_id: int) -> bytes:
    if not isinstance(response, ApiMessage):
        return response.frame(correlation_id)
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))
