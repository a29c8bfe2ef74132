"""Which outbox a client uses: an argument, ``POSTONCE_OUTBOX``, or the default file."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import platformdirs

from .._exceptions import ConfigurationError
from .base import Store
from .sqlite import Durability, SQLiteStore

__all__ = ["ENV_VAR", "OutboxSpec", "default_outbox_path", "open_store", "split_schema"]

ENV_VAR = "POSTONCE_OUTBOX"
OutboxSpec = str | os.PathLike[str] | Store | None


def default_outbox_path() -> Path:
    """The durable default: ``outbox.sqlite3`` in the user data directory, never a temp dir."""
    return platformdirs.user_data_path("postonce") / "outbox.sqlite3"


def describe(spec: OutboxSpec) -> str | Store:
    """The store itself, or the location a spec names once the environment is read."""
    if spec is None:
        spec = os.environ.get(ENV_VAR) or default_outbox_path()
    if isinstance(spec, str | os.PathLike):
        return os.fspath(spec)
    return spec


def split_schema(url: str) -> tuple[str, str]:
    """A PostgreSQL URL without postonce's own ``schema=`` query parameter, and that schema."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for name, value in query if name == "schema"]
    rest = [(name, value) for name, value in query if name != "schema"]
    schema = schemas[-1] if schemas else "postonce"
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


def open_store(spec: OutboxSpec, *, durability: Durability = "full", create: bool = True) -> Store:
    """Open the outbox a spec names: a Store, a path, ``sqlite:///path``, a PostgreSQL URL.

    ``postgresql://user@host/db?schema=name`` keeps the tables in schema
    ``name`` (default ``postonce``).

    With ``create=False`` a missing outbox is an OutboxError, not a new file.
    """
    where = describe(spec)
    if not isinstance(where, str):
        return where
    if where.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                "a PostgreSQL outbox needs the postgres extra: pip install 'postonce[postgres]'"
            ) from exc
        url, schema = split_schema(where)
        return PostgresStore(url, schema=schema, durability=durability, create=create)
    if where.startswith("sqlite:///"):
        where = where[len("sqlite:///") :]
    elif "://" in where:
        raise ConfigurationError(f"unknown outbox URL {where!r}: use a path or sqlite:///path")
    return SQLiteStore(Path(where).expanduser(), durability=durability, create=create)
