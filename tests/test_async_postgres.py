"""AsyncClient on PostgreSQL, end to end: a cancel or a close while its calls are on the workers.

On PostgreSQL an AsyncClient's store calls run side by side on worker threads
(``StoreThread``), not in the one writer's batches SQLite gets. These tests
take the real path (a loopback server, the real PostgreSQL) and stop the call
at its worst moments: while its answer's record is running on a worker, and
while the client is being closed. (A cancel while the server holds the request
is tested on every outbox in test_async.py.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
import pytest

import postonce
from postonce import State
from postonce._outbox.locate import open_store
from tests.conftest import FAST, LoopbackServer, pg_schema

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

T = TypeVar("T")

CHARGES = "/ietf/v1/charges"


def run(main: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(main)


@pytest.fixture
def pg_outbox() -> Iterator[str]:
    with pg_schema() as url:
        yield url


class SlowRecord:
    """Replaces a store's ``record``: says when a record has begun, then holds it ``hold`` s."""

    def __init__(self, store: Any, hold: float) -> None:
        self.real = store.record
        self.hold = hold
        self.started = threading.Event()
        self.finished = threading.Event()
        self.threads: set[str] = set()
        store.record = self

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        self.threads.add(threading.current_thread().name)
        self.started.set()
        time.sleep(self.hold)
        try:
            done: bool = self.real(*args, **kwargs)
            return done
        finally:
            self.finished.set()


def stored(url: str, intent: str) -> tuple[postonce.IntentRecord, list[str]]:
    """The intent and its attempts' outcomes, read by a store of its own."""
    store = open_store(url)
    try:
        record = store.get(intent)
        assert record is not None
        return record, [a.outcome.value for a in store.attempts(intent)]
    finally:
        store.close()


def test_cancelled_mid_record_on_postgresql_keeps_the_answer(
    server: LoopbackServer, pg_outbox: str
) -> None:
    """Cancelled while its 2xx is being recorded on a worker: the record still commits.

    The cancel reaches the caller only after the record's commit: nothing is
    left leased or pending, and no drain sends it again.
    """

    async def main() -> tuple[str, bool]:
        async with postonce.AsyncClient(server.base_url, outbox=pg_outbox, retry=FAST) as client:
            slow = SlowRecord(client.outbox, hold=0.6)
            with anyio.move_on_after(0.3) as scope:
                await client.post_once(CHARGES, json={"amount": 2}, intent="mid-record")
            assert slow.started.is_set(), "the cancel came before the record began"
            # Given back only after the shielded record committed:
            committed = slow.finished.is_set()
            assert slow.threads == {"postonce-outbox-writer"}
            record = await client.lookup("mid-record")
            assert record is not None
            return record.key, scope.cancelled_caught and committed

    key, cancelled_after_commit = run(main)
    assert cancelled_after_commit
    record, outcomes = stored(pg_outbox, "mid-record")
    assert (record.state, record.lease_owner, record.attempts) == (State.SUCCEEDED, None, 1)
    assert outcomes == ["final"]

    async def drain() -> postonce.DrainReport:
        async with postonce.AsyncClient(server.base_url, outbox=pg_outbox, retry=FAST) as c:
            return await c.drain()

    assert run(drain).claimed == 0
    assert len(server.effects_for(key)) == 1


def test_aclose_with_a_record_on_a_worker_answers_the_call_first(
    server: LoopbackServer, pg_outbox: str
) -> None:
    """aclose() while a call's record runs on a worker: the call gets its answer, then all closes.

    Closing must neither strand the caller (a ticket never answered hangs it)
    nor close the store under the record (its answer would be lost to the drain).
    """

    async def main() -> tuple[int, str]:
        client = postonce.AsyncClient(server.base_url, outbox=pg_outbox, retry=FAST)
        slow = SlowRecord(client.outbox, hold=0.5)
        answers: list[postonce.IntentInfo] = []
        statuses: list[int] = []

        async def call() -> None:
            response = await client.post_once(CHARGES, json={"amount": 3}, intent="closing")
            statuses.append(response.status_code)
            answers.append(response.extensions["postonce"])

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await anyio.to_thread.run_sync(slow.started.wait, 5.0)
                assert not slow.finished.is_set()
                await client.aclose()
                # aclose waited for the record on the worker:
                assert slow.finished.is_set()
        assert [a.state for a in answers] == [State.SUCCEEDED]
        return statuses[0], answers[0].key

    status, key = run(main)
    assert status == 201
    record, outcomes = stored(pg_outbox, "closing")
    assert (record.state, record.lease_owner) == (State.SUCCEEDED, None)
    assert outcomes == ["final"]
    assert len(server.effects_for(key)) == 1


def test_a_call_after_aclose_is_refused_before_anything_is_sent(
    server: LoopbackServer, pg_outbox: str
) -> None:
    """After aclose() a post_once fails typed, names its intent, and nothing reaches the server."""

    async def main() -> None:
        client = postonce.AsyncClient(server.base_url, outbox=pg_outbox, retry=FAST)
        await client.post_once(CHARGES, json={"amount": 4}, intent="before")
        await client.aclose()
        with anyio.fail_after(10), pytest.raises(postonce.ConfigurationError) as caught:
            await client.post_once(CHARGES, json={"amount": 5}, intent="after")
        assert caught.value.intent == "after"

    before = len(server.ledger()["effects"])
    run(main)
    assert len(server.ledger()["effects"]) == before + 1  # only "before" was charged
    store = open_store(pg_outbox)
    try:
        assert store.get("after") is None
    finally:
        store.close()
