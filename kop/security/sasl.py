"""SASL mechanisms on the server side, sans-IO: an exchange takes the client's tokens one at a time and answers with
the server's, until it names the authenticated user or raises AuthenticationFailed. PLAIN (RFC 4616) checks the
password against the user store; SCRAM-SHA-256/512 (RFC 5802/7677) run through scramp."""
import secrets
from dataclasses import dataclass
from typing import Protocol

import scramp

from kop.security.users import DEFAULT_ITERATIONS, ScramCredential, UserStore

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class AuthenticationFailed(Exception):
    """The client is not who it says (wrong password, unknown user, a malformed token): the message is safe to send
    to the client and names no secret."""


@dataclass(frozen=True)
class Step:
    challenge: bytes  # the server's token to send back (may be empty)
    user: str | None  # set once the exchange is complete
    expires_at_ms: int | None = None  # when the credential itself expires (an OAUTHBEARER token), epoch ms


class SaslExchange(Protocol):
    mechanism: str
    derives_keys: bool  # a step derives a key from a password (PBKDF2, milliseconds): run it off the event loop

    def step(self, token: bytes) -> Step: ...


class PlainExchange:
    mechanism = "PLAIN"
    derives_keys = True  # the password is checked against the stored SCRAM keys: PBKDF2 on every try

    def __init__(self, users: UserStore) -> None:
        self._users = users

    def step(self, token: bytes) -> Step:
        try:
            authzid, user, password = token.decode("utf-8").split("\0")
        except (UnicodeDecodeError, ValueError):
            raise AuthenticationFailed("malformed PLAIN token: expected authzid NUL user NUL password") from None
        if authzid and authzid != user:
            raise AuthenticationFailed("PLAIN: authorization id must be empty or the user name")
        if not user or not self._users.check_password(user, password):
            raise AuthenticationFailed("Invalid username or password")
        return Step(b"", user)


class ScramExchange:
    derives_keys = False  # the client derives the key; the server checks its proof with two HMACs

    def __init__(self, users: UserStore, mechanism: str) -> None:
        self.mechanism = mechanism
        self._users = users
        self._server = scramp.ScramMechanism(mechanism).make_server(self._auth_info)
        self._round = 0
        self._user: str | None = None

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        credential = self._users.credential(user, self.mechanism)
        if credential is None:
            # RFC 5802 §9: go on with a credential no password matches, so an unknown user fails where a wrong
            # password does and the answer does not tell which users exist
            credential = ScramCredential(self.mechanism, DEFAULT_ITERATIONS, secrets.token_bytes(32),
                                         secrets.token_bytes(64), secrets.token_bytes(64))
        self._user = user
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def step(self, token: bytes) -> Step:
        self._round += 1
        try:
            text = token.decode("utf-8")
            if self._round == 1:
                self._server.set_client_first(text)
                return Step(self._server.get_server_first().encode(), None)
            if self._round == 2:
                self._server.set_client_final(text)
                return Step(self._server.get_server_final().encode(), self._user)
        except UnicodeDecodeError:
            raise AuthenticationFailed(f"{self.mechanism}: a token that is not UTF-8") from None
        except scramp.ScramException as exc:
            # scramp's messages say which check failed (proof, nonce, format), never the credential
            raise AuthenticationFailed("Invalid username or password" if "proof" in str(exc).lower()
                                       else f"{self.mechanism}: {exc}") from None
        raise AuthenticationFailed(f"{self.mechanism}: the exchange is already complete")


def start_exchange(mechanism: str, users: UserStore) -> SaslExchange:
    return PlainExchange(users) if mechanism == "PLAIN" else ScramExchange(users, mechanism)
