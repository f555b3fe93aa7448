"""Managed ledgers: Pulsar-style partition storage (ledgers of entries, cursors with properties)."""
from kop.ledger.errors import (CursorNotFoundError, InvalidMarkDeleteError, LedgerClosedError, LedgerFencedError,
                               LedgerFencedOut, LedgerWriteError, ManagedLedgerError)
from kop.ledger.file_ledger import FileManagedLedger
from kop.ledger.interface import Entry, ManagedLedger, TrimResult
from kop.ledger.ledger_base import LedgerConfig
from kop.ledger.position import BEFORE_FIRST, Position

__all__ = ["BEFORE_FIRST", "CursorNotFoundError", "Entry", "FileManagedLedger", "InvalidMarkDeleteError",
           "LedgerClosedError", "LedgerConfig", "LedgerFencedError", "LedgerFencedOut", "LedgerWriteError",
           "ManagedLedger", "ManagedLedgerError", "Position", "TrimResult"]
