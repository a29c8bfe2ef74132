"""The Store protocol once, in SQL, for every SQL backend.

:class:`SQLStore` writes each store move as SQL over the decisions in
:mod:`.decide`. A backend subclass supplies only what truly differs: how a
transaction is opened and committed (and how durable it is), how a read runs,
which due rows a claim may lock (``BEGIN IMMEDIATE`` in SQLite, ``FOR UPDATE
SKIP LOCKED`` in PostgreSQL), and the spelling of the dialect: placeholders,
schema-qualified table names, the row-lock clause and "no limit".

Statements are written with ``?`` placeholders and ``{intents}`` /
``{attempts}`` for the tables; :meth:`SQLStore._sql` spells them for the
backend once and caches the result.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from .._exceptions import IntentConflict
from .._intent import IntentRecord, State
from .._lease import alive as lease_owner_alive
from . import decide
from .base import AttemptRecord, Census, Foreign, Lease, NewIntent, Opened, Purged
from .rows import COLUMNS, decode_attempt, decode_row
from .store import Mine, StoreBase, Take

__all__ = ["SQLStore"]

# ``conn`` below is a DB-API connection, sqlite3's or psycopg's: both answer
# ``execute(query, params)`` with a cursor, and neither's stubs name the other.


class SQLStore(StoreBase):
    """One outbox implementation over a SQL dialect; subclasses bring the connection."""

    #: The dialect's parameter marker.
    placeholder: ClassVar[str] = "?"
    #: Appended to a SELECT that reads a row it is about to change.
    lock_row: ClassVar[str] = ""
    #: The LIMIT value that means "all rows".
    no_limit: ClassVar[int | None] = -1
    #: The dialect's two-argument maximum.
    greatest: ClassVar[str] = "max"
    #: Appended to a SELECT of rows to take, where other claimants skip them.
    skip_locked: ClassVar[str] = ""
    #: The driver's unique-violation errors (an INSERT racing another).
    integrity_errors: ClassVar[tuple[type[Exception], ...]] = ()
    #: A new intent's row is cheaper as one statement, its own transaction
    #: (:meth:`_insert_alone`), tried before the general path.
    one_statement_writes: ClassVar[bool] = False

    def __init__(
        self, intents: str, attempts: str, leases: str | None = None, receipts: str = "receipts"
    ) -> None:
        # ``leases``: what the queries of sending rows' leases read; by default the
        # intents table (SQLite's keeps fresh rows out of its lease index).
        # ``receipts``: where ``receive_once`` records notifications (schema v9 / 6).
        self._tables = {
            "intents": intents,
            "attempts": attempts,
            "leases": leases or intents,
            "receipts": receipts,
        }
        self._spelled: dict[str, str] = {}
        self._shapes: dict[tuple[str, tuple[str, ...]], str] = {}

    # -- what a backend supplies -----------------------------------------

    @abstractmethod
    def _write(self, durable: bool) -> AbstractContextManager[Any]:
        """One write transaction (or a savepoint inside the running batch); yields a connection.

        ``durable``: the commit must survive power loss (where the outbox is
        configured for it). A driver error leaves as ``OutboxError``; a
        unique violation as one of :attr:`integrity_errors`.
        """

    def _insert_alone(self, row: decide.Changes) -> int | None:
        """A new intent's row as one statement of its own: its id, or None if nothing was written.

        Only for a backend with :attr:`one_statement_writes`. None covers any
        unique value already held (the general path reads which).
        """
        raise NotImplementedError

    @abstractmethod
    def _read(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run one spelled SELECT outside any write; driver errors leave as ``OutboxError``."""

    @abstractmethod
    def _due_rows(
        self, conn: Any, *, due_by: float, now: float, limit: int, mine: Mine
    ) -> list[tuple[Any, ...]]:
        """The rows (``COLUMNS``) a claim takes: due, oldest due first, at most ``limit``.

        Due means pending with ``due_at <= due_by``; sending under a lease that
        expired by ``due_by`` (its owner died); or pending but touched after
        ``now`` plus the clock tolerance (a clock that went back). Each row is
        locked against other claimants until the transaction ends. Each arm
        filters by :meth:`_mine` (its sender leads the claim indexes).
        """

    @abstractmethod
    def close(self) -> None: ...

    # -- the dialect -------------------------------------------------------

    def _sql(self, text: str) -> str:
        """``text`` in this backend's spelling (tables named, placeholders marked)."""
        spelled = self._spelled.get(text)
        if spelled is None:
            spelled = text.format(**self._tables).replace("?", self.placeholder)
            self._spelled[text] = spelled
        return spelled

    @staticmethod
    def _mine(mine: Mine, unindexed: str = "") -> tuple[str, tuple[Any, ...]]:
        """The ``AND ...`` filter (and its parameters) for the rows a claim may take.

        ``unindexed``: a prefix that keeps the planner off the sender-led indexes
        (SQLite's unary ``+``), for an arm another index serves better.
        """
        params: tuple[Any, ...]
        text, params = "", ()
        if mine.sender is not None:
            text, params = f" AND {unindexed}sender = ?", (mine.sender,)
        if mine.origins is not None:
            marks = ", ".join("?" for _ in mine.origins)
            text += f" AND origin IN ({marks})" if mine.origins else " AND 1 = 0"
            params += mine.origins
        return text, params

    @staticmethod
    def _dead(mine: Mine) -> tuple[str, tuple[Any, ...]]:
        """``OR lease_owner IN (...)``: the sending rows of owners known gone (or nothing)."""
        if not mine.dead:
            return "", ()
        return f" OR lease_owner IN ({', '.join('?' for _ in mine.dead)})", mine.dead

    def _holders(self, now: float, mine: Mine) -> list[str]:
        only, params = self._mine(mine)
        rows = self._select(
            "SELECT DISTINCT lease_owner FROM {leases}"
            f" WHERE state = 'sending' AND lease_expires_at > ?{only}",
            (now, *params),
        )
        return [str(owner) for (owner,) in rows if owner is not None]

    def _shaped(self, template: str, columns: tuple[str, ...]) -> str:
        """``template`` with ``{sets}``, ``{cols}`` and ``{marks}`` for ``columns``, spelled.

        Cached by shape: the hot path writes the same few column sets every call.
        """
        key = (template, columns)
        spelled = self._shapes.get(key)
        if spelled is None:
            text = template.format(
                **self._tables,
                sets=", ".join(f"{column} = ?" for column in columns),
                cols=", ".join(columns),
                marks=", ".join("?" for _ in columns),
            )
            spelled = self._shapes[key] = text.replace("?", self.placeholder)
        return spelled

    def _select(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._read(self._sql(text), params)

    def _run(self, conn: Any, text: str, params: Sequence[Any]) -> Any:
        """Execute one statement inside a write; returns the driver's cursor."""
        return conn.execute(self._sql(text), params)

    def _update(
        self, conn: Any, intent_id: int, changes: decide.Changes, *, token: str | None = None
    ) -> int:
        """Write ``changes`` to one intent (only while ``token`` owns it, if given)."""
        if token is None:
            query = self._shaped("UPDATE {intents} SET {sets} WHERE id = ?", tuple(changes))
            cur = conn.execute(query, (*changes.values(), intent_id))
        else:
            query = self._shaped(
                "UPDATE {intents} SET {sets} WHERE id = ? AND claim_token = ?", tuple(changes)
            )
            cur = conn.execute(query, (*changes.values(), intent_id, token))
        return int(cur.rowcount)

    def _fenced(self, lease: Lease, changes: decide.Changes, *, durable: bool) -> bool:
        """One change to a leased intent, accepted only while the lease's token owns it."""
        with self._write(durable=durable) as conn:
            changed = self._update(conn, lease.intent_id, changes, token=lease.token) == 1
            if changed:
                self._ended(conn, lease.intent_id, changes)
            return changed

    def _extend(self, lease: Lease, now: float, until: float) -> float | None:
        with self._write(durable=False) as conn:
            row = self._run(
                conn,
                f"UPDATE {{intents}} SET lease_expires_at = {self.greatest}(lease_expires_at, ?),"
                " updated_at = ? WHERE id = ? AND claim_token = ? RETURNING lease_expires_at",
                (until, now, lease.intent_id, lease.token),
            ).fetchone()
        return None if row is None else float(row[0])

    def _ended(self, conn: Any, intent_id: int, changes: decide.Changes) -> None:
        """Tell waiters (``Client.wait``) that an intent reached a terminal state.

        A no-op where waiters poll; PostgreSQL sends a NOTIFY, delivered on commit.
        """

    _TAKE: ClassVar[dict[str, tuple[str, str]]] = {
        "settle": ("settle_due_at <= ?", " ORDER BY settle_due_at, id"),
        "expired": (
            # Spelled as the partial index intents_unresolved is (schema v7).
            "state IN ('expired', 'indeterminate') AND (reconcile_at IS NULL OR reconcile_at <= ?)",
            " ORDER BY id",
        ),
    }

    def _take_rows(
        self, kind: str, *, mine: Mine, now: float, limit: int, changes: decide.Changes
    ) -> list[IntentRecord]:
        where, order = self._TAKE[kind]
        only, params = self._mine(mine)
        with self._write(durable=False) as conn:
            rows = self._run(
                conn,
                f"SELECT {COLUMNS} FROM {{intents}} WHERE {where}{only}{order} LIMIT ?"
                f"{self.skip_locked}",
                (now, *params, limit),
            ).fetchall()
            records = [decode_row(row) for row in rows]
            for record in records:
                self._update(conn, record.id, changes)
        return records

    def _change_row(
        self, intent_id: int, changes: decide.Changes, *, bump: str | None, owed_at: float
    ) -> bool:
        extra = f", {bump} = {bump} + 1" if bump is not None else ""
        query = self._shaped(
            f"UPDATE {{intents}} SET {{sets}}{extra} WHERE id = ? AND settle_due_at = ?",
            tuple(changes),
        )
        with self._write(durable=False) as conn:
            cur = conn.execute(query, (*changes.values(), intent_id, owed_at))
            return int(cur.rowcount) == 1

    def _by_reference(self, conn: Any, reference: str) -> IntentRecord | None:
        """The intent stored under ``reference``, locked for this transaction's change."""
        row = self._run(
            conn,
            f"SELECT {COLUMNS} FROM {{intents}} WHERE reference = ?{self.lock_row}",
            (reference,),
        ).fetchone()
        return None if row is None else decode_row(row)

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
        row = decide.insert_row(new, lease, now)
        tried = False
        try:
            if self.one_statement_writes:
                # The common case, a new intent, is one statement: its own
                # transaction. Any conflict is read and decided below.
                intent_id = self._insert_alone(row)
                if intent_id is not None:
                    return decide.created(new, intent_id, lease, now)
                tried = True
            with self._write(durable=True) as conn:
                # After a statement alone that clashed, the stored intent is read
                # first; the INSERT runs here only if none is (again, if the row
                # it clashed with is gone since).
                record = self._by_reference(conn, new.reference) if tried else None
                if record is None:
                    insert = self._shaped(
                        "INSERT INTO {intents} ({cols}) VALUES ({marks})"
                        # Any unique conflict (reference or key, even both at once under
                        # concurrency) inserts nothing; which one it was is read back.
                        " ON CONFLICT DO NOTHING RETURNING id",
                        tuple(row),
                    )
                    found = conn.execute(insert, tuple(row.values())).fetchone()
                    if found is not None:
                        return decide.created(new, int(found[0]), lease, now)
                    record = self._by_reference(conn, new.reference)
                if record is None:  # not this reference: the key belongs to another intent
                    raise IntentConflict(decide.KEY_TAKEN, reference=new.reference, key=new.key)
                opened, changes = decide.reopened(record, new, lease, now, alive)
                if changes is not None:
                    self._update(conn, record.id, changes)
                return opened
        except self.integrity_errors as exc:
            raise IntentConflict(decide.KEY_TAKEN, reference=new.reference, key=new.key) from exc

    def _record(
        self, lease: Lease, attempt: AttemptRecord, changes: decide.Changes, *, durable: bool
    ) -> bool:
        with self._write(durable=durable) as conn:
            number = self._count_attempt(conn, lease, changes, first=False)
            if number is None:
                return False
            self._ended(conn, lease.intent_id, changes)
            row = decide.attempt_row(
                lease, number, attempt, changes, carry=self.carries_first_attempt
            )
            if row is not None:
                insert = self._shaped(
                    "INSERT INTO {attempts} ({cols}) VALUES ({marks})", tuple(row)
                )
                conn.execute(insert, tuple(row.values()))
            return True

    def _count_attempt(
        self, conn: Any, lease: Lease, changes: decide.Changes, *, first: bool
    ) -> int | None:
        """Write ``changes`` and count one attempt, while the lease owns the row; its number.

        ``first``: only while no attempt is counted; the number is then 1, so
        nothing is read back (a ``RETURNING`` clause costs SQLite an ephemeral
        table) and the count of changed rows says whether it matched. None:
        nothing matched.
        """
        counted, then = (
            ("1", " AND attempts = 0") if first else ("attempts + 1", " RETURNING attempts")
        )
        update = self._shaped(
            f"UPDATE {{intents}} SET {{sets}}, attempts = {counted}"
            f" WHERE id = ? AND claim_token = ?{then}",
            tuple(changes),
        )
        cursor = conn.execute(update, (*changes.values(), lease.intent_id, lease.token))
        if first:
            return 1 if cursor.rowcount == 1 else None
        rows = cursor.fetchall()
        return int(rows[0][0]) if rows else None

    def _claim(
        self, *, due_by: float, now: float, limit: int, take: Take, mine: Mine
    ) -> list[Opened]:
        claimed: list[Opened] = []
        updates: list[tuple[Any, ...]] = []
        sets = ""
        with self._write(durable=True) as conn:
            for row in self._due_rows(conn, due_by=due_by, now=now, limit=limit, mine=mine):
                opened, changes = take(decode_row(row))
                claimed.append(opened)
                updates.append((*changes.values(), opened.record.id))
                sets = ", ".join(f"{column} = ?" for column in changes)
            if updates:
                # One statement for the batch (psycopg pipelines it: one round trip).
                conn.cursor().executemany(
                    self._sql(f"UPDATE {{intents}} SET {sets} WHERE id = ?"), updates
                )
        return claimed

    def _unowned(
        self, previous: str | None, unfinished: bool = False
    ) -> list[tuple[int, str, str | None]]:
        whose = "sender IS NULL" if previous is None else "sender = ?"
        params: tuple[Any, ...] = () if previous is None else (previous,)
        if unfinished:
            # Each arm through its claim index (sender first): a drain asks at every pass.
            rows = self._select(
                f"SELECT id, url, origin FROM {{intents}} WHERE {whose} AND state = 'pending'"
                f" UNION ALL SELECT id, url, origin FROM {{leases}}"
                f" WHERE {whose} AND state = 'sending'",
                params * 2,
            )
        else:
            rows = self._select(f"SELECT id, url, origin FROM {{intents}} WHERE {whose}", params)
        return [(int(i), str(url), origin) for i, url, origin in rows]

    def _assign(self, changes: list[tuple[int, decide.Changes]], previous: str | None) -> int:
        whose = "sender IS NULL" if previous is None else "sender = ?"
        adopted = 0
        with self._write(durable=True) as conn:
            for intent_id, change in changes:
                sets = ", ".join(f"{column} = ?" for column in change)
                cur = self._run(
                    conn,
                    f"UPDATE {{intents}} SET {sets} WHERE id = ? AND {whose}",
                    (*change.values(), intent_id, *(() if previous is None else (previous,))),
                )
                adopted += int(cur.rowcount) if "sender" in change else 0
        return adopted

    def census(self, *, sender: str, origins: Collection[str] | None, now: float) -> Census:
        """Due intents this sender may not send, and its intents other owners hold now.

        A due row of no sender addressed to one of ``origins`` is not another's:
        it is counted as ``unowned`` (the drain's next pass adopts it).
        """
        mine = Mine(sender, None if origins is None else tuple(sorted(origins)))
        only, params = self._mine(mine)
        theirs, theirs_params = self._theirs(mine)
        unowned, unowned_params = self._adoptable(mine)
        due = (
            "SELECT {cols} FROM {{intents}} WHERE state = 'pending' AND due_at <= ? AND {where}"
            " UNION ALL SELECT {cols} FROM {{leases}}"
            " WHERE state = 'sending' AND lease_expires_at <= ? AND {where}"
        )
        ((not_ours, leased, expiry, failing, adoptable),) = self._select(
            "SELECT (SELECT count(*) FROM ("
            + due.format(cols="id", where=theirs)
            + ") t), (SELECT count(*) FROM {leases}"
            f" WHERE state = 'sending' AND lease_expires_at > ?{only}),"
            " (SELECT min(lease_expires_at) FROM {leases}"
            f" WHERE state = 'sending' AND lease_expires_at > ?{only}),"
            " (SELECT count(*) FROM {intents}"
            f" WHERE settle_due_at IS NOT NULL AND settle_attempts > 0{only}),"
            " (SELECT count(*) FROM (" + due.format(cols="id", where=unowned) + ") u)",
            (
                *(now, *theirs_params, now, *theirs_params),
                *(now, *params, now, *params, *params),
                *(now, *unowned_params, now, *unowned_params),
            ),
        )
        foreign: tuple[Foreign, ...] = ()
        if not_ours:
            # Read only when there are some: whose they are, and since when they wait,
            # for the message that tells a person which client's drain sends them.
            groups = self._select(
                "SELECT sender, origin, count(*), min(since) FROM ("
                + due.format(
                    cols="sender, origin, CASE WHEN state = 'sending' THEN lease_expires_at"
                    " ELSE due_at END AS since",
                    where=theirs,
                )
                + ") due GROUP BY sender, origin",
                (now, *theirs_params, now, *theirs_params),
            )
            foreign = decide.foreign_of(
                (s, o, int(n), None if t is None else float(t)) for s, o, n, t in groups
            )
        return Census(
            int(not_ours), int(leased), expiry, foreign, int(failing), int(adoptable), now
        )

    def _theirs(self, mine: Mine) -> tuple[str, tuple[Any, ...]]:
        """The rows this census counts as others': not ``mine``'s, nor of no sender to its origins.

        The negation of Mine.admits, NULL-safe: a row of no origin is ours unless the
        client names its origins (then only rows addressed to one of them are).
        """
        only, params = self._mine(mine)
        guard = "sender IS NOT NULL" + (
            " AND origin IS NOT NULL" if mine.origins is not None else ""
        )
        adoptable, more = self._adoptable(mine)
        return f"NOT ({guard}{only}) AND NOT ({adoptable})", (*params, *more)

    @staticmethod
    def _adoptable(mine: Mine) -> tuple[str, tuple[Any, ...]]:
        """Rows of no sender addressed to one of ``mine``'s origins (false if it names none)."""
        if not mine.origins:
            return "1 = 0", ()
        marks = ", ".join("?" for _ in mine.origins)
        return f"sender IS NULL AND origin IS NOT NULL AND origin IN ({marks})", mine.origins

    def get(self, reference: str) -> IntentRecord | None:
        rows = self._select(f"SELECT {COLUMNS} FROM {{intents}} WHERE reference = ?", (reference,))
        return decode_row(rows[0]) if rows else None

    def get_by_key(self, key: str) -> IntentRecord | None:
        # Through the reference index for an intent named by its key, and through
        # the key index (SQLite's covers only key != reference) for the others.
        rows = self._select(
            f"SELECT {COLUMNS} FROM {{intents}} WHERE reference = ? AND key = ?"
            f" UNION ALL SELECT {COLUMNS} FROM {{intents}} WHERE key = ? AND key != reference",
            (key, key, key),
        )
        return decode_row(rows[0]) if rows else None

    def attempts(self, reference: str) -> list[AttemptRecord]:
        # One statement, so one snapshot: the intent row and its attempt rows
        # agree (a carried attempt is read only where no row was written).
        rows = self._select(
            "SELECT i.state, i.attempts, i.first_delivery_at, i.updated_at, i.last_outcome,"
            " i.response_status, i.purged_at,"
            " a.started_at, a.duration, a.outcome, a.status, a.error_type, a.replayed"
            " FROM {intents} i LEFT JOIN {attempts} a ON a.intent_id = i.id"
            " WHERE i.reference = ? ORDER BY a.number",
            (reference,),
        )
        if not rows:
            return []
        if rows[0][7] is None:  # no attempt rows
            return decide.carried_attempts(*rows[0][:7])
        return [decode_attempt(r[7:]) for r in rows]

    def list_intents(
        self, *, state: State | None = None, limit: int | None = None
    ) -> list[IntentRecord]:
        """Intents, newest first, optionally of one state."""
        where = "WHERE state = ?" if state is not None else ""
        params: tuple[object, ...] = (state.value,) if state is not None else ()
        rows = self._select(
            f"SELECT {COLUMNS} FROM {{intents}} {where} ORDER BY id DESC LIMIT ?",
            (*params, self.no_limit if limit is None else limit),
        )
        return [decode_row(r) for r in rows]

    def stats(self, *, now: float) -> dict[str, Any]:
        """Counts per state, the oldest pending intent, the next due time, expired ones."""
        counts = self._select(
            "SELECT state, count(*) FROM {intents} WHERE purged_at IS NULL GROUP BY state"
        )
        oldest, next_due, lease_due, tombstones, due_now, leased, expiry, owed, failing = (
            self._select(
                "SELECT"
                " (SELECT min(created_at) FROM {intents} WHERE state = 'pending'),"
                " (SELECT min(due_at) FROM {intents} WHERE state = 'pending'),"
                " (SELECT min(lease_expires_at) FROM {leases}"
                " WHERE state = 'sending' AND lease_expires_at IS NOT NULL),"
                " (SELECT count(*) FROM {intents} WHERE purged_at IS NOT NULL),"
                " (SELECT count(*) FROM {intents} WHERE state = 'pending' AND due_at <= ?)"
                " + (SELECT count(*) FROM {leases}"
                " WHERE state = 'sending' AND lease_expires_at <= ?),"
                " (SELECT count(*) FROM {leases}"
                " WHERE state = 'sending' AND lease_expires_at > ?),"
                " (SELECT min(lease_expires_at) FROM {leases}"
                " WHERE state = 'sending' AND lease_expires_at > ?),"
                " (SELECT count(*) FROM {intents} WHERE settle_due_at IS NOT NULL),"
                " (SELECT count(*) FROM {intents}"
                " WHERE settle_due_at IS NOT NULL AND settle_attempts > 0)",
                (now, now, now, now),
            )[0]
        )
        return decide.stats_report(
            {str(state): int(count) for state, count in counts},
            oldest=oldest,
            next_due=next_due,
            lease_due=lease_due,
            tombstones=tombstones,
            due_now=due_now,
            leased=leased,
            lease_expiry=expiry,
            owed=owed,
            failing=failing,
        )

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
        with self._write(durable=True) as conn:
            record = self._by_reference(conn, reference)
            if record is None:
                raise KeyError(reference)
            after, changes = decide.moved(record, to, now, note, settle_hold)
            self._update(conn, record.id, changes)
            self._ended(conn, record.id, changes)
        return after

    def purge_receipts(self, *, before: float) -> int:
        """Forget the notification receipts recorded before ``before``; how many."""
        with self._write(durable=True) as conn:
            cur = self._run(conn, "DELETE FROM {receipts} WHERE received_at < ?", (before,))
            return int(cur.rowcount)

    def purge(self, *, before: float, tombstones: bool, now: float) -> Purged:
        """Forget finished intents last changed before ``before``; see ``Store.purge``.

        By default each keeps a tombstone (reference, key, fingerprint, state),
        so the same reference is never executed again; ``tombstones=True``
        deletes tombstones of that age instead. Expired and indeterminate
        intents, and any whose settlement is still owed, are kept.
        """
        if tombstones:
            aged = "purged_at IS NOT NULL AND purged_at < ?"
            params: tuple[object, ...] = (before,)
        else:
            marks = ", ".join("?" for _ in decide.PURGEABLE)
            aged = f"state IN ({marks}) AND updated_at < ? AND purged_at IS NULL"
            params = (*decide.PURGEABLE, before)
        # A row whose settlement is owed keeps its answer until its handler has it.
        ids = f"SELECT id FROM {{intents}} WHERE {aged} AND settle_due_at IS NULL"
        with self._write(durable=True) as conn:
            ((kept,),) = self._run(
                conn,
                f"SELECT count(*) FROM {{intents}} WHERE {aged} AND settle_due_at IS NOT NULL",
                params,
            ).fetchall()
            self._run(conn, f"DELETE FROM {{attempts}} WHERE intent_id IN ({ids})", params)
            if tombstones:
                cur = self._run(conn, f"DELETE FROM {{intents}} WHERE id IN ({ids})", params)
            else:
                changes = decide.purged(now)
                sets = ", ".join(f"{column} = ?" for column in changes)
                cur = self._run(
                    conn,
                    f"UPDATE {{intents}} SET {sets} WHERE id IN ({ids})",
                    (*changes.values(), *params),
                )
            return Purged(int(cur.rowcount), int(kept))
