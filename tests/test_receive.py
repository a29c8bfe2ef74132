"""``receive_once``: a provider's notification applied once, in the application's transaction.

Against real PostgreSQL and SQLite through the drivers applications use; the
Stripe emulator (tests/provider_emulators.py) for a notification that settles
an intent whose answer left its effect unknown.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from psycopg import sql
from sqlalchemy.orm import Session

import postonce
from postonce import IntentIndeterminate, Settlement, State
from tests.conftest import FAST, PG_URL, _serve, pg_schema
from tests.provider_emulators import Emulator


class Shop:
    """An application database holding the outbox, with an ``effects`` table of its own."""

    def __init__(self, backend: str, outbox: str, path: Path | None, schema: str) -> None:
        self.backend, self.outbox, self.path, self.schema = backend, outbox, path, schema
        self.mark = "?" if backend == "sqlite" else "%s"

    def connect(self) -> Any:
        if self.path is not None:
            return sqlite3.connect(self.path, timeout=30)
        return psycopg.connect(PG_URL)

    def apply(self, conn: Any, event: str) -> None:
        """The notification's effect: one row per application."""
        conn.execute(f"INSERT INTO {self.effects} (event) VALUES ({self.mark})", (event,))

    @property
    def effects(self) -> str:
        return "effects" if self.path is not None else f"{self.schema}_app.effects"

    def effect_count(self, event: str) -> int:
        with self.connect() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {self.effects} WHERE event = {self.mark}", (event,)
            ).fetchone()
        return int(row[0])


@pytest.fixture(params=["sqlite", "postgres"])
def shop(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shop]:
    if request.param == "sqlite":
        path = tmp_path / "shop.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE effects (event TEXT)")
            conn.execute("CREATE TABLE receipts (id INTEGER PRIMARY KEY, note TEXT)")  # its own
        spec = f"sqlite:///{path}?create=1"
        with postonce.Client("http://api.test", outbox=spec) as client:
            client.outbox  # noqa: B018 (at start: postonce's tables, receipts included)
        yield Shop("sqlite", spec, path, "")
        return
    with pg_schema() as url:
        schema = url.rsplit("schema=", 1)[1]
        with postonce.Client("http://api.test", outbox=url) as client:
            client.outbox  # noqa: B018 (creates the outbox's schema, receipts included)
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(f"{schema}_app")))
            conn.execute(f"CREATE TABLE {schema}_app.effects (event text)")
        try:
            yield Shop("postgres", url, None, schema)
        finally:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(f"{schema}_app"))
                )


def receive(shop: Shop, conn: Any, event: str, delivery: str | None = None) -> bool:
    return postonce.receive_once(
        conn, source="stripe", event_id=event, delivery_id=delivery, schema=shop.schema
    )


def test_the_first_delivery_applies_and_a_duplicate_does_not(shop: Shop) -> None:
    event = f"evt_{uuid.uuid4().hex}"
    for delivery, first in (("d-1", True), ("d-2", False), ("d-3", False)):
        with shop.connect() as conn:
            if receive(shop, conn, event, delivery) is first and first:
                shop.apply(conn, event)
            assert receive(shop, conn, event) is False  # within the same transaction too
            conn.commit()
    assert shop.effect_count(event) == 1


def test_a_rollback_forgets_the_receipt_so_the_redelivery_applies(shop: Shop) -> None:
    event = f"evt_{uuid.uuid4().hex}"
    with shop.connect() as conn:
        assert receive(shop, conn, event)
        shop.apply(conn, event)
        conn.rollback()  # the effect failed: neither it nor the receipt stays
    with shop.connect() as conn:
        assert receive(shop, conn, event)
        shop.apply(conn, event)
        conn.commit()
    assert shop.effect_count(event) == 1


def test_one_event_delivered_by_eight_threads_at_once_has_one_effect(shop: Shop) -> None:
    """Each delivery in its own transaction; exactly one is first, and none raises."""
    event = f"evt_{uuid.uuid4().hex}"
    start, firsts, errors = threading.Barrier(8), [], []

    def deliver(n: int) -> None:
        try:
            with shop.connect() as conn:
                start.wait(timeout=10)
                if receive(shop, conn, event, f"delivery-{n}"):
                    firsts.append(n)
                    time.sleep(0.1)  # the others wait on the first's commit
                    shop.apply(conn, event)
                conn.commit()
        except Exception as exc:  # recorded: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(firsts) == 1
    assert shop.effect_count(event) == 1


@pytest.mark.parametrize("kind", ["sqlalchemy-connection", "sqlalchemy-session"])
def test_sqlalchemy_connections_receive_once(shop: Shop, kind: str) -> None:
    url = f"sqlite:///{shop.path}" if shop.path else PG_URL.replace("://", "+psycopg://", 1)
    engine = sqlalchemy.create_engine(url)
    event = f"evt_{uuid.uuid4().hex}"
    try:
        for expected in (True, False):
            if kind == "sqlalchemy-session":
                with Session(engine) as session:
                    assert receive(shop, session, event) is expected
                    session.commit()
            else:
                with engine.connect() as conn:
                    assert receive(shop, conn, event) is expected
                    conn.commit()
    finally:
        engine.dispose()


def test_async_connections_receive_once(shop: Shop) -> None:
    import aiosqlite

    async def main() -> list[bool]:
        seen, event = [], f"evt_{uuid.uuid4().hex}"
        for _ in range(2):
            if shop.path is not None:
                async with aiosqlite.connect(shop.path) as conn:
                    seen.append(await _receive_async(shop, conn, event))
                    await conn.commit()
            else:
                async with await psycopg.AsyncConnection.connect(PG_URL) as pg:
                    seen.append(await _receive_async(shop, pg, event))
                    await pg.commit()
        return seen

    assert asyncio.run(main()) == [True, False]


@pytest.mark.parametrize("kind", ["connection", "session"])
def test_sqlalchemy_async_connections_receive_once(kind: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def main(schema: str) -> list[bool]:
        engine = create_async_engine(PG_URL.replace("://", "+psycopg://", 1))
        seen, event = [], f"evt_{uuid.uuid4().hex}"
        try:
            for _ in range(2):
                if kind == "session":
                    async with AsyncSession(engine) as session:
                        seen.append(await postonce.receive_once_async(
                            session, source="stripe", event_id=event, schema=schema
                        ))  # fmt: skip
                        await session.commit()
                else:
                    async with engine.connect() as conn:
                        seen.append(await postonce.receive_once_async(
                            conn, source="stripe", event_id=event, schema=schema
                        ))  # fmt: skip
                        await conn.commit()
        finally:
            await engine.dispose()
        return seen

    with pg_schema() as url:
        with postonce.Client("http://api.test", outbox=url) as client:
            client.outbox  # noqa: B018 (creates the outbox's schema, receipts included)
        assert asyncio.run(main(url.rsplit("schema=", 1)[1])) == [True, False]


async def _receive_async(shop: Shop, conn: Any, event: str) -> bool:
    return await postonce.receive_once_async(
        conn, source="stripe", event_id=event, schema=shop.schema
    )


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("event_id", ""),
        ("event_id", "evt_\x001"),
        ("source", None),
        ("event_id", "x" * 256),
        ("delivery_id", 7),
    ],
    ids=["empty", "nul", "no-source", "too-long", "not-text"],
)
def test_an_identifier_no_database_stores_alike_is_refused_before_anything_is_written(
    shop: Shop, field: str, value: Any
) -> None:
    arguments: dict[str, Any] = {"source": "stripe", "event_id": "evt_1", field: value}
    with shop.connect() as conn:
        with pytest.raises(postonce.InvalidRequest, match=field):
            postonce.receive_once(conn, schema=shop.schema, **arguments)
        # Nothing written, and on PostgreSQL the transaction is still usable.
        assert receive(shop, conn, "evt_1") is True
        conn.rollback()


def test_a_database_without_the_outboxs_schema_is_refused(tmp_path: Path) -> None:
    """An application's own table called receipts is never written to."""
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE receipts (id INTEGER PRIMARY KEY, note TEXT)")
    with (
        sqlite3.connect(path) as conn,
        pytest.raises(postonce.ConfigurationError, match="no postonce receipts table"),
    ):
        postonce.receive_once(conn, source="stripe", event_id="evt_1")
    with psycopg.connect(PG_URL) as pg:
        with pytest.raises(postonce.ConfigurationError, match="no postonce receipts table"):
            postonce.receive_once(pg, source="stripe", event_id="evt_1", schema="no_such_schema")
        pg.execute("SELECT 1")  # the transaction is not aborted


# -- the operation identifier, per provider --------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "payload", "headers", "expected"),
    [
        (
            "stripe",
            {"id": "evt_1", "type": "charge.succeeded", "request": {"idempotency_key": "k-1"}},
            None,
            postonce.NotificationIds("stripe", "evt_1", None, "k-1"),
        ),
        (
            "stripe",
            {"id": "evt_2", "request": "req_123"},  # API versions before 2017-05-25
            None,
            postonce.NotificationIds("stripe", "evt_2"),
        ),
        (
            "adyen",
            {"NotificationRequestItem": {"pspReference": "P1", "eventCode": "AUTHORISATION",
                                         "merchantReference": "order-1"}},
            None,
            postonce.NotificationIds("adyen", "AUTHORISATION:P1", None, None, "order-1"),
        ),
        (
            "Adyen",  # one item, unwrapped; a profile name in any case
            {"pspReference": "P1", "eventCode": "CAPTURE"},
            None,
            postonce.NotificationIds("adyen", "CAPTURE:P1"),
        ),
        (
            "paypal_orders",
            {"id": "WH-1", "event_type": "PAYMENT.CAPTURE.COMPLETED"},
            {"PAYPAL-TRANSMISSION-ID": "t-9"},
            postonce.NotificationIds("paypal", "WH-1", "t-9"),
        ),
        (
            "sslcommerz",
            {"tran_id": "T-1", "val_id": "V-1", "status": "VALID"},
            None,
            postonce.NotificationIds("sslcommerz", "T-1", "V-1", None, "T-1"),
        ),
    ],
)  # fmt: skip
def test_each_documented_sender_names_its_operation(
    provider: str, payload: dict[str, Any], headers: dict[str, str] | None,
    expected: postonce.NotificationIds,
) -> None:  # fmt: skip
    assert postonce.notification_ids(provider, payload, headers=headers) == expected


@pytest.mark.parametrize(
    ("provider", "payload", "error"),
    [
        ("stripe", {"type": "charge.succeeded"}, postonce.InvalidRequest),
        ("adyen", {"NotificationRequestItem": {"pspReference": "P1"}}, postonce.InvalidRequest),
        ("paypal_orders", {"id": ""}, postonce.InvalidRequest),
        ("stripe", ["evt_1"], postonce.InvalidRequest),
        ("square", {"event_id": "e-1"}, postonce.ConfigurationError),
    ],
)
def test_a_payload_without_its_identifier_is_refused(
    provider: str, payload: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        postonce.notification_ids(provider, payload)


# -- a notification settles an intent ---------------------------------------------------------


@pytest.fixture
def stripe_api() -> Iterator[str]:
    app = Emulator("replayed")
    uv, thread, port = _serve(app)  # type: ignore[arg-type]
    yield f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(timeout=10)


def test_a_stripe_event_resolves_an_indeterminate_intent_and_settles_it_once(
    stripe_api: str, tmp_path: Path
) -> None:
    """Stripe stored a 500 for the key: the charge is unknown. Its event, naming the key,
    answers; a redelivery of that event changes nothing."""
    path = tmp_path / "shop.db"
    settled: list[Settlement] = []
    with postonce.Client(
        stripe_api, provider="stripe", outbox=f"sqlite:///{path}?create=1", retry=FAST,
        on_settled=settled.append,
    ) as client:  # fmt: skip
        with pytest.raises(IntentIndeterminate) as raised:
            client.post_once(
                "/v1/charges", json={"fail": 1, "should_retry": False}, intent="order-1/charge"
            )
        assert [s.state for s in settled] == [State.INDETERMINATE]
        event = {
            "id": f"evt_{uuid.uuid4().hex}",
            "type": "charge.succeeded",
            "request": {"id": "req_1", "idempotency_key": raised.value.key},
        }
        outcomes = []
        for _ in range(2):  # delivered twice
            ids = postonce.notification_ids("stripe", event)
            # The intent first: idempotent (a second time it agrees), and on SQLite its
            # write must not wait on the application's open transaction.
            outcomes.append(client.resolve_from_notification("succeeded", key=ids.idempotency_key))
            with sqlite3.connect(path) as db:
                if postonce.receive_once(db, source=ids.source, event_id=ids.event_id):
                    db.execute("SELECT 1")  # the application's own effect would go here
                db.commit()
        notified, again = outcomes
        assert notified.applied
        assert notified.record.state is State.SUCCEEDED
        assert (again.applied, again.contradiction) == (False, None)
        assert [s.state for s in settled] == [State.INDETERMINATE, State.SUCCEEDED]
        assert client.lookup("order-1/charge").state is State.SUCCEEDED  # type: ignore[union-attr]


def test_a_notification_never_overwrites_a_stored_ending(
    stripe_api: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settled: list[Settlement] = []
    with postonce.Client(
        stripe_api, provider="stripe", outbox=tmp_path / "o.sqlite3", retry=FAST,
        on_settled=settled.append,
    ) as client:  # fmt: skip
        response = client.post_once("/v1/charges", json={"a": 1}, intent="order-2/charge")
        assert response.is_success
        key = response.request.headers["Idempotency-Key"]
        with caplog.at_level(logging.WARNING, logger="postonce"):
            said = client.resolve_from_notification("failed", key=key)
        agreed = client.resolve_from_notification("succeeded", intent="order-2/charge")
        with pytest.raises(postonce.UnknownIntent):
            client.resolve_from_notification("succeeded", key="not-a-key-of-ours")
    assert not said.applied
    assert said.contradiction is not None
    assert said.record.state is State.SUCCEEDED
    assert "never overwritten" in caplog.text
    assert (agreed.applied, agreed.contradiction) == (False, None)
    assert [s.state for s in settled] == [State.SUCCEEDED]  # settled once, by the call


def test_receipts_are_purged_only_on_request_and_only_older_ones(shop: Shop) -> None:
    import subprocess
    import sys

    old, new = f"evt_old_{uuid.uuid4().hex}", f"evt_new_{uuid.uuid4().hex}"
    table = "postonce_receipts" if shop.path is not None else f'"{shop.schema}".receipts'
    with shop.connect() as conn:
        assert receive(shop, conn, old)
        assert receive(shop, conn, new)
        conn.execute(
            f"UPDATE {table} SET received_at = received_at - 3456000 WHERE event_id = {shop.mark}",
            (old,),
        )
        conn.commit()
    spec = str(shop.path) if shop.path is not None else shop.outbox
    done = subprocess.run(
        [sys.executable, "-m", "postonce", "outbox", "--outbox", spec, "purge-receipts",
         "--older-than", "30d"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"purged_receipts": 1' in done.stdout
    with shop.connect() as conn:
        assert receive(shop, conn, old) is True  # forgotten: a redelivery would apply again
        assert receive(shop, conn, new) is False
        conn.rollback()


def test_async_client_applies_a_notification_as_the_sync_one(
    stripe_api: str, tmp_path: Path
) -> None:
    async def main() -> tuple[postonce.Notified, postonce.Notified]:
        async with postonce.AsyncClient(
            stripe_api, provider="stripe", outbox=tmp_path / "o.sqlite3", retry=FAST
        ) as client:
            response = await client.post_once("/v1/charges", json={"a": 1}, intent="order-3")
            key = response.request.headers["Idempotency-Key"]
            said = await client.resolve_from_notification("failed", key=key)
            agreed = await client.resolve_from_notification("succeeded", intent="order-3")
            with pytest.raises(postonce.UnknownIntent):
                await client.resolve_from_notification("succeeded", key="not-ours")
            return said, agreed

    said, agreed = asyncio.run(main())
    assert said.contradiction is not None
    assert said.record.state is State.SUCCEEDED
    assert (agreed.applied, agreed.contradiction) == (False, None)
