"""SASL mechanisms on the client side, sans-IO, for kop's own connections to other brokers (the replication link):
`first()` is the client's opening token, `answer(challenge)` the token that replies to the server's, or None once
the exchange is complete. A server that fails to prove it knows the password (SCRAM) raises SaslClientError."""
from typing import Protocol

import scramp


class SaslClientError(Exception):
    """The exchange cannot go on: the server's answer is malformed or its proof is wrong."""


class SaslClient(Protocol):
    def first(self) -> bytes: ...

    def answer(self, challenge: bytes) -> bytes | None: ...


class PlainClient:
    def __init__(self, user: str, password: str) -> None:
        self._token = b"\0" + user.encode() + b"\0" + password.encode()  # RFC 4616, no authorization identity

    def first(self) -> bytes:
        return self._token

    def answer(self, challenge: bytes) -> bytes | None:
        return None


class ScramClient:
    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self._client = scramp.ScramClient([mechanism], user, password)
        self._steps = iter((self._final, self._verify))

    def first(self) -> bytes:
        return self._client.get_client_first().encode()

    def answer(self, challenge: bytes) -> bytes | None:
        step = next(self._steps, None)
        if step is None:
            raise SaslClientError("the server sent more than SCRAM's two messages")
        try:
            return step(challenge.decode())
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise SaslClientError(f"SCRAM: {exc}") from None

    def _final(self, server_first: str) -> bytes:
        self._client.set_server_first(server_first)
        return self._client.get_client_final().encode()

    def _verify(self, server_final: str) -> None:
        self._client.set_server_final(server_final)  # checks the server's signature
        return None


def sasl_client(mechanism: str, user: str, password: str) -> SaslClient:
    if mechanism == "PLAIN":
        return PlainClient(user, password)
    return ScramClient(mechanism, user, password)
