"""What every outbox backend offers the shells, and the records it trades in.

A store is a ledger with leases. It decides nothing about delivery: the
engine does. Its one job is to make each of these moves atomic and durable:

* ``open_intent`` — the write-ahead: create the intent, or find it, and take
  its lease, in one transaction that is committed before any send;
* ``record`` — one attempt and the state it leads to, accepted only while the
  caller's lease token still owns the row (fencing);
* ``renew``, ``release``, ``settle`` — lease upkeep and terminal moves
  without a send.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any, Literal, NamedTuple, Protocol

from .._intent import (
    FOREIGN_SHOWN,
    AttemptRecord,
    Census,
    Foreign,
    IntentRecord,
    Lease,
    NewIntent,
    Opened,
    Purged,
    State,
    StoredResponse,
)

__all__ = [
    "FOREIGN_SHOWN",
    "AttemptRecord",
    "Census",
    "Foreign",
    "Lease",
    "NewIntent",
    "Opened",
    "Purged",
    "Store",
    "Target",
    "run_calls",
]


class Target(NamedTuple):
    """Where an outbox keeps its intents, as an application's own connection must see it.

    ``client.enqueue`` writes there through the application's connection,
    in the application's transaction (``postonce._appdb``).
    """

    dialect: Literal["sqlite", "postgres"]
    table: str  # the intents table, quoted where it needs to be
    database: str  # SQLite: the file's path; PostgreSQL: the database's name
    channel: str | None = None  # PostgreSQL: NOTIFY'd at commit, to wake a drain


class Store(Protocol):
    """One implementation per backend; a blocking API the shells call."""

    def open_intent(
        self,
        new: NewIntent,
        *,
        owner: str,
        now: float,
        lease_for: float,
        alive: Callable[[str], bool] = ...,
    ) -> Opened: ...

    def record(
        self,
        lease: Lease,
        attempt: AttemptRecord,
        *,
        state: State,
        anchor: float | None,
        due_at: float | None,
        lease_until: float | None,
        response: StoredResponse | None,
        note: str | None,
        durable: bool,
        settle_hold: float | None = None,
    ) -> bool: ...

    def renew(self, lease: Lease, *, now: float, until: float) -> Lease | None: ...

    def release(
        self, lease: Lease, *, now: float, due_at: float | None, anchor: float | None
    ) -> bool: ...

    def settle(
        self,
        lease: Lease,
        *,
        now: float,
        state: State,
        note: str,
        settle_hold: float | None = None,
    ) -> bool: ...

    def claim_settlements(
        self,
        *,
        sender: str,
        now: float,
        limit: int,
        hold: float,
        origins: Collection[str] | None = None,
    ) -> list[IntentRecord]: ...

    def take_settlement(
        self, *, intent_id: int, owed_at: float, now: float, hold: float
    ) -> float | None: ...

    def settlement_done(self, *, intent_id: int, now: float, owed_at: float) -> bool: ...

    def settlement_failed(
        self, *, intent_id: int, error: str, retry_at: float, owed_at: float
    ) -> bool: ...

    def claim_expired(
        self,
        *,
        sender: str,
        now: float,
        limit: int,
        every: float,
        origins: Collection[str] | None = None,
    ) -> list[IntentRecord]: ...

    def wait_change(self, intent_id: int, timeout: float) -> None: ...

    def claim_due(
        self,
        *,
        owner: str,
        now: float,
        limit: int,
        lease_for: float,
        due_by: float | None = None,
        sender: str | None = None,
        origins: Collection[str] | None = None,
        alive: Callable[[str], bool] = ...,
    ) -> list[Opened]: ...

    def adopt(
        self,
        *,
        sender: str,
        origins: Collection[str] | None,
        previous: str | None = None,
        unfinished: bool = False,
    ) -> int: ...

    def census(self, *, sender: str, origins: Collection[str] | None, now: float) -> Census: ...

    def get(self, reference: str) -> IntentRecord | None: ...

    def get_by_key(self, key: str) -> IntentRecord | None:
        """The intent whose idempotency key is ``key``, or None."""
        ...

    def attempts(self, reference: str) -> list[AttemptRecord]:
        """Every attempt of the intent, oldest first; [] for an unknown reference.

        A first attempt that ended the intent with a stored answer is kept by the
        intent row, not in the attempts table (``decide.carried``): it is read
        back from the row, its start being the write-ahead's time.
        """
        ...

    def list_intents(
        self, *, state: State | None = None, limit: int | None = None
    ) -> list[IntentRecord]: ...

    def stats(self, *, now: float) -> dict[str, Any]: ...

    def operator_move(
        self,
        reference: str,
        to: State,
        *,
        now: float,
        note: str,
        settle_hold: float | None = None,
    ) -> IntentRecord: ...

    def purge(self, *, before: float, tombstones: bool, now: float) -> int:
        """Forget succeeded, failed and cancelled intents last changed before ``before``.

        Each keeps a tombstone; ``tombstones=True`` deletes tombstones purged
        before ``before`` instead. Never purges an expired or indeterminate
        intent (``decide.PURGEABLE``), nor one whose settlement is still owed
        (``settle_due_at`` set): its handler has not heard of it yet. Returns
        how many were purged, as a :class:`Purged` whose ``kept_owed`` counts
        those of that age kept for an owed settlement (a plain ``int`` is
        accepted from a custom store: the CLI then does not say).
        """
        ...

    def export_rows(self) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


def run_calls(store: Store, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
    """Run store calls in one transaction where the store can (``run_batch``), else one by one.

    Returns ``(ok, result or exception)`` per call; never raises.
    """
    batch = getattr(store, "run_batch", None)
    if batch is not None:
        try:
            results: list[tuple[bool, Any]] = batch(calls)
        except Exception as exc:
            return [(False, exc)] * len(calls)
        return results
    results = []
    for method, kwargs in calls:
        try:
            results.append((True, getattr(store, method)(**kwargs)))
        except Exception as exc:
            results.append((False, exc))
    return results
