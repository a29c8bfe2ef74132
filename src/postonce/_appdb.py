"""The application's own database connection: postonce writes through it, in its transaction.

``enqueue`` runs its statements on the connection the application passes, so
the intent commits or rolls back with the application's own rows. Nothing
here commits, rolls back or begins anything the application did not ask for.

Sans-I/O where it can be: :func:`enqueue_steps` is a generator of statements
(it yields one, is sent its rows) deciding from what it reads; a sync
:class:`AppConnection` or an async :class:`AsyncAppConnection` runs them on
the connections applications use: ``sqlite3`` and ``aiosqlite``, psycopg 3
(``Connection``, ``AsyncConnection``), and SQLAlchemy's ``Connection``/``Session``
and their async twins on the ``pysqlite``, ``aiosqlite`` and ``psycopg`` drivers.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import weakref
from collections.abc import Generator
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

from ._diff import conflict_with
from ._exceptions import IntentConflict, InvalidRequest, OutboxError
from ._intent import IntentInfo, IntentRecord, NewIntent, State
from ._outbox import decide
from ._outbox.base import Target
from ._outbox.rows import COLUMNS, decode_row

__all__ = [
    "AppConnection",
    "AsyncAppConnection",
    "Statement",
    "Target",
    "app_connection",
    "async_app_connection",
    "enqueue_steps",
]

Dialect = Literal["sqlite", "postgres"]
Rows = list[tuple[Any, ...]]
T = TypeVar("T")


class Named(Protocol):
    """What an error names: the intent and its key (a ``NewIntent``), or neither."""

    @property
    def reference(self) -> str | None: ...
    @property
    def key(self) -> str | None: ...


class Statement(NamedTuple):
    """One statement, with ``?`` placeholders (each connection spells its own)."""

    sql: str
    params: tuple[Any, ...] = ()


def enqueue_steps(
    target: Target, new: NewIntent, now: float, *, checked: bool = False
) -> Generator[Statement, Rows, IntentInfo]:
    """Write ``new`` through the application's connection: its statements, and what they mean.

    First a check that the connection reaches the outbox's database (the
    insert would otherwise land in another database, or fail and, on
    PostgreSQL, abort the application's transaction). Then one INSERT that
    writes nothing on any unique conflict (so the application's transaction
    never sees an error), and, only if it wrote nothing, a read of what is
    stored: the same request is that intent, already enqueued; another is
    an :class:`IntentConflict`. ``checked``: this connection was found to reach
    the outbox's database before (the check is left out).
    """
    if not checked:
        seen = yield _where(target)
        refused = other_database(target, seen)
        if refused is not None:
            raise InvalidRequest(refused, reference=new.reference, key=new.key)
    row = decide.enqueued_row(new, now)
    written = yield _insert(target, row)
    if written:
        return IntentInfo(
            new.reference, new.key, State.PENDING, 0, replayed=False, from_outbox=False
        )
    found = yield Statement(
        f"SELECT {COLUMNS} FROM {target.table} WHERE reference = ?", (new.reference,)
    )
    return already_enqueued(decode_row(found[0]) if found else None, new)


def _where(target: Target) -> Statement:
    if target.dialect == "sqlite":
        return Statement("SELECT file FROM pragma_database_list WHERE name = 'main'")
    return Statement("SELECT current_database(), to_regclass(?) IS NOT NULL", (target.table,))


def other_database(target: Target, seen: Rows) -> str | None:
    """Why the connection that answered ``seen`` is not the outbox's database (None: it is)."""
    if target.dialect == "sqlite":
        path = str(seen[0][0]) if seen and seen[0][0] else ""
        if not path or not _same_file(path, target.database):
            return (
                f"the connection is to {path or 'an in-memory database'}, and the outbox is "
                f"{target.database}: enqueue writes in the outbox's database, in the "
                "application's transaction there; nothing was written"
            )
        return None
    database, has_table = seen[0]
    if database != target.database or not has_table:
        return (
            f"the connection is to database {database!r}"
            + ("" if database != target.database else f", where {target.table} is not visible")
            + f", and the outbox is {target.table} in database {target.database!r}: enqueue "
            "writes in the outbox's database; nothing was written"
        )
    return None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _insert(target: Target, row: dict[str, Any]) -> Statement:
    columns, marks = ", ".join(row), ", ".join("?" for _ in row)
    insert = f"INSERT INTO {target.table} ({columns}) VALUES ({marks}) ON CONFLICT DO NOTHING"
    if target.channel is None:
        return Statement(f"{insert} RETURNING id", tuple(row.values()))
    # NOTIFY is transactional: a listening drain hears of it when the application commits.
    notify = f"WITH written AS ({insert} RETURNING id)"
    return Statement(
        f"{notify} SELECT id, pg_notify(?, '') FROM written", (*row.values(), target.channel)
    )


def already_enqueued(record: IntentRecord | None, new: NewIntent) -> IntentInfo:
    """The INSERT wrote nothing: ``new``'s reference is stored, or its key is another's."""
    if record is None:
        raise IntentConflict(
            decide.KEY_TAKEN + "; nothing was written", reference=new.reference, key=new.key
        )
    conflict = conflict_with(record, new)
    if conflict is not None:
        raise IntentConflict(
            f"{conflict}; nothing was written", reference=record.reference, key=record.key
        )
    return IntentInfo(
        record.reference,
        record.key,
        record.state,
        record.attempts,
        replayed=False,
        from_outbox=True,
    )


# -- the connections ---------------------------------------------------------------


#: psycopg connections found to reach an outbox's database: a connection's database
#: never changes, so each is checked once (a round trip saved on every later enqueue).
#: (sqlite3 connections take no weak reference; their check is a local read.)
_REACHED: weakref.WeakKeyDictionary[Any, Target] = weakref.WeakKeyDictionary()


def _checked(driver: Any, target: Target) -> bool:
    try:
        return _REACHED.get(driver) == target
    except TypeError:  # not weakly referenceable
        return False


def _remember(driver: Any, target: Target) -> None:
    with contextlib.suppress(TypeError):
        _REACHED[driver] = target


class AppConnection:
    """A sync connection of the application's (``driver``: the DB-API one beneath it)."""

    def __init__(self, run: Any, dialect: Dialect, driver: Any) -> None:
        self._run, self.dialect, self._driver = run, dialect, driver

    def enqueue(self, target: Target, new: NewIntent, now: float) -> IntentInfo:
        """Write ``new`` in the application's transaction (:func:`enqueue_steps`)."""
        steps = enqueue_steps(target, new, now, checked=_checked(self._driver, target))
        info = self.drive(steps, new)
        _remember(self._driver, target)
        return info

    def drive(self, steps: Generator[Statement, Rows, T], named: Named) -> T:
        """Run each statement ``steps`` yields, send it its rows; return what it returns."""
        rows: Rows | None = None
        try:
            while True:
                statement = steps.send(rows) if rows is not None else next(steps)
                rows = _failed_as_outbox_error(self._run, statement, named, self.dialect)
        except StopIteration as done:
            value: T = done.value
            return value


class AsyncAppConnection:
    """An async connection of the application's (``driver``: the one beneath it)."""

    def __init__(self, run: Any, dialect: Dialect, driver: Any) -> None:
        self._run, self.dialect, self._driver = run, dialect, driver

    async def enqueue(self, target: Target, new: NewIntent, now: float) -> IntentInfo:
        """Write ``new`` in the application's transaction (:func:`enqueue_steps`)."""
        steps = enqueue_steps(target, new, now, checked=_checked(self._driver, target))
        info = await self.drive(steps, new)
        _remember(self._driver, target)
        return info

    async def drive(self, steps: Generator[Statement, Rows, T], named: Named) -> T:
        """Run each statement ``steps`` yields, send it its rows; return what it returns."""
        rows: Rows | None = None
        try:
            while True:
                statement = steps.send(rows) if rows is not None else next(steps)
                try:
                    rows = await self._run(_spelled(statement, self.dialect))
                except Exception as exc:
                    raise _outbox_error(exc, named, self.dialect) from exc
        except StopIteration as done:
            value: T = done.value
            return value


def _failed_as_outbox_error(run: Any, statement: Statement, named: Named, dialect: Dialect) -> Rows:
    try:
        rows: Rows = run(_spelled(statement, dialect))
    except Exception as exc:
        raise _outbox_error(exc, named, dialect) from exc
    return rows


def _spelled(statement: Statement, dialect: Dialect) -> Statement:
    """``statement`` in its driver's placeholders: psycopg's ``%s`` (a ``%`` of its own,
    in a quoted schema name, doubled), sqlite3's ``?`` as written."""
    if dialect == "sqlite":
        return statement
    return Statement(statement.sql.replace("%", "%%").replace("?", "%s"), statement.params)


def _outbox_error(exc: Exception, named: Named, dialect: Dialect) -> OutboxError:
    aborted = (
        " PostgreSQL has aborted the application's transaction: roll it back"
        if dialect == "postgres"
        else ""
    )
    return OutboxError(
        f"cannot write the intent through the application's connection: "
        f"{type(exc).__name__}: {exc}.{aborted}",
        reference=named.reference,
        key=named.key,
    )


def _sqlite_run(conn: sqlite3.Connection) -> Any:
    def run(statement: Statement) -> Rows:
        return conn.execute(statement.sql, statement.params).fetchall()

    return run


def _psycopg_run(conn: Any) -> Any:
    def run(statement: Statement) -> Rows:
        cursor = conn.execute(statement.sql, statement.params)
        return cursor.fetchall() if cursor.description is not None else []

    return run


def _sqlalchemy_run(conn: Any) -> Any:
    def run(statement: Statement) -> Rows:
        result = conn.exec_driver_sql(statement.sql, statement.params)
        return [tuple(row) for row in result.fetchall()] if result.returns_rows else []

    return run


def app_connection(connection: Any, named: Named) -> AppConnection:
    """The application's sync ``connection``, checked: open, in (or able to begin) a transaction.

    Refused with :class:`InvalidRequest` (nothing written): a closed
    connection, one in autocommit mode outside a transaction (the intent
    would commit on its own, before the application's rows), a PostgreSQL
    transaction that already failed, and any other kind of connection.
    """
    if isinstance(connection, sqlite3.Connection):
        _check_sqlite(connection, named)
        return AppConnection(_sqlite_run(connection), "sqlite", connection)
    if _module(connection) == "psycopg" and not _awaits(connection):
        _check_psycopg(connection, named)
        return AppConnection(_psycopg_run(connection), "postgres", connection)
    alchemy = _sqlalchemy_sync(connection)
    if alchemy is not None:
        dialect = _alchemy_dialect(alchemy, named)
        driver = alchemy.connection.driver_connection
        _check_driver(driver, named)
        return AppConnection(_sqlalchemy_run(alchemy), dialect, driver)
    raise _unknown(connection, named, "a sync")


async def async_app_connection(connection: Any, named: Named) -> AsyncAppConnection:
    """The application's async ``connection`` (psycopg, aiosqlite, SQLAlchemy's), checked."""
    if _module(connection) == "aiosqlite":
        _check_aiosqlite(connection, named)

        async def run_aiosqlite(statement: Statement) -> Rows:
            cursor = await connection.execute(statement.sql, statement.params)
            return list(await cursor.fetchall())

        return AsyncAppConnection(run_aiosqlite, "sqlite", connection)
    if _module(connection) == "psycopg" and _awaits(connection):
        _check_psycopg(connection, named)

        async def run_psycopg(statement: Statement) -> Rows:
            cursor = await connection.execute(statement.sql, statement.params)
            return list(await cursor.fetchall()) if cursor.description is not None else []

        return AsyncAppConnection(run_psycopg, "postgres", connection)
    alchemy = await _sqlalchemy_async(connection)
    if alchemy is not None:
        dialect = _alchemy_dialect(alchemy, named)
        raw = await alchemy.get_raw_connection()
        _check_driver(raw.driver_connection, named)

        async def run_alchemy(statement: Statement) -> Rows:
            result = await alchemy.exec_driver_sql(statement.sql, statement.params)
            return [tuple(row) for row in result.fetchall()] if result.returns_rows else []

        return AsyncAppConnection(run_alchemy, dialect, raw.driver_connection)
    raise _unknown(connection, named, "an async")


def _module(connection: Any) -> str:
    return type(connection).__module__.split(".", 1)[0]


def _awaits(connection: Any) -> bool:
    return type(connection).__name__.startswith("Async")


def _unknown(connection: Any, named: Named, kind: str) -> InvalidRequest:
    return InvalidRequest(
        f"connection= takes {kind} connection of the application's database: "
        + (
            "sqlite3.Connection, psycopg.Connection, or a SQLAlchemy Connection or Session"
            if kind == "a sync"
            else "psycopg.AsyncConnection, aiosqlite.Connection, or a SQLAlchemy AsyncConnection "
            "or AsyncSession"
        )
        + f", not {type(connection).__module__}.{type(connection).__qualname__}"
        + "; nothing was written",
        reference=named.reference,
        key=named.key,
    )


def _refused(why: str, named: Named) -> InvalidRequest:
    return InvalidRequest(f"{why}; nothing was written", reference=named.reference, key=named.key)


def _check_driver(driver: Any, named: Named) -> None:
    if isinstance(driver, sqlite3.Connection):
        _check_sqlite(driver, named)
    elif _module(driver) == "psycopg":
        _check_psycopg(driver, named)
    elif _module(driver) == "aiosqlite":
        _check_aiosqlite(driver, named)


def _check_sqlite(conn: sqlite3.Connection, named: Named) -> None:
    try:
        in_transaction = conn.in_transaction
    except sqlite3.ProgrammingError:
        raise _refused("the sqlite3 connection is closed", named) from None
    if not in_transaction and conn.isolation_level is None:
        raise _refused(
            "the sqlite3 connection is in autocommit mode (isolation_level=None) outside a "
            "transaction: the write would commit at once, apart from the application's rows. "
            "Execute BEGIN first, or use the default isolation_level",
            named,
        )


def _check_aiosqlite(conn: Any, named: Named) -> None:
    try:
        in_transaction, isolation_level = conn.in_transaction, conn.isolation_level
    except (ValueError, sqlite3.ProgrammingError, AttributeError):
        raise _refused("the aiosqlite connection is closed", named) from None
    if not in_transaction and isolation_level is None:
        raise _refused(
            "the aiosqlite connection is in autocommit mode (isolation_level=None) outside a "
            "transaction: the write would commit at once, apart from the application's rows",
            named,
        )


def _check_psycopg(conn: Any, named: Named) -> None:
    from psycopg.pq import TransactionStatus

    if conn.closed:
        raise _refused("the psycopg connection is closed", named)
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise _refused("the application's transaction has already failed: roll it back", named)
    if conn.autocommit and status == TransactionStatus.IDLE:
        raise _refused(
            "the psycopg connection is in autocommit mode outside a transaction: the intent "
            "would commit at once, apart from the application's rows. Open one with "
            "conn.transaction()",
            named,
        )


def _sqlalchemy_sync(connection: Any) -> Any:
    """A SQLAlchemy ``Connection`` for ``connection`` (a Session's, begun), or None."""
    if "sqlalchemy" not in sys.modules or _module(connection) != "sqlalchemy":
        return None
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(connection, Session):
        return connection.connection()
    return connection if isinstance(connection, Connection) else None


async def _sqlalchemy_async(connection: Any) -> Any:
    if "sqlalchemy" not in sys.modules or _module(connection) != "sqlalchemy":
        return None
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(connection, AsyncSession):
        return await connection.connection()
    if isinstance(connection, AsyncConnection):
        return connection
    return None


def _alchemy_dialect(alchemy: Any, named: Named) -> Dialect:
    if alchemy.closed:
        raise _refused("the SQLAlchemy connection is closed", named)
    name, driver = alchemy.dialect.name, alchemy.dialect.driver
    if name == "sqlite" and driver in ("pysqlite", "aiosqlite"):
        return "sqlite"
    if (name, driver) == ("postgresql", "psycopg"):
        return "postgres"
    raise _refused(
        f"a SQLAlchemy connection on {name}+{driver}: enqueue writes through "
        "sqlite (pysqlite, aiosqlite) or postgresql+psycopg (psycopg 3)",
        named,
    )
