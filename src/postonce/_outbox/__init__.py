"""Outbox backends behind one Store protocol."""

from __future__ import annotations

from .base import AttemptRecord, Lease, NewIntent, Opened, Store
from .locate import default_outbox_path, open_store
from .sqlite import SQLiteStore

__all__ = [
    "AttemptRecord",
    "Lease",
    "NewIntent",
    "Opened",
    "SQLiteStore",
    "Store",
    "default_outbox_path",
    "open_store",
]
