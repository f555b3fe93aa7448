"""The user store: SCRAM credentials per user and mechanism, durable in `<data>/users.json` (replaced atomically,
readable by the broker's user only). Passwords are never stored: only the salt, the iteration count and the keys
SCRAM derives from them (RFC 5802: StoredKey and ServerKey), which verify a password but cannot sign in as it.
SASL PLAIN checks a password against the same credentials, so one user has one password whatever the mechanism."""
import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass

from kop.ledger.framed_file import replace_atomically

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}  # Kafka's ScramMechanism numbers
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's bounds
DEFAULT_ITERATIONS = 8192


class CredentialError(ValueError):
    """A credential kop will not store (unknown mechanism, iterations out of bounds, empty name)."""


@dataclass(frozen=True)
class ScramCredential:
    mechanism: str
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_salted_password(cls, mechanism: str, iterations: int, salt: bytes,
                             salted_password: bytes) -> "ScramCredential":
        digest = HASHES[mechanism]
        client_key = hmac.digest(salted_password, b"Client Key", digest)
        return cls(mechanism, iterations, salt, hashlib.new(digest, client_key).digest(),
                   hmac.digest(salted_password, b"Server Key", digest))

    @classmethod
    def from_password(cls, mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                      salt: bytes | None = None) -> "ScramCredential":
        salt = salt if salt is not None else secrets.token_bytes(32)
        return cls.from_salted_password(mechanism, iterations, salt, salted_password(mechanism, password, salt,
                                                                                      iterations))

    def verifies(self, password: str) -> bool:
        again = ScramCredential.from_password(self.mechanism, password, self.iterations, self.salt)
        return hmac.compare_digest(again.stored_key, self.stored_key)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802 Hi(): what a client sends in AlterUserScramCredentials instead of the password."""
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


def check_credential(user: str, mechanism: str, iterations: int) -> None:
    if not user:
        raise CredentialError("the user name is empty")
    if mechanism not in HASHES:
        raise CredentialError(f"unknown SCRAM mechanism {mechanism!r}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, got {iterations}")


class UserStore:
    def __init__(self, data_dir: str, durable: bool = True) -> None:
        self.path = os.path.join(data_dir, "users.json")
        self._durable = durable
        self._users: dict[str, dict[str, ScramCredential]] = {}

    def load(self) -> None:
        """Raises OSError or ValueError for a file that cannot be read (the broker refuses to start)."""
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8") as f:
            stored = json.load(f)
        self._users = {
            user: {mechanism: ScramCredential(mechanism, c["iterations"], _unb64(c["salt"]), _unb64(c["stored_key"]),
                                              _unb64(c["server_key"]))
                   for mechanism, c in credentials.items()}
            for user, credentials in stored["users"].items()}

    def _save(self) -> None:
        stored = {"users": {user: {mechanism: {"iterations": c.iterations, "salt": _b64(c.salt),
                                               "stored_key": _b64(c.stored_key), "server_key": _b64(c.server_key)}
                                   for mechanism, c in credentials.items()}
                            for user, credentials in sorted(self._users.items())}}
        replace_atomically(self.path, json.dumps(stored, indent=1).encode(), durable=self._durable, mode=0o600)

    def users(self) -> dict[str, list[ScramCredential]]:
        return {user: list(credentials.values()) for user, credentials in sorted(self._users.items())}

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    def put(self, user: str, credentials: list[ScramCredential]) -> None:
        for credential in credentials:
            check_credential(user, credential.mechanism, credential.iterations)
        self._users.setdefault(user, {}).update((c.mechanism, c) for c in credentials)
        self._save()

    def set_password(self, user: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> None:
        """Credentials for every SCRAM mechanism from one password (`kop admin users set`)."""
        if not password:
            raise CredentialError("the password is empty")
        self.put(user, [ScramCredential.from_password(m, password, iterations) for m in HASHES])

    def delete(self, user: str, mechanism: str | None = None) -> bool:
        """Forget one credential (or all of the user's); False when there was none."""
        credentials = self._users.get(user)
        if not credentials or (mechanism is not None and mechanism not in credentials):
            return False
        if mechanism is None:
            credentials.clear()
        else:
            del credentials[mechanism]
        if not credentials:
            del self._users[user]
        self._save()
        return True

    def check_password(self, user: str, password: str) -> bool:
        """SASL PLAIN: the password matches one of the user's SCRAM credentials (the strongest first). Runs in a
        worker thread (PBKDF2) while the event loop may change the store: it reads each mapping once."""
        credentials = self._users.get(user, {})
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            credential = credentials.get(mechanism)
            if credential is not None:
                return credential.verifies(password)
        return False


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)
