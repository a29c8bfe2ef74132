"""The PostgreSQL outbox: one durable record of intents shared by many hosts.

The same Store protocol and the same rules as the SQLite outbox, on psycopg 3
with a psycopg_pool connection pool. Due intents are claimed with
``FOR UPDATE SKIP LOCKED``, so any number of drains on any number of hosts
take disjoint batches without waiting on each other; a completion is
accepted only from the lease token that owns the row.

Durability follows the SQLite outbox: the write-ahead, terminal moves and
non-2xx answers commit with ``synchronous_commit = on``; the commits that a
provider's replay repairs (2xx answers, retries, deferrals) run with
``synchronous_commit = off``: lost only if the *database server* crashes in
the following fraction of a second, never by a crash of the application.

The tables live in a schema of their own (default ``postonce``), migrated by
the SQL files in ``migrations/postgres``, with the version stored in
``<schema>.postonce_meta``.

Round trips are what a drain on PostgreSQL pays for, so the hot moves send
few: pooled connections run in autocommit (a read is one statement, no
ROLLBACK after it); a transaction opens with its durability in one message;
a recorded attempt is one statement (the fenced UPDATE, the attempts row and
the NOTIFY), sent with its BEGIN and COMMIT in one pipeline; and records
that threads make at the same time are committed together (group commit).
"""

from __future__ import annotations

import functools
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool
from psycopg import sql

from .._engine import CLOCK_TOLERANCE
from .._exceptions import ConfigurationError, OutboxError
from .._intent import TERMINAL
from . import decide
from .base import AttemptRecord, Lease, Opened, Target
from .migrations.postgres import (
    MIGRATIONS,
    SCHEMA_VERSION,
    current_version,
    migrate,
    migrations,
)
from .rows import COLUMN_NAMES, decode_row, needs_durable, newer_schema
from .sql import SQLStore
from .sqlite import Durability
from .store import Mine, Take

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresStore", "migrations"]

TERMINAL_VALUES = frozenset(state.value for state in TERMINAL)

#: SQLSTATE classes of a statement the server refused, leaving the transaction
#: certainly uncommitted and the connection usable: data, integrity, and
#: rollback (deadlock, serialization) errors. A group that fails with one is
#: retried one write at a time, so one bad write fails alone.
_REFUSED = ("22", "23", "40")

#: Ends each statement a group commits; its parameter ("on"/"off") is added by the
#: group. Local to the transaction, which for a statement alone in autocommit is
#: the statement's own: evaluated before the commit it governs.
_DURABILITY = "set_config('synchronous_commit', %s, true)"
#: How often a drain's idle wait on NOTIFY looks at its stop event (seconds).
_STOP_LOOK = 0.25


def _quiet(conn: psycopg.Connection[Any]) -> bool:
    """Nothing has arrived from the server since the connection went idle.

    A server that restarts, or a backend terminated, sends its connections a
    FATAL message and closes them: their sockets turn readable. An idle
    connection in autocommit is sent nothing else here (no LISTEN on pooled
    connections), so a quiet socket is a live connection as far as anything
    but a round trip can tell, and a round trip would be stale a moment later.
    """
    try:
        if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
            return False
        fd = conn.pgconn.socket
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return not poller.poll(0)
        readable, _, _ = select.select([fd], [], [], 0)  # Windows: no poll()
        return not readable
    except (OSError, ValueError, psycopg.Error):
        return False


def _check_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's check before it hands a connection out: a round trip only if one is due.

    A connection the server has written to while it sat idle (a FATAL before
    closing, most likely) is tested with an empty query; the pool replaces one
    that fails. A quiet one is handed out at the cost of a poll().
    """
    if not _quiet(conn):
        psycopg_pool.ConnectionPool.check_connection(conn)


def binary_array(cast: str, values: list[Any]) -> list[Any]:
    """``values`` for a binary array parameter cast to ``cast[]``: ints in a float column widened.

    Arrays go in binary (``%b``): psycopg's text array dumper quotes each
    element through a regular expression and writes each float with repr().
    Both refuse a list that mixes ``int`` and ``float`` (a clock of whole
    seconds beside the float times rows keep); nothing else is converted, so
    any other mix is still the driver's error, named as an OutboxError.
    """
    if cast != "double precision":
        return values
    return [float(value) if type(value) is int else value for value in values]


class _Queued:
    """One fenced write waiting for its group's commit."""

    __slots__ = ("done", "durable", "error", "finished", "lead", "params", "query", "row")

    def __init__(self, query: str, params: tuple[Any, ...], durable: bool) -> None:
        self.query = query
        self.params = params
        self.durable = durable
        # Made only for a write that waits (see _GroupCommit.run): a lone writer leads.
        self.done: threading.Event | None = None
        self.finished = False
        self.lead = False  # handed the lead: commit the next group
        self.row: tuple[Any, ...] | None = None
        self.error: BaseException | None = None

    def result(self) -> tuple[Any, ...] | None:
        if self.error is not None:
            raise self.error
        return self.row

    def waits(self) -> threading.Event:
        """The event this write will wait on, made now (under the group's lock)."""
        self.done = threading.Event()
        return self.done

    def wake(self) -> None:
        if self.done is not None:
            self.done.set()


class _GroupCommit:
    """Fenced writes from many threads, committed together in one transaction.

    The first thread to write leads: it commits what is queued (its own write
    first) in one pipelined transaction while later writers queue, then hands
    the lead to the oldest of those. A writer returns only once its write is
    committed (or failed), as with a transaction of its own. Alone, a writer
    commits its write by itself at once: nothing waits for company.
    """

    def __init__(self, commit: Callable[[list[_Queued]], None], most: int = 64) -> None:
        self._commit = commit
        self._most = most
        self._lock = threading.Lock()
        self._queue: list[_Queued] = []
        self._leading = False

    def run(self, query: str, params: tuple[Any, ...], durable: bool) -> tuple[Any, ...] | None:
        """The first row ``query`` answered, once committed; None if it answered none.

        An interrupt (Ctrl-C) anywhere in here leaves the group whole: a write
        withdrawn before its group was taken hands on the lead it held or was
        handed, and a group taken is ended (committed, or failed) and woken.
        """
        mine = _Queued(query, params, durable)
        lead = False
        group: list[_Queued] = []
        try:
            with self._lock:
                lead = not self._leading
                if not lead:  # made before it is queued, so the leader can wake it
                    done = mine.waits()
                self._queue.append(mine)
                self._leading = True
            if not lead:
                done.wait()
                if mine.finished:
                    return mine.result()
            # The lead: commit a group that starts with this write.
            with self._lock:
                group = self._queue[: self._most]
                del self._queue[: self._most]
            self._commit(group)
        except BaseException:
            if not group:  # withdrawn before its group was taken: the lead goes on
                with self._lock:
                    if mine in self._queue:
                        self._queue.remove(mine)
                        if lead or mine.lead:
                            self._pass_lead()
            raise
        finally:
            if group:
                self._end(group)
        return mine.result()

    def _end(self, group: list[_Queued]) -> None:
        """Hand the lead on and wake ``group``'s writers; a write not finished failed."""
        with self._lock:
            if self._queue and self._queue[0] in group:  # interrupted as it was taken
                self._queue[:] = [queued for queued in self._queue if queued not in group]
            self._pass_lead()
        for queued in group:
            if not queued.finished:  # the commit was interrupted: its outcome is unknown
                queued.error = OutboxError("the group commit of this write was interrupted")
                queued.finished = True
            queued.wake()

    def _pass_lead(self) -> None:
        """Hand the lead to the oldest queued write, or give it up (holding the lock)."""
        if self._queue:
            self._queue[0].lead = True
            self._queue[0].wake()
        else:
            self._leading = False


class _Checkout:
    """A pooled connection for one ``with`` block, given back after it; a driver error named.

    ``pool.connection()`` for a connection in autocommit, in two calls rather than
    a generator's four and the connection's own ``with``: one of these per record,
    on the drain's hot path. Unlike ``pool.connection()`` it commits nothing on
    the way out: every block here ends the transaction it opens (COMMIT, or
    ``_abort``), and the pool rolls back one left open, with a warning.
    """

    __slots__ = ("_conn", "_store")

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def __enter__(self) -> psycopg.Connection[Any]:
        try:
            self._conn: psycopg.Connection[Any] = self._store._pool.getconn()
        except psycopg.Error as exc:  # PoolTimeout among them
            raise self._store._failed(exc) from exc
        return self._conn

    def __exit__(self, kind: object, exc: BaseException | None, trace: object) -> None:
        self._store._pool.putconn(self._conn)  # rolled back by the pool; discarded if broken
        if isinstance(exc, psycopg.Error) and not isinstance(exc, psycopg.IntegrityError):
            raise self._store._failed(exc) from exc


class PostgresStore(SQLStore):
    """An outbox in a PostgreSQL schema, shared by every host that can reach it."""

    #: Every attempt keeps its attempts row, with the host that sent it: hosts are
    #: many here, and the WAL-page economy of a carried first attempt is SQLite's.
    carries_first_attempt = False
    remote = True

    placeholder = "%s"
    lock_row = " FOR UPDATE"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    greatest = "GREATEST"
    no_limit = None
    integrity_errors = (psycopg.IntegrityError,)

    def __init__(
        self,
        url: str,
        *,
        schema: str = "postonce",
        durability: Durability = "full",
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 10.0,
        create: bool = True,
        check_connections: bool = True,
        migrate: bool = True,
    ) -> None:
        """Connect a pool to ``url`` and migrate ``schema`` (created if missing).

        ``create=False``: a missing outbox is an OutboxError. ``migrate=False``
        (a command that only reads): no DDL at all; an outbox of an older schema
        is an OutboxError saying it needs a migration.

        ``check_connections`` tests each pooled connection before use, so a
        database restart costs no failed call: a poll() of its socket, and an
        empty query (one round trip) only if the server wrote to it while idle,
        as a restart or a terminated backend does before closing it (see
        :func:`_check_connection`). Without it, the first call on a dead
        connection raises OutboxError and the pool reconnects for the next.
        """
        if durability not in ("full", "normal"):
            raise ConfigurationError(f"durability must be 'full' or 'normal', not {durability!r}")
        quoted = '"' + schema.replace('"', '""') + '"'
        super().__init__(
            intents=f"{quoted}.intents",
            attempts=f"{quoted}.attempts",
            receipts=f"{quoted}.receipts",
        )
        self.url = url
        self.schema = schema
        self.durability: Durability = durability
        self._create = create
        self._migrating = migrate
        self._local = threading.local()
        self._group = _GroupCommit(self._commit_group)
        self._records: dict[tuple[Any, ...], str] = {}
        try:
            self._pool = psycopg_pool.ConnectionPool(
                url,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
                # Transactions are opened explicitly (see _transaction); a read
                # outside one is a statement of its own, with nothing to roll back.
                kwargs={"autocommit": True},
                open=False,
                check=_check_connection if check_connections else None,
            )
            self._pool.open(wait=True, timeout=timeout)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise OutboxError(
                f"cannot reach the PostgreSQL outbox at {self._where}: {exc}"
            ) from exc
        try:
            self._migrate()
            self._types = self._column_types()
        except BaseException:
            self._pool.close()
            raise

    @property
    def parallel_calls(self) -> int:
        """An async client's workers: one per pooled connection but one, kept for heartbeats."""
        return max(1, int(self._pool.max_size) - 1)

    @property
    def _where(self) -> str:
        # The URL may carry a password: name the host and database only.
        info = psycopg.conninfo.conninfo_to_dict(self.url)
        return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"

    def _sync_setting(self, durable: bool) -> str:
        # Durable commits wait for the WAL flush whatever the role's default is.
        on = durable and self.durability == "full"
        return f"SET LOCAL synchronous_commit = {'on' if on else 'off'}"

    # -- plumbing ---------------------------------------------------------

    def _migrate(self) -> None:
        with self._connection() as conn:
            if self._migrating:
                migrate(conn, self.schema, create=self._create, where=self._where)
                return
            version = current_version(conn, self.schema)
        if version is None:
            raise OutboxError(f"no outbox in schema {self.schema!r} at {self._where}")
        if version > SCHEMA_VERSION:
            raise newer_schema(f"in schema {self.schema!r}", version, SCHEMA_VERSION)
        if version < SCHEMA_VERSION:
            raise OutboxError(
                f"the outbox in schema {self.schema!r} at {self._where} has schema version "
                f"{version}, and this postonce reads version {SCHEMA_VERSION}: it needs a "
                "migration, which a command that only reads never makes. A postonce.Client (or "
                "postonce drain) of this version migrates it when it opens it"
            )

    def _column_types(self) -> dict[str, dict[str, str]]:
        """Each table's columns and their types, spelled as casts."""
        rows = self._read(
            "SELECT attrelid::regclass::text, attname, format_type(atttypid, atttypmod)"
            " FROM pg_attribute WHERE attrelid IN (%s::regclass, %s::regclass)"
            " AND attnum > 0 AND NOT attisdropped",
            (self._tables["intents"], self._tables["attempts"]),
        )
        types: dict[str, dict[str, str]] = {"intents": {}, "attempts": {}}
        names = {"intents": "intents", "attempts": "attempts"}
        for table, name, kind in rows:
            types[names[str(table).rsplit(".", 1)[-1].strip('"')]][str(name)] = str(kind)
        return types

    def _connection(self) -> _Checkout:
        """A pooled connection for a ``with`` block; a broken one is discarded, the error named."""
        return _Checkout(self)

    def _failed(self, exc: BaseException) -> OutboxError:
        """A driver's error, as the OutboxError naming this outbox (never its password)."""
        return OutboxError(f"PostgreSQL outbox at {self._where} failed: {exc}")

    @contextmanager
    def _transaction(self, conn: psycopg.Connection[Any], durable: bool) -> Iterator[None]:
        """BEGIN with the commit's durability (one message); COMMIT, or ROLLBACK on error.

        A ``conn.transaction()`` inside is a savepoint.
        """
        # Two statements in one message (the simple protocol): one round trip.
        conn.execute(f"BEGIN; {self._sync_setting(durable)}", prepare=False)
        try:
            yield
        except BaseException:
            self._abort(conn)
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _abort(conn: psycopg.Connection[Any]) -> None:
        """Roll back whatever transaction a failure left open (if the connection still works)."""
        if conn.closed or conn.broken:
            return
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            pass  # the pool discards a connection it cannot reset

    @contextmanager
    def _pipelined(self, durable: bool) -> Iterator[psycopg.Connection[Any]]:
        """One write transaction sent as a pipeline: BEGIN, its durability, the block, COMMIT.

        Statements whose results are read after the block (their cursors keep
        them) go with the BEGIN and the COMMIT in one round trip; a read inside
        the block sends what is queued so far (one more). Once the block has
        left, the transaction is committed: results read then are committed ones.
        """
        with self._connection() as conn:
            try:
                with conn.pipeline():
                    conn.execute("BEGIN")
                    conn.execute(self._sync_setting(durable))
                    yield conn
                    conn.execute("COMMIT")
            except BaseException:
                self._abort(conn)
                raise

    @contextmanager
    def _write(self, durable: bool) -> Iterator[psycopg.Connection[Any]]:
        """One write transaction, or one savepoint inside the batch this thread runs."""
        batch = getattr(self._local, "conn", None)
        if batch is not None:
            with batch.transaction():  # a savepoint inside the batch's transaction
                yield batch
            return
        with self._connection() as conn, self._transaction(conn, durable):
            yield conn

    def _read(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        batch = getattr(self._local, "conn", None)
        if batch is not None:
            found: list[tuple[Any, ...]] = batch.execute(query, params).fetchall()
            return found
        with self._connection() as conn:  # autocommit: the statement is its own transaction
            rows: list[tuple[Any, ...]] = conn.execute(query, params).fetchall()
            return rows

    def run_batch(self, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """Run several store calls in one transaction (group commit), each in a savepoint."""
        durable = any(needs_durable(method, kwargs) for method, kwargs in calls)
        results: list[tuple[bool, Any]] = []
        try:
            with self._connection() as conn, self._transaction(conn, durable):
                self._local.conn = conn
                try:
                    for method, kwargs in calls:
                        try:
                            results.append((True, getattr(self, method)(**kwargs)))
                        except psycopg.IntegrityError as exc:
                            results.append((False, exc))
                        except psycopg.Error as exc:
                            # Typed as outside a batch: callers (the drain's claim) catch
                            # OutboxError, never a driver's own exception.
                            failed = self._failed(exc)
                            failed.__cause__ = exc
                            results.append((False, failed))
                        except Exception as exc:
                            results.append((False, exc))
                finally:
                    self._local.conn = None
        except Exception as exc:
            error = exc if isinstance(exc, OutboxError) else OutboxError(str(exc))
            return [(False, error) for _ in calls]
        return results

    # -- the drain's hot moves, in few round trips -------------------------

    def _commit_group(self, group: list[_Queued]) -> None:
        """Commit ``group``'s writes in one transaction, one round trip; each gets its row or error.

        Each write is one statement whose last parameter is the commit's
        durability (it ends in :data:`_DURABILITY`): as durable as the group's
        most durable write. Alone, a write is a statement in autocommit, its own
        transaction; together, they go between BEGIN and COMMIT in one pipeline.
        If the server refused one of them (the transaction certainly not
        committed), each is tried again alone, so only that one fails.
        """
        durable = any(queued.durable for queued in group)
        setting = "on" if durable and self.durability == "full" else "off"
        try:
            with self._connection() as conn:
                if len(group) == 1:
                    (queued,) = group
                    rows = [conn.execute(queued.query, (*queued.params, setting)).fetchone()]
                else:
                    try:
                        with conn.pipeline():
                            conn.execute("BEGIN")
                            cursors = [conn.execute(q.query, (*q.params, setting)) for q in group]
                            conn.execute("COMMIT")
                    except BaseException:
                        self._abort(conn)
                        raise
                    rows = [cursor.fetchone() for cursor in cursors]
        except (OutboxError, psycopg.Error) as exc:
            cause = exc.__cause__ if isinstance(exc, OutboxError) else exc
            sqlstate = getattr(cause, "sqlstate", None) or ""
            if len(group) == 1:
                group[0].error, group[0].finished = exc, True
                return
            if not sqlstate.startswith(_REFUSED):  # the group's commit is unknown: all failed
                for queued in group:
                    queued.error = OutboxError(str(exc))
                    queued.error.__cause__ = cause
                    queued.finished = True
                return
            for queued in group:
                self._commit_group([queued])
            return
        for queued, row in zip(group, rows, strict=True):
            queued.row, queued.finished = row, True

    def _record_query(self, attempt_row: decide.Changes, changes: decide.Changes) -> str:
        """The fenced record of an attempt as one statement, which answers the attempt's number.

        The UPDATE matches only while the claim token owns the row; the attempts
        row is written (numbered by the UPDATE) and the NOTIFY sent only if it did.
        """
        notify = changes.get("state") in TERMINAL_VALUES
        key = (tuple(changes), tuple(attempt_row), notify)
        query = self._records.get(key)
        if query is None:
            sets = ", ".join(f"{column} = %s" for column in changes)
            # Typed: a parameter in a SELECT list is not typed by the column it fills.
            values = ", ".join(
                "u.attempts" if column == "number" else f"%s::{self._types['attempts'][column]}"
                for column in attempt_row
            )
            told = ", pg_notify(%s, u.id::text)" if notify else ""
            query = self._records[key] = self._sql(
                f"WITH u AS (UPDATE {{intents}} SET {sets}, attempts = attempts + 1"
                " WHERE id = %s AND claim_token = %s RETURNING id, attempts),"
                f" a AS (INSERT INTO {{attempts}} ({', '.join(attempt_row)})"
                f" SELECT {values} FROM u)"
                f" SELECT u.attempts{told}, {_DURABILITY} FROM u"
            )
        return query

    def _record(
        self, lease: Lease, attempt: AttemptRecord, changes: decide.Changes, *, durable: bool
    ) -> bool:
        if getattr(self._local, "conn", None) is not None:  # inside run_batch: a savepoint
            return super()._record(lease, attempt, changes, durable=durable)
        # Numbered by the statement; every attempt keeps its row here.
        row = decide.attempt_row(lease, 0, attempt, changes, carry=False)
        assert row is not None
        query = self._record_query(row, changes)
        params = (
            *changes.values(),
            lease.intent_id,
            lease.token,
            *(value for column, value in row.items() if column != "number"),
        )
        if changes.get("state") in TERMINAL_VALUES:
            params = (*params, self._channel)
        return self._group.run(query, params, durable) is not None

    def _fenced(self, lease: Lease, changes: decide.Changes, *, durable: bool) -> bool:
        if getattr(self._local, "conn", None) is not None:
            return super()._fenced(lease, changes, durable=durable)
        told = ", pg_notify(%s, u.id::text)" if changes.get("state") in TERMINAL_VALUES else ""
        query = self._shaped(
            "WITH u AS (UPDATE {intents} SET {sets} WHERE id = ? AND claim_token = ? RETURNING id)"
            f" SELECT 1{told}, {_DURABILITY} FROM u",
            tuple(changes),
        )
        params = (*changes.values(), lease.intent_id, lease.token)
        if told:
            params = (*params, self._channel)
        return self._group.run(query, params, durable) is not None

    def _claim(
        self, *, due_by: float, now: float, limit: int, take: Take, mine: Mine
    ) -> list[Opened]:
        if getattr(self._local, "conn", None) is not None:
            return super()._claim(due_by=due_by, now=now, limit=limit, take=take, mine=mine)
        claimed: list[Opened] = []
        taken: list[decide.Changes] = []
        # BEGIN goes with the first read; the UPDATE with the COMMIT.
        with self._pipelined(durable=True) as conn:
            for row in self._due_rows(conn, due_by=due_by, now=now, limit=limit, mine=mine):
                opened, changes = take(decode_row(row))
                claimed.append(opened)
                taken.append({**changes, "id": opened.record.id})
            if taken:
                columns = tuple(taken[0])
                if any(tuple(changes) != columns for changes in taken):
                    raise ValueError("a claim's rows change different columns")
                # One statement for the batch: each column's values as one array.
                types = self._types["intents"]
                arrays = ", ".join(f"%b::{types[column]}[]" for column in columns)
                sets = ", ".join(f"{column} = v.{column}" for column in columns if column != "id")
                conn.execute(
                    self._sql(
                        f"UPDATE {{intents}} AS i SET {sets}"
                        f" FROM unnest({arrays}) AS v({', '.join(columns)}) WHERE i.id = v.id"
                    ),
                    [
                        binary_array(types[column], [changes[column] for changes in taken])
                        for column in columns
                    ],
                )
        return claimed

    def _due_rows(
        self, conn: psycopg.Connection[Any], *, due_by: float, now: float, limit: int, mine: Mine
    ) -> list[tuple[Any, ...]]:
        # Candidates first, without locks: each arm reads only its first rows
        # from its partial index, so a claim costs O(limit), not O(backlog);
        # each looks a little further than ``limit``, since rows other hosts
        # hold are skipped below.
        ahead = limit * 2 + 8
        only, params = self._mine(mine)
        # Leases of owners known gone are due now, though not run out.
        dead, owners = self._dead(mine)
        dead_i = dead.replace("lease_owner", "i.lease_owner")
        # The same sender/origin filter under the lock: an adopt() may have moved a
        # candidate to another sender since it was read.
        only_i = only.replace("sender", "i.sender").replace("origin", "i.origin")
        candidates = [
            row[0]
            for row in conn.execute(
                self._sql(
                    "(SELECT id FROM {intents} WHERE state = 'pending' AND due_at <= ?"
                    f"{only} ORDER BY due_at, id LIMIT ?)"
                    " UNION"
                    " (SELECT id FROM {intents} WHERE state = 'sending'"
                    f" AND (lease_expires_at <= ?{dead}){only}"
                    " ORDER BY lease_expires_at, id LIMIT ?)"
                    # A clock that went back leaves due times far ahead: pending rows
                    # touched "in the future" are due now (a live lease is never cut short).
                    " UNION"
                    " (SELECT id FROM {intents} WHERE state = 'pending' AND updated_at > ?"
                    # (due_at + 0: sorted, not walked in intents_due's order.)
                    f"{only} ORDER BY due_at + 0, id LIMIT ?)"
                ),
                (
                    *(due_by, *params, ahead),
                    *(due_by, *owners, *params, ahead),
                    *(now + CLOCK_TOLERANCE, *params, ahead),
                ),
            ).fetchall()
        ]
        if not candidates:
            return []
        # Then lock them by primary key, skipping rows another host holds, and
        # check again under the lock: another host may have claimed one since.
        # (``id = ANY``, not a join to unnest(): with the statistics of a table
        # just filled or adopted, the planner joined by a nested loop over a
        # scan of every row, O(rows x candidates): 70 ms a claim at 3000 rows.
        # ANY is a bitmap scan of the key, or one hashed scan of a small table.)
        columns = ", ".join(f"i.{name}" for name in COLUMN_NAMES)
        rows: list[tuple[Any, ...]] = conn.execute(
            self._sql(
                f"SELECT {columns} FROM {{intents}} AS i WHERE i.id = ANY(%b::bigint[])"
                # A CASE, not ORs: the planner cannot turn it back into a scan of
                # every due row; it filters the rows looked up by key.
                " AND CASE i.state"
                "  WHEN 'pending' THEN i.due_at <= ? OR i.updated_at > ?"
                f"  WHEN 'sending' THEN i.lease_expires_at <= ?{dead_i}"
                "  ELSE false END"
                f"{only_i}"
                # When each became due: a pending due time, a sending lease expiry.
                " ORDER BY CASE WHEN i.state = 'sending' THEN i.lease_expires_at"
                " ELSE i.due_at END, i.id LIMIT ?"
                " FOR UPDATE OF i SKIP LOCKED"
            ),
            (candidates, due_by, now + CLOCK_TOLERANCE, due_by, *owners, *params, limit),
        ).fetchall()
        return rows

    @property
    def _channel(self) -> str:
        """The LISTEN/NOTIFY channel of this outbox: one per schema."""
        return f"postonce_{self.schema}"[:63]

    def _ended(self, conn: psycopg.Connection[Any], intent_id: int, changes: Any) -> None:
        # NOTIFY is transactional: waiters hear of it once the terminal state is committed.
        if changes.get("state") in TERMINAL_VALUES:
            conn.execute("SELECT pg_notify(%s, %s)", (self._channel, str(intent_id)))

    def wait_change(self, intent_id: int, timeout: float) -> None:
        """Block until this outbox reports an intent ended (LISTEN), or ``timeout`` passes."""
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                for _ in conn.notifies(timeout=max(0.0, timeout), stop_after=1):
                    break
        except psycopg.Error as exc:
            raise self._failed(exc) from exc

    @property
    def due_channel(self) -> str:
        """The channel NOTIFY'd when an intent written in an application's transaction commits."""
        return f"postonce_due_{self.schema}"[:63]

    @functools.cached_property
    def app_target(self) -> Target:
        """Where ``enqueue`` writes through an application's connection to this database."""
        try:
            with self._pool.connection() as conn:
                row = conn.execute("SELECT current_database()").fetchone()
        except psycopg.Error as exc:
            raise self._failed(exc) from exc
        assert row is not None
        return Target("postgres", self._tables["intents"], str(row[0]), self.due_channel)

    @contextmanager
    def due_listener(self, stop: threading.Event) -> Iterator[Callable[[float], None]]:
        """A drain's idle wait: it ends when an enqueued intent commits (LISTEN), or at a stop.

        One connection listens for the drain's whole run, so a commit between two
        waits is heard at the next. If it fails, the wait falls back to sleeping.
        """
        try:
            listening = psycopg.connect(self.url, autocommit=True)
            listening.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.due_channel)))
        except psycopg.Error as exc:
            raise self._failed(exc) from exc

        def wait(timeout: float) -> None:
            end = time.monotonic() + timeout
            while not stop.is_set() and (left := end - time.monotonic()) > 0:
                try:
                    for _ in listening.notifies(timeout=min(left, _STOP_LOOK), stop_after=1):
                        return
                except psycopg.Error:
                    stop.wait(left)
                    return

        try:
            yield wait
        finally:
            listening.close()

    def close(self) -> None:
        self._pool.close()
