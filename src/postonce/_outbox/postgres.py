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

import dataclasses
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import psycopg
import psycopg_pool
from psycopg import sql

from .._engine import CLOCK_TOLERANCE
from .._exceptions import ConfigurationError, IntentConflict, OutboxError
from .._intent import IntentRecord, Outcome, State, StoredResponse, operator_move
from .base import AttemptRecord, Lease, NewIntent, Opened
from .rows import COLUMNS, decode_row, export_rows, needs_durable
from .sqlite import Durability

__all__ = ["MIGRATIONS", "PostgresStore", "migrations"]

_BY_REFERENCE_FOR_UPDATE = (
    f"SELECT {COLUMNS} FROM {{schema}}.intents WHERE reference = %s FOR UPDATE"
)
_MIGRATION_LOCK = 0x706F73746F6E6365  # "postonce": one migrator at a time, per database


def migrations() -> list[tuple[int, str]]:
    """(version, SQL) for every migration file, in order."""
    folder = resources.files("postonce._outbox.migrations.postgres")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text()))
    return sorted(found)


MIGRATIONS = migrations()
SCHEMA_VERSION = MIGRATIONS[-1][0]


class PostgresStore:
    """An outbox in a PostgreSQL schema, shared by every host that can reach it."""

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
        self.url = url
        self.schema = schema
        self.durability: Durability = durability
        self._create = create
        self._q = sql.Identifier(schema)
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

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(schema=self._q)

    # -- plumbing ---------------------------------------------------------

    def _current_version(self, conn: psycopg.Connection[Any]) -> int | None:
        """The stored schema version, or None where no outbox is (or can be seen)."""
        found = conn.execute(
            "SELECT 1 FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name = 'postonce_meta'",
            (self.schema,),
        ).fetchone()
        if found is None:
            conn.rollback()
            return None
        row = conn.execute(self._sql("SELECT version FROM {schema}.postonce_meta")).fetchone()
        conn.rollback()
        return None if row is None else int(row[0])

    def _migrate(self) -> None:
        with self._connection() as conn:
            # An outbox already current needs no DDL: a role with only the run-time
            # grants (no CREATE) can use it.
            if self._current_version(conn) == SCHEMA_VERSION:
                return
            if not self._create:
                found = conn.execute(
                    "SELECT 1 FROM information_schema.tables"
                    " WHERE table_schema = %s AND table_name = 'postonce_meta'",
                    (self.schema,),
                ).fetchone()
                if found is None:
                    raise OutboxError(f"no outbox in schema {self.schema!r} at {self._where}")
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                conn.execute(self._sql("CREATE SCHEMA IF NOT EXISTS {schema}"))
                conn.execute(
                    self._sql("CREATE TABLE IF NOT EXISTS {schema}.postonce_meta (version integer)")
                )
                row = conn.execute(
                    self._sql("SELECT version FROM {schema}.postonce_meta")
                ).fetchone()
                version = 0 if row is None else int(row[0])
                if version > SCHEMA_VERSION:
                    raise OutboxError(
                        f"the outbox in schema {self.schema!r} has schema version {version}, "
                        f"written by a newer postonce; this one knows versions up to "
                        f"{SCHEMA_VERSION}: upgrade postonce"
                    )
                for number, text in MIGRATIONS:
                    if number > version:
                        conn.execute(self._sql(text))
                if row is None:
                    conn.execute(
                        self._sql("INSERT INTO {schema}.postonce_meta VALUES (%s)"),
                        (SCHEMA_VERSION,),
                    )
                elif version < SCHEMA_VERSION:
                    conn.execute(
                        self._sql("UPDATE {schema}.postonce_meta SET version = %s"),
                        (SCHEMA_VERSION,),
                    )

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

    def _read(self, query: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        batch = getattr(self._local, "conn", None)
        if batch is not None:
            found: list[tuple[Any, ...]] = batch.execute(self._sql(query), params).fetchall()
            return found
        with self._connection() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(self._sql(query), params).fetchall()
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

    # -- the Store protocol -----------------------------------------------

    def open_intent(self, new: NewIntent, *, owner: str, now: float, lease_for: float) -> Opened:
        token = os.urandom(12).hex()
        expires = now + lease_for
        try:
            with self._write(durable=True) as conn:
                row = conn.execute(
                    self._sql(
                        "INSERT INTO {schema}.intents (reference, key, provider, method, url,"
                        " headers, body, fingerprint, state, created_at, updated_at,"
                        " first_delivery_at, deadline_at, attempts, lease_owner,"
                        " lease_expires_at, claim_token)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0,"
                        " %s, %s, %s)"
                        # Any unique conflict (reference or key, even both at once
                        # under concurrency) inserts nothing; which is read back.
                        " ON CONFLICT DO NOTHING RETURNING id"
                    ),
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
                ).fetchone()
                if row is not None:
                    record = IntentRecord(
                        id=int(row[0]),
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
                    lease = Lease(int(row[0]), token, owner, expires)
                    return Opened(record, lease, created=True, conflict=None, anchor_before=None)
                return self._reopen(conn, new, Lease(0, token, owner, expires), now)
        except psycopg.IntegrityError as exc:
            raise IntentConflict(
                "this key already belongs to another intent", reference=new.reference, key=new.key
            ) from exc

    def _reopen(
        self, conn: psycopg.Connection[Any], new: NewIntent, lease: Lease, now: float
    ) -> Opened:
        row = conn.execute(self._sql(_BY_REFERENCE_FOR_UPDATE), (new.reference,)).fetchone()
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
        if conflict or record.state not in (State.PENDING, State.SENDING) or not free:
            return Opened(
                record,
                None,
                created=False,
                conflict=conflict,
                anchor_before=record.first_delivery_at,
            )
        anchor = record.first_delivery_at if record.first_delivery_at is not None else now
        conn.execute(
            self._sql(
                "UPDATE {schema}.intents SET state = %s, lease_owner = %s, lease_expires_at = %s,"
                " claim_token = %s, first_delivery_at = %s, updated_at = %s WHERE id = %s"
            ),
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
            "state = %s",
            "attempts = attempts + 1",
            "last_outcome = %s",
            "first_delivery_at = %s",
            "due_at = %s",
            "lease_owner = %s",
            "lease_expires_at = %s",
            "claim_token = %s",
            "updated_at = %s",
            "note = COALESCE(%s, note)",
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
                "response_status = %s",
                "response_headers = %s",
                "response_body = %s",
                "response_truncated = %s",
                "response_sha256 = %s",
            ]
            params += [
                response.status,
                json.dumps(response.headers),
                response.body,
                int(response.truncated),
                response.sha256,
            ]
        with self._write(durable=durable) as conn:
            row = conn.execute(
                self._sql(
                    "UPDATE {schema}.intents SET "
                    + ", ".join(sets)
                    + " WHERE id = %s AND claim_token = %s RETURNING attempts"
                ),
                (*params, lease.intent_id, lease.token),
            ).fetchone()
            if row is None:
                return False
            conn.execute(
                self._sql(
                    "INSERT INTO {schema}.attempts (intent_id, number, started_at, duration,"
                    " outcome, status, error_type, replayed, owner)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                ),
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
                self._sql(
                    "UPDATE {schema}.intents SET lease_expires_at = %s, updated_at = %s"
                    " WHERE id = %s AND claim_token = %s"
                ),
                (until, now, lease.intent_id, lease.token),
            )
            changed = cur.rowcount
        if changed != 1:
            return None
        return Lease(lease.intent_id, lease.token, lease.owner, until)

    def release(
        self, lease: Lease, *, now: float, due_at: float | None, anchor: float | None
    ) -> bool:
        with self._write(durable=False) as conn:
            cur = conn.execute(
                self._sql(
                    "UPDATE {schema}.intents SET state = %s, due_at = %s, first_delivery_at = %s,"
                    " lease_owner = NULL, lease_expires_at = NULL, claim_token = NULL,"
                    " updated_at = %s WHERE id = %s AND claim_token = %s"
                ),
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
                self._sql(
                    "UPDATE {schema}.intents SET state = %s, note = %s, due_at = NULL,"
                    " lease_owner = NULL, lease_expires_at = NULL, claim_token = NULL,"
                    " updated_at = %s WHERE id = %s AND claim_token = %s"
                ),
                (state.value, note, now, lease.intent_id, lease.token),
            )
            return cur.rowcount == 1

    def claim_due(
        self,
        *,
        owner: str,
        now: float,
        limit: int,
        lease_for: float,
        due_by: float | None = None,
    ) -> list[Opened]:
        """Lease up to ``limit`` due intents; other hosts skip the rows we lock."""
        expires = now + lease_for
        due_by = now if due_by is None else min(due_by, now)
        claimed: list[Opened] = []
        with self._write(durable=True) as conn:
            # Candidates first, without locks: each arm reads only its first rows
            # from its partial index, so a claim costs O(limit), not O(backlog);
            # each looks a little further than ``limit``, since rows other hosts
            # hold are skipped below.
            ahead = limit * 2 + 8
            candidates = [
                row[0]
                for row in conn.execute(
                    self._sql(
                        "(SELECT id FROM {schema}.intents WHERE state = 'pending' AND due_at <= %s"
                        " ORDER BY due_at, id LIMIT %s)"
                        " UNION"
                        " (SELECT id FROM {schema}.intents"
                        " WHERE state = 'sending' AND lease_expires_at <= %s"
                        " ORDER BY lease_expires_at, id LIMIT %s)"
                        # A clock that went back leaves due times far ahead: pending rows
                        # touched "in the future" are due now (a live lease is never cut short).
                        " UNION"
                        " (SELECT id FROM {schema}.intents"
                        " WHERE state = 'pending' AND updated_at > %s"
                        # (due_at + 0: sorted, not walked in intents_due's order.)
                        " ORDER BY due_at + 0, id LIMIT %s)"
                    ),
                    (due_by, ahead, due_by, ahead, now + CLOCK_TOLERANCE, ahead),
                ).fetchall()
            ]
            if not candidates:
                return []
            # Then lock them by primary key, skipping rows another host holds, and
            # check again under the lock: another host may have claimed one since.
            # (Joined to the list, so each row is looked up by its key.)
            columns = ", ".join(f"i.{name.strip()}" for name in COLUMNS.split(","))
            rows = conn.execute(
                self._sql(
                    f"SELECT {columns} FROM unnest(%s::bigint[]) AS c(id)"
                    " JOIN {schema}.intents AS i ON i.id = c.id"
                    # A CASE, not ORs: the planner cannot turn it back into a scan of
                    # every due row; it filters the rows looked up by key.
                    " WHERE CASE i.state"
                    "  WHEN 'pending' THEN i.due_at <= %s OR i.updated_at > %s"
                    "  WHEN 'sending' THEN i.lease_expires_at <= %s"
                    "  ELSE false END"
                    # When each became due: a pending due time, a sending lease expiry.
                    " ORDER BY CASE WHEN i.state = 'sending' THEN i.lease_expires_at"
                    " ELSE i.due_at END, i.id LIMIT %s"
                    " FOR UPDATE OF i SKIP LOCKED"
                ),
                (candidates, due_by, now + CLOCK_TOLERANCE, due_by, limit),
            ).fetchall()
            records = [decode_row(row) for row in rows]
            tokens = [os.urandom(12).hex() for _ in records]
            anchors = [r.first_delivery_at if r.delivered_maybe else now for r in records]
            if records:
                # One round trip for the whole claim, not one per row.
                conn.execute(
                    self._sql(
                        "UPDATE {schema}.intents AS i SET state = %s, lease_owner = %s,"
                        " lease_expires_at = %s, claim_token = v.token,"
                        " first_delivery_at = v.anchor, updated_at = %s"
                        " FROM unnest(%s::bigint[], %s::text[], %s::double precision[])"
                        " AS v(id, token, anchor) WHERE i.id = v.id"
                    ),
                    (
                        State.SENDING.value,
                        owner,
                        expires,
                        now,
                        [r.id for r in records],
                        tokens,
                        anchors,
                    ),
                )
            for record, token, anchor in zip(records, tokens, anchors, strict=True):
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

    def get(self, reference: str) -> IntentRecord | None:
        rows = self._read(
            f"SELECT {COLUMNS} FROM {{schema}}.intents WHERE reference = %s", (reference,)
        )
        return decode_row(rows[0]) if rows else None

    def attempts(self, reference: str) -> list[AttemptRecord]:
        rows = self._read(
            "SELECT a.started_at, a.duration, a.outcome, a.status, a.error_type, a.replayed"
            " FROM {schema}.attempts a JOIN {schema}.intents i ON i.id = a.intent_id"
            " WHERE i.reference = %s ORDER BY a.number",
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

    def list_intents(
        self, *, state: State | None = None, limit: int | None = None
    ) -> list[IntentRecord]:
        where = "WHERE state = %s" if state is not None else ""
        params: tuple[object, ...] = (state.value,) if state is not None else ()
        rows = self._read(
            f"SELECT {COLUMNS} FROM {{schema}}.intents {where} ORDER BY id DESC LIMIT %s",
            (*params, limit),
        )
        return [decode_row(r) for r in rows]

    def stats(self, *, now: float) -> dict[str, Any]:
        counts = {state.value: 0 for state in State}
        for state, count in self._read(
            "SELECT state, count(*) FROM {schema}.intents WHERE purged_at IS NULL GROUP BY state",
            (),
        ):
            counts[str(state)] = int(count)
        oldest, next_due, lease_due, tombstones, due_now = self._read(
            "SELECT"
            " (SELECT min(created_at) FROM {schema}.intents WHERE state = 'pending'),"
            " (SELECT min(due_at) FROM {schema}.intents WHERE state = 'pending'),"
            " (SELECT min(lease_expires_at) FROM {schema}.intents WHERE state = 'sending'),"
            " (SELECT count(*) FROM {schema}.intents WHERE purged_at IS NOT NULL),"
            " (SELECT count(*) FROM {schema}.intents WHERE (state = 'pending' AND due_at <= %s)"
            "  OR (state = 'sending' AND lease_expires_at <= %s))",
            (now, now),
        )[0]
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
        with self._write(durable=True) as conn:
            row = conn.execute(
                self._sql(
                    f"SELECT {COLUMNS} FROM {{schema}}.intents WHERE reference = %s FOR UPDATE"
                ),
                (reference,),
            ).fetchone()
            if row is None:
                raise KeyError(reference)
            record = decode_row(row)
            operator_move(record, to, now)
            conn.execute(
                self._sql(
                    "UPDATE {schema}.intents SET state = %s, note = %s, due_at = NULL,"
                    " lease_owner = NULL, lease_expires_at = NULL, claim_token = NULL,"
                    " updated_at = %s WHERE id = %s"
                ),
                (to.value, note, now, record.id),
            )
        return dataclasses.replace(
            record, state=to, note=note, due_at=None, lease_owner=None, lease_expires_at=None
        )

    def purge(self, *, before: float, tombstones: bool, now: float) -> int:
        with self._write(durable=True) as conn:
            if tombstones:
                ids = (
                    "SELECT id FROM {schema}.intents WHERE purged_at IS NOT NULL AND purged_at < %s"
                )
                conn.execute(
                    self._sql(f"DELETE FROM {{schema}}.attempts WHERE intent_id IN ({ids})"),
                    (before,),
                )
                cur = conn.execute(
                    self._sql(f"DELETE FROM {{schema}}.intents WHERE id IN ({ids})"), (before,)
                )
                return cur.rowcount
            # Unresolved expired intents stay until a person resolves them.
            ids = (
                "SELECT id FROM {schema}.intents"
                " WHERE state IN ('succeeded', 'failed', 'cancelled')"
                " AND updated_at < %s AND purged_at IS NULL"
            )
            conn.execute(
                self._sql(f"DELETE FROM {{schema}}.attempts WHERE intent_id IN ({ids})"), (before,)
            )
            cur = conn.execute(
                self._sql(
                    "UPDATE {schema}.intents SET body = ''::bytea, headers = '[]',"
                    " response_headers = NULL, response_body = NULL, purged_at = %s"
                    f" WHERE id IN ({ids})"
                ),
                (now, before),
            )
            return cur.rowcount

    def export_rows(self) -> Iterator[dict[str, Any]]:
        return export_rows(self)

    def close(self) -> None:
        self._pool.close()
