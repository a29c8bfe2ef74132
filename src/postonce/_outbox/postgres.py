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
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool
from psycopg import sql

from .._engine import CLOCK_TOLERANCE
from .._exceptions import ConfigurationError, IntentConflict, OutboxError
from .._intent import TERMINAL
from .migrations.postgres import MIGRATIONS, SCHEMA_VERSION, migrate, migrations
from .rows import COLUMN_NAMES, needs_durable
from .sql import SQLStore
from .sqlite import Durability
from .store import Mine

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresStore", "migrations"]

TERMINAL_VALUES = frozenset(state.value for state in TERMINAL)


class PostgresStore(SQLStore):
    """An outbox in a PostgreSQL schema, shared by every host that can reach it."""

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
    ) -> None:
        """Connect a pool to ``url`` and migrate ``schema`` (created if missing).

        ``check_connections`` tests each pooled connection before use (one
        round trip), so a database restart costs no failed call; without it,
        the first call on a dead connection raises OutboxError and the pool
        reconnects for the next.
        """
        if durability not in ("full", "normal"):
            raise ConfigurationError(f"durability must be 'full' or 'normal', not {durability!r}")
        quoted = '"' + schema.replace('"', '""') + '"'
        super().__init__(intents=f"{quoted}.intents", attempts=f"{quoted}.attempts")
        self.url = url
        self.schema = schema
        self.durability: Durability = durability
        self._create = create
        self._local = threading.local()
        try:
            self._pool = psycopg_pool.ConnectionPool(
                url,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
                kwargs={"autocommit": False},
                open=False,
                check=psycopg_pool.ConnectionPool.check_connection if check_connections else None,
            )
            self._pool.open(wait=True, timeout=timeout)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise OutboxError(
                f"cannot reach the PostgreSQL outbox at {self._where}: {exc}"
            ) from exc
        try:
            self._migrate()
        except BaseException:
            self._pool.close()
            raise

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
            migrate(conn, self.schema, create=self._create, where=self._where)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; a broken one is discarded and the error named."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except (OutboxError, IntentConflict, psycopg.IntegrityError):
            raise
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise OutboxError(f"PostgreSQL outbox at {self._where} failed: {exc}") from exc

    @contextmanager
    def _write(self, durable: bool) -> Iterator[psycopg.Connection[Any]]:
        """One write transaction, or one savepoint inside the batch this thread runs."""
        batch = getattr(self._local, "conn", None)
        if batch is not None:
            with batch.transaction():  # a savepoint inside the batch's transaction
                yield batch
            return
        with self._connection() as conn, conn.transaction():
            conn.execute(self._sync_setting(durable))
            yield conn

    def _read(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        batch = getattr(self._local, "conn", None)
        if batch is not None:
            found: list[tuple[Any, ...]] = batch.execute(query, params).fetchall()
            return found
        with self._connection() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(query, params).fetchall()
            conn.rollback()
            return rows

    def run_batch(self, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """Run several store calls in one transaction (group commit), each in a savepoint."""
        durable = any(needs_durable(method, kwargs) for method, kwargs in calls)
        results: list[tuple[bool, Any]] = []
        try:
            with self._connection() as conn, conn.transaction():
                conn.execute(self._sync_setting(durable))
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
                            failed = OutboxError(
                                f"PostgreSQL outbox at {self._where} failed: {exc}"
                            )
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
        # (Joined to the list, so each row is looked up by its key.)
        columns = ", ".join(f"i.{name}" for name in COLUMN_NAMES)
        rows: list[tuple[Any, ...]] = conn.execute(
            self._sql(
                f"SELECT {columns} FROM unnest(?::bigint[]) AS c(id)"
                " JOIN {intents} AS i ON i.id = c.id"
                # A CASE, not ORs: the planner cannot turn it back into a scan of
                # every due row; it filters the rows looked up by key.
                " WHERE CASE i.state"
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
            raise OutboxError(f"PostgreSQL outbox at {self._where} failed: {exc}") from exc

    def close(self) -> None:
        self._pool.close()
