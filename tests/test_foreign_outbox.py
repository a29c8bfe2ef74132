"""Nothing foreign is touched: read-only commands change nothing, clients ask before sharing.

``postonce outbox list/show/stats/export`` never create or migrate anything; a
client adds its tables to another application's SQLite database only where
the outbox spec asks for it (``sqlite:///app.db?create=1``) (issue 35, item 8).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import psycopg
import pytest
import sqlite_utils
from click.testing import CliRunner
from psycopg import sql

import postonce
from postonce._cli import main
from postonce._outbox.locate import split_schema
from postonce._outbox.migrations.postgres import current_version, migrations
from postonce._outbox.migrations.sqlite import MIGRATIONS, SCHEMA_VERSION
from tests.conftest import PG_URL, pg_schema

READ_ONLY = [
    pytest.param(("list",), id="list"),
    pytest.param(("show", "order-1"), id="show"),
    pytest.param(("stats",), id="stats"),
    pytest.param(("export",), id="export"),
]


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def foreign_database(path: Path, user_version: int = 0, clash: bool = False) -> None:
    """Another application's SQLite file: tables of its own, no postonce tables.

    ``clash``: one of its tables is named as one of postonce's.
    """
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
        if clash:
            conn.execute("CREATE TABLE intents (id INTEGER PRIMARY KEY, what TEXT)")
        conn.execute("INSERT INTO users (email) VALUES ('a@example.com')")
        conn.execute(f"PRAGMA user_version = {user_version}")
    conn.close()


def snapshot(path: Path) -> tuple[bytes, int, list[str]]:
    """The file's bytes, its user_version, and the files beside it."""
    data = path.read_bytes()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()
    return data, version, sorted(p.name for p in path.parent.iterdir())


@pytest.mark.parametrize("command", READ_ONLY)
@pytest.mark.parametrize(
    ("user_version", "clash"),
    [
        pytest.param(0, False, id="plain"),
        pytest.param(12, False, id="versioned"),
        pytest.param(0, True, id="intents-table"),
    ],
)
def test_a_read_only_command_refuses_another_applications_database_and_writes_nothing(
    tmp_path: Path, command: tuple[str, ...], user_version: int, clash: bool
) -> None:
    """``outbox list/show/stats/export`` on another application's SQLite file say it is not an
    outbox, and leave its bytes and user_version as they were."""
    app_db = tmp_path / "app.db"
    foreign_database(app_db, user_version, clash)
    before = snapshot(app_db)
    code, out = cli("outbox", "--outbox", str(app_db), *command)
    assert code != 0
    assert "not a postonce outbox" in out
    assert "users" in out  # what it found, so a person sees which file it is
    assert snapshot(app_db) == before


@pytest.mark.parametrize("command", READ_ONLY)
def test_a_read_only_command_on_an_empty_file_says_there_is_no_outbox(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """An empty file is no outbox for a command that only reads: nothing is created in it."""
    empty = tmp_path / "outbox.sqlite3"
    empty.touch()
    code, out = cli("outbox", "--outbox", str(empty), *command)
    assert code != 0
    assert "no outbox" in out
    assert empty.read_bytes() == b""


def older_sqlite_outbox(path: Path, version: int) -> None:
    """An outbox as the release of schema ``version`` left it, with one pending intent."""
    db = sqlite_utils.Database(path)
    for step in MIGRATIONS[:version]:
        step(db, "")
    db.execute(f"PRAGMA user_version = {version}")
    db.execute(
        "INSERT INTO intents (reference, key, provider, method, url, headers, body, fingerprint,"
        " state, created_at, updated_at, due_at, attempts) VALUES ('order-1', 'k-1', 'stripe',"
        " 'POST', 'https://api.stripe.com/v1/charges', '[]', x'7b7d', 'f', 'pending', 1, 1, 1, 0)"
    )
    db.conn.commit()
    db.close()


@pytest.mark.parametrize("command", READ_ONLY)
def test_a_read_only_command_never_migrates_an_older_sqlite_outbox(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """An outbox of an older schema is not migrated by a command that only reads: it says a
    migration is needed and who makes it, and leaves the file as it was."""
    outbox = tmp_path / "outbox.sqlite3"
    older_sqlite_outbox(outbox, SCHEMA_VERSION - 1)
    before = snapshot(outbox)
    code, out = cli("outbox", "--outbox", str(outbox), *command)
    assert code != 0
    assert f"schema version {SCHEMA_VERSION - 1}" in out
    assert "migrat" in out
    assert snapshot(outbox) == before
    # A client (or a drain) migrates it; then the command reads it.
    with postonce.Client("https://api.stripe.com", provider="stripe", outbox=outbox) as client:
        assert client.lookup("order-1") is not None
    code, out = cli("outbox", "--outbox", str(outbox), "show", "order-1")
    assert code == 0, out


def test_a_read_only_command_never_migrates_an_older_postgres_outbox() -> None:
    """The same on PostgreSQL: an outbox schema of an older version is read by no command that
    only reads; its version stays."""
    with pg_schema() as url:
        pg_url, schema = split_schema(url)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(
                sql.SQL("CREATE TABLE {}.postonce_meta (version integer)").format(
                    sql.Identifier(schema)
                )
            )
            for number, text in migrations()[:-1]:
                conn.execute(sql.SQL(text).format(schema=sql.Identifier(schema)))
                older = number
            conn.execute(
                sql.SQL("INSERT INTO {}.postonce_meta VALUES (%s)").format(sql.Identifier(schema)),
                (older,),
            )
        for command in (("list",), ("stats",), ("export",), ("show", "x")):
            code, out = cli("outbox", "--outbox", url, *command)
            assert code != 0, command
            assert f"schema version {older}" in out
        with psycopg.connect(PG_URL) as conn:
            assert current_version(conn, schema) == older


def test_a_client_adds_its_tables_to_another_applications_database_only_when_asked(
    tmp_path: Path,
) -> None:
    """A client pointed at another application's SQLite file refuses before anything is stored or
    sent, naming the opt-in; with ``?create=1`` it adds its tables, named ``postonce_...``,
    beside the application's, and keeps its version in ``postonce_meta``."""
    app_db = tmp_path / "app.db"
    foreign_database(app_db)
    before = snapshot(app_db)
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201)

    transport = httpx.MockTransport(answer)
    with (
        postonce.Client("http://api.test", outbox=app_db, transport=transport) as client,
        pytest.raises(postonce.ConfigurationError, match=r"\?create=1") as refused,
    ):
        client.post_once("/c", json={}, intent="order-1")
    assert "users" in str(refused.value)
    assert sent == []
    assert snapshot(app_db) == before
    with postonce.Client(
        "http://api.test", outbox=f"sqlite:///{app_db}?create=1", transport=transport
    ) as client:
        assert client.post_once("/c", json={}, intent="order-1").status_code == 201
    assert len(sent) == 1
    with sqlite3.connect(app_db) as conn:
        assert conn.execute("SELECT email FROM users").fetchall() == [("a@example.com",)]
        assert int(conn.execute("PRAGMA user_version").fetchone()[0]) == 0
        assert conn.execute("SELECT version FROM postonce_meta").fetchall() == [(SCHEMA_VERSION,)]
        assert conn.execute("SELECT reference FROM postonce_intents").fetchall() == [("order-1",)]
    conn.close()
    # Once its tables are there, the file is an outbox: no opt-in needed any more.
    with postonce.Client("http://api.test", outbox=app_db, transport=transport) as client:
        assert client.lookup("order-1") is not None


def test_a_client_never_takes_what_another_application_keeps(tmp_path: Path) -> None:
    """A database with a table of postonce's prefixed names but no ``postonce_meta`` is refused
    even with ``?create=1``: postonce would overwrite it. (Its own ``intents`` table and
    user_version are not in the way: tests/test_outbox_in_app_db.py.)"""
    app_db = tmp_path / "app.db"
    foreign_database(app_db, 12, clash=True)
    with sqlite3.connect(app_db) as conn:
        conn.execute("CREATE TABLE postonce_attempts (id INTEGER PRIMARY KEY)")
    conn.close()
    before = snapshot(app_db)
    client = postonce.Client("http://api.test", outbox=f"sqlite:///{app_db}?create=1")
    with pytest.raises(postonce.ConfigurationError, match="postonce_attempts but no postonce_meta"):
        client.lookup("order-1")
    client.close()
    assert snapshot(app_db) == before


def test_an_outbox_url_option_is_checked_when_the_client_is_built(tmp_path: Path) -> None:
    """``?create=`` takes 1 or 0; any other option of a sqlite URL is refused at construction,
    and ``?create=0`` never creates an outbox."""
    with pytest.raises(postonce.ConfigurationError, match="create"):
        postonce.Client("http://api.test", outbox=f"sqlite:///{tmp_path}/o.db?mode=ro")
    with pytest.raises(postonce.ConfigurationError, match="create"):
        postonce.Client("http://api.test", outbox=f"sqlite:///{tmp_path}/o.db?create=maybe")
    client = postonce.Client("http://api.test", outbox=f"sqlite:///{tmp_path}/o.db?create=0")
    with pytest.raises(postonce.OutboxError, match="no outbox"):
        client.lookup("order-1")
    client.close()
    assert not (tmp_path / "o.db").exists()
