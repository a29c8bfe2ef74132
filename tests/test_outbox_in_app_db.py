"""An outbox inside an application's own SQLite database takes none of the application's names.

``sqlite:///app.db?create=1`` adds the outbox's tables beside the application's,
named ``postonce_...`` (``postonce_intents``, ``postonce_attempts``, ...), with
its schema version in ``postonce_meta``: an application's own ``intents`` table
and its ``PRAGMA user_version`` stay as they are. An outbox file of its own, and
an application's database an earlier release joined, keep the unprefixed names.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from click.testing import CliRunner

import postonce
from postonce import SQLiteStore, State
from postonce._cli import main
from postonce._outbox.migrations.sqlite import MIGRATIONS, SCHEMA_VERSION
from tests.conftest import FAST, LoopbackServer
from tests.test_outbox import new_intent

ONE = FAST.model_copy(update={"attempts": 1})
CHARGES = "/ietf/v1/charges"


def app_database(path: Path, user_version: int = 7) -> None:
    """An application's SQLite file: tables ``intents`` and ``attempts`` of its own, with rows,
    and its schema version in ``PRAGMA user_version``."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE intents (id INTEGER PRIMARY KEY, customer TEXT, amount INT)")
        conn.execute("CREATE TABLE attempts (id INTEGER PRIMARY KEY, intent_id INT, note TEXT)")
        conn.execute("INSERT INTO intents (customer, amount) VALUES ('ada', 10), ('bob', 20)")
        conn.execute("INSERT INTO attempts (intent_id, note) VALUES (1, 'first try')")
        conn.execute(f"PRAGMA user_version = {user_version}")
    conn.close()


def app_state(path: Path) -> dict[str, Any]:
    """What the application keeps: its tables' definitions and rows, and its user_version."""
    conn = sqlite3.connect(path)
    try:
        return {
            "schema": conn.execute(
                "SELECT type, name, sql FROM sqlite_master"
                " WHERE name NOT LIKE 'postonce%' ORDER BY name"
            ).fetchall(),
            "intents": conn.execute("SELECT * FROM intents ORDER BY id").fetchall(),
            "attempts": conn.execute("SELECT * FROM attempts ORDER BY id").fetchall(),
            "user_version": conn.execute("PRAGMA user_version").fetchone()[0],
        }
    finally:
        conn.close()


def outbox_schema(path: Path) -> list[tuple[str, str, str]]:
    """The outbox's own tables, indexes and triggers (type, name, SQL), by name."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name LIKE 'postonce%' ORDER BY name"
        ).fetchall()
    finally:
        conn.close()
    return [(str(t), str(n), str(s)) for t, n, s in rows]


def left_pending(client: postonce.Client, intent: str) -> str:
    """An intent whose only foreground attempt met a 503: pending, due at once; its key."""
    body = {"amount": 5, "_test": {"before": [{"status": 503, "retry_after": "0"}]}}
    with pytest.raises(postonce.IntentPending) as pending:
        client.post_once(CHARGES, json=body, intent=intent, retry=ONE)
    return pending.value.key


def test_an_app_database_with_its_own_intents_table_and_user_version_holds_the_outbox(
    tmp_path: Path, server: LoopbackServer
) -> None:
    """With ``?create=1`` a client writes its intents beside an application's own ``intents``
    and ``attempts`` tables and user_version 7; a drain sends a due one, a second client and
    ``postonce outbox list`` read them; the application's tables, rows and version stay."""
    app_db = tmp_path / "app.db"
    app_database(app_db)
    before = app_state(app_db)
    run = uuid.uuid4().hex[:8]  # the session's server outlives this test
    spec = f"sqlite:///{app_db}?create=1"
    with postonce.Client(server.base_url, outbox=spec, retry=FAST) as client:
        store = client.outbox
        assert isinstance(store, SQLiteStore)
        assert (store.prefix, store.intents_table) == ("postonce_", "postonce_intents")
        sent = client.post_once(CHARGES, json={"amount": 1}, intent=f"paid-{run}")
        assert sent.status_code == 201
        key = left_pending(client, f"later-{run}")
        report = client.drain()
        assert (report.claimed, report.succeeded) == (1, 1)
        assert len(server.effects_for(key)) == 1
    conn = sqlite3.connect(app_db)
    try:
        assert conn.execute("SELECT version FROM postonce_meta").fetchall() == [(SCHEMA_VERSION,)]
        assert conn.execute("SELECT reference FROM postonce_intents ORDER BY id").fetchall() == [
            (f"paid-{run}",),
            (f"later-{run}",),
        ]
    finally:
        conn.close()
    # A second client finds the outbox by its postonce_meta: no opt-in needed any more.
    with postonce.Client(server.base_url, outbox=app_db) as again:
        record = again.lookup(f"later-{run}")
        assert record is not None
        assert record.state is State.SUCCEEDED
        assert again.drain().claimed == 0
    result = CliRunner().invoke(main, ["outbox", "--outbox", str(app_db), "list", "--json"])
    assert result.exit_code == 0, result.output
    listed = {row["reference"]: row["state"] for row in json.loads(result.output)}
    assert listed == {f"paid-{run}": "succeeded", f"later-{run}": "succeeded"}
    assert app_state(app_db) == before


def older_prefixed_outbox(path: Path, version: int) -> None:
    """An application's database holding a prefixed outbox as the release of schema ``version``
    left it, with one pending intent: MIGRATIONS[:version] with the prefix, and postonce_meta."""
    app_database(path)
    db = sqlite_utils.Database(path)
    for step in MIGRATIONS[:version]:
        step(db, "postonce_")
    db.execute(
        "CREATE TABLE postonce_meta (one INTEGER PRIMARY KEY CHECK (one = 1),"
        " version INTEGER NOT NULL)"
    )
    db.execute("INSERT INTO postonce_meta (one, version) VALUES (1, ?)", [version])
    db.execute(
        "INSERT INTO postonce_intents (reference, key, provider, method, url, headers, body,"
        " fingerprint, state, created_at, updated_at, due_at, attempts) VALUES ('order-1',"
        " 'k-1', 'ietf_draft', 'POST', 'http://api.test/c', '[]', x'7b7d', 'f', 'pending',"
        " 1000, 1000, 1000, 0)"
    )
    db.conn.commit()
    db.close()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_a_prefixed_outbox_of_every_older_version_is_migrated_on_open(
    tmp_path: Path, version: int
) -> None:
    """A prefixed outbox of any older schema is refused by a store that only reads, and migrated
    by one that writes: to the schema a new one has, its version in postonce_meta, its intent
    still claimed, and the application's tables and user_version untouched."""
    fresh = tmp_path / "fresh.db"
    app_database(fresh)
    SQLiteStore(fresh, foreign=True).close()
    app_db = tmp_path / "app.db"
    older_prefixed_outbox(app_db, version)
    before = app_state(app_db)
    with pytest.raises(postonce.OutboxError, match=f"schema version {version}"):
        SQLiteStore(app_db, create=False, migrate=False)
    store = SQLiteStore(app_db, durability="normal")
    try:
        assert store.prefix == "postonce_"
        (claimed,) = store.claim_due(owner="drain", now=1020.0, limit=10, lease_for=30)
        assert claimed.record.reference == "order-1"
    finally:
        store.close()
    assert outbox_schema(app_db) == outbox_schema(fresh)
    conn = sqlite3.connect(app_db)
    try:
        assert conn.execute("SELECT * FROM postonce_meta").fetchall() == [(1, SCHEMA_VERSION)]
    finally:
        conn.close()
    assert app_state(app_db) == before


def snapshot(path: Path) -> tuple[bytes, list[str]]:
    """The file's bytes and the files beside it."""
    return path.read_bytes(), sorted(p.name for p in path.parent.iterdir())


def test_a_postonce_table_without_postonce_meta_is_refused_and_left_unchanged(
    tmp_path: Path,
) -> None:
    """A database holding ``postonce_intents`` but no ``postonce_meta`` is not an outbox postonce
    made: it is refused, even with ``?create=1``, saying which table, and not changed at all."""
    app_db = tmp_path / "app.db"
    app_database(app_db)
    conn = sqlite3.connect(app_db)
    with conn:
        conn.execute("CREATE TABLE postonce_intents (id INTEGER PRIMARY KEY, what TEXT)")
    conn.close()
    before = snapshot(app_db)
    with pytest.raises(postonce.ConfigurationError, match="postonce_intents but no postonce_meta"):
        SQLiteStore(app_db, foreign=True)
    client = postonce.Client("http://api.test", outbox=f"sqlite:///{app_db}?create=1")
    with pytest.raises(postonce.ConfigurationError, match="nothing was changed"):
        client.lookup("order-1")
    client.close()
    result = CliRunner().invoke(main, ["outbox", "--outbox", str(app_db), "list"])
    assert result.exit_code != 0
    assert "not a postonce outbox" in result.output
    assert snapshot(app_db) == before


def earlier_release_in_app_db(path: Path) -> None:
    """An application's database an earlier release joined: its unprefixed tables at the
    current version (in user_version), beside the application's ``users``."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
    conn.close()
    db = sqlite_utils.Database(path)
    for step in MIGRATIONS:
        step(db, "")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    db.conn.commit()
    db.close()


def nothing(path: Path) -> None:
    """A new file."""


@pytest.mark.parametrize(
    ("make", "foreign", "prefix"),
    [
        pytest.param(nothing, False, "", id="new-file"),
        pytest.param(nothing, True, "", id="new-file-create-1"),
        pytest.param(app_database, True, "postonce_", id="app-db"),
        pytest.param(earlier_release_in_app_db, True, "", id="joined-by-an-earlier-release"),
        pytest.param(earlier_release_in_app_db, False, "", id="joined-reopened"),
    ],
)
def test_the_names_are_decided_by_what_the_file_holds(
    tmp_path: Path, make: Callable[[Path], None], foreign: bool, prefix: str
) -> None:
    """An outbox file of its own, and an application's database an earlier release joined, keep
    the unprefixed names; an outbox added to an application's database now is prefixed."""
    path = tmp_path / "db.sqlite3"
    make(path)
    store = SQLiteStore(path, foreign=foreign)
    try:
        assert (store.prefix, store.intents_table) == (prefix, f"{prefix}intents")
        opened = store.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10)
        assert opened.lease is not None
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        table = f"{prefix}intents"
        assert conn.execute(f"SELECT reference FROM {table}").fetchall() == [("r-1",)]
    finally:
        conn.close()


def test_clients_joining_an_app_database_at_once_make_one_outbox(tmp_path: Path) -> None:
    """Stores opening the same application's database at the same moment each find or create
    the one prefixed outbox: the creation is one transaction, the file read again inside it."""
    app_db = tmp_path / "app.db"
    app_database(app_db)
    start = threading.Barrier(4)
    prefixes: list[str] = []
    errors: list[BaseException] = []

    def join() -> None:
        start.wait()
        try:
            store = SQLiteStore(app_db, foreign=True, busy_timeout=10.0)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)
            return
        prefixes.append(store.prefix)
        store.close()

    threads = [threading.Thread(target=join) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert prefixes == ["postonce_"] * 4
    conn = sqlite3.connect(app_db)
    try:
        assert conn.execute("SELECT * FROM postonce_meta").fetchall() == [(1, SCHEMA_VERSION)]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
    finally:
        conn.close()


def plans(store: SQLiteStore, statements: list[str]) -> list[list[str]]:
    """The query plan of each statement, step by step."""
    return [
        [str(row[-1]) for row in store._conn.execute("EXPLAIN QUERY PLAN " + statement)]
        for statement in statements
    ]


def claim_and_census_plans(path: Path, foreign: bool) -> tuple[str, list[list[str]]]:
    """The prefix, and the plans of every statement one claim and one census run."""
    store = SQLiteStore(path, durability="normal", foreign=foreign)
    try:
        for n in range(3):
            store.open_intent(new_intent(f"r-{n}", f"k-{n}"), owner="a", now=1000.0, lease_for=10)
        trace: list[str] = []
        store._conn.set_trace_callback(trace.append)
        store.claim_due(owner="d", now=1020.0, limit=10, lease_for=30, sender="s")
        store.census(sender="s", origins=None, now=1020.0)
        store._conn.set_trace_callback(None)
        statements = [t for t in trace if t.split(" ")[0] in ("SELECT", "UPDATE")]
        return store.prefix, plans(store, statements)
    finally:
        store.close()


def test_a_prefixed_claim_reads_its_indexes_as_an_outbox_file_does(tmp_path: Path) -> None:
    """Every statement of a claim and a census on the prefixed schema has the plan it has in an
    outbox file of its own, its names prefixed: the same indexes, never the whole table."""
    own = tmp_path / "outbox.sqlite3"
    app_db = tmp_path / "app.db"
    app_database(app_db)
    own_prefix, unprefixed = claim_and_census_plans(own, foreign=False)
    prefix, prefixed = claim_and_census_plans(app_db, foreign=True)
    assert (own_prefix, prefix) == ("", "postonce_")
    assert [[step.replace("postonce_", "") for step in plan] for plan in prefixed] == unprefixed
    scan = re.compile(r"SCAN postonce_intents(?!_)(?! USING)")
    assert prefixed
    assert not [plan for plan in prefixed if any(scan.search(step) for step in plan)]


@pytest.mark.parametrize(
    ("sql", "index"),
    [
        pytest.param("SELECT * FROM {t} WHERE reference = 'x'", "{t}_reference", id="ref"),
        pytest.param(
            "SELECT id FROM {t} WHERE state = 'pending' AND sender = 's' AND due_at <= 5"
            " ORDER BY due_at",
            "{t}_due",
            id="due",
        ),
        pytest.param(
            "SELECT id FROM {t} WHERE state = 'sending' AND sender = 's'"
            " AND lease_expires_at <= 5 AND fresh IS NULL ORDER BY lease_expires_at",
            "{t}_lease",
            id="lease",
        ),
        pytest.param(
            "SELECT id FROM {t} WHERE id > coalesce((SELECT upto FROM {t}_swept), 0)"
            " AND fresh IS NOT NULL AND state = 'sending' AND lease_expires_at <= 5",
            "INTEGER PRIMARY KEY (rowid>?)",
            id="fresh-tail",
        ),
        pytest.param("SELECT 1 FROM {t} WHERE key = 'k' AND key != reference", "{t}_key", id="key"),
    ],
)
def test_prefixed_lookups_use_their_index(tmp_path: Path, sql: str, index: str) -> None:
    """In an application's database, each claim arm and lookup is a search of the prefixed
    index, in its order: no scan of the table, no temporary B-tree."""
    app_db = tmp_path / "app.db"
    app_database(app_db)
    store = SQLiteStore(app_db, foreign=True)
    try:
        table = store.intents_table
        (plan,) = plans(store, [sql.format(t=table)])
    finally:
        store.close()
    assert any(index.format(t=table) in step for step in plan), plan
    assert not [step for step in plan if re.search(rf"SCAN {table}(?!_)(?! USING)", step)]
    assert not [step for step in plan if "TEMP B-TREE" in step]
