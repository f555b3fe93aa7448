"""Named one-shot timers on the running event loop: member sessions, rebalance and sync deadlines.

Arming a name again replaces its timer (a heartbeat pushes the session deadline out)."""
import asyncio
import logging
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)


class Timers:
    def __init__(self) -> None:
        self._handles: dict[Hashable, asyncio.TimerHandle] = {}

    def arm(self, key: Hashable, delay_ms: int, callback: Callable, *args) -> None:
        self.cancel(key)
        self._handles[key] = asyncio.get_running_loop().call_later(max(0, delay_ms) / 1000, self._fire, key,
                                                                   callback, args)

    def _fire(self, key: Hashable, callback: Callable, args: tuple) -> None:
        self._handles.pop(key, None)
        try:
            callback(*args)
        except Exception:
            log.exception("group timer %r failed", key)

    def armed(self, key: Hashable) -> bool:
        return key in self._handles

    def cancel(self, key: Hashable) -> None:
        handle = self._handles.pop(key, None)
        if handle is not None:
            handle.cancel()

    def cancel_where(self, predicate: Callable[[Hashable], bool]) -> None:
        for key in [k for k in self._handles if predicate(k)]:
            self.cancel(key)

    def cancel_all(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
