"""``enqueue``: the intent commits with the application's own rows, in its transaction.

Against the real databases and drivers applications use: sqlite3 and psycopg 3
directly, and SQLAlchemy's Connection and Session over both (sync), and
psycopg's AsyncConnection and SQLAlchemy's AsyncConnection and AsyncSession
(async). The loopback server's ledger judges what was sent.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
import sqlalchemy
from psycopg import sql
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import postonce
import postonce.testing
from tests.conftest import FAST, PG_URL, LoopbackServer, pg_schema

CHARGES = "/ietf/v1/charges"


@dataclass
class AppDB:
    """An application's database with an ``orders`` table, and the outbox inside it."""

    backend: str  # "sqlite" or "postgres"
    outbox: str  # the outbox spec
    orders: str  # the application's orders table, qualified
    path: Path | None = None  # SQLite: the file

    def orders_committed(self) -> set[str]:
        """The order ids committed, read on a connection of its own."""
        if self.path is not None:
            with sqlite3.connect(self.path) as conn:
                return {row[0] for row in conn.execute(f"SELECT id FROM {self.orders}")}
        with psycopg.connect(PG_URL) as conn:
            return {row[0] for row in conn.execute(f"SELECT id FROM {self.orders}")}


@pytest.fixture(params=["sqlite", "postgres"])
def app_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppDB]:
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, state TEXT NOT NULL)")
            # The application's own table of this name keeps working beside the outbox's.
            conn.execute("CREATE TABLE intents (id INTEGER PRIMARY KEY, what TEXT)")
            conn.execute("INSERT INTO intents (what) VALUES ('the application''s own row')")
        yield AppDB("sqlite", f"sqlite:///{path}?create=1", "orders", path)
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT what FROM intents").fetchall() == [
                ("the application's own row",)
            ]
        return
    app_schema = f"app_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(app_schema)))
        conn.execute(f"CREATE TABLE {app_schema}.orders (id text PRIMARY KEY, state text)")
    try:
        with pg_schema() as url:
            yield AppDB("postgres", url, f"{app_schema}.orders")
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(app_schema)))


class Tx:
    """One application transaction: its connection for enqueue, its own write, its end."""

    def __init__(self, connection: Any, execute: Callable[[str, tuple[Any, ...]], Any],
                 commit: Callable[[], None], rollback: Callable[[], None]) -> None:  # fmt: skip
        self.connection, self._execute = connection, execute
        self.commit, self.rollback = commit, rollback

    def add_order(self, app: AppDB, order: str) -> None:
        mark = "?" if app.backend == "sqlite" else "%s"
        self._execute(f"INSERT INTO {app.orders} (id, state) VALUES ({mark}, 'new')", (order,))


SYNC_KINDS = ["driver", "sqlalchemy-connection", "sqlalchemy-session"]


@contextmanager
def transaction(app: AppDB, kind: str) -> Iterator[Tx]:
    """An open transaction of ``kind`` on ``app``'s database; closed (not ended) on exit."""
    if kind == "driver" and app.path is not None:
        conn = sqlite3.connect(app.path, timeout=10)
        try:
            yield Tx(conn, conn.execute, conn.commit, conn.rollback)
        finally:
            conn.close()
        return
    if kind == "driver":
        with psycopg.connect(PG_URL) as pg:
            yield Tx(pg, pg.execute, pg.commit, pg.rollback)
        return
    url = f"sqlite:///{app.path}" if app.path is not None else _alchemy_url()
    engine = sqlalchemy.create_engine(url)
    try:
        if kind == "sqlalchemy-session":
            with Session(engine) as session:

                def run(text: str, params: tuple[Any, ...]) -> Any:
                    return session.connection().exec_driver_sql(text, params)

                yield Tx(session, run, session.commit, session.rollback)
        else:
            with engine.connect() as alchemy:
                yield Tx(alchemy, alchemy.exec_driver_sql, alchemy.commit, alchemy.rollback)
    finally:
        engine.dispose()


def _alchemy_url() -> str:
    return PG_URL.replace("postgresql://", "postgresql+psycopg://", 1)


def client_for(app: AppDB, server: LoopbackServer, **options: Any) -> postonce.Client:
    """A client of the outbox in ``app``'s database, opened as an application opens it at
    start: before any transaction of its own (on SQLite, creating the outbox's tables needs
    the write lock a transaction that has written holds)."""
    client = postonce.Client(server.base_url, outbox=app.outbox, retry=FAST, **options)
    client.outbox  # noqa: B018
    return client


# -- commit, rollback, and nothing before commit ---------------------------------------------


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_a_committed_intent_is_sent_once_and_never_before_its_commit(
    app_db: AppDB, server: LoopbackServer, kind: str
) -> None:
    """A drain (another client of the same outbox) runs while the transaction is open: on
    PostgreSQL it finds nothing; on SQLite its claim waits for the application's write lock.
    Either way the charge is sent once, and only after the commit."""
    order = f"order-{uuid.uuid4().hex[:8]}"
    drained: list[int] = []
    with client_for(app_db, server) as client, client_for(app_db, server) as drainer:
        with transaction(app_db, kind) as tx:
            tx.add_order(app_db, order)
            info = client.enqueue(
                CHARGES, connection=tx.connection, intent=f"{order}/charge", json={"amount": 1}
            )
            assert (info.state, info.attempts, info.from_outbox) == (
                postonce.State.PENDING, 0, False
            )  # fmt: skip
            during = threading.Thread(target=lambda: drained.append(drainer.drain().succeeded))
            during.start()
            time.sleep(0.3)
            assert server.requests_for(info.key) == []
            committed_at = time.monotonic()
            tx.commit()
            during.join(timeout=30)
        drained.append(client.drain().succeeded)
        assert client.drain().succeeded == 0  # sent once
    assert sum(drained) == 1
    assert len(server.effects_for(info.key)) == 1
    assert all(request["at"] >= committed_at for request in server.requests_for(info.key))
    assert app_db.orders_committed() == {order}


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_a_rolled_back_intent_leaves_nothing(
    app_db: AppDB, server: LoopbackServer, kind: str
) -> None:
    order = f"order-{uuid.uuid4().hex[:8]}"
    with client_for(app_db, server) as client, transaction(app_db, kind) as tx:
        tx.add_order(app_db, order)
        info = client.enqueue(
            CHARGES, connection=tx.connection, intent=f"{order}/charge", json={"amount": 1250}
        )
        tx.rollback()
        assert client.lookup(f"{order}/charge") is None
        assert client.drain().succeeded == 0
    assert server.requests_for(info.key) == []
    assert app_db.orders_committed() == set()


def test_post_once_resumes_an_enqueued_intent_with_its_key(
    app_db: AppDB, server: LoopbackServer
) -> None:
    """The application may send it at once after its commit: no conflict, no second row."""
    intent = f"order-{uuid.uuid4().hex[:8]}/charge"
    with client_for(app_db, server) as client:
        with transaction(app_db, "driver") as tx:
            info = client.enqueue(CHARGES, connection=tx.connection, intent=intent, json={"a": 1})
            tx.commit()
        response = client.post_once(CHARGES, intent=intent, json={"a": 1})
        assert response.status_code == 201
        assert response.request.headers["Idempotency-Key"] == info.key
        assert client.drain().succeeded == 0
        record = client.lookup(intent)
        assert record is not None
        assert record.state == postonce.State.SUCCEEDED
        assert client.wait(intent, timeout=5).status_code == 201
    assert len(server.effects_for(info.key)) == 1


def test_the_same_intent_enqueued_again_writes_nothing(
    app_db: AppDB, server: LoopbackServer
) -> None:
    intent = f"order-{uuid.uuid4().hex[:8]}/charge"
    with client_for(app_db, server) as client:
        with transaction(app_db, "driver") as tx:
            first = client.enqueue(CHARGES, connection=tx.connection, intent=intent, json={"a": 1})
            tx.commit()
        with transaction(app_db, "driver") as tx:
            again = client.enqueue(CHARGES, connection=tx.connection, intent=intent, json={"a": 1})
            tx.commit()
        assert (again.key, again.from_outbox) == (first.key, True)
        assert client.drain().succeeded == 1


def test_another_request_under_a_stored_intent_is_a_conflict_and_the_transaction_goes_on(
    app_db: AppDB, server: LoopbackServer
) -> None:
    """On PostgreSQL a failed statement would abort the application's transaction: none fails."""
    intent = f"order-{uuid.uuid4().hex[:8]}/charge"
    order = f"order-{uuid.uuid4().hex[:8]}"
    with client_for(app_db, server) as client:
        with transaction(app_db, "driver") as tx:
            client.enqueue(CHARGES, connection=tx.connection, intent=intent, json={"a": 1})
            tx.commit()
        with transaction(app_db, "driver") as tx:
            with pytest.raises(postonce.IntentConflict, match="nothing was written") as raised:
                client.enqueue(CHARGES, connection=tx.connection, intent=intent, json={"a": 2})
            assert raised.value.intent == intent
            tx.add_order(app_db, order)  # the application's transaction is still usable
            tx.commit()
    assert app_db.orders_committed() == {order}


# -- bad input: refused, nothing written ----------------------------------------------------


def test_a_request_breaking_a_rule_is_refused_before_anything_is_written(
    app_db: AppDB, server: LoopbackServer
) -> None:
    with client_for(app_db, server) as client, transaction(app_db, "driver") as tx:
        with pytest.raises(postonce.InvalidKey):
            client.enqueue(CHARGES, connection=tx.connection, intent="i-1", key="has space")
        with pytest.raises(postonce.InvalidRequest, match="intent"):
            client.enqueue(CHARGES, connection=tx.connection, json={"a": 1})
        with pytest.raises(TypeError, match="retry="):
            client.enqueue(CHARGES, connection=tx.connection, intent="i-2", retry=FAST)
        with pytest.raises(postonce.InvalidRequest, match="not one of this client's origins"):
            client.enqueue("http://elsewhere.example/x", connection=tx.connection, intent="i-3")
        tx.commit()
        assert [client.lookup(f"i-{n}") for n in (1, 2, 3)] == [None, None, None]


def test_a_closed_connection_is_refused(app_db: AppDB, server: LoopbackServer) -> None:
    with client_for(app_db, server) as client:
        with transaction(app_db, "driver") as tx:
            tx.connection.close()
            with pytest.raises(postonce.InvalidRequest, match="closed") as raised:
                client.enqueue(CHARGES, connection=tx.connection, intent="i-1", json={"a": 1})
        assert raised.value.intent == "i-1"
        assert client.lookup("i-1") is None


def test_an_autocommit_connection_outside_a_transaction_is_refused(
    app_db: AppDB, server: LoopbackServer
) -> None:
    with client_for(app_db, server) as client:
        if app_db.path is not None:
            conn: Any = sqlite3.connect(app_db.path, isolation_level=None)
        else:
            conn = psycopg.connect(PG_URL, autocommit=True)
        try:
            with pytest.raises(postonce.InvalidRequest, match="autocommit"):
                client.enqueue(CHARGES, connection=conn, intent="i-1", json={"a": 1})
            # Inside an explicit transaction it is the application's to commit.
            if app_db.path is not None:
                conn.execute("BEGIN")
                client.enqueue(CHARGES, connection=conn, intent="i-1", json={"a": 1})
                conn.execute("COMMIT")
            else:
                with conn.transaction():
                    client.enqueue(CHARGES, connection=conn, intent="i-1", json={"a": 1})
        finally:
            conn.close()
        assert client.lookup("i-1") is not None


def test_a_connection_to_another_database_is_refused(
    app_db: AppDB, server: LoopbackServer, tmp_path: Path
) -> None:
    with client_for(app_db, server) as client:
        if app_db.path is not None:
            other: Any = sqlite3.connect(tmp_path / "another.db")
        else:
            other = psycopg.connect(PG_URL.rsplit("/", 1)[0] + "/postgres")
        try:
            with pytest.raises(postonce.InvalidRequest, match=r"another|database") as raised:
                client.enqueue(CHARGES, connection=other, intent="i-1", json={"a": 1})
            assert "nothing was written" in str(raised.value)
        finally:
            other.close()
        assert client.lookup("i-1") is None


def test_an_in_memory_outbox_cannot_take_an_application_transaction(
    server: LoopbackServer, tmp_path: Path
) -> None:
    conn = sqlite3.connect(tmp_path / "app.db")
    memory = postonce.testing.MemoryOutbox()
    with (
        postonce.Client(server.base_url, outbox=memory) as client,
        pytest.raises(postonce.ConfigurationError, match="outbox must live in that database"),
    ):
        client.enqueue(CHARGES, connection=conn, intent="i-1", json={"a": 1})
    conn.close()


def test_something_that_is_not_a_connection_is_refused(
    app_db: AppDB, server: LoopbackServer
) -> None:
    with (
        client_for(app_db, server) as client,
        pytest.raises(postonce.InvalidRequest, match="connection= takes"),
    ):
        client.enqueue(CHARGES, connection="postgresql://nope", intent="i-1", json={"a": 1})


# -- PostgreSQL: a running drain is woken by the commit ---------------------------------------


def test_a_worker_drain_is_woken_by_the_commit_not_its_interval(server: LoopbackServer) -> None:
    """NOTIFY at commit: sent well within a 30 s interval (the drain would otherwise sleep)."""
    with pg_schema() as url, postonce.Client(server.base_url, outbox=url, retry=FAST) as client:
        stop = threading.Event()
        worker = threading.Thread(
            target=client.drain, kwargs={"forever": True, "interval": 30.0, "stop": stop}
        )
        worker.start()
        try:
            time.sleep(0.5)  # the worker has claimed nothing and waits
            with psycopg.connect(PG_URL) as conn:
                info = client.enqueue(CHARGES, connection=conn, intent="woken", json={"a": 1})
                conn.commit()
                committed = time.monotonic()
            while not server.effects_for(info.key) and time.monotonic() - committed < 10:
                time.sleep(0.01)
            delay = time.monotonic() - committed
        finally:
            stop.set()
            worker.join(timeout=10)
        assert len(server.effects_for(info.key)) == 1, f"not sent {delay:.1f} s after commit"


# -- async connections -----------------------------------------------------------------------

ASYNC_KINDS = ["psycopg", "sqlalchemy-connection", "sqlalchemy-session"]


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_async_connections_commit_and_roll_back_with_the_application(
    server: LoopbackServer, kind: str
) -> None:
    async def main(url: str) -> tuple[str, str]:
        async with postonce.AsyncClient(server.base_url, outbox=url, retry=FAST) as client:
            keys = []
            for intent, commit in (("kept", True), ("dropped", False)):
                async with _async_transaction(kind) as (connection, end):
                    info = await client.enqueue(
                        CHARGES, connection=connection, intent=intent, json={"a": 1}
                    )
                    await end(commit)
                keys.append(info.key)
            assert await client.lookup("dropped") is None
            assert (await client.drain()).succeeded == 1
            return keys[0], keys[1]

    with pg_schema() as url:
        kept, dropped = asyncio.run(main(url))
    assert len(server.effects_for(kept)) == 1
    assert server.requests_for(dropped) == []


def test_an_async_client_asks_its_outbox_where_to_write_once_and_never_after_aclose(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outbox's answer (on PostgreSQL a query, on a worker thread) is kept: later
    enqueues write at once. A closed client refuses an enqueue, cached answer or not."""
    asked: list[str] = []
    target_of = postonce.AsyncClient._target_of

    def counted(store: Any, new: Any) -> Any:
        asked.append(new.reference)
        return target_of(store, new)

    monkeypatch.setattr(postonce.AsyncClient, "_target_of", staticmethod(counted))

    async def main(url: str) -> None:
        client = postonce.AsyncClient(server.base_url, outbox=url, retry=FAST)
        for intent in ("one", "two", "three"):
            async with _async_transaction("psycopg") as (connection, end):
                await client.enqueue(CHARGES, connection=connection, intent=intent, json={})
                await end(True)
        await client.aclose()
        async with _async_transaction("psycopg") as (connection, end):
            with pytest.raises(postonce.PostonceError, match="closed") as raised:
                await client.enqueue(CHARGES, connection=connection, intent="late", json={})
            await end(False)
        assert raised.value.intent == "late"

    with pg_schema() as url:
        asyncio.run(main(url))
    assert asked == ["one"]


class _async_transaction:
    """``async with``: (the connection to pass, ``end(commit)``) of one async transaction."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def __aenter__(self) -> tuple[Any, Callable[[bool], Any]]:
        if self.kind == "psycopg":
            self._pg = await psycopg.AsyncConnection.connect(PG_URL)
            conn = self._pg
            return conn, lambda commit: conn.commit() if commit else conn.rollback()
        self._engine = create_async_engine(_alchemy_url())
        if self.kind == "sqlalchemy-session":
            self._session = AsyncSession(self._engine)
            session = self._session
            return session, lambda commit: session.commit() if commit else session.rollback()
        self._conn = await self._engine.connect()
        alchemy = self._conn
        return alchemy, lambda commit: alchemy.commit() if commit else alchemy.rollback()

    async def __aexit__(self, *exc: object) -> None:
        if self.kind == "psycopg":
            await self._pg.close()
            return
        if self.kind == "sqlalchemy-session":
            await self._session.close()
        else:
            await self._conn.close()
        await self._engine.dispose()


# -- crashes and concurrency -----------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _app_location(app: AppDB) -> str:
    return str(app.path) if app.path is not None else PG_URL


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_a_random_moment_loses_no_committed_charge_and_sends_none_twice(
    app_db: AppDB, server: LoopbackServer, seed: int
) -> None:
    """An application writing orders with their charges is SIGKILLed at a seeded random
    moment (before, inside or after a transaction); a drain then sends exactly the charges
    of the committed orders, each once, and nothing of a transaction the kill cut short."""
    rng = random.Random(seed)
    prefix = f"crash{seed}-{uuid.uuid4().hex[:6]}"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.enqueue_app", app_db.backend, app_db.outbox,
         _app_location(app_db), app_db.orders, server.base_url, prefix, "200"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"ready", child.stderr.read() if child.stderr else b""
    time.sleep(rng.uniform(0.0, 0.4))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    said = [line for line in child.stdout.read().decode().splitlines() if line]
    committed = app_db.orders_committed()
    # Every order the application was told is committed is there (and perhaps one more,
    # committed just before the kill could be printed).
    assert {f"{prefix}-{line.split()[1]}" for line in said} <= committed
    with client_for(app_db, server) as client:
        client.drain()
        for order in committed:
            record = client.lookup(f"{order}/charge")
            assert record is not None, order
            assert record.state == postonce.State.SUCCEEDED, order
            assert len(server.effects_for(record.key)) == 1, order
        # Nothing of an order that did not commit: its charge was never written.
        for n in range(200):
            order = f"{prefix}-{n}"
            if order not in committed:
                assert client.lookup(f"{order}/charge") is None, order


def test_concurrent_transactions_and_a_drain_claim_nothing_before_commit_and_nothing_twice(
    server: LoopbackServer,
) -> None:
    """Eight application threads enqueue in transactions they hold open a moment, half
    committed, half rolled back, while a worker drain runs: the server sees each committed
    charge once, after its commit, and nothing else."""
    with pg_schema() as url, postonce.Client(server.base_url, outbox=url, retry=FAST) as client:
        stop = threading.Event()
        drainer = threading.Thread(
            target=client.drain, kwargs={"forever": True, "interval": 0.05, "stop": stop}
        )
        drainer.start()
        commits: dict[str, float] = {}
        rolled_back: list[str] = []

        def application(n: int) -> None:
            for m in range(5):
                with psycopg.connect(PG_URL) as conn:
                    info = client.enqueue(
                        CHARGES, connection=conn, intent=f"c-{n}-{m}", json={"n": n, "m": m}
                    )
                    time.sleep(0.05)  # held open while the drain looks
                    if (n + m) % 2:
                        conn.rollback()
                        rolled_back.append(info.key)
                    else:
                        before = time.monotonic()
                        conn.commit()
                        commits[info.key] = before

        threads = [threading.Thread(target=application, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(server.effects_for(k) for k in commits):
            time.sleep(0.05)
        stop.set()
        drainer.join(timeout=10)
    assert (len(commits), len(rolled_back)) == (20, 20)
    for key, committed_at in commits.items():
        requests = server.requests_for(key)
        assert len(server.effects_for(key)) == 1, key
        assert all(request["at"] >= committed_at for request in requests), key
    for key in rolled_back:
        assert server.requests_for(key) == []


def test_the_application_role_needs_only_insert_and_select_on_the_intents_table(
    server: LoopbackServer,
) -> None:
    """The grants docs/dual-write.md gives the application's role, and no more, are enough;
    without SELECT the write fails as an OutboxError that says the transaction is aborted."""
    role = f"shop_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    with pg_schema() as url, postonce.Client(server.base_url, outbox=url, retry=FAST) as client:
        schema = sql.Identifier(url.rsplit("schema=", 1)[1])
        client.outbox  # noqa: B018 (the outbox's owner creates it)
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
            admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, ident))
            admin.execute(sql.SQL("GRANT INSERT ON {}.intents TO {}").format(schema, ident))
            admin.execute(
                sql.SQL("GRANT USAGE ON SEQUENCE {}.intents_id_seq TO {}").format(schema, ident)
            )
        try:
            app_url = PG_URL.replace("postgres@", f"{role}@", 1)
            with psycopg.connect(app_url) as conn:
                with pytest.raises(postonce.OutboxError, match="roll it back"):
                    client.enqueue(CHARGES, connection=conn, intent="no-select", json={"a": 1})
                conn.rollback()
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute(sql.SQL("GRANT SELECT ON {}.intents TO {}").format(schema, ident))
            with psycopg.connect(app_url) as conn:
                info = client.enqueue(CHARGES, connection=conn, intent="granted", json={"a": 1})
                conn.commit()
            assert client.drain().succeeded == 1
        finally:
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
                admin.execute(sql.SQL("DROP ROLE {}").format(ident))
    assert len(server.effects_for(info.key)) == 1


def test_a_sqlalchemy_engine_in_autocommit_is_refused(server: LoopbackServer) -> None:
    engine = sqlalchemy.create_engine(_alchemy_url(), isolation_level="AUTOCOMMIT")
    try:
        with (
            pg_schema() as url,
            postonce.Client(server.base_url, outbox=url) as client,
            engine.connect() as conn,
            pytest.raises(postonce.InvalidRequest, match="autocommit"),
        ):
            client.enqueue(CHARGES, connection=conn, intent="i-1", json={"a": 1})
    finally:
        engine.dispose()


def test_aiosqlite_commits_and_rolls_back_with_the_application(
    server: LoopbackServer, tmp_path: Path
) -> None:
    import aiosqlite

    path = tmp_path / "shop.db"

    async def main() -> tuple[str, str]:
        async with postonce.AsyncClient(
            server.base_url, outbox=f"sqlite:///{path}?create=1", retry=FAST
        ) as client:
            await client.lookup("-")  # opened at start, before any transaction
            keys = []
            for intent, commit in (("kept", True), ("dropped", False)):
                async with aiosqlite.connect(path) as db:
                    info = await client.enqueue(
                        CHARGES, connection=db, intent=intent, json={"a": 1}
                    )
                    await (db.commit() if commit else db.rollback())
                keys.append(info.key)
            assert await client.lookup("dropped") is None
            assert (await client.drain()).succeeded == 1
            return keys[0], keys[1]

    kept, dropped = asyncio.run(main())
    assert len(server.effects_for(kept)) == 1
    assert server.requests_for(dropped) == []


def test_an_outbox_first_opened_inside_a_transaction_that_wrote_says_to_open_it_at_start(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """SQLite: creating the outbox's tables needs the write lock the transaction holds."""
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id TEXT)")
    db = sqlite3.connect(path)
    db.execute("INSERT INTO orders VALUES ('order-1')")
    with (
        postonce.Client(server.base_url, outbox=f"sqlite:///{path}?create=1") as client,
        pytest.raises(postonce.OutboxError, match=r"Open the outbox when the application starts"),
    ):
        client.enqueue(CHARGES, connection=db, intent="order-1/charge", json={"a": 1})
    db.rollback()
    db.close()


def test_an_enqueued_intent_is_settled_as_any_other(app_db: AppDB, server: LoopbackServer) -> None:
    """on_settled hears of it once, with its meta, from the drain that sends it."""
    settled: list[postonce.Settlement] = []
    with client_for(app_db, server, on_settled=settled.append) as client:
        with transaction(app_db, "driver") as tx:
            tx.add_order(app_db, "order-7")
            client.enqueue(
                CHARGES, connection=tx.connection, intent="order-7/charge", json={"a": 7},
                meta={"order_id": "order-7"},
            )  # fmt: skip
            tx.commit()
        assert client.drain().settled == 1
        assert client.drain().settled == 0
    (settlement,) = settled
    assert (settlement.intent, settlement.state, settlement.meta) == (
        "order-7/charge", postonce.State.SUCCEEDED, {"order_id": "order-7"}
    )  # fmt: skip


def test_an_async_worker_drain_is_woken_by_the_commit_and_stops_at_once(
    server: LoopbackServer,
) -> None:
    """AsyncClient.drain(forever=True) with a 30 s interval on PostgreSQL: an enqueued
    intent is sent within seconds of its commit, and a stop ends the idle wait at once."""

    async def main(url: str) -> tuple[str, float, float]:
        async with postonce.AsyncClient(server.base_url, outbox=url, retry=FAST) as client:
            stop = anyio.Event()
            worker = asyncio.ensure_future(client.drain(forever=True, interval=30.0, stop=stop))
            await asyncio.sleep(0.5)  # the worker found nothing and waits
            async with await psycopg.AsyncConnection.connect(PG_URL) as conn:
                info = await client.enqueue(CHARGES, connection=conn, intent="woken", json={})
                await conn.commit()
            committed = time.monotonic()
            while not server.effects_for(info.key) and time.monotonic() - committed < 10:
                await asyncio.sleep(0.05)
            sent_after = time.monotonic() - committed
            stopping = time.monotonic()
            stop.set()
            await asyncio.wait_for(worker, timeout=10)
            return info.key, sent_after, time.monotonic() - stopping

    with pg_schema() as url:
        key, sent_after, stopped_after = asyncio.run(main(url))
    assert len(server.effects_for(key)) == 1, f"not sent {sent_after:.1f} s after the commit"
    assert stopped_after < 5  # not its 30 s interval
