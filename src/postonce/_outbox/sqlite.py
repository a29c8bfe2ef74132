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

The schema is created and migrated with sqlite-utils. A file is read before
anything is written to it, and that decides the names (:attr:`SQLiteStore.prefix`):

- an outbox file of its own (a new, empty database) keeps the names of every
  earlier release (``intents``, ``attempts``, ...) and its version in
  ``PRAGMA user_version``;
- an outbox added to another application's database, only where the outbox
  spec asks for it (``foreign=True``), names everything ``postonce_...``
  (``postonce_intents``, ...) and keeps its version in ``postonce_meta``, so
  it takes none of the application's names nor its ``user_version``;
- an application's database an earlier release joined with the unprefixed
  names stays as it is.

A store opened to read only (``migrate=False``) neither switches the journal
mode nor migrates an older schema.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal

import sqlite_utils

from .._engine import CLOCK_TOLERANCE
from .._exceptions import ConfigurationError, OutboxError, PostonceError
from .._intent import TERMINAL
from . import decide
from .base import AttemptRecord, Lease, Target
from .decide import LEASE_SWEEP
from .migrations.sqlite import META, MIGRATIONS, PREFIX, SCHEMA_VERSION, set_version
from .rows import COLUMNS, needs_durable, newer_schema
from .sql import SQLStore
from .store import Mine

__all__ = ["SCHEMA_VERSION", "WAKE_ORDER", "SQLiteStore"]

#: The order of due intents in a claim: when each became due (a pending row's
#: due time, a sending row's lease expiry), then id.
WAKE_ORDER = "CASE WHEN state = 'sending' THEN lease_expires_at ELSE due_at END, id"

#: An ended row that handed its lease back: its lease expiry, if any is left,
#: means nothing (decide.lease_exit_deferred; rows.decode_row reads it as None).
_LEASE_ENDED = "state IN ({}) AND lease_owner IS NULL".format(
    ", ".join(sorted(f"'{state.value}'" for state in TERMINAL))
)

#: The rows in the lease index ``intents_lease``: its condition, spelled as the
#: index spells it (migrations._v6), so that the planner can use the index.
_INDEXED = "lease_expires_at IS NOT NULL AND fresh IS NULL"

#: Columns an outbox's intents table has had since schema v1, beside its index
#: ``intents_reference``: an ``intents`` table without them is an application's own.
_OUTBOX_COLUMNS = frozenset({"reference", "key", "fingerprint", "claim_token", "lease_expires_at"})


def _tail(prefix: str) -> str:
    """The fresh rows of the table's tail, past the sweep's watermark (migrations._v6):
    a range of the table's key. (A missing watermark reads as 0: the whole table.)"""
    return f"id > coalesce((SELECT upto FROM {prefix}intents_swept), 0) AND fresh IS NOT NULL"


def _leases(prefix: str) -> str:
    """Every row that may hold a lease (schema v6): those in the lease index, and the tail's.

    A sending row is always in one of them; the queries of the shared store
    that ask for leases read this instead of the table, and each arm keeps its index.
    """
    intents = f"{prefix}intents"
    return (
        f"(SELECT * FROM {intents} WHERE {_INDEXED}"
        f" UNION ALL SELECT * FROM {intents} WHERE {_tail(prefix)})"
    )


#: How many lease-index entries past the claim's own a claim looks at for ended
#: intents to take out (left there by a process killed before its sweep). Few:
#: a claim stays O(limit).
_CLAIM_SWEEPS = LEASE_SWEEP

logger = logging.getLogger("postonce")


Durability = Literal["full", "normal"]


def _sweep_at_exit(ref: weakref.ReferenceType[SQLiteStore], pid: int) -> None:
    """At interpreter exit: take a still-open store's ended intents out of its lease index.

    Only in the process that opened it: a forked child must not touch its
    parent's SQLite connection.
    """
    store = ref()
    if store is not None and os.getpid() == pid:
        store.close()


def _create_private(path: Path) -> None:
    """Create the outbox file 0600 (and a missing directory 0700) before SQLite opens it."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def take_in_the_tail(conn: sqlite3.Connection, prefix: str = "") -> None:
    """In a write transaction: the tail's fresh rows still sending join the lease index,
    and the watermark moves to the table's end (schema v6).

    ``prefix``: the outbox's (:attr:`SQLiteStore.prefix`). Its own statements,
    so a writer holds the only write lock: no row can be written between them.
    """
    intents = f"{prefix}intents"
    conn.execute(f"UPDATE {intents} SET fresh = NULL WHERE {_tail(prefix)} AND state = 'sending'")
    conn.execute(
        f"UPDATE {intents}_swept SET upto = (SELECT coalesce(max(id), 0) FROM {intents})"
        f" WHERE upto < (SELECT coalesce(max(id), 0) FROM {intents})"
    )


class SQLiteStore(SQLStore):
    """An outbox in one SQLite file. Thread-safe; shareable between processes."""

    integrity_errors = (sqlite3.IntegrityError,)
    one_statement_writes = True

    #: What starts the name of each of the outbox's tables, indexes and triggers:
    #: ``""`` in an outbox file of its own, ``"postonce_"`` in another application's
    #: database (decided when the file is opened).
    prefix: str
    #: The intents table's name (``intents`` or ``postonce_intents``), for an
    #: application that writes to it through its own connection.
    intents_table: str

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "full",
        busy_timeout: float = 5.0,
        create: bool = True,
        migrate: bool = True,
        foreign: bool = False,
    ) -> None:
        """Open (and migrate) the outbox in the file at ``path``.

        ``create``: a missing file, or an empty database, becomes a new outbox
        (False: the outbox must be there). ``migrate``: an outbox of an older
        schema is migrated, and the file switched to WAL (False: opened to read
        only, an older schema is refused and nothing is written). ``foreign``:
        the outbox's tables may be added to a database holding another
        application's tables, named ``postonce_...`` beside them (whatever its
        tables and its ``user_version``; refused only where a ``postonce_``
        name is taken already).
        """
        if durability not in ("full", "normal"):
            raise ValueError(f"durability must be 'full' or 'normal', not {durability!r}")
        self.path = Path(path)
        self.prefix = ""
        self.durability: Durability = durability
        self._lock = threading.RLock()
        #: The batch :meth:`run_batch` runs, as (thread ident, mode), or None. Only
        #: that thread's writes join it; a plain attribute, read on every write,
        #: where a ``threading.local`` read cost ~0.3 us.
        self._batch: tuple[int, str] | None = None
        self._sync: str | None = None
        self._left: list[int] = []  # ended intents perhaps still in the lease index (_record)
        self._unswept = 0  # fresh intents written since this store's last sweep
        self._create, self._migrating, self._foreign = create, migrate, foreign
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
        except PostonceError:
            self._conn.close()
            raise
        # The names, now that the file said which (_find_outbox).
        self.intents_table = f"{self.prefix}intents"
        self._tail = _tail(self.prefix)
        super().__init__(
            intents=self.intents_table,
            attempts=f"{self.prefix}attempts",
            leases=_leases(self.prefix),
            receipts=f"{self.prefix}receipts",
        )
        # A process that exits without close() still sweeps (a killed one leaves the
        # rest to the claims). Through a weak reference: the store may go first.
        self._at_exit = functools.partial(_sweep_at_exit, weakref.ref(self), os.getpid())
        atexit.register(self._at_exit)

    # -- what the SQL store asks of a backend --------------------------------

    def _prepare(self, busy_timeout: float) -> None:
        """Switch to WAL and migrate, waiting out other processes doing the same.

        Turning on WAL can answer SQLITE_BUSY at once, without the busy handler,
        while another connection opens the same new file; so wait and retry
        within the busy timeout.
        """
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                # Read first: nothing is written to a file that is not ours to change.
                version = self._check_file()
                if version is None:
                    return
                self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
                if version < SCHEMA_VERSION:
                    self._migrate()
                return
            except sqlite3.OperationalError as exc:
                locked = "locked" in str(exc) or "busy" in str(exc)
                if not locked or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _check_file(self) -> int | None:
        """The outbox's schema version (0: a new one), where this store is to switch the file
        to WAL and migrate it; None where it only reads. Raises where it is not ours to.

        Decides :attr:`prefix`. An outbox of an older schema is refused when
        opened to read only.
        """
        self.prefix, version = self._find_outbox()
        if version > SCHEMA_VERSION:
            raise newer_schema(f"at {self.path}", version, SCHEMA_VERSION)
        if 0 < version < SCHEMA_VERSION and not self._migrating:
            raise OutboxError(
                f"the outbox at {self.path} has schema version {version}, and this postonce "
                f"reads version {SCHEMA_VERSION}: it needs a migration, which a command that "
                "only reads never makes. A postonce.Client (or postonce drain) of this "
                "version migrates it when it opens it; older releases still running keep "
                "working after it"
            )
        return version if self._migrating else None

    def _find_outbox(self) -> tuple[str, int]:
        """The outbox in this file: the prefix of its names, and its schema version (0: none
        yet, one to create). Reads only; raises where the file is not one to use as asked.

        ``postonce_meta`` marks the prefixed outbox of an application's database,
        and holds its version. postonce's unprefixed tables with a
        ``user_version`` of 1 or more are an outbox file, or an application's
        database an earlier release joined: both keep their names. An empty
        database becomes an outbox file of its own, where ``create`` allows.
        Any other is another application's: joined with prefixed names on
        request (``foreign``), and only where no ``postonce_`` name is taken.
        """
        # One statement, so one snapshot: another process creating the outbox right
        # now is seen before or after its migration's commit, never half-way.
        found = self._conn.execute(
            "SELECT 'version', user_version FROM pragma_user_version"
            " UNION ALL SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite%'"
            " UNION ALL SELECT 'column', name FROM pragma_table_info('intents')"
        ).fetchall()
        user_version = next(int(value) for kind, value in found if kind == "version")
        names = {str(name) for kind, name in found if kind not in ("version", "column")}
        tables = sorted(str(name) for kind, name in found if kind in ("table", "view"))
        columns = {str(name) for kind, name in found if kind == "column"}
        if META in names:
            # Set in the commit that created the tables, and only raised since: read
            # after them, it is at least as new as what the statement above saw.
            (version,) = self._conn.execute(f"SELECT max(version) FROM {META}").fetchone()
            if version and {f"{PREFIX}intents", f"{PREFIX}attempts"} <= names:
                return PREFIX, int(version)
            raise OutboxError(
                f"{self.path} has a {META} table but no outbox beside it (tables "
                f"{', '.join(tables)}): nothing was changed"
            )
        unprefixed = columns >= _OUTBOX_COLUMNS and {"attempts", "intents_reference"} <= names
        if unprefixed and user_version >= 1:
            return "", user_version
        if not names and user_version == 0:
            if not (self._create and self._migrating):
                raise OutboxError(f"no outbox at {self.path}: the file holds no tables")
            return "", 0
        taken = sorted(name for name in names if name.lower().startswith(PREFIX))
        if self._create and self._migrating and self._foreign and not taken and not unprefixed:
            return PREFIX, 0
        raise self._not_ours(user_version, tables, taken)

    def _not_ours(self, version: int, tables: list[str], taken: list[str]) -> PostonceError:
        """The refusal of another application's database: why, and the way out."""
        found = f"tables {', '.join(tables) or 'none'}, user_version {version}"
        if not (self._create and self._migrating):
            return OutboxError(
                f"{self.path} is not a postonce outbox ({found}): nothing was changed"
            )
        if not self._foreign:
            spec = f"sqlite:///{self.path}?create=1"
            why = (
                f"postonce adds its tables ({PREFIX}intents, {PREFIX}attempts, ..., {META}) "
                f"to another application's database only where asked: outbox={spec!r}, or "
                "give the outbox a file of its own"
            )
        elif taken:
            why = (
                f"it has {', '.join(taken)} but no {META}, so they are not an outbox postonce "
                "made and it would take their names: nothing was changed. Rename them, or "
                "give the outbox a file of its own"
            )
        else:
            why = (
                "its intents and attempts tables are an outbox of an earlier release, whose "
                "schema version PRAGMA user_version no longer holds: nothing was changed. "
                "Give the outbox a file of its own"
            )
        return ConfigurationError(f"{self.path} is another application's database ({found}): {why}")

    def _migrate(self) -> None:
        """Create or migrate the outbox: every missing step, and its version, in one commit."""
        db = sqlite_utils.Database(self._conn)
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            # Read the file again under the write lock: another process may have created
            # or migrated the outbox (either version location) while we waited for it.
            self.prefix, version = self._find_outbox()
            if version > SCHEMA_VERSION:
                raise newer_schema(f"at {self.path}", version, SCHEMA_VERSION)
            if version < SCHEMA_VERSION:
                for step in MIGRATIONS[version:]:
                    step(db, self.prefix)
                set_version(self._conn, self.prefix, SCHEMA_VERSION)
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

    def _write(self, durable: bool) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction, or one savepoint inside the batch this thread runs.

        Inside a batch without savepoints (an async writer's every batch, until
        a call fails) the connection is handed over as it is, by a plain context
        manager: twice per intent there, a generator one cost ~8 Python calls.
        """
        batch = self._batch_here()
        if batch == "plain":
            return contextlib.nullcontext(self._conn)
        return self._transaction(durable, batch)

    @contextmanager
    def _transaction(self, durable: bool, batch: str | None) -> Iterator[sqlite3.Connection]:
        if batch == "savepoints":
            with self._savepoint() as conn:
                yield conn
            return
        with self._writing(durable) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _write_failed(self, exc: sqlite3.Error) -> OutboxError:
        """A driver's error on a write, as the OutboxError naming this outbox."""
        return OutboxError(f"outbox write failed at {self.path}: {exc}")

    def _batch_here(self) -> str | None:
        """The mode of the batch this thread runs, or None."""
        running = self._batch
        return running[1] if running is not None and running[0] == threading.get_ident() else None

    def _write_alone(self, durable: bool) -> AbstractContextManager[sqlite3.Connection]:
        """One statement as its own transaction (autocommit): no BEGIN and COMMIT statements.

        As safe as ``BEGIN IMMEDIATE``: a statement that writes takes the write
        lock before it reads, and waits for it under the busy timeout. Inside a
        batch it is one more operation of the batch's transaction. A statement
        with a result must be read to its end inside the block: that is its commit.
        """
        if self._batch_here() is not None:
            return self._write(durable)
        return self._writing(durable)

    def _writing(self, durable: bool) -> _Writing:
        """The connection, this process's writes serialised and synced as asked.

        A driver error leaves as ``OutboxError`` naming the file; a unique
        violation as itself (the store reads which intent holds the value).
        """
        return _Writing(self, durable)

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
            if self._sweep_due():
                self._sweep()
            return results

    def _batch_once(
        self, calls: list[tuple[str, dict[str, Any]]], durable: bool, mode: str
    ) -> list[tuple[bool, Any]] | None:
        try:
            self._set_sync(durable)
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            error = self._write_failed(exc)
            return [(False, error) for _ in calls]
        results: list[tuple[bool, Any]] = []
        self._batch = (threading.get_ident(), mode)
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
                        failed = self._write_failed(exc)
                        failed.__cause__ = exc
                        exc = failed
                    results.append((False, exc))
        finally:
            self._batch = None
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            error = OutboxError(f"outbox commit failed at {self.path}: {exc}")
            return [(False, error) for _ in calls]
        return results

    def _record(
        self, lease: Lease, attempt: AttemptRecord, changes: decide.Changes, *, durable: bool
    ) -> bool:
        """The shared record, with two economies of this file's pages and statements.

        A first attempt the intent row carries (``decide.carried``) is one
        statement, its own transaction; a later one matches no row there and
        takes the shared path, with its attempts row.

        A record that ends the intent leaves its lease expiry for a sweep of
        many. A fresh row (schema v6) never entered the lease index; one a
        sweep or a heartbeat took in while it was sending did, and taking it
        out with the answer would write that index's page in a second commit.
        The rows sit side by side at the table's end, as do their entries at
        the index's: one statement (:meth:`_sweep`) rewrites a few pages for
        :data:`LEASE_SWEEP` of them, and leaves the rows still fresh alone.
        """
        deferred = decide.lease_exit_deferred(changes)
        written = changes if deferred is None else deferred
        recorded = self._carried_alone(lease, attempt, written, durable=durable) or super()._record(
            lease, attempt, written, durable=durable
        )
        with self._lock:
            if recorded and deferred is not None:
                self._left.append(lease.intent_id)
            # Inside a batch, the sweep waits for its end (run_batch): a batch
            # undone and run again would undo the sweep with it.
            if self._sweep_due() and self._batch_here() is None:
                self._sweep()
        return recorded

    def _carried_alone(
        self, lease: Lease, attempt: AttemptRecord, changes: decide.Changes, *, durable: bool
    ) -> bool:
        """Record a first attempt the intent row carries, in one autocommit statement.

        Fenced like any record, and only while no attempt is counted.
        """
        if not decide.carried(lease, 1, attempt, changes):
            return False
        with self._write_alone(durable=durable) as conn:
            return self._count_attempt(conn, lease, changes, first=True) is not None

    def _insert_alone(self, row: decide.Changes) -> int | None:
        """A new intent's row as one autocommit statement: its id, or None if nothing was written.

        A plain ``INSERT``: no ``ON CONFLICT`` and no ``RETURNING``, which makes
        SQLite build an ephemeral table for the returned row (the pair of hot
        statements measured ~10 us faster without it). A unique value already
        held raises and writes nothing; a row a key trigger refuses
        (``RAISE(IGNORE)``) is not written and counts no change, and then
        ``lastrowid`` would still name the previous insert: only a counted
        change gives an id.
        """
        insert = self._shaped(
            "INSERT INTO {intents} ({cols}, fresh) VALUES ({marks}, 1)", tuple(row)
        )
        try:
            with self._write_alone(durable=True) as conn:  # (holds self._lock)
                cursor = conn.execute(insert, tuple(row.values()))
                if cursor.rowcount != 1 or cursor.lastrowid is None:
                    return None
                self._unswept += 1
                return int(cursor.lastrowid)
        except sqlite3.IntegrityError:
            return None

    def _sweep_due(self) -> bool:
        return len(self._left) >= LEASE_SWEEP or self._unswept >= LEASE_SWEEP

    def _sweep(self) -> None:
        """Tidy the lease index in one transaction: the ended intents of :attr:`_left` leave
        it, the tail's fresh intents still sending join it, and the watermark moves on.

        Never fails the call it runs in: an error leaves the ended intents for
        the next sweep (at most a few sweeps' worth are kept; a claim takes out
        the rest), and the tail for the next sweep or claim. Only ended rows
        with no lease owner leave, and only rows in the index, so an id whose
        record did not commit (a batch that failed) changes nothing.
        """
        with self._lock:
            ids, self._left, self._unswept = self._left, [], 0
            try:
                with self._write(durable=False) as conn:
                    if ids:
                        marks = ", ".join("?" for _ in ids)
                        conn.execute(
                            f"UPDATE {self.intents_table} SET lease_expires_at = NULL"
                            f" WHERE id IN ({marks}) AND {_INDEXED} AND {_LEASE_ENDED}",
                            ids,
                        )
                    take_in_the_tail(conn, self.prefix)
            except (OutboxError, sqlite3.Error) as exc:
                logger.debug("lease sweep of %d ended intents left for later: %s", len(ids), exc)
                self._left = [*ids, *self._left][-LEASE_SWEEP * 4 :]

    def _read(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._conn.execute(query, params).fetchall()
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox read failed at {self.path}: {exc}") from exc

    def _due_rows(
        self, conn: sqlite3.Connection, *, due_by: float, now: float, limit: int, mine: Mine
    ) -> list[tuple[Any, ...]]:
        # BEGIN IMMEDIATE already holds the only write lock: no row lock to take.
        # Each arm takes only its first ``limit`` rows (the pending arm straight
        # from its index, in order), so a claim costs O(limit), not O(backlog).
        # Oldest first by the time each became due: a pending row's due time, a
        # sending row's lease expiry (WAKE_ORDER), each arm in its index's order.
        intents = self.intents_table
        only, params = self._mine(mine)
        # (The clock arm reads intents_touched; +sender keeps it off intents_due.)
        late, _ = self._mine(mine, unindexed="+")
        # Leases of owners known gone are due now, though not run out.
        dead, owners = self._dead(mine)
        # Ended intents whose lease expiry is still in the row (their process
        # exited before its sweep) sit among the expired leases the lease arm
        # walks: take out those within its reach, so no claim walks them twice.
        # (By sender only: the lease arm walks the sender's entries of every origin,
        # and an ended row is nobody's to send, whatever its origin.)
        sender, whose = self._mine(Mine(mine.sender, None))
        conn.execute(
            f"UPDATE {intents} SET lease_expires_at = NULL WHERE id IN ("
            f" SELECT id FROM (SELECT id, state, lease_owner FROM {intents}"
            f"  WHERE lease_expires_at <= ? AND fresh IS NULL{sender}"
            "  ORDER BY lease_expires_at, id LIMIT ?)"
            f" WHERE {_LEASE_ENDED})",
            (due_by, *whose, limit + _CLAIM_SWEEPS),
        )
        # A sending row whose lease ran out (or whose owner is gone). It is in the
        # lease index or, a fresh write-ahead whose process died, in the tail
        # (schema v6): one arm reads each, the tail as a range of the table's key.
        # Then the claim takes the tail in, so the next claim's tail is short.
        expired = (
            f"state = 'sending' AND (lease_expires_at <= ?{dead}){only}"
            " ORDER BY lease_expires_at, id LIMIT ?"
        )
        expired_params = (due_by, *owners, *params, limit)
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM {intents} WHERE id IN ("
            f" SELECT id FROM (SELECT id FROM {intents}"
            f"  WHERE state = 'pending' AND due_at <= ?{only} ORDER BY due_at, id LIMIT ?)"
            " UNION"
            # (The lease index's condition in full, which the OR would hide.)
            f" SELECT id FROM (SELECT id FROM {intents} WHERE {_INDEXED} AND {expired})"
            " UNION"
            f" SELECT id FROM (SELECT id FROM {intents} WHERE {self._tail} AND {expired})"
            # A clock that went back leaves due times far ahead: pending rows
            # touched "in the future" are due now (a live lease is never cut short).
            " UNION"
            # (+due_at: sorted, so the planner takes the few rows from intents_touched
            # rather than walking every pending row in intents_due's order.)
            f" SELECT id FROM (SELECT id FROM {intents}"
            f"  WHERE state = 'pending' AND updated_at > ?{late} ORDER BY +due_at, id LIMIT ?)"
            f") ORDER BY {WAKE_ORDER} LIMIT ?",
            (
                *(due_by, *params, limit),
                *expired_params,
                *expired_params,
                *(now + CLOCK_TOLERANCE, *params, limit),
                limit,
            ),
        ).fetchall()
        take_in_the_tail(conn, self.prefix)
        return rows

    @functools.cached_property
    def app_target(self) -> Target:
        """Where ``enqueue`` writes through an application's connection to this file."""
        return Target("sqlite", self.intents_table, str(self.path.resolve()))

    def close(self) -> None:
        with self._lock:
            atexit.unregister(self._at_exit)
            if self._left or self._unswept:
                # A tidy-up, not worth a long wait behind another process's write
                # (a connection closed already: _sweep finds it so too).
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA busy_timeout = 100")
                self._sweep()
            self._conn.close()


class _Writing:
    """:meth:`SQLiteStore._writing`: a plain context manager (twice per ``post_once``)."""

    __slots__ = ("_durable", "_store")

    def __init__(self, store: SQLiteStore, durable: bool) -> None:
        self._store, self._durable = store, durable

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        store._lock.acquire()
        try:
            store._set_sync(self._durable)
        except BaseException as exc:
            self.__exit__(type(exc), exc, None)  # released, and a driver error typed
            raise
        return store._conn

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        store = self._store
        store._lock.release()
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError):
            raise store._write_failed(exc) from exc
