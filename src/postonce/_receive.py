"""The receiving half: a provider's notification applied once, in the application's transaction.

Providers deliver notifications at least once, with no key the application
chose. The key is the sender's own operation identifier (``source``,
``event_id``), recorded in the same transaction as the effect: an INSERT that
writes nothing on a conflict *is* the duplicate detection, with no read first,
no lock and no window, and it never fails (so a PostgreSQL transaction is
never aborted by a duplicate). A rollback forgets the receipt with the effect,
so the redelivery applies.

The receipts table is part of the outbox's schema (``receipts`` in
PostgreSQL's outbox schema; ``postonce_receipts`` in an application's SQLite
database): a client opening the outbox there creates it.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any, NamedTuple

from ._appdb import Dialect, Rows, Statement, app_connection, async_app_connection
from ._exceptions import ConfigurationError, InvalidRequest

__all__ = ["receive_once", "receive_once_async", "receive_steps"]

#: The columns of postonce's receipts table: an application's own table of that
#: name (in a SQLite file an earlier release joined unprefixed) is never written.
RECEIPT_COLUMNS = frozenset({"source", "event_id", "delivery_id", "received_at"})
_LONGEST = 255


class _Nameless(NamedTuple):
    """A receipt names no intent: its errors say which event instead."""

    reference: str | None = None
    key: str | None = None


def checked_ids(source: object, event_id: object, delivery_id: object) -> None:
    """Refuse identifiers no database stores alike (before anything is written)."""
    for name, value in (("source", source), ("event_id", event_id), ("delivery_id", delivery_id)):
        if value is None and name == "delivery_id":
            continue
        why = None
        if not isinstance(value, str) or not value:
            why = "must be a non-empty string"
        elif len(value) > _LONGEST:
            why = f"is {len(value)} characters long; at most {_LONGEST}"
        elif "\x00" in value or not value.isprintable():
            why = "holds a control character (PostgreSQL refuses a NUL)"
        if why is not None:
            raise InvalidRequest(f"receive_once: {name}={value!r} {why}; nothing was written")


def receive_steps(
    dialect: Dialect,
    schema: str,
    receipt: tuple[str, str, str | None],
    now: float,
) -> Generator[Statement, Rows, bool]:
    """Record ``receipt`` (source, event_id, delivery_id): True the first time, else False."""
    source, event_id, delivery_id = receipt
    if dialect == "sqlite":
        found = yield Statement(
            "SELECT m.name, group_concat(c.name) FROM sqlite_master m, pragma_table_info(m.name) c"
            " WHERE m.type = 'table' AND m.name IN ('postonce_receipts', 'receipts')"
            " GROUP BY m.name ORDER BY m.name"
        )
        tables = [name for name, columns in found if set(columns.split(",")) == RECEIPT_COLUMNS]
        table = tables[0] if tables else None
        where = "this SQLite database"
    else:
        table = '"' + schema.replace('"', '""') + '".receipts'
        found = yield Statement("SELECT to_regclass(?) IS NOT NULL", (table,))
        table = table if found[0][0] else None
        where = f"schema {schema!r} of this database"
    if table is None:
        raise ConfigurationError(
            f"no postonce receipts table in {where}: it is part of the outbox's schema, which a "
            "postonce client creates when it opens an outbox there (client.outbox); for "
            f"({source!r}, {event_id!r}) nothing was written"
        )
    inserted = yield Statement(
        f"INSERT INTO {table} (source, event_id, delivery_id, received_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING RETURNING 1",
        (source, event_id, delivery_id, now),
    )
    return bool(inserted)


def receive_once(
    connection: Any,
    *,
    source: str,
    event_id: str,
    delivery_id: str | None = None,
    schema: str = "postonce",
) -> bool:
    """Record a notification in the application's open transaction: True the first time.

    ``source`` names the sender (``"stripe"``), ``event_id`` its own identifier of
    the operation (``postonce.notification_ids`` reads it from a payload);
    ``delivery_id`` is kept for the audit log, never part of the key. Call it in
    the transaction that applies the notification's effect: on ``False`` (a
    duplicate) skip the effect and answer 2xx; a rollback forgets the receipt,
    so the redelivery applies. Concurrent deliveries of one event, each in its
    own transaction: exactly one gets True (the others wait for its commit),
    and none raises.

    ``connection``: ``sqlite3``, psycopg 3, or a SQLAlchemy ``Connection`` or
    ``Session``, as for ``client.enqueue``. ``schema``: the PostgreSQL outbox's.
    """
    checked_ids(source, event_id, delivery_id)
    writer = app_connection(connection, _Nameless())
    steps = receive_steps(writer.dialect, schema, (source, event_id, delivery_id), time.time())
    return writer.drive(steps, _Nameless())


async def receive_once_async(
    connection: Any,
    *,
    source: str,
    event_id: str,
    delivery_id: str | None = None,
    schema: str = "postonce",
) -> bool:
    """:func:`receive_once` on an async connection (psycopg, aiosqlite, SQLAlchemy's)."""
    checked_ids(source, event_id, delivery_id)
    writer = await async_app_connection(connection, _Nameless())
    steps = receive_steps(writer.dialect, schema, (source, event_id, delivery_id), time.time())
    return await writer.drive(steps, _Nameless())
