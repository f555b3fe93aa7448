"""What hostile bytes may do to each parser kop runs on a client's input, as functions the fuzzers call.

Each oracle feeds one parser the way the broker does and returns when the parser answered as it must: a value, or
its own error (ProtocolError/UnsupportedVersion close the connection, RecordBatchError is the partition's error
code, AuthenticationFailed is SASL_AUTHENTICATION_FAILED, an admin 401). Any other exception escapes: the broker
would log it as an internal error and drop the connection instead of answering, so the fuzzer reports it. A failed
assertion is a broken promise (a batch that passed validation but cannot be read, a decompression past its limit).

tests/test_fuzz.py drives these with hypothesis in every `make test`; `python -m fuzz` with atheris, coverage-guided.
"""
import asyncio
import base64
import tempfile
from functools import cache

from kop.admin.auth import AdminAuth, Unauthenticated
from kop.admin.http import HttpError, Request
from kop.handlers import build_api_router
from kop.security.acls import Authorizer
from kop.security.oauthbearer import OAuthBearerExchange, UnsecuredValidator
from kop.security.sasl import AuthenticationFailed, PlainExchange, ScramExchange
from kop.security.users import MIN_ITERATIONS, UserStore
from protocol.api import ProtocolError, UnsupportedVersion, decode_body, parse_header
from protocol.compression import RecordBatchError, decompress
from protocol.records import FalseMaxTimestamp, iter_records, set_max_timestamp, split_batches, validate_batch
from protocol.sequence_headers import SequenceHeaderScan, sequenced_records

SERVED = build_api_router().versions
DECOMPRESSED_LIMIT = 1 << 16  # what one decompression may produce here: a bomb must stop at it
USER, PASSWORD = "alice", "alice-secret"
NOW_MS = 1_700_000_000_000  # the OAUTHBEARER clock: tokens are judged against a fixed instant, as a replay needs


def request_frame(frame: bytes) -> None:
    """A request frame (without its size prefix), through the header parser and the body decoder."""
    try:
        header, offset = parse_header(frame, SERVED)
        decode_body(header, frame, offset)
    except (ProtocolError, UnsupportedVersion):
        pass


def produce_records(records: bytes) -> None:
    """A Produce partition's `records`, checked as the Produce handler checks them (one batch, validation with the
    application sequence-id headers watched, maxTimestamp set from the records when it is false), then read as a
    fetch, the compaction cleaner or the sequence-id judge reads a stored batch: a batch that passed must read."""
    try:
        batches = split_batches(records)
        if len(batches) != 1:
            return
        header, view = batches[0]
        try:
            walked = validate_batch(header, view, watch=SequenceHeaderScan,
                                    max_decompressed_size=DECOMPRESSED_LIMIT)
        except FalseMaxTimestamp as exc:
            fixed = bytearray(view)
            set_max_timestamp(fixed, 0, exc.records_max)
            header, view = split_batches(fixed)[0]
            walked = validate_batch(header, view, watch=SequenceHeaderScan,
                                    max_decompressed_size=DECOMPRESSED_LIMIT)
    except RecordBatchError:
        return
    read = list(iter_records(view, max_decompressed_size=DECOMPRESSED_LIMIT))
    assert len(read) == header.records_count, f"validated {header.records_count} records, read {len(read)}"
    if walked is not None and walked.headers is not None:
        try:
            sequenced_records(walked.headers)
        except RecordBatchError:
            pass


def codec_stream(codec: int, data: bytes) -> None:
    try:
        out = decompress(codec, data, DECOMPRESSED_LIMIT)
    except RecordBatchError:
        return
    assert len(out) <= DECOMPRESSED_LIMIT, f"codec {codec} produced {len(out)} bytes past its limit"


@cache
def _users() -> UserStore:
    """A store with one user (credentials at the minimum iterations: PLAIN derives a key per try)."""
    store = UserStore(tempfile.mkdtemp(prefix="kop-fuzz-users-"), durable=False)
    store.set_password(USER, PASSWORD, iterations=MIN_ITERATIONS)
    return store


def sasl_plain(token: bytes) -> None:
    try:
        PlainExchange(_users()).step(token)
    except AuthenticationFailed:
        pass


def scram(mechanism: str, client_first: bytes, client_final: bytes) -> None:
    """Both client messages of a SCRAM exchange, for the one user the store knows or any other."""
    exchange = ScramExchange(_users(), mechanism)
    try:
        exchange.step(client_first)
        exchange.step(client_final)
    except AuthenticationFailed:
        pass


def oauthbearer(message: bytes, acknowledgement: bytes, required_scope: str = "") -> None:
    """An OAUTHBEARER client message and, when the token is refused, what the client sends after the error."""
    validator = UnsecuredValidator(required_scopes=frozenset(required_scope.split()), clock_skew_ms=1000)
    exchange = OAuthBearerExchange(validator, clock=lambda: NOW_MS / 1000)
    try:
        step = exchange.step(message)
        if step.user is None:
            exchange.step(acknowledgement)
    except AuthenticationFailed:
        pass


@cache
def _admin_auth() -> AdminAuth:
    authorizer = Authorizer(tempfile.mkdtemp(prefix="kop-fuzz-acls-"), f"User:{USER}", allow_if_no_acl=False,
                            enabled=False, durable=False)
    return AdminAuth(_users(), authorizer, "admin-token", True)


def admin_authorization(method: str, authorization: str) -> None:
    """An admin REST request's Authorization header: served, or refused with 401/403."""
    request = Request(method, "HTTP/1.1", "/admin/v2/clusters", {}, {"authorization": authorization}, b"",
                      "127.0.0.1")
    try:
        asyncio.run(_admin_auth().check(request, frozenset()))
    except (Unauthenticated, HttpError):
        pass


def basic_credentials(user: bytes, password: bytes) -> str:
    return "Basic " + base64.b64encode(user + b":" + password).decode()
