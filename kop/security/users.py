"""The user store: SCRAM credentials per user and mechanism, durable in `<data>/users.json` (replaced atomically,
readable by the broker's user only), or with the PostgreSQL engine in the database, one record per user and
mechanism shared by every broker of the cluster (kop/shared_book.py). Passwords are never stored: only the salt, the iteration count and the keys
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
from kop.shared_book import SharedBook

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


class UserStore(SharedBook):
    kind = "scram-credential"

    def __init__(self, data_dir: str, durable: bool = True) -> None:
        super().__init__()
        self.path = os.path.join(data_dir, "users.json")
        self._durable = durable
        self._users: dict[str, dict[str, ScramCredential]] = {}

    def load(self) -> None:
        """Raises OSError or ValueError for a file that cannot be read (the broker refuses to start)."""
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8") as f:
            stored = json.load(f)
        self._users = {user: {mechanism: _credential(mechanism, c) for mechanism, c in credentials.items()}
                       for user, credentials in stored["users"].items()}

    def save(self) -> None:
        stored = {"users": {user: {mechanism: _stored(c) for mechanism, c in credentials.items()}
                            for user, credentials in sorted(self._users.items())}}
        replace_atomically(self.path, json.dumps(stored, indent=1).encode(), durable=self._durable, mode=0o600)

    def as_records(self) -> dict[str, bytes]:
        return {json.dumps([user, mechanism]): json.dumps(_stored(c)).encode()
                for user, credentials in self._users.items() for mechanism, c in credentials.items()}

    def take_records(self, records: dict[str, bytes]) -> None:
        users: dict[str, dict[str, ScramCredential]] = {}
        for key, value in records.items():
            user, mechanism = json.loads(key)
            users.setdefault(user, {})[mechanism] = _credential(mechanism, json.loads(value))
        self._users = users  # one assignment: a PLAIN check in a worker thread sees the old or the new

    def users(self) -> dict[str, list[ScramCredential]]:
        return {user: list(credentials.values()) for user, credentials in sorted(self._users.items())}

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    async def put(self, user: str, credentials: list[ScramCredential]) -> None:
        for credential in credentials:
            check_credential(user, credential.mechanism, credential.iterations)
        async with self.changing():
            self._users.setdefault(user, {}).update((c.mechanism, c) for c in credentials)

    async def set_password(self, user: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> None:
        """Credentials for every SCRAM mechanism from one password (`kop admin users set`)."""
        if not password:
            raise CredentialError("the password is empty")
        check_credential(user, "SCRAM-SHA-256", iterations)  # before the key derivation, which takes a while
        await self.put(user, [ScramCredential.from_password(m, password, iterations) for m in HASHES])

    async def delete(self, user: str, mechanism: str | None = None) -> bool:
        """Forget one credential (or all of the user's); False when there was none."""
        credentials = self._users.get(user)
        if not credentials or (mechanism is not None and mechanism not in credentials):
            return False
        async with self.changing():
            kept = {} if mechanism is None else {m: c for m, c in credentials.items() if m != mechanism}
            if kept:
                self._users[user] = kept
            else:
                del self._users[user]
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


def _stored(credential: ScramCredential) -> dict:
    return {"iterations": credential.iterations, "salt": _b64(credential.salt),
            "stored_key": _b64(credential.stored_key), "server_key": _b64(credential.server_key)}


def _credential(mechanism: str, stored: dict) -> ScramCredential:
    return ScramCredential(mechanism, stored["iterations"], _unb64(stored["salt"]), _unb64(stored["stored_key"]),
                           _unb64(stored["server_key"]))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)
