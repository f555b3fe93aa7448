"""The broker's settings in force: the static ones (properties file, command line) with the dynamic levels over them,
the cluster-wide default first and this broker's own level above it, as Kafka orders them. A change is checked
against everything it would put in force (each value, then the rules between settings), stored durably, logged, and
then handed to the subsystems that act on it (`subscribe`)."""
import asyncio
import logging
from collections.abc import Awaitable, Callable

from kop.config import BrokerConfig
from kop.dynamic.keys import BrokerConfigError, check_level, overlay, refused
from kop.dynamic.store import DynamicConfigStore, LevelChange, Records
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

DEFAULT_LEVEL = ""  # the cluster-wide default: the BROKER resource with an empty name
Subscriber = Callable[[BrokerConfig], Awaitable[None]]


def level_label(name: str) -> str:
    return "the cluster-wide default" if name == DEFAULT_LEVEL else f"broker {name}"


class BrokerSettings:
    def __init__(self, static: BrokerConfig, explicit: frozenset[str]) -> None:
        """explicit: the fields the properties file or command line set (STATIC_BROKER_CONFIG)."""
        self.static = static
        self.explicit = explicit
        self.current = static
        self.node = str(static.node_id)  # this broker's level
        self.store = DynamicConfigStore(static.data_dir, static.fsync)
        self._subscribers: list[Subscriber] = []
        self._lock = asyncio.Lock()  # one change or reload at a time

    def subscribe(self, subscriber: Subscriber) -> None:
        """subscriber(config) is awaited with the settings in force after every change."""
        self._subscribers.append(subscriber)

    def level(self, name: str, report: bool = False) -> dict[str, str]:
        """A level's stored configs that can be applied (report: log those that cannot)."""
        return _applicable(name, self.store.levels.get(name, {}), report)

    # ---- loading

    def load(self) -> None:
        """The levels of the data directory's file, put in force (before the subsystems start)."""
        self.store.load()
        self.current = self._in_force()

    async def share_through(self, records: Records) -> None:
        """PostgreSQL engine: the levels of the database from now on (shared with the other brokers)."""
        await self.store.share_through(records)
        self.current = self._in_force()

    async def reload(self) -> None:
        """Read the database's levels again and put any change another broker made in force. Under the lock of
        changes: levels read before a change of this broker must not replace it once it is stored."""
        async with self._lock:
            if await self.store.reload():
                await self._put_in_force()

    def _in_force(self) -> BrokerConfig:
        default, mine = self.level(DEFAULT_LEVEL, report=True), self.level(self.node, report=True)
        try:
            return overlay(self.static, default, mine)
        except ValueError as exc:  # levels changed by two brokers at once, or static settings changed since
            log.error("dynamic broker configs break a rule together (%s); applying them one by one", exc)
        config = self.static
        for name, configs in ((DEFAULT_LEVEL, default), (self.node, mine)):
            for key, value in configs.items():
                try:
                    config = overlay(config, {key: value})
                except ValueError as exc:
                    log.error("dynamic config %s=%s of %s not applied: %s", key, value, level_label(name), exc)
        return config

    async def _put_in_force(self) -> None:
        config = self._in_force()
        if config == self.current:
            return
        self.current = config
        for subscriber in self._subscribers:
            await subscriber(config)

    # ---- changing

    async def alter(self, name: str, change: LevelChange, validate_only: bool, principal: str) -> None:
        """Change one level (DEFAULT_LEVEL or this broker's): change(its configs) -> the configs it is to hold.
        BrokerConfigError when the result is refused or cannot be stored."""
        if name not in (DEFAULT_LEVEL, self.node):
            raise refused(f"Unexpected broker id, expected {self.node} or empty string, but received {name}")
        async with self._lock:
            if self.store.shared and await self.store.reload():  # check against what the other brokers did,
                await self._put_in_force()  # and put it in force even if this change is refused or only validated
            before = self.level(name)
            checked = self._checked_change(name, change)
            if validate_only:
                checked(dict(self.store.levels.get(name, {})))
                return
            try:
                after = await self.store.update(name, checked)
            except BrokerConfigError:
                raise
            except Exception as exc:  # a full disk, the database gone: nothing changed
                log.error("broker configs of %s not changed: storing them failed: %s", level_label(name), exc)
                raise BrokerConfigError(ErrorCode.UNKNOWN_SERVER_ERROR, f"storing the configs failed: {exc}") \
                    from None
            log.info("broker configs of %s changed by %s: %s", level_label(name), principal, _changes(before, after))
            await self._put_in_force()

    def _checked_change(self, name: str, change: LevelChange) -> LevelChange:
        """The change as the store applies it to the level it holds: refused unless every setting it puts in force
        is accepted, alone and together with the others."""
        def checked(stored: dict[str, str]) -> dict[str, str]:
            configs = check_level(change(_applicable(name, stored, report=False)), per_broker=name != DEFAULT_LEVEL)
            levels = {DEFAULT_LEVEL: self.level(DEFAULT_LEVEL), self.node: self.level(self.node), name: configs}
            try:
                overlay(self.static, levels[DEFAULT_LEVEL], levels[self.node])
            except ValueError as exc:
                raise refused(str(exc)) from None
            return configs
        return checked


def _applicable(name: str, stored: dict[str, str], report: bool) -> dict[str, str]:
    """A level's stored configs without those that cannot be applied (a key no longer dynamic after an upgrade, a
    value no longer accepted), as Kafka leaves such configs out."""
    usable = {}
    for key, value in stored.items():
        try:
            usable.update(check_level({key: value}, per_broker=name != DEFAULT_LEVEL))
        except BrokerConfigError as exc:
            if report:
                log.error("dynamic config %s=%s of %s ignored: %s", key, value, level_label(name), exc)
    return usable


def _changes(before: dict[str, str], after: dict[str, str]) -> str:
    parts = [f"{key}={after[key]}" if key in after else f"{key} deleted"
             for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]
    return ", ".join(parts) or "no change"
