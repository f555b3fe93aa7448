"""A blocking client for kop's admin REST API (stdlib urllib only), used by `kop admin` and by tests."""
import base64
import json
import urllib.error
import urllib.request
from urllib.parse import quote, urlencode

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"


class AdminError(Exception):
    """The admin API answered an error (`status` > 0) or could not be reached (`status` 0)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}" if status else reason)
        self.status = status
        self.reason = reason


def topic_path(topic: str) -> str:
    """`T`, `tenant/ns/T` or `persistent://tenant/ns/T` -> `tenant/ns/T` (a short name is in public/default, as in
    pulsar-admin)."""
    scheme, sep, rest = topic.partition("://")
    if sep:
        if scheme != "persistent":
            raise ValueError(f"only persistent topics exist in kop, got {topic!r}")
        topic = rest
    parts = topic.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"expected TOPIC, tenant/namespace/TOPIC or persistent://tenant/namespace/TOPIC, "
                         f"got {topic!r}")
    return "/".join(quote(p, safe="") for p in parts)


def namespace_path(namespace: str) -> str:
    parts = namespace.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"expected tenant/namespace, got {namespace!r}")
    return "/".join(quote(p, safe="") for p in parts)


def namespace_resource(namespace: str, name: str) -> str:
    """The REST path of a namespace policy, e.g. `deduplication`."""
    return f"/admin/v2/namespaces/{namespace_path(namespace)}/{name}"


def topic_resource(topic: str, name: str) -> str:
    """The REST path of a topic's policy or stats, e.g. `deduplicationEnabled`, `internalStats`."""
    return f"/admin/v2/persistent/{topic_path(topic)}/{name}"


CLUSTERS_PATH = "/admin/v2/clusters"


def cluster_resource(name: str) -> str:
    return f"{CLUSTERS_PATH}/{quote(name, safe='')}"


def group_resource(group: str, name: str) -> str:
    return f"/admin/v2/groups/{quote(group, safe='')}/{name}"


def namespace_topics(namespace: str) -> str:
    """The REST path listing a namespace's (persistent) topic partitions."""
    return f"/admin/v2/persistent/{namespace_path(namespace)}"


def basic_credentials(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class AdminClient:
    def __init__(self, url: str = DEFAULT_ADMIN_URL, timeout: float = 30.0, authorization: str | None = None) -> None:
        """authorization: the Authorization header's value (see basic_credentials), None for none."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.authorization = authorization

    def get(self, path: str, **query: object) -> object:
        if query:
            path += "?" + urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in query.items()})
        return self._call("GET", path)

    def post(self, path: str, value: object) -> object:
        return self._call("POST", path, json.dumps(value).encode())

    def put(self, path: str, value: object) -> object:
        return self._call("PUT", path, json.dumps(value).encode())

    def delete(self, path: str) -> object:
        return self._call("DELETE", path)

    def _call(self, method: str, path: str, body: bytes | None = None) -> object:
        request = urllib.request.Request(self.url + path, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        if self.authorization:
            request.add_header("Authorization", self.authorization)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise AdminError(exc.code, _reason(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(0, f"cannot reach the admin API at {self.url}: {reason}") from None
        return json.loads(raw) if raw.strip() else None


def _reason(exc: "urllib.error.HTTPError") -> str:
    try:
        body = exc.read()
        reason = json.loads(body).get("reason") if body else None
    except (ValueError, AttributeError, OSError):
        reason = None
    return reason or exc.reason or "error"
