"""Transactions in the soak: a confluent-kafka transactional producer writes numbered transactions across a topic's
partitions through the same faults as everything else, aborting a seeded share of them on purpose; its verdict,
read read_committed once the faults are over, is that every committed transaction is there exactly once, no aborted
one is visible, and no transaction hangs (each partition's last stable offset reaches its end).

A transaction's outcome is what the client was told: committed when commit_transaction returned, aborted when
abort_transaction did (on purpose, or after an abortable error a fault caused). A commit that failed and then an
abort that succeeded is an abort: were the commit stored, the coordinator would have refused the abort."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from integration.txn_clients import (CK_THROUGH_FAULTS, READ_COMMITTED, READ_UNCOMMITTED, ck_abort, ck_commit,
                                     ck_read_to_end)
from integration.waiting import wait_until

RECORDS_PER_TXN = 8  # spread over the partitions
ABORT_SHARE = 0.2
TXN_TIMEOUT_MS = 30_000
GAP_S = 0.05  # between transactions: the transactional producer is one load among several
STABLE_S = 60  # after the producer stops, for every partition's last stable offset to reach its end


def transactional_id(topic: str) -> str:
    """The transactional producer's id for `topic` (a deployment picks the broker coordinating it as a victim)."""
    return f"{topic}-writer"


@dataclass
class TxnLog:
    committed: list[list[bytes]] = field(default_factory=list)
    aborted: list[list[bytes]] = field(default_factory=list)
    aborted_by_fault: int = 0  # of the aborted: those a fault made abortable, not the ones aborted on purpose


class TransactionalProducer(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, partitions: int, seed: int) -> None:
        super().__init__(name="producer-txn", daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.rng = random.Random(seed)
        self.log = TxnLog()
        self.error: BaseException | None = None
        self._stop_asked = threading.Event()

    def stop(self) -> None:
        self._stop_asked.set()

    def run(self) -> None:
        try:
            self.produce()
        except BaseException as exc:  # noqa: BLE001 - reported by the verdict
            self.error = exc

    def produce(self) -> None:
        from confluent_kafka import KafkaException, Producer
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": transactional_id(self.topic),
                             "linger.ms": 5, "transaction.timeout.ms": TXN_TIMEOUT_MS, **CK_THROUGH_FAULTS})
        producer.init_transactions(60)
        number = 0
        while not self._stop_asked.wait(GAP_S):
            values = [f"txn-{number}-{j}".encode() for j in range(RECORDS_PER_TXN)]
            number += 1
            abort = self.rng.random() < ABORT_SHARE
            try:
                producer.begin_transaction()
                for j, value in enumerate(values):
                    producer.produce(self.topic, value, partition=j % self.partitions)
                producer.flush(30)  # stored before the outcome, so an aborted transaction leaves records behind
                if not abort:
                    ck_commit(producer)
                    self.log.committed.append(values)
                    continue
            except KafkaException as failed:
                # librdkafka's contract: abort only what it says needs an abort. A fatal error, or a commit still
                # unresolved after ck_commit's retries (whose outcome is unknown, and which librdkafka refuses to
                # abort: _CONFLICT), ends the producer and is reported.
                if not failed.args[0].txn_requires_abort():
                    raise
                self.log.aborted_by_fault += 1
            ck_abort(producer)
            self.log.aborted.append(values)


@dataclass(frozen=True, slots=True)
class TxnVerdict:
    committed: int
    aborted: int
    aborted_by_fault: int
    missing: int  # records of committed transactions a read_committed reader never got
    duplicated: int  # records it got more than once
    aborted_visible: int  # records of aborted transactions it got
    foreign: int  # records of no transaction the producer knows
    aborted_stored: int  # control: records of aborted transactions a read_uncommitted reader gets
    hanging: dict[int, tuple[int, int]]  # partition: (last stable offset, end) still apart
    producer_error: str | None
    where: str = ""  # the cluster read, where there are several
    replica: bool = False  # read in a cluster the transactions were replicated to: no aborted record stored there

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.aborted_visible or self.foreign or self.hanging
                    or self.producer_error or (self.replica and self.aborted_stored))

    def summary(self) -> str:
        return (f"{'transactions' + self.where:<19} {'ok  ' if self.ok else 'FAIL'} committed={self.committed} "
                f"aborted={self.aborted} (by faults {self.aborted_by_fault}) missing={self.missing} "
                f"duplicated={self.duplicated} aborted_visible={self.aborted_visible} foreign={self.foreign} "
                f"aborted_stored={self.aborted_stored} hanging={self.hanging}"
                + (f" producer_error={self.producer_error}" if self.producer_error else ""))


def judge_transactions(producer: TransactionalProducer, offsets: Callable[..., dict[int, int]],
                       bootstrap: str, where: str = "", replica: bool = False) -> TxnVerdict:
    """After the producer stopped: wait for the last stable offsets to reach the ends, then read both ways.
    offsets(topic, partitions, committed=False): the ends (or last stable offsets) as the deployment reads them."""
    partitions = range(producer.partitions)

    def apart() -> dict[int, tuple[int, int]]:
        ends = offsets(producer.topic, partitions)
        stable = offsets(producer.topic, partitions, committed=True)
        return {p: (stable[p], ends[p]) for p in partitions if stable[p] < ends[p]}

    wait_until(lambda: not apart(), timeout=STABLE_S, interval=0.5)
    hanging = apart()
    committed = Counter(value for _, _, value in ck_read_to_end(bootstrap, producer.topic, partitions,
                                                                READ_COMMITTED, timeout=60))
    uncommitted = {value for _, _, value in ck_read_to_end(bootstrap, producer.topic, partitions,
                                                           READ_UNCOMMITTED, timeout=60)}
    log = producer.log
    wanted = {v for values in log.committed for v in values}
    aborted = {v for values in log.aborted for v in values}
    return TxnVerdict(
        committed=len(log.committed), aborted=len(log.aborted), aborted_by_fault=log.aborted_by_fault,
        missing=len(wanted - committed.keys()), duplicated=sum(n - 1 for n in committed.values()),
        aborted_visible=len(aborted & committed.keys()), foreign=len(committed.keys() - wanted - aborted),
        aborted_stored=len(aborted & uncommitted), hanging=hanging,
        producer_error=None if producer.error is None else repr(producer.error), where=where,
        replica=replica)
