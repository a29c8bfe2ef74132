"""An outbox in a Python object: the Store protocol for unit tests, with no file and no database.

:class:`MemoryOutbox` keeps the same rules as the SQLite outbox (leases,
fencing by claim token, horizon anchors, due times, tombstones, operator
moves) in plain dictionaries behind one lock. Every call is atomic: a call
that raises changes nothing. Records handed out are frozen and share no
mutable state with the store.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .._engine import CLOCK_TOLERANCE
from .._exceptions import IntentConflict
from .._intent import TERMINAL, IntentRecord, Outcome, State, StoredResponse, operator_move
from .base import AttemptRecord, Lease, NewIntent, Opened
from .rows import _pairs, export_rows

__all__ = ["MemoryOutbox"]

_MISSING: Any = object()


def _real(value: float | None) -> float | None:
    """A time as a REAL column keeps it: a float, or None."""
    return None if value is None else float(value)


def _stored(response: StoredResponse | None) -> StoredResponse | None:
    """A response as the SQLite outbox reads it back (headers through JSON, flags as ints)."""
    if response is None:
        return None
    return StoredResponse(
        status=int(response.status),
        headers=_pairs(json.dumps(response.headers)),
        body=bytes(response.body or b""),
        truncated=bool(int(response.truncated)),
        sha256=str(response.sha256 or ""),
    )


@dataclass(frozen=True, slots=True)
class _Attempt:
    number: int
    attempt: AttemptRecord
    owner: str


@dataclass(frozen=True, slots=True)
class _Row:
    """One intent: the record the shells read, plus what only the store sees."""

    record: IntentRecord
    updated_at: float
    claim_token: str | None
    log: tuple[_Attempt, ...]

    def but(self, **changes: Any) -> _Row:
        """This row with record fields (and ``updated_at``/``claim_token``/``log``) changed."""
        own = {
            name: changes.pop(name)
            for name in ("updated_at", "claim_token", "log")
            if name in changes
        }
        record = dataclasses.replace(self.record, **changes) if changes else self.record
        return dataclasses.replace(self, record=record, **own)


class MemoryOutbox:
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
        self._rows: dict[int, _Row] = {}
        self._by_reference: dict[str, int] = {}
        self._by_key: dict[str, int] = {}
        # The highest id in use: a new row takes the next one, as a SQLite rowid
        # does (so the id of a deleted last row is used again).
        self._meta: dict[str, int] = {"top": 0}
        self._journal: list[tuple[MutableMapping[Any, Any], Any, Any]] | None = None

    def __repr__(self) -> str:
        return f"<MemoryOutbox: {len(self._rows)} intents>"

    # -- plumbing ---------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One atomic change: everything it set is undone if it raises."""
        with self._lock:
            if self._journal is not None:  # inside another write: that one undoes
                yield
                return
            self._journal = []
            try:
                yield
            except BaseException:
                for mapping, key, old in reversed(self._journal):
                    if old is _MISSING:
                        mapping.pop(key, None)
                    else:
                        mapping[key] = old
                raise
            finally:
                self._journal = None

    def _set(self, mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
        assert self._journal is not None, "a change outside _write"
        self._journal.append((mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def _drop(self, mapping: MutableMapping[Any, Any], key: Any) -> None:
        assert self._journal is not None, "a change outside _write"
        self._journal.append((mapping, key, mapping[key]))
        del mapping[key]

    def _owned(self, lease: Lease) -> _Row | None:
        """The row ``lease`` still owns (its token is the row's claim token), else None."""
        row = self._rows.get(lease.intent_id)
        if row is None or row.claim_token is None or row.claim_token != lease.token:
            return None
        return row

    def run_batch(self, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """Run several store calls under the lock, in order; ``(ok, result or exception)`` each.

        A failing call changes nothing and the batch goes on, as with the
        SQLite outbox's savepoints.
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

    def open_intent(self, new: NewIntent, *, owner: str, now: float, lease_for: float) -> Opened:
        token = os.urandom(12).hex()
        expires = now + lease_for
        with self._write():
            if new.reference in self._by_reference or new.key in self._by_key:
                return self._reopen(new, Lease(0, token, owner, expires), now)
            id_ = self._meta["top"] + 1
            record = IntentRecord(
                id=id_,
                reference=str(new.reference),
                key=str(new.key),
                provider=str(new.provider),
                method=str(new.method),
                url=str(new.url),
                headers=_pairs(json.dumps(new.headers)),
                body=bytes(new.body),
                fingerprint=str(new.fingerprint),
                state=State.SENDING,
                created_at=float(now),
                first_delivery_at=float(now),
                due_at=None,
                deadline_at=_real(new.deadline_at),
                attempts=0,
                last_outcome=None,
                lease_owner=owner,
                lease_expires_at=_real(expires),
                response=None,
                note=None,
            )
            self._set(self._rows, id_, _Row(record, float(now), token, ()))
            self._set(self._by_reference, record.reference, id_)
            self._set(self._by_key, record.key, id_)
            self._set(self._meta, "top", id_)
            return Opened(
                record,
                Lease(id_, token, owner, expires),
                created=True,
                conflict=None,
                anchor_before=None,
            )

    def _reopen(self, new: NewIntent, lease: Lease, now: float) -> Opened:
        found = self._by_reference.get(new.reference)
        if found is None:  # not this reference: the key belongs to another intent
            raise IntentConflict(
                "this key already belongs to another intent", reference=new.reference, key=new.key
            )
        row = self._rows[found]
        record = row.record
        conflict = None
        if record.fingerprint != new.fingerprint:
            conflict = "it is stored with a different request (method, path, query or body)"
        elif new.key_given and record.key != new.key:
            conflict = "it is stored with a different key"
        free = record.lease_expires_at is None or record.lease_expires_at <= now
        if conflict or record.state in TERMINAL or not free:
            return Opened(
                record,
                None,
                created=False,
                conflict=conflict,
                anchor_before=record.first_delivery_at,
            )
        anchor = record.first_delivery_at if record.first_delivery_at is not None else now
        claimed = row.but(
            state=State.SENDING,
            lease_owner=lease.owner,
            lease_expires_at=_real(lease.expires_at),
            claim_token=lease.token,
            first_delivery_at=_real(anchor),
            updated_at=float(now),
        )
        self._set(self._rows, record.id, claimed)
        return Opened(
            claimed.record,
            Lease(record.id, lease.token, lease.owner, lease.expires_at),
            created=False,
            conflict=None,
            anchor_before=record.first_delivery_at,
        )

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
    ) -> bool:
        keep = lease_until is not None
        with self._write():
            row = self._owned(lease)
            if row is None:
                return False
            number = row.record.attempts + 1
            kept = AttemptRecord(
                started_at=float(attempt.started_at),
                duration=float(attempt.duration),
                outcome=Outcome(attempt.outcome.value),
                status=attempt.status,
                error_type=attempt.error_type,
                replayed=bool(int(attempt.replayed)),
            )
            changes: dict[str, Any] = {
                "state": State(state.value),
                "attempts": number,
                "last_outcome": kept.outcome,
                "first_delivery_at": _real(anchor),
                "due_at": _real(due_at),
                "lease_owner": lease.owner if keep else None,
                "lease_expires_at": _real(lease_until),
                "claim_token": lease.token if keep else None,
                "updated_at": float(attempt.started_at + attempt.duration),
                "note": row.record.note if note is None else note,
                "log": (*row.log, _Attempt(number, kept, lease.owner)),
            }
            if response is not None:
                changes["response"] = _stored(response)
            self._set(self._rows, row.record.id, row.but(**changes))
            return True

    def renew(self, lease: Lease, *, now: float, until: float) -> Lease | None:
        with self._write():
            row = self._owned(lease)
            if row is None:
                return None
            self._set(
                self._rows,
                row.record.id,
                row.but(lease_expires_at=_real(until), updated_at=float(now)),
            )
        return Lease(lease.intent_id, lease.token, lease.owner, until)

    def release(
        self, lease: Lease, *, now: float, due_at: float | None, anchor: float | None
    ) -> bool:
        """Hand an unsent claim back: pending, due at ``due_at`` (default now).

        ``anchor`` restores the horizon anchor the claim found: a claim that
        sent nothing must not start the horizon.
        """
        with self._write():
            row = self._owned(lease)
            if row is None:
                return False
            released = row.but(
                state=State.PENDING,
                due_at=_real(now if due_at is None else due_at),
                first_delivery_at=_real(anchor),
                lease_owner=None,
                lease_expires_at=None,
                claim_token=None,
                updated_at=float(now),
            )
            self._set(self._rows, row.record.id, released)
            return True

    def settle(self, lease: Lease, *, now: float, state: State, note: str) -> bool:
        with self._write():
            row = self._owned(lease)
            if row is None:
                return False
            settled = row.but(
                state=State(state.value),
                note=note,
                due_at=None,
                lease_owner=None,
                lease_expires_at=None,
                claim_token=None,
                updated_at=float(now),
            )
            self._set(self._rows, row.record.id, settled)
            return True

    def claim_due(
        self,
        *,
        owner: str,
        now: float,
        limit: int,
        lease_for: float,
        due_by: float | None = None,
    ) -> list[Opened]:
        """Atomically lease up to ``limit`` intents that are due and not leased.

        Due means: pending with ``due_at <= due_by`` (default: now), or sending
        under a lease that expired by then (its owner died), or pending but
        touched in the future (a clock that went back). Oldest due first.
        """
        expires = now + lease_for
        due_by = now if due_by is None else min(due_by, now)
        claimed: list[Opened] = []
        with self._write():
            due = [row for row in self._rows.values() if self._due(row, due_by, now)]

            def order(row: _Row) -> tuple[bool, float, int]:
                # When it became due (a sending row's lease expiry, else its due
                # time), then id; NULL first, as SQLite sorts it (WAKE_ORDER).
                record = row.record
                sending = record.state is State.SENDING
                when = record.lease_expires_at if sending else record.due_at
                return (when is not None, 0.0 if when is None else when, record.id)

            due.sort(key=order)
            if limit >= 0:
                due = due[:limit]
            for row in due:
                record = row.record
                token = os.urandom(12).hex()
                anchor = record.first_delivery_at if record.delivered_maybe else now
                taken = row.but(
                    state=State.SENDING,
                    lease_owner=owner,
                    lease_expires_at=_real(expires),
                    claim_token=token,
                    first_delivery_at=_real(anchor),
                    updated_at=float(now),
                )
                self._set(self._rows, record.id, taken)
                claimed.append(
                    Opened(
                        taken.record,
                        Lease(record.id, token, owner, expires),
                        created=False,
                        conflict=None,
                        anchor_before=record.first_delivery_at,
                    )
                )
        return claimed

    @staticmethod
    def _due(row: _Row, due_by: float, now: float) -> bool:
        record = row.record
        if record.state is State.PENDING:
            if record.due_at is not None and record.due_at <= due_by:
                return True
            # A clock that went back leaves due times far ahead: pending rows
            # touched "in the future" are due now (a live lease is never cut short).
            return row.updated_at > now + CLOCK_TOLERANCE
        if record.state is State.SENDING:
            return record.lease_expires_at is not None and record.lease_expires_at <= due_by
        return False

    def get(self, reference: str) -> IntentRecord | None:
        with self._lock:
            found = self._by_reference.get(reference)
            return None if found is None else self._rows[found].record

    def attempts(self, reference: str) -> list[AttemptRecord]:
        with self._lock:
            found = self._by_reference.get(reference)
            if found is None:
                return []
            log = sorted(self._rows[found].log, key=lambda a: a.number)
        return [a.attempt for a in log]

    def list_intents(
        self, *, state: State | None = None, limit: int | None = None
    ) -> list[IntentRecord]:
        """Intents, newest first, optionally of one state."""
        with self._lock:
            rows = sorted(self._rows.values(), key=lambda r: r.record.id, reverse=True)
        found = [r.record for r in rows if state is None or r.record.state.value == state.value]
        if limit is not None and limit >= 0:
            found = found[:limit]
        return found

    def stats(self, *, now: float) -> dict[str, Any]:
        """Counts per state, the oldest pending intent, the next due time, expired ones."""
        with self._lock:
            records = [row.record for row in self._rows.values()]
        counts = {state.value: 0 for state in State}
        for record in records:
            if record.purged_at is None:
                counts[record.state.value] += 1
        pending = [r for r in records if r.state is State.PENDING]
        sending = [r for r in records if r.state is State.SENDING]
        oldest = min((r.created_at for r in pending), default=None)
        next_due = min((r.due_at for r in pending if r.due_at is not None), default=None)
        lease_due = min(
            (r.lease_expires_at for r in sending if r.lease_expires_at is not None), default=None
        )
        due_now = sum(1 for r in pending if r.due_at is not None and r.due_at <= now) + sum(
            1 for r in sending if r.lease_expires_at is not None and r.lease_expires_at <= now
        )
        candidates = [t for t in (next_due, lease_due) if t is not None]
        return {
            "states": counts,
            "due_now": due_now,
            "oldest_pending_created_at": oldest,
            "next_due_at": min(candidates) if candidates else None,
            "expired_needing_attention": counts[State.EXPIRED.value],
            "tombstones": sum(1 for r in records if r.purged_at is not None),
        }

    def operator_move(self, reference: str, to: State, *, now: float, note: str) -> IntentRecord:
        """An operator's cancel or resolve, checked by the life-cycle rules, atomically."""
        with self._write():
            found = self._by_reference.get(reference)
            if found is None:
                raise KeyError(reference)
            row = self._rows[found]
            operator_move(row.record, to, now)
            moved = row.but(
                state=State(to.value),
                note=note,
                due_at=None,
                lease_owner=None,
                lease_expires_at=None,
                claim_token=None,
                updated_at=float(now),
            )
            self._set(self._rows, found, moved)
            return moved.record

    def purge(self, *, before: float, tombstones: bool, now: float) -> int:
        """Forget finished intents last changed before ``before`` (never unresolved expired ones).

        By default each keeps a tombstone (reference, key, fingerprint, state),
        so the same reference is never executed again; ``tombstones=True``
        deletes tombstones of that age instead.
        """
        with self._write():
            if tombstones:
                gone = [
                    row.record
                    for row in self._rows.values()
                    if row.record.purged_at is not None and row.record.purged_at < before
                ]
                for record in gone:
                    self._drop(self._rows, record.id)
                    self._drop(self._by_reference, record.reference)
                    self._drop(self._by_key, record.key)
                self._set(self._meta, "top", max(self._rows, default=0))
                return len(gone)
            # An expired intent stays until a person resolves it: purging it would
            # hide it from the "needs attention" count.
            finished = [
                row
                for row in self._rows.values()
                if row.record.state in TERMINAL
                and row.record.state is not State.EXPIRED
                and row.updated_at < before
                and row.record.purged_at is None
            ]
            for row in finished:
                kept = row.record.response
                if kept is not None:
                    kept = dataclasses.replace(kept, headers=(), body=b"")
                self._set(
                    self._rows,
                    row.record.id,
                    row.but(body=b"", headers=(), response=kept, purged_at=float(now), log=()),
                )
            return len(finished)

    def export_rows(self) -> Iterator[dict[str, Any]]:
        """Every intent with its attempts, as plain data (one consistent snapshot)."""
        with self._lock:
            return iter(list(export_rows(self)))

    def close(self) -> None:
        """Nothing to close: the data stays for as long as this object lives."""
