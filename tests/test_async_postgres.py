"""AsyncClient on PostgreSQL, end to end: a cancel or a close while its calls are on the workers.

On PostgreSQL an AsyncClient's store calls run side by side on worker threads
(``StoreThread``), not in the one writer's batches SQLite gets. These tests
take the real path (a loopback server, the real PostgreSQL) and close the
client while a record runs on a worker. (A cancel while the server holds the
request, or while the answer's record runs, is tested on every outbox in
test_async.py.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import anyio
import pytest

import postonce
from postonce import State
from postonce._outbox.locate import open_store
from tests.conftest import FAST, LoopbackServer, SlowRecord, pg_schema, stored_intent

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

T = TypeVar("T")

CHARGES = "/ietf/v1/charges"


def run(main: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(main)


@pytest.fixture
def pg_outbox() -> Iterator[str]:
    with pg_schema() as url:
        yield url


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
    record, outcomes = stored_intent(pg_outbox, "closing")
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
