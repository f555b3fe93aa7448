"""Where the dynamic broker configs are kept, level by level (the cluster-wide default "", or a broker's node id).

The file engine keeps every level in one protobuf record, `<data>/broker-configs`, replaced atomically (and fsynced
unless fsync is off) before a change is answered, so a change acknowledged survives kill -9. The PostgreSQL engine
keeps each level as a record of its own in the database (kind `broker-config`), shared by every broker of the
cluster as the policies are: a change is read, made and written in one transaction under the record's row lock, so
changes from several brokers never overwrite each other, and every broker reads the levels again each heartbeat.
"""
import logging
import os
from collections.abc import Callable
from typing import Protocol

from kop.ledger.framed_file import replace_atomically
from proto.kop_pb2 import BrokerConfigLevel, BrokerConfigStore, KeyValue

log = logging.getLogger(__name__)

RECORD_KIND = "broker-config"
FILE_NAME = "broker-configs"

Levels = dict[str, dict[str, str]]  # level name -> Kafka key -> value
LevelChange = Callable[[dict[str, str]], dict[str, str]]  # a level's configs -> the ones to store instead


class Records(Protocol):
    """The database's record store (kop/ledger/postgres/store.py)."""

    async def records(self, kind: str) -> dict[str, bytes]: ...

    async def put_record(self, kind: str, key: str, value: bytes) -> None: ...

    async def update_record(self, kind: str, key: str, change: Callable[[bytes], bytes]) -> bytes: ...


def _encode(name: str, configs: dict[str, str]) -> BrokerConfigLevel:
    return BrokerConfigLevel(name=name, configs=[KeyValue(key=k, value=v) for k, v in sorted(configs.items())])


def _decode(level: BrokerConfigLevel) -> dict[str, str]:
    return {kv.key: kv.value for kv in level.configs}


def _parse(value: bytes) -> dict[str, str]:
    """A database record's level (b"": a record being created, no configs yet)."""
    return _decode(BrokerConfigLevel.FromString(value)) if value else {}


class DynamicConfigStore:
    def __init__(self, data_dir: str, durable: bool) -> None:
        self.path = os.path.join(data_dir, FILE_NAME)
        self._durable = durable
        self.levels: Levels = {}  # as last read or written
        self._records: Records | None = None  # the database's (PostgreSQL engine), else the file

    @property
    def shared(self) -> bool:
        """Kept in a database other brokers change too."""
        return self._records is not None

    def load(self) -> None:
        """The file's levels (the file engine's, or those a broker had before it moved to the database)."""
        if not os.path.exists(self.path):
            return
        store = BrokerConfigStore()
        with open(self.path, "rb") as f:
            store.ParseFromString(f.read())
        self.levels = {level.name: _decode(level) for level in store.levels if level.configs}

    async def share_through(self, records: Records) -> None:
        """Keep the levels in the database from now on (after `load`). A database that holds none yet takes the
        ones this broker had in its file, so moving to PostgreSQL keeps them."""
        carried = self.levels
        self._records = records
        await self.reload()
        if not self.levels and carried:
            for name, configs in carried.items():
                await records.put_record(RECORD_KIND, name, _encode(name, configs).SerializeToString())
            log.info("dynamic broker configs of %s copied into the database", self.path)
            await self.reload()

    async def reload(self) -> bool:
        """Read the database's levels again (another broker may have changed them); whether they changed."""
        if self._records is None:
            return False
        found = {name: _parse(value) for name, value in (await self._records.records(RECORD_KIND)).items()}
        found = {name: configs for name, configs in found.items() if configs}
        changed = found != self.levels
        self.levels = found
        return changed

    async def update(self, name: str, change: LevelChange) -> dict[str, str]:
        """Store `change` of one level (an empty result removes it) and return it; durable once this returns. An
        exception from `change` or from the storage changes nothing."""
        if self._records is None:
            configs = change(dict(self.levels.get(name, {})))
            levels = {**self.levels, name: configs}
            self._write_file({k: v for k, v in levels.items() if v})
        else:
            def encoded(old: bytes) -> bytes:
                configs = change(_parse(old))
                return _encode(name, configs).SerializeToString() if configs else b""
            configs = _parse(await self._records.update_record(RECORD_KIND, name, encoded))
        if configs:
            self.levels[name] = configs
        else:
            self.levels.pop(name, None)
        return configs

    def _write_file(self, levels: Levels) -> None:
        store = BrokerConfigStore(levels=[_encode(name, configs) for name, configs in sorted(levels.items())])
        replace_atomically(self.path, store.SerializeToString(), durable=self._durable)
