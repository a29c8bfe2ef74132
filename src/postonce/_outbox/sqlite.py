"""The SQLite outbox: one file that every process on a host can share.

WAL mode, a busy timeout, and ``BEGIN IMMEDIATE`` for every write, so claims
are atomic across processes. The write-ahead commit (``open_intent``) is
durable across power loss by default (``synchronous=FULL``). Later commits
relax to ``NORMAL`` only where losing them to a power cut is safe: a lost
retry or success record leaves the intent ``sending`` under an expiring lease,
and the drain re-sends the same key and gets the provider's replay. A final
non-2xx answer or a terminal move without one is committed durably, because
not every provider replays those. Either way, an application crash loses no
committed transaction in WAL mode; only the power-loss window differs.

The schema is created and migrated with sqlite-utils; the version lives in
``PRAGMA user_version``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import sqlite_utils

from .._engine import CLOCK_TOLERANCE
from .._exceptions import IntentConflict, OutboxError
from .._intent import TERMINAL, IntentRecord, Outcome, State, StoredResponse, operator_move
from .base import AttemptRecord, Lease, NewIntent, Opened
from .rows import COLUMNS, decode_row, export_rows, needs_durable

__all__ = ["SCHEMA_VERSION", "WAKE_ORDER", "SQLiteStore"]

#: The order of due intents in a claim: when each became due (a pending row's
#: due time, a sending row's lease expiry), then id.
WAKE_ORDER = "CASE WHEN state = 'sending' THEN lease_expires_at ELSE due_at END, id"


Durability = Literal["full", "normal"]


def _v1(db: sqlite_utils.Database) -> None:
    db.table("intents").create(
        {
            "id": int,
            "reference": str,
            "key": str,
            "provider": str,
            "method": str,
            "url": str,
            "headers": str,  # JSON list of [name, value]; never a secret header
            "body": bytes,
            "fingerprint": str,
            "state": str,
            "created_at": float,
            "updated_at": float,
            "first_delivery_at": float,  # retry-horizon anchor; NULL while never sent
            "due_at": float,
            "deadline_at": float,
            "attempts": int,
            "last_outcome": str,
            "lease_owner": str,
            "lease_expires_at": float,
            "claim_token": str,
            "response_status": int,
            "response_headers": str,
            "response_body": bytes,
            "response_truncated": int,
            "response_sha256": str,
            "note": str,
            "purged_at": float,  # set when purge keeps only a tombstone
        },
        pk="id",
        not_null=[
            "reference",
            "key",
            "provider",
            "method",
            "url",
            "headers",
            "body",
            "fingerprint",
            "state",
            "created_at",
            "updated_at",
            "attempts",
        ],
        defaults={"attempts": 0},
    )
    db.table("intents").create_index(["reference"], index_name="intents_reference", unique=True)
    db.table("intents").create_index(["key"], index_name="intents_key", unique=True)
    # Partial indexes: only the few rows a claim looks for are in them, so a
    # call that succeeds touches one of them twice (in, then out of "sending")
    # and the claim stays as fast at a million finished rows as at ten thousand.
    # claim_due spells these states as literals so the planner can use them.
    # (purge and stats scan: they are operator commands, not the hot path.)
    db.execute("CREATE INDEX intents_due ON intents (due_at) WHERE state = 'pending'")
    db.execute("CREATE INDEX intents_touched ON intents (updated_at) WHERE state = 'pending'")
    db.execute("CREATE INDEX intents_lease ON intents (lease_expires_at) WHERE state = 'sending'")
    # WITHOUT ROWID, keyed by (intent, number): one B-tree per attempt written,
    # not a table and an index.
    db.execute(
        "CREATE TABLE attempts ("
        " intent_id INTEGER NOT NULL REFERENCES intents (id),"
        " number INTEGER NOT NULL,"
        " started_at FLOAT NOT NULL,"
        " duration FLOAT NOT NULL,"
        " outcome TEXT NOT NULL,"
        " status INTEGER,"
        " error_type TEXT,"
        " replayed INTEGER,"
        " owner TEXT,"
        " PRIMARY KEY (intent_id, number)"
        ") WITHOUT ROWID"
    )


#: MIGRATIONS[n] takes a database at schema version n to n + 1.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1]
SCHEMA_VERSION = len(MIGRATIONS)


def _create_private(path: Path) -> None:
    """Create the outbox file 0600 (and a missing directory 0700) before SQLite opens it."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        return
    os.close(fd)


class SQLiteStore:
    """An outbox in one SQLite file. Thread-safe; shareable between processes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "full",
        busy_timeout: float = 5.0,
        create: bool = True,
    ) -> None:
        if durability not in ("full", "normal"):
            raise ValueError(f"durability must be 'full' or 'normal', not {durability!r}")
        self.path = Path(path)
        self.durability: Durability = durability
        self._lock = threading.RLock()
        self._local = threading.local()
        self._sync: str | None = None
        if not create and not self.path.exists():
            raise OutboxError(f"no outbox at {self.path}")
        try:
            _create_private(self.path)
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout
            )
        except (OSError, sqlite3.Error) as exc:
            raise OutboxError(f"cannot open the outbox at {self.path}: {exc}") from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._prepare(busy_timeout)
        except sqlite3.Error as exc:
            self._conn.close()
            raise OutboxError(f"cannot use {self.path} as an outbox: {exc}") from exc
        except OutboxError:
            self._conn.close()
            raise

    # -- plumbing ---------------------------------------------------------

    def _prepare(self, busy_timeout: float) -> None:
        """Switch to WAL and migrate, waiting out other processes doing the same.

        Turning on WAL can answer SQLITE_BUSY at once, without the busy handler,
        while another connection opens the same new file; so wait and retry
        within the busy timeout.
        """
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
                self._migrate()
                return
            except sqlite3.OperationalError as exc:
                locked = "locked" in str(exc) or "busy" in str(exc)
                if not locked or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _migrate(self) -> None:
        version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise OutboxError(
                f"the outbox at {self.path} has schema version {version}, written by a newer "
                f"postonce; this one knows versions up to {SCHEMA_VERSION}: upgrade postonce"
            )
        db = sqlite_utils.Database(self._conn)
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the lock.
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
            for step in MIGRATIONS[version:]:
                step(db)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    def _set_sync(self, durable: bool) -> None:
        wanted = "FULL" if durable and self.durability == "full" else "NORMAL"
        if wanted != self._sync:
            self._conn.execute(f"PRAGMA synchronous = {wanted}")
            self._sync = wanted

    @contextmanager
    def _write(self, durable: bool) -> Iterator[sqlite3.Connection]:
        """One write transaction, or one savepoint inside the batch this thread runs."""
        batch = getattr(self._local, "batch", None)
        if batch == "plain":
            yield self._conn
            return
        if batch == "savepoints":
            with self._savepoint() as conn:
                yield conn
            return
        with self._lock:
            try:
                self._set_sync(durable)
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.IntegrityError:
                raise
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox write failed at {self.path}: {exc}") from exc

    @contextmanager
    def _savepoint(self) -> Iterator[sqlite3.Connection]:
        """One operation of a batch: undone alone if it fails, the batch goes on."""
        conn = self._conn
        conn.execute("SAVEPOINT op")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
            raise
        conn.execute("RELEASE op")

    def run_batch(self, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """Run several store calls in ONE transaction: one commit, one fsync (group commit).

        Returns ``(ok, result or exception)`` per call. A failing call is rolled
        back alone; a failing commit fails them all. The commit is durable when
        any call in the batch needs it to be.
        """
        durable = any(needs_durable(method, kwargs) for method, kwargs in calls)
        with self._lock:
            # Optimistic first: no savepoints (half the statements). If any call
            # fails, undo the lot and run them again each in its own savepoint.
            results = self._batch_once(calls, durable, "plain")
            if results is None:
                results = self._batch_once(calls, durable, "savepoints")
            assert results is not None
            return results

    def _batch_once(
        self, calls: list[tuple[str, dict[str, Any]]], durable: bool, mode: str
    ) -> list[tuple[bool, Any]] | None:
        try:
            self._set_sync(durable)
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            error = OutboxError(f"outbox write failed at {self.path}: {exc}")
            return [(False, error) for _ in calls]
        results: list[tuple[bool, Any]] = []
        self._local.batch = mode
        try:
            for method, kwargs in calls:
                try:
                    results.append((True, getattr(self, method)(**kwargs)))
                except Exception as exc:
                    if mode == "plain":
                        if self._conn.in_transaction:
                            self._conn.execute("ROLLBACK")
                        return None
                    if isinstance(exc, sqlite3.Error) and not isinstance(
                        exc, sqlite3.IntegrityError
                    ):
                        # Typed as outside a batch: callers catch OutboxError.
                        failed = OutboxError(f"outbox write failed at {self.path}: {exc}")
                        failed.__cause__ = exc
                        exc = failed
                    results.append((False, exc))
        finally:
            self._local.batch = None
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            error = OutboxError(f"outbox commit failed at {self.path}: {exc}")
            return [(False, error) for _ in calls]
        return results

    def _read(self, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox read failed at {self.path}: {exc}") from exc

    # -- the Store protocol -----------------------------------------------

    def open_intent(self, new: NewIntent, *, owner: str, now: float, lease_for: float) -> Opened:
        token = os.urandom(12).hex()
        expires = now + lease_for
        lease = Lease(intent_id=0, token=token, owner=owner, expires_at=expires)
        try:
            with self._write(durable=True) as conn:
                cur = conn.execute(
                    "INSERT INTO intents (reference, key, provider, method, url, headers, body,"
                    " fingerprint, state, created_at, updated_at, first_delivery_at, deadline_at,"
                    " attempts, lease_owner, lease_expires_at, claim_token)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)"
                    # Any unique conflict (reference or key) inserts nothing; which
                    # one it was is read back below.
                    " ON CONFLICT DO NOTHING",
                    (
                        new.reference,
                        new.key,
                        new.provider,
                        new.method,
                        new.url,
                        json.dumps(new.headers),
                        new.body,
                        new.fingerprint,
                        State.SENDING.value,
                        now,
                        now,
                        now,
                        new.deadline_at,
                        owner,
                        expires,
                        token,
                    ),
                )
                if cur.rowcount == 1:
                    assert cur.lastrowid is not None
                    record = IntentRecord(
                        id=cur.lastrowid,
                        reference=new.reference,
                        key=new.key,
                        provider=new.provider,
                        method=new.method,
                        url=new.url,
                        headers=new.headers,
                        body=new.body,
                        fingerprint=new.fingerprint,
                        state=State.SENDING,
                        created_at=now,
                        first_delivery_at=now,
                        due_at=None,
                        deadline_at=new.deadline_at,
                        attempts=0,
                        last_outcome=None,
                        lease_owner=owner,
                        lease_expires_at=expires,
                        response=None,
                        note=None,
                    )
                    lease = Lease(cur.lastrowid, token, owner, expires)
                    return Opened(record, lease, created=True, conflict=None, anchor_before=None)
                return self._reopen(conn, new, lease, now)
        except sqlite3.IntegrityError as exc:
            raise IntentConflict(
                "this key already belongs to another intent", reference=new.reference, key=new.key
            ) from exc

    def _reopen(self, conn: sqlite3.Connection, new: NewIntent, lease: Lease, now: float) -> Opened:
        row = conn.execute(
            f"SELECT {COLUMNS} FROM intents WHERE reference = ?",
            (new.reference,),
        ).fetchone()
        if row is None:  # not this reference: the key belongs to another intent
            raise IntentConflict(
                "this key already belongs to another intent", reference=new.reference, key=new.key
            )
        record = decode_row(row)
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
        conn.execute(
            "UPDATE intents SET state = ?, lease_owner = ?, lease_expires_at = ?,"
            " claim_token = ?, first_delivery_at = ?, updated_at = ? WHERE id = ?",
            (
                State.SENDING.value,
                lease.owner,
                lease.expires_at,
                lease.token,
                anchor,
                now,
                record.id,
            ),
        )
        claimed = dataclasses.replace(
            record,
            state=State.SENDING,
            first_delivery_at=anchor,
            lease_owner=lease.owner,
            lease_expires_at=lease.expires_at,
        )
        return Opened(
            claimed,
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
        sets = [
            "state = ?",
            "attempts = attempts + 1",
            "last_outcome = ?",
            "first_delivery_at = ?",
            "due_at = ?",
            "lease_owner = ?",
            "lease_expires_at = ?",
            "claim_token = ?",
            "updated_at = ?",
            "note = COALESCE(?, note)",
        ]
        params: list[object] = [
            state.value,
            attempt.outcome.value,
            anchor,
            due_at,
            lease.owner if keep else None,
            lease_until,
            lease.token if keep else None,
            attempt.started_at + attempt.duration,
            note,
        ]
        if response is not None:
            sets += [
                "response_status = ?",
                "response_headers = ?",
                "response_body = ?",
                "response_truncated = ?",
                "response_sha256 = ?",
            ]
            params += [
                response.status,
                json.dumps(response.headers),
                response.body,
                int(response.truncated),
                response.sha256,
            ]
        with self._write(durable=durable) as conn:
            sql = f"UPDATE intents SET {', '.join(sets)} WHERE id = ? AND claim_token = ?"
            row = conn.execute(
                sql + " RETURNING attempts",
                (*params, lease.intent_id, lease.token),
            ).fetchone()
            if row is None:
                return False
            conn.execute(
                "INSERT INTO attempts (intent_id, number, started_at, duration, outcome, status,"
                " error_type, replayed, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    lease.intent_id,
                    row[0],
                    attempt.started_at,
                    attempt.duration,
                    attempt.outcome.value,
                    attempt.status,
                    attempt.error_type,
                    int(attempt.replayed),
                    lease.owner,
                ),
            )
            return True

    def renew(self, lease: Lease, *, now: float, until: float) -> Lease | None:
        with self._write(durable=False) as conn:
            cur = conn.execute(
                "UPDATE intents SET lease_expires_at = ?, updated_at = ?"
                " WHERE id = ? AND claim_token = ?",
                (until, now, lease.intent_id, lease.token),
            )
        if cur.rowcount != 1:
            return None
        return Lease(lease.intent_id, lease.token, lease.owner, until)

    def release(
        self, lease: Lease, *, now: float, due_at: float | None, anchor: float | None
    ) -> bool:
        """Hand an unsent claim back: pending, due at ``due_at`` (default now).

        ``anchor`` restores the horizon anchor the claim found: a claim that
        sent nothing must not start the horizon.
        """
        with self._write(durable=False) as conn:
            cur = conn.execute(
                "UPDATE intents SET state = ?, due_at = ?, first_delivery_at = ?,"
                " lease_owner = NULL, lease_expires_at = NULL, claim_token = NULL,"
                " updated_at = ? WHERE id = ? AND claim_token = ?",
                (
                    State.PENDING.value,
                    now if due_at is None else due_at,
                    anchor,
                    now,
                    lease.intent_id,
                    lease.token,
                ),
            )
        return cur.rowcount == 1

    def settle(self, lease: Lease, *, now: float, state: State, note: str) -> bool:
        with self._write(durable=True) as conn:
            cur = conn.execute(
                "UPDATE intents SET state = ?, note = ?, due_at = NULL, lease_owner = NULL,"
                " lease_expires_at = NULL, claim_token = NULL, updated_at = ?"
                " WHERE id = ? AND claim_token = ?",
                (state.value, note, now, lease.intent_id, lease.token),
            )
        return cur.rowcount == 1

    def get(self, reference: str) -> IntentRecord | None:
        rows = self._read(
            f"SELECT {COLUMNS} FROM intents WHERE reference = ?",
            (reference,),
        )
        return decode_row(rows[0]) if rows else None

    def attempts(self, reference: str) -> list[AttemptRecord]:
        rows = self._read(
            "SELECT a.started_at, a.duration, a.outcome, a.status, a.error_type, a.replayed"
            " FROM attempts a JOIN intents i ON i.id = a.intent_id"
            " WHERE i.reference = ? ORDER BY a.number",
            (reference,),
        )
        return [
            AttemptRecord(
                started_at=float(r[0]),
                duration=float(r[1]),
                outcome=Outcome(r[2]),
                status=r[3],
                error_type=r[4],
                replayed=bool(r[5]),
            )
            for r in rows
        ]

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
        under a lease that expired by then (its owner died). Oldest due first.
        """
        expires = now + lease_for
        due_by = now if due_by is None else min(due_by, now)
        claimed: list[Opened] = []
        with self._write(durable=True) as conn:
            # Each arm takes only its first ``limit`` rows (the pending arm straight
            # from its index, in order), so a claim costs O(limit), not O(backlog).
            # Oldest first by the time each became due: a pending row's due time, a
            # sending row's lease expiry (WAKE_ORDER), each arm in its index's order.
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM intents WHERE id IN ("
                " SELECT id FROM (SELECT id FROM intents"
                "  WHERE state = 'pending' AND due_at <= ? ORDER BY due_at, id LIMIT ?)"
                " UNION"
                " SELECT id FROM (SELECT id FROM intents"
                "  WHERE state = 'sending' AND lease_expires_at <= ?"
                "  ORDER BY lease_expires_at, id LIMIT ?)"
                # A clock that went back leaves due times far ahead: pending rows
                # touched "in the future" are due now (a live lease is never cut short).
                " UNION"
                # (+due_at: sorted, so the planner takes the few rows from intents_touched
                # rather than walking every pending row in intents_due's order.)
                " SELECT id FROM (SELECT id FROM intents"
                "  WHERE state = 'pending' AND updated_at > ? ORDER BY +due_at, id LIMIT ?)"
                f") ORDER BY {WAKE_ORDER} LIMIT ?",
                (due_by, limit, due_by, limit, now + CLOCK_TOLERANCE, limit, limit),
            ).fetchall()
            for row in rows:
                record = decode_row(row)
                token = os.urandom(12).hex()
                anchor = record.first_delivery_at if record.delivered_maybe else now
                conn.execute(
                    "UPDATE intents SET state = ?, lease_owner = ?, lease_expires_at = ?,"
                    " claim_token = ?, first_delivery_at = ?, updated_at = ? WHERE id = ?",
                    (State.SENDING.value, owner, expires, token, anchor, now, record.id),
                )
                claimed.append(
                    Opened(
                        dataclasses.replace(
                            record,
                            state=State.SENDING,
                            first_delivery_at=anchor,
                            lease_owner=owner,
                            lease_expires_at=expires,
                        ),
                        Lease(record.id, token, owner, expires),
                        created=False,
                        conflict=None,
                        anchor_before=record.first_delivery_at,
                    )
                )
        return claimed

    def list_intents(
        self, *, state: State | None = None, limit: int | None = None
    ) -> list[IntentRecord]:
        """Intents, newest first, optionally of one state."""
        where = "WHERE state = ?" if state is not None else ""
        params: tuple[object, ...] = (state.value,) if state is not None else ()
        rows = self._read(
            f"SELECT {COLUMNS} FROM intents {where} ORDER BY id DESC LIMIT ?",
            (*params, -1 if limit is None else limit),
        )
        return [decode_row(r) for r in rows]

    def stats(self, *, now: float) -> dict[str, Any]:
        """Counts per state, the oldest pending intent, the next due time, expired ones."""
        counts = {state.value: 0 for state in State}
        for state, count in self._read(
            "SELECT state, count(*) FROM intents WHERE purged_at IS NULL GROUP BY state", ()
        ):
            counts[str(state)] = int(count)
        (oldest, next_due) = self._read(
            "SELECT min(created_at), min(due_at) FROM intents WHERE state = 'pending'", ()
        )[0]
        (lease_due,) = self._read(
            "SELECT min(lease_expires_at) FROM intents WHERE state = 'sending'", ()
        )[0]
        (tombstones,) = self._read("SELECT count(*) FROM intents WHERE purged_at IS NOT NULL", ())[
            0
        ]
        due_now = self._read(
            "SELECT (SELECT count(*) FROM intents WHERE state = 'pending' AND due_at <= ?)"
            " + (SELECT count(*) FROM intents WHERE state = 'sending' AND lease_expires_at <= ?)",
            (now, now),
        )[0][0]
        candidates = [t for t in (next_due, lease_due) if t is not None]
        return {
            "states": counts,
            "due_now": int(due_now),
            "oldest_pending_created_at": oldest,
            "next_due_at": min(candidates) if candidates else None,
            "expired_needing_attention": counts[State.EXPIRED.value],
            "tombstones": int(tombstones),
        }

    def operator_move(self, reference: str, to: State, *, now: float, note: str) -> IntentRecord:
        """An operator's cancel or resolve, checked by the life-cycle rules, atomically."""
        with self._write(durable=True) as conn:
            row = conn.execute(
                f"SELECT {COLUMNS} FROM intents WHERE reference = ?",
                (reference,),
            ).fetchone()
            if row is None:
                raise KeyError(reference)
            record = decode_row(row)
            operator_move(record, to, now)
            conn.execute(
                "UPDATE intents SET state = ?, note = ?, due_at = NULL, lease_owner = NULL,"
                " lease_expires_at = NULL, claim_token = NULL, updated_at = ? WHERE id = ?",
                (to.value, note, now, record.id),
            )
        return dataclasses.replace(
            record, state=to, note=note, due_at=None, lease_owner=None, lease_expires_at=None
        )

    def purge(self, *, before: float, tombstones: bool, now: float) -> int:
        """Forget finished intents last changed before ``before`` (never unresolved expired ones).

        By default each keeps a tombstone (reference, key, fingerprint, state),
        so the same reference is never executed again; ``tombstones=True``
        deletes tombstones of that age instead.
        """
        # An expired intent stays until a person resolves it: purging it would
        # hide it from the "needs attention" count.
        terminal = tuple(s.value for s in TERMINAL if s is not State.EXPIRED)
        marks = ", ".join("?" for _ in terminal)
        with self._write(durable=True) as conn:
            if tombstones:
                ids = "SELECT id FROM intents WHERE purged_at IS NOT NULL AND purged_at < ?"
                conn.execute(f"DELETE FROM attempts WHERE intent_id IN ({ids})", (before,))
                cur = conn.execute(f"DELETE FROM intents WHERE id IN ({ids})", (before,))
                return cur.rowcount
            ids = (
                f"SELECT id FROM intents WHERE state IN ({marks})"
                " AND updated_at < ? AND purged_at IS NULL"
            )
            conn.execute(f"DELETE FROM attempts WHERE intent_id IN ({ids})", (*terminal, before))
            cur = conn.execute(
                "UPDATE intents SET body = x'', headers = '[]', response_headers = NULL,"
                " response_body = NULL, purged_at = ?"
                f" WHERE id IN ({ids})",
                (now, *terminal, before),
            )
            return cur.rowcount

    def export_rows(self) -> Iterator[dict[str, Any]]:
        """Every intent with its attempts, as plain data."""
        return export_rows(self)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
