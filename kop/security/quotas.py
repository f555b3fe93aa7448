"""Client quotas as Kafka keeps them: byte rates per user and/or client id, with `<default>` entities, resolved in
Kafka's order of precedence, durable in `<data>/quotas.json`; and the rate each (user, client id) uses, measured
over a window of one-second samples. A client above its rate is answered at once with the time it must wait
(throttle_time_ms, KIP-219), and the broker reads nothing more from that connection until then."""
import json
import os
import time
from collections import deque
from dataclasses import dataclass

from kop.ledger.framed_file import replace_atomically

USER, CLIENT_ID = "user", "client-id"
PRODUCE_RATE, FETCH_RATE = "producer_byte_rate", "consumer_byte_rate"
KEYS = frozenset({PRODUCE_RATE, FETCH_RATE})
SAMPLES, SAMPLE_SECONDS = 11, 1.0  # Kafka's quota.window.num and quota.window.size.seconds

Entity = tuple[tuple[str, str | None], ...]  # ((entity type, name or None for <default>), ...), sorted by type


class QuotaError(ValueError):
    """An entity or key Kafka would refuse."""


def check_entity(entity: Entity) -> None:
    types = [kind for kind, _name in entity]
    if not types or len(set(types)) != len(types) or not set(types) <= {USER, CLIENT_ID}:
        raise QuotaError(f"entity {entity}: types must be user and/or client-id, each once")


class QuotaBook:
    def __init__(self, data_dir: str, durable: bool = True) -> None:
        self.path = os.path.join(data_dir, "quotas.json")
        self._durable = durable
        self._quotas: dict[Entity, dict[str, float]] = {}

    def load(self) -> None:
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                stored = json.load(f)["quotas"]
            self._quotas = {tuple((kind, name) for kind, name in entry["entity"]): entry["values"]
                            for entry in stored}

    def _save(self) -> None:
        stored = [{"entity": list(entity), "values": values} for entity, values in sorted(
            self._quotas.items(), key=lambda item: json.dumps(item[0]))]
        replace_atomically(self.path, json.dumps({"quotas": stored}, indent=1).encode(), durable=self._durable)

    def alter(self, entity: Entity, changes: dict[str, float | None], validate_only: bool = False) -> None:
        """changes: key -> value, None removes the key. Raises QuotaError for an entity or key kop does not serve."""
        check_entity(entity)
        for key, value in changes.items():
            if key not in KEYS:
                raise QuotaError(f"quota {key} is not served (only {', '.join(sorted(KEYS))})")
            if value is not None and value <= 0:
                raise QuotaError(f"quota {key} must be above 0, got {value}")
        if validate_only:
            return
        values = self._quotas.setdefault(entity, {})
        for key, value in changes.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        if not values:
            del self._quotas[entity]
        self._save()

    def entries(self) -> dict[Entity, dict[str, float]]:
        return dict(self._quotas)

    def limit(self, user: str, client_id: str, key: str) -> float | None:
        """Kafka's precedence: user+client, user+default client, user, default user+client, default user+default
        client, default user, client, default client."""
        if not self._quotas:  # none set (the usual case): every request asks, so answer without building keys
            return None
        for entity in ((("client-id", client_id), ("user", user)), (("client-id", None), ("user", user)),
                       (("user", user),), (("client-id", client_id), ("user", None)),
                       (("client-id", None), ("user", None)), (("user", None),), (("client-id", client_id),),
                       (("client-id", None),)):
            value = self._quotas.get(entity, {}).get(key)
            if value is not None:
                return value
        return None


@dataclass
class _Rate:
    samples: deque  # (sample start, bytes)

    def record(self, now: float, size: int) -> tuple[float, float]:
        """Add size; (the rate in bytes/s, the window it is measured over: at least SAMPLES - 1 samples long, as
        Kafka measures, so a first burst is not judged over a sliver of time)."""
        start = now - now % SAMPLE_SECONDS
        if self.samples and self.samples[-1][0] == start:
            self.samples[-1][1] += size
        else:
            self.samples.append([start, size])
        while self.samples[0][0] <= now - SAMPLES * SAMPLE_SECONDS:
            self.samples.popleft()
        elapsed = max(now - self.samples[0][0], (SAMPLES - 1) * SAMPLE_SECONDS)
        return sum(s[1] for s in self.samples) / elapsed, elapsed


MAX_TRACKED = 10_000  # (quota, user, client id) rates kept before idle ones are dropped


class QuotaMeter:
    """The throttle a (user, client id) earns by the bytes it moves."""

    def __init__(self, book: QuotaBook, clock=time.monotonic) -> None:
        self._book = book
        self._clock = clock
        self._rates: dict[tuple[str, str, str], _Rate] = {}

    def _forget_idle(self, now: float) -> None:
        """Drop rates whose last sample left the window: they would measure 0 anyway."""
        idle = [k for k, r in self._rates.items() if r.samples[-1][0] <= now - SAMPLES * SAMPLE_SECONDS]
        for k in idle:
            del self._rates[k]

    def record(self, key: str, user: str, client_id: str, size: int) -> int:
        """throttle_time_ms for having moved `size` more bytes (0 when within the quota or there is none)."""
        limit = self._book.limit(user, client_id, key)
        if limit is None:
            return 0
        now = self._clock()
        tracked = self._rates.get((key, user, client_id))
        if tracked is None:
            if len(self._rates) >= MAX_TRACKED:
                self._forget_idle(now)
            tracked = self._rates[(key, user, client_id)] = _Rate(deque())
        rate, window = tracked.record(now, size)
        if rate <= limit:
            return 0
        # Kafka's rule: the wait that brings the rate over the window back to the quota, at most a whole window
        return int(min((rate - limit) / limit * window, SAMPLES * SAMPLE_SECONDS) * 1000)
