"""The user store and the SASL exchanges, against scramp's client (another implementation of RFC 5802)."""
import asyncio
import base64
import json
import threading

import pytest
import scramp

from kop.admin.auth import AdminAuth
from kop.admin.http import Request
from kop.security.acls import Authorizer
from kop.security.listeners import ListenerSpec
from kop.security.sasl import AuthenticationFailed, PlainExchange, ScramExchange
from kop.security.session import Session
from kop.security.users import CredentialError, ScramCredential, UserStore, salted_password


@pytest.fixture
def users(tmp_path):
    store = UserStore(str(tmp_path), durable=False)
    store.set_password("alice", "wonderland")
    return store


def scram(users, mechanism, user, password):
    client = scramp.ScramClient([mechanism], user, password)
    exchange = ScramExchange(users, mechanism)
    first = exchange.step(client.get_client_first().encode())
    assert first.user is None
    client.set_server_first(first.challenge.decode())
    final = exchange.step(client.get_client_final().encode())
    client.set_server_final(final.challenge.decode())  # raises unless the server proved it holds the credential
    return final.user


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_with_the_right_password_names_the_user(users, mechanism):
    assert scram(users, mechanism, "alice", "wonderland") == "alice"


@pytest.mark.parametrize("user, password", [("alice", "looking-glass"), ("bob", "wonderland")])
def test_a_wrong_password_and_an_unknown_user_fail_alike_at_the_proof(users, user, password):
    with pytest.raises(AuthenticationFailed, match="^Invalid username or password$"):
        scram(users, "SCRAM-SHA-256", user, password)




@pytest.mark.parametrize("token, accepted", [
    (b"\0alice\0wonderland", True), (b"alice\0alice\0wonderland", True), (b"\0alice\0nope", False),
    (b"bob\0alice\0wonderland", False), (b"\0bob\0wonderland", False), (b"alice\0wonderland", False),
    (b"\0alice\0\xff", False)])
def test_plain_tokens(users, token, accepted):
    if accepted:
        assert PlainExchange(users).step(token).user == "alice"
    else:
        with pytest.raises(AuthenticationFailed):
            PlainExchange(users).step(token)


def test_a_credential_from_the_salted_password_a_client_sends_equals_one_from_the_password():
    salt = b"0123456789abcdef"
    direct = ScramCredential.from_password("SCRAM-SHA-512", "pw", 4096, salt)
    sent = ScramCredential.from_salted_password("SCRAM-SHA-512", 4096, salt,
                                                salted_password("SCRAM-SHA-512", "pw", salt, 4096))
    assert direct == sent and direct.verifies("pw") and not direct.verifies("pw2")


def test_the_store_survives_a_reload_and_holds_no_password(users, tmp_path):
    again = UserStore(str(tmp_path))
    again.load()
    assert again.users() == users.users()
    assert again.check_password("alice", "wonderland") and not again.check_password("alice", "x")
    text = (tmp_path / "users.json").read_text()
    assert "wonderland" not in text and set(json.loads(text)["users"]["alice"]) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert again.delete("alice", "SCRAM-SHA-512") and not again.delete("alice", "SCRAM-SHA-512")
    assert again.delete("alice") and again.users() == {}


@pytest.mark.parametrize("user, mechanism, iterations, message", [
    ("", "SCRAM-SHA-256", 4096, "empty"), ("a", "SCRAM-SHA-1", 4096, "unknown SCRAM mechanism"),
    ("a", "SCRAM-SHA-256", 100, "between 4096 and 16384")])
def test_credentials_kafka_would_refuse_are_refused(users, user, mechanism, iterations, message):
    with pytest.raises(CredentialError, match=message):
        users.put(user, [ScramCredential(mechanism, iterations, b"s", b"k", b"k")])


class HeldStore(UserStore):
    """Holds each password check until the event loop has run something else (a deadlock guard of 10 s: a check
    on the loop itself would find nobody to release it, and fail)."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory, durable=False)
        self.checking, self.released = threading.Event(), threading.Event()

    def check_password(self, user: str, password: str) -> bool:
        self.checking.set()
        assert self.released.wait(10), "the password check held the event loop"
        return super().check_password(user, password)


async def released_while_checking(store: HeldStore, attempt) -> object:
    task = asyncio.ensure_future(attempt)
    await asyncio.to_thread(store.checking.wait, 10)
    store.released.set()  # run by the event loop while the check is under way
    return await task


async def test_a_plain_attempt_derives_its_key_off_the_event_loop(tmp_path):
    store = HeldStore(str(tmp_path))
    store.set_password("alice", "wonderland")
    session = Session.start(ListenerSpec("SASL", "SASL_PLAINTEXT", "127.0.0.1", 0, "127.0.0.1", 0), None)
    session.begin(PlainExchange(store), raw_tokens=False)
    step = await released_while_checking(store, session.advance(b"\0alice\0wonderland", 0))
    assert step.user == "alice" and session.principal == "User:alice"


async def test_admin_basic_credentials_are_checked_off_the_event_loop(tmp_path):
    store = HeldStore(str(tmp_path))
    store.set_password("admin", "secret")
    authorizer = Authorizer(str(tmp_path), "User:admin", allow_if_no_acl=False, enabled=False, durable=False)
    request = Request("GET", "HTTP/1.1", "/admin/v2/users", {},
                      {"authorization": "Basic " + base64.b64encode(b"admin:secret").decode()}, b"", "127.0.0.1")
    await released_while_checking(store, AdminAuth(store, authorizer, "", True).check(request, frozenset()))
