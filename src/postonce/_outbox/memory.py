"""An outbox in a Python object: the Store protocol for unit tests, with no file and no database.

:class:`MemoryOutbox` keeps rows of the same columns as the SQL outboxes in
plain dictionaries behind one lock, and changes them with the same decisions
(:mod:`.decide`): leases, fencing by claim token, horizon anchors, due times,
tombstones, operator moves. Every call is atomic: a call that raises changes
nothing. Records handed out are decoded afresh and share no mutable state
with the store.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from .._engine import CLOCK_TOLERANCE
from .._exceptions import IntentConflict
from .._intent import UNRESOLVED, IntentRecord, State
from .._lease import alive as lease_owner_alive
from . import decide
from .base import AttemptRecord, Census, Lease, NewIntent, Opened, Purged
from .rows import COLUMN_NAMES, decode_attempt, decode_row
from .store import Mine, StoreBase, Take

_UNRESOLVED = frozenset(s.value for s in UNRESOLVED)

__all__ = ["MemoryOutbox"]

Row = dict[str, Any]
_ATTEMPT = ("started_at", "duration", "outcome", "status", "error_type", "replayed")


def _decode(row: Row) -> IntentRecord:
    return decode_row(tuple(row.get(column) for column in COLUMN_NAMES))


class MemoryOutbox(StoreBase):
    """An outbox held in memory, for unit tests: no file, no database, nothing to clean up.

    Pass one as ``outbox=`` to :class:`~postonce.Client` or
    :class:`~postonce.AsyncClient`. It follows the SQLite outbox's rules
    exactly, so a test sees the same states, keys, attempts and leases that
    production would. Several clients in one process may share one instance
    (they see each other's intents, as processes sharing a file do); it is
    thread-safe, under one lock.

    Nothing survives the process, and no other process can see it: never use
    it in production, where the outbox exists precisely to survive a crash.
    ``close()`` keeps the data, so a client that closes it (or a test that
    opens the "same" outbox again) still finds every intent.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rows: dict[int, Row] = {}  # id -> columns; replaced, never changed in place
        self._attempts: dict[int, tuple[Row, ...]] = {}
        self._by_reference: dict[str, int] = {}
        self._by_key: dict[str, int] = {}
        self._depth = 0

    def __repr__(self) -> str:
        return f"<MemoryOutbox: {len(self._rows)} intents>"

    # -- plumbing ---------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One atomic change: the tables as they were come back if it raises.

        A shallow copy per write: rows are never changed in place, so the copy
        is a consistent snapshot. Linear in the rows, which a unit test keeps few.
        """
        with self._lock:
            if self._depth:  # inside another write: that one undoes
                yield
                return
            before = (dict(self._rows), dict(self._attempts))
            keys = (dict(self._by_reference), dict(self._by_key))
            self._depth += 1
            try:
                yield
            except BaseException:
                self._rows, self._attempts = before
                self._by_reference, self._by_key = keys
                raise
            finally:
                self._depth -= 1

    def _change(self, intent_id: int, changes: decide.Changes) -> None:
        self._rows[intent_id] = {**self._rows[intent_id], **changes}

    def _owned(self, lease: Lease) -> Row | None:
        """The row ``lease`` still owns (its token is the row's claim token), else None."""
        row = self._rows.get(lease.intent_id)
        if row is None or row.get("claim_token") is None or row["claim_token"] != lease.token:
            return None
        return row

    def _fenced(self, lease: Lease, changes: decide.Changes, *, durable: bool) -> bool:
        with self._write():
            if self._owned(lease) is None:
                return False
            self._change(lease.intent_id, changes)
            return True

    def _extend(self, lease: Lease, now: float, until: float) -> float | None:
        with self._write():
            row = self._owned(lease)
            if row is None:
                return None
            expires = max(float(row.get("lease_expires_at") or 0.0), until)
            self._change(lease.intent_id, {"lease_expires_at": expires, "updated_at": now})
            return expires

    def _record(
        self, lease: Lease, attempt: AttemptRecord, changes: decide.Changes, *, durable: bool
    ) -> bool:
        with self._write():
            row = self._owned(lease)
            if row is None:
                return False
            number = int(row["attempts"]) + 1
            self._change(lease.intent_id, {**changes, "attempts": number})
            logged = decide.attempt_row(
                lease, number, attempt, changes, carry=self.carries_first_attempt
            )
            if logged is not None:
                self._attempts[lease.intent_id] += (logged,)
            return True

    def _take_rows(
        self, kind: str, *, mine: Mine, now: float, limit: int, changes: decide.Changes
    ) -> list[IntentRecord]:
        with self._write():
            if kind == "settle":
                rows = [
                    r
                    for r in self._rows.values()
                    if (r.get("settle_due_at") or now + 1) <= now
                    and mine.admits(r["sender"], r["origin"])
                ]
                rows.sort(key=lambda r: (r["settle_due_at"], r["id"]))
            else:
                rows = [
                    r
                    for r in self._rows.values()
                    if r["state"] in _UNRESOLVED
                    and mine.admits(r["sender"], r["origin"])
                    and (r.get("reconcile_at") is None or r["reconcile_at"] <= now)
                ]
                rows.sort(key=lambda r: int(r["id"]))
            taken = [_decode(r) for r in rows[:limit]]
            for record in taken:
                self._change(record.id, changes)
        return taken

    def _change_row(
        self, intent_id: int, changes: decide.Changes, *, bump: str | None, owed_at: float
    ) -> bool:
        with self._write():
            row = self._rows.get(intent_id)
            if row is None or row.get("settle_due_at") != owed_at:
                return False
            extra = {bump: int(row.get(bump) or 0) + 1} if bump is not None else {}
            self._change(intent_id, {**changes, **extra})
            return True

    def _token(self) -> str:
        # Minted here, through this module's ``os``, so a test can make it fail mid-claim.
        return os.urandom(12).hex()

    def _claim(
        self, *, due_by: float, now: float, limit: int, take: Take, mine: Mine
    ) -> list[Opened]:
        claimed: list[Opened] = []
        with self._write():
            due = [
                row
                for row in self._rows.values()
                if mine.admits(row["sender"], row["origin"])
                and (self._due(row, due_by, now) or self._orphaned(row, mine))
            ]
            due.sort(key=self._wake_order)
            for row in due[:limit] if limit >= 0 else due:
                opened, changes = take(_decode(row))
                self._change(opened.record.id, changes)
                claimed.append(opened)
        return claimed

    @staticmethod
    def _wake_order(row: Row) -> tuple[bool, float, int]:
        # When it became due (a sending row's lease expiry, else its due time),
        # then id; NULL first, as SQLite sorts it (WAKE_ORDER).
        sending = row["state"] == State.SENDING.value
        when = row.get("lease_expires_at") if sending else row.get("due_at")
        return (when is not None, 0.0 if when is None else when, row["id"])

    @staticmethod
    def _orphaned(row: Row, mine: Mine) -> bool:
        return row["state"] == State.SENDING.value and row.get("lease_owner") in mine.dead

    def _holders(self, now: float, mine: Mine) -> list[str]:
        with self._lock:
            return sorted(
                {
                    row["lease_owner"]
                    for row in self._rows.values()
                    if row["state"] == State.SENDING.value
                    and (row.get("lease_expires_at") or 0.0) > now
                    and mine.admits(row["sender"], row["origin"])
                }
            )

    @staticmethod
    def _due(row: Row, due_by: float, now: float) -> bool:
        state, due_at, expires = row["state"], row.get("due_at"), row.get("lease_expires_at")
        if state == State.PENDING.value:
            # A clock that went back leaves due times far ahead: pending rows
            # touched "in the future" are due now (a live lease is never cut short).
            late = row["updated_at"] > now + CLOCK_TOLERANCE
            return late or (due_at is not None and due_at <= due_by)
        if state == State.SENDING.value:
            return expires is not None and expires <= due_by
        return False

    def _unowned(
        self, previous: str | None, unfinished: bool = False
    ) -> list[tuple[int, str, str | None]]:
        open_states = (State.PENDING.value, State.SENDING.value)
        with self._lock:
            rows = [
                r
                for r in self._rows.values()
                if r["sender"] == previous and (not unfinished or r["state"] in open_states)
            ]
        return [(r["id"], r["url"], r["origin"]) for r in rows]

    def _assign(self, changes: list[tuple[int, decide.Changes]], previous: str | None) -> int:
        adopted = 0
        with self._write():
            for intent_id, change in changes:
                if self._rows[intent_id]["sender"] == previous:
                    self._change(intent_id, change)
                    adopted += "sender" in change
        return adopted

    def census(self, *, sender: str, origins: Collection[str] | None, now: float) -> Census:
        """Due intents this sender may not send, and its intents other owners hold now."""
        mine = Mine(sender, None if origins is None else tuple(origins))
        return decide.census_of(self._records(), now, mine.admits, mine.origins)

    def run_batch(self, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """Run several store calls under the lock, in order; ``(ok, result or exception)`` each.

        A failing call changes nothing and the batch goes on, as with the
        SQL outboxes' savepoints.
        """
        results: list[tuple[bool, Any]] = []
        with self._lock:
            for method, kwargs in calls:
                try:
                    with self._write():
                        results.append((True, getattr(self, method)(**kwargs)))
                except Exception as exc:
                    results.append((False, exc))
        return results

    # -- the Store protocol -----------------------------------------------

    def open_intent(
        self,
        new: NewIntent,
        *,
        owner: str,
        now: float,
        lease_for: float,
        alive: Callable[[str], bool] = lease_owner_alive,
    ) -> Opened:
        lease = Lease(0, self._token(), owner, now + lease_for)
        with self._write():
            found = self._by_reference.get(new.reference)
            if found is not None:
                record = _decode(self._rows[found])
                opened, changes = decide.reopened(record, new, lease, now, alive)
                if changes is not None:
                    self._change(found, changes)
                return opened
            if new.key in self._by_key:  # not this reference: the key belongs to another intent
                raise IntentConflict(decide.KEY_TAKEN, reference=new.reference, key=new.key)
            # The next id after the highest in use, as a SQLite rowid takes it.
            id_ = max(self._rows, default=0) + 1
            self._rows[id_] = {"id": id_, **decide.insert_row(new, lease, now)}
            self._attempts[id_] = ()
            self._by_reference[new.reference] = self._by_key[new.key] = id_
            return decide.created(new, id_, lease, now)

    def get(self, reference: str) -> IntentRecord | None:
        with self._lock:
            found = self._by_reference.get(reference)
            return None if found is None else _decode(self._rows[found])

    def get_by_key(self, key: str) -> IntentRecord | None:
        with self._lock:
            for row in self._rows.values():
                if row["key"] == key:
                    return _decode(row)
            return None

    def attempts(self, reference: str) -> list[AttemptRecord]:
        with self._lock:
            found = self._by_reference.get(reference)
            if found is None:
                return []
            log, row = self._attempts[found], self._rows[found]
        if log:
            return [decode_attempt(tuple(a[c] for c in _ATTEMPT)) for a in log]
        return decide.carried_attempts(
            row["state"],
            row["attempts"],
            row.get("first_delivery_at"),
            row["updated_at"],
            row.get("last_outcome"),
            row.get("response_status"),
            row.get("purged_at"),
        )

    def list_intents(
        self, *, state: State | None = None, limit: int | None = None
    ) -> list[IntentRecord]:
        """Intents, newest first, optionally of one state."""
        with self._lock:
            rows = [self._rows[i] for i in sorted(self._rows, reverse=True)]
        found = [_decode(r) for r in rows if state is None or r["state"] == state.value]
        return found[:limit] if limit is not None and limit >= 0 else found

    def stats(self, *, now: float) -> dict[str, Any]:
        """Counts per state, the oldest pending intent, the next due time, expired ones."""
        return decide.stats_of(self._records(), now)

    def _records(self) -> list[IntentRecord]:
        with self._lock:
            return [_decode(row) for row in self._rows.values()]

    def operator_move(
        self,
        reference: str,
        to: State,
        *,
        now: float,
        note: str,
        settle_hold: float | None = None,
    ) -> IntentRecord:
        """An operator's cancel or resolve, checked by the life-cycle rules, atomically."""
        with self._write():
            found = self._by_reference.get(reference)
            if found is None:
                raise KeyError(reference)
            record = _decode(self._rows[found])
            after, changes = decide.moved(record, to, now, note, settle_hold)
            self._change(found, changes)
            return after

    def purge(self, *, before: float, tombstones: bool, now: float) -> Purged:
        """Forget finished intents last changed before ``before``; see ``Store.purge``.

        By default each keeps a tombstone (reference, key, fingerprint, state),
        so the same reference is never executed again; ``tombstones=True``
        deletes tombstones of that age instead. Expired and indeterminate
        intents, and any whose settlement is still owed, are kept.
        """
        with self._write():
            if tombstones:
                aged = [r for r in self._rows.values() if (r.get("purged_at") or before) < before]
            else:
                aged = [
                    r
                    for r in self._rows.values()
                    if r["state"] in decide.PURGEABLE
                    and r["updated_at"] < before
                    and r.get("purged_at") is None
                ]
            # A row whose settlement is owed keeps its answer until its handler has it.
            gone = [r for r in aged if r.get("settle_due_at") is None]
            kept = len(aged) - len(gone)
            for row in gone:
                if tombstones:
                    del self._rows[row["id"]], self._attempts[row["id"]]
                    del self._by_reference[row["reference"]], self._by_key[row["key"]]
                else:
                    self._change(row["id"], decide.purged(now))
                    self._attempts[row["id"]] = ()
            return Purged(len(gone), kept)

    def export_rows(self) -> Iterator[dict[str, Any]]:
        """Every intent with its attempts, as plain data (one consistent snapshot)."""
        with self._lock:
            return iter(list(super().export_rows()))

    def close(self) -> None:
        """Nothing to close: the data stays for as long as this object lives."""
