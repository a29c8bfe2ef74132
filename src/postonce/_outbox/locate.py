"""Which outbox a client uses: an argument, ``POSTONCE_OUTBOX``, or the default file."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import platformdirs

from .._exceptions import ConfigurationError, OutboxError
from .base import Store
from .sqlite import Durability, SQLiteStore

__all__ = [
    "ENV_VAR",
    "OutboxSpec",
    "check_spec",
    "default_outbox_path",
    "open_store",
    "probe_postgres",
    "split_schema",
]

ENV_VAR = "POSTONCE_OUTBOX"
OutboxSpec = str | os.PathLike[str] | Store | None

_POSTGRES = ("postgresql://", "postgres://")
_SQLITE = "sqlite:///"
#: The forms an outbox spec takes, for every message that refuses one.
ACCEPTED = (
    "a path (outbox.sqlite3), sqlite:///path[?create=1], or postgresql://user@host/db[?schema=name]"
)
#: ``sqlite:///path?create=...``: 1 adds the outbox's tables to a database of another
#: application's; 0 never creates anything (the outbox must be there).
_CREATE = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
#: Seconds the PostgreSQL probe waits to connect: a wrong host fails in this, not in a pool hang.
PROBE_TIMEOUT = 5


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
    # quote, not urlencode's default quote_plus: libpq decodes %20 but leaves "+" as a plus,
    # so application_name='web 1' would reach the server as "web+1".
    return urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote))), schema


def _sqlite_path(where: str) -> Path:
    return _sqlite_spec(where)[0]


def _sqlite_spec(where: str) -> tuple[Path, bool | None]:
    """The file a SQLite spec names, and its ``?create=`` (None: not given).

    Only the ``sqlite:///`` form takes options; a plain path is taken as it is.
    """
    create = None
    if where.startswith(_SQLITE):
        where, _, query = where[len(_SQLITE) :].partition("?")
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name != "create" or value.lower() not in _CREATE:
                raise ConfigurationError(
                    f"the outbox URL option {name}={value!r} is not known: a sqlite:/// URL "
                    "takes only create=1 (add the outbox's tables to another application's "
                    "database) or create=0 (never create an outbox)"
                )
            create = _CREATE[value.lower()]
    return Path(where).expanduser(), create


def check_spec(spec: OutboxSpec) -> None:
    """Refuse a spec that cannot name an outbox, before anything is opened or created.

    An unknown URL scheme (``postgress://``) and a path whose directory does
    not exist are ConfigurationErrors: a typo must not create a new, empty
    outbox that mints new keys for old orders. The default location (no
    argument, no ``POSTONCE_OUTBOX``) is the one path whose directory is created.
    """
    where = describe(spec)
    if not isinstance(where, str):
        return
    if where.startswith(_POSTGRES):
        return
    if "://" in where and not where.startswith(_SQLITE):
        raise ConfigurationError(f"unknown outbox URL {_redact(where)!r}: use {ACCEPTED}")
    if spec is None and not os.environ.get(ENV_VAR):
        return
    path = _sqlite_path(where)
    if not path.parent.is_dir():
        raise ConfigurationError(
            f"the outbox directory {os.fspath(path.parent)!r} does not exist: create it, or fix "
            f"the path {where!r} (postonce creates only the default location's directory)"
        )


def _redact(url: str) -> str:
    """A URL for a message: without a password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def probe_postgres(url: str, *, timeout: int = PROBE_TIMEOUT) -> None:
    """Connect once, directly, and raise one line naming the database and the cause.

    The pool would retry a database that does not exist, or a role it refuses,
    until its own timeout, logging each try; one direct connection says why at once.
    """
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"the PostgreSQL outbox URL is not valid: {exc}") from None
    try:
        with psycopg.connect(url, connect_timeout=timeout, autocommit=True):
            pass
    except psycopg.Error as exc:
        database = params.get("dbname") or params.get("user") or os.environ.get("PGDATABASE")
        host = params.get("host") or os.environ.get("PGHOST") or "localhost"
        raise OutboxError(
            f"cannot open the PostgreSQL outbox database {database!r} on {host}: {_cause(exc)}"
        ) from exc


def _cause(exc: Exception) -> str:
    """libpq's reason, on one line (its messages run over several, prefixed FATAL)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = lines[-1] if lines else type(exc).__name__
    for prefix in ("connection failed:", "FATAL:"):
        if reason.startswith(prefix):
            reason = reason[len(prefix) :].strip()
    if ": FATAL:" in reason:
        reason = reason.split(": FATAL:", 1)[1].strip()
    return reason


def open_store(
    spec: OutboxSpec,
    *,
    durability: Durability = "full",
    create: bool = True,
    migrate: bool = True,
) -> Store:
    """Open the outbox a spec names: a Store, a path, ``sqlite:///path``, a PostgreSQL URL.

    ``postgresql://user@host/db?schema=name`` keeps the tables in schema
    ``name`` (default ``postonce``). ``sqlite:///path?create=1`` adds the
    outbox's tables to another application's database (refused otherwise);
    ``?create=0`` creates nothing.

    With ``create=False`` a missing outbox is an OutboxError, not a new file.
    With ``migrate=False`` (a command that only reads) nothing is written: an
    outbox of an older schema is an OutboxError, not migrated.
    """
    where = describe(spec)
    if not isinstance(where, str):
        return where
    if create:
        check_spec(spec)
    if where.startswith(_POSTGRES):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                "a PostgreSQL outbox needs the postgres extra: pip install 'postonce[postgres]'"
            ) from exc
        url, schema = split_schema(where)
        probe_postgres(url)
        return PostgresStore(
            url, schema=schema, durability=durability, create=create, migrate=migrate
        )
    if "://" in where and not where.startswith(_SQLITE):
        raise ConfigurationError(f"unknown outbox URL {_redact(where)!r}: use {ACCEPTED}")
    path, asked = _sqlite_spec(where)
    return SQLiteStore(
        path,
        durability=durability,
        create=create and asked is not False,
        migrate=migrate,
        foreign=create and asked is True,
    )
