"""The PostgreSQL managed-ledger engine (`kop standalone --storage postgresql://...`)."""
from kop.ledger.postgres.ledger import PgManagedLedger
from kop.ledger.postgres.store import LedgerFencedOut, PgStore

__all__ = ["LedgerFencedOut", "PgManagedLedger", "PgStore"]
