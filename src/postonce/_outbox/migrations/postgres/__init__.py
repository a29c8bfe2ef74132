"""The PostgreSQL outbox's schema: the SQL files beside this module, applied in order.

``{schema}`` in each file is replaced by the quoted schema name; the version
lives in ``<schema>.postonce_meta``. One migrator at a time per database (an
advisory lock), and an outbox already current needs no DDL, so a role with
only the run-time grants can use it.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from ...._exceptions import OutboxError
from ...rows import newer_schema

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "current_version", "migrate", "migrations"]

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


def _ddl(schema: str, text: str) -> sql.Composed:
    return sql.SQL(text).format(schema=sql.Identifier(schema))


def current_version(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """The stored schema version, or None where no outbox is (or can be seen)."""
    found = conn.execute(
        "SELECT 1 FROM information_schema.tables"
        " WHERE table_schema = %s AND table_name = 'postonce_meta'",
        (schema,),
    ).fetchone()
    if found is None:
        conn.rollback()
        return None
    row = conn.execute(_ddl(schema, "SELECT version FROM {schema}.postonce_meta")).fetchone()
    conn.rollback()
    return None if row is None else int(row[0])


def migrate(conn: psycopg.Connection[Any], schema: str, *, create: bool, where: str) -> None:
    """Bring ``schema`` to SCHEMA_VERSION (creating it if ``create``); refuse a newer one."""
    current = current_version(conn, schema)
    if current == SCHEMA_VERSION:
        return
    if current is None and not create:
        raise OutboxError(f"no outbox in schema {schema!r} at {where}")
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(_ddl(schema, "CREATE SCHEMA IF NOT EXISTS {schema}"))
        conn.execute(
            _ddl(schema, "CREATE TABLE IF NOT EXISTS {schema}.postonce_meta (version integer)")
        )
        row = conn.execute(_ddl(schema, "SELECT version FROM {schema}.postonce_meta")).fetchone()
        version = 0 if row is None else int(row[0])
        if version > SCHEMA_VERSION:
            raise newer_schema(f"in schema {schema!r}", version, SCHEMA_VERSION)
        for number, text in MIGRATIONS:
            if number > version:
                conn.execute(_ddl(schema, text))
        if row is None:
            conn.execute(
                _ddl(schema, "INSERT INTO {schema}.postonce_meta VALUES (%s)"), (SCHEMA_VERSION,)
            )
        elif version < SCHEMA_VERSION:
            conn.execute(
                _ddl(schema, "UPDATE {schema}.postonce_meta SET version = %s"), (SCHEMA_VERSION,)
            )
