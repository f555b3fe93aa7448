"""Managed-ledger failures, raised inside storage and mapped to Kafka error codes at the handler boundary."""


class ManagedLedgerError(Exception):
    """Base class of storage failures."""


class LedgerWriteError(ManagedLedgerError):
    """A write or fsync failed: the entry is not durable and the ledger was rolled."""


class LedgerFencedError(ManagedLedgerError):
    """The ledger is recovering from a failed write; retry shortly."""


class LedgerFencedOut(ManagedLedgerError):
    """Another owner opened the managed ledger since, or this broker's lease expired: it may not write to it."""


class LedgerClosedError(ManagedLedgerError):
    """The managed ledger was closed or deleted."""


class InvalidMarkDeleteError(ManagedLedgerError):
    """A mark-delete position moves backwards or past the last confirmed entry."""


class CursorNotFoundError(ManagedLedgerError):
    """No cursor of that name."""
