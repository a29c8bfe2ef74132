"""What only AsyncClient has to prove: group commit, a free event loop, cancellation, load.

Everything Client does, AsyncClient does too: the shared suites run against both.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import httpx
import pytest
from httpx_aiohttp import AiohttpTransport

import postonce
from postonce import SQLiteStore, State
from postonce._outbox.locate import open_store
from postonce._outbox.threaded import StoreThread
from tests.conftest import (
    FAST,
    LoopbackServer,
    OutboxUnderTest,
    SlowRecord,
    pg_schema,
    stored_intent,
)

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]], backend: str = "asyncio") -> T:
    return anyio.run(main, backend=backend)


async def pending_via_503(client: postonce.AsyncClient, intent: str) -> None:
    """Leave an intent pending for a drain: its only foreground attempt meets a 503."""
    with pytest.raises(postonce.IntentPending):
        await client.post_once(
            "/ietf/v1/charges",
            json={"amount": 1, "_test": {"before": [{"status": 503, "retry_after": "0"}]}},
            intent=intent,
            retry=FAST.model_copy(update={"attempts": 1}),
        )


def test_concurrent_intents_share_commits_and_each_is_written_ahead(outbox_path: Path) -> None:
    """64 concurrent post_once: fewer transactions than calls; each row is there before its send."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        conn = sqlite3.connect(outbox_path)
        (n,) = conn.execute(
            "SELECT count(*) FROM intents WHERE key = ?", (request.headers["Idempotency-Key"],)
        ).fetchone()
        conn.close()
        seen.append("row" if n == 1 else "missing")
        return httpx.Response(201, json={"ok": True})

    async def main() -> int:
        async with postonce.AsyncClient(
            "http://api.test",
            outbox=outbox_path,
            retry=FAST,
            transport=httpx.MockTransport(handler),
        ) as client:

            async def one(i: int) -> None:
                await client.post_once("/c", json={"i": i}, intent=f"g{i}")

            async with anyio.create_task_group() as group:
                for i in range(64):
                    group.start_soon(one, i)
            assert client._thread is not None
            thread = client._thread
            # The outbox was opened once, not by each of the 64 first callers.
            openers = [t for t in threading.enumerate() if t.name == "AnyIO worker thread"]
            assert len(openers) <= 1
            return thread.batches

    batches = run(main)
    assert seen == ["row"] * 64
    # 64 write-aheads + 64 completions; grouped, they take far fewer transactions.
    assert batches < 64


def test_no_sql_runs_on_the_event_loop_thread(outbox_path: Path) -> None:
    """Every SQL statement of an async call runs off the event loop's thread."""
    SQLiteStore(outbox_path).close()
    store = SQLiteStore(outbox_path)
    threads: set[str] = set()
    store._conn.set_trace_callback(lambda sql: threads.add(threading.current_thread().name))

    async def main() -> str:
        async with postonce.AsyncClient(
            "http://api.test",
            outbox=store,
            retry=FAST,
            transport=httpx.MockTransport(lambda r: httpx.Response(503)),
        ) as client:
            with pytest.raises(postonce.IntentPending):
                await client.post_once("/c", json={}, intent="loop")
            await client.drain()
            await client.lookup("loop")
        return threading.current_thread().name

    loop_thread = run(main)
    store._conn.set_trace_callback(None)  # close() (its sweep) is the caller's, after the loop
    store.close()
    assert threads == {"postonce-outbox-writer"}
    assert loop_thread not in threads


def test_cancelled_mid_send_leaves_the_intent_pending_and_unleased(
    server: LoopbackServer, outbox: OutboxUnderTest
) -> None:
    """A task cancelled while its request is at the server: ambiguous, pending, lease released.

    On every outbox: on PostgreSQL the calls run on the store's workers, not in
    SQLite's batches, and the clean-up's record must still land.
    """

    async def main() -> str:
        async with postonce.AsyncClient(server.base_url, outbox=outbox, retry=FAST) as client:
            await client.lookup("cx")  # the outbox opened (and migrated) before the clock starts
            with anyio.move_on_after(0.5) as scope:
                await client.post_once(
                    "/ietf/v1/charges", json={"amount": 1, "_test": {"delay": 1.0}}, intent="cx"
                )
            assert scope.cancelled_caught
            record = await client.lookup("cx")
            assert record is not None
            return record.key

    key = run(main)
    store = open_store(outbox)
    try:
        record = store.get("cx")
        attempts = store.attempts("cx")
    finally:
        store.close()
    assert record is not None
    assert record.state is State.PENDING
    assert record.lease_owner is None
    assert record.first_delivery_at is not None  # it may have been delivered: the horizon runs
    assert [a.outcome.value for a in attempts] == ["ambiguous"]
    deadline = time.monotonic() + 10
    while not server.effects_for(key):  # the server finishes the charge it was given
        assert time.monotonic() < deadline, "the server never finished the charge"
        time.sleep(0.05)

    async def finish() -> postonce.DrainReport:
        async with postonce.AsyncClient(server.base_url, outbox=outbox, retry=FAST) as c:
            return await c.drain()

    report = run(finish)
    assert (report.succeeded, report.replayed) == (1, 1)
    assert len(server.effects_for(key)) == 1


@pytest.mark.parametrize("backend_lib", ["asyncio", "trio"])
def test_cancelled_mid_record_keeps_the_answer(
    server: LoopbackServer, outbox: OutboxUnderTest, backend_lib: str
) -> None:
    """Cancelled while its 2xx is being recorded on the writer: the record still commits.

    The cancel reaches the caller only after the record's commit: nothing is
    left leased or pending, and no drain sends it again. The caller's wait for
    the record is cancelled and waits again, shielded, for the same call: on
    every outbox (SQLite's one writer batches it; PostgreSQL's workers run it
    alone), on asyncio (a future of the loop) and trio (an event).
    """

    async def main() -> tuple[str, bool]:
        async with postonce.AsyncClient(server.base_url, outbox=outbox, retry=FAST) as client:
            slow = SlowRecord(client.outbox, hold=0.6)
            with anyio.move_on_after(0.3) as scope:
                await client.post_once("/ietf/v1/charges", json={"amount": 2}, intent="mid-record")
            assert slow.started.is_set(), "the cancel came before the record began"
            # Given back only after the shielded record committed:
            committed = slow.finished.is_set()
            assert slow.threads == {"postonce-outbox-writer"}
            record = await client.lookup("mid-record")
            assert record is not None
            return record.key, scope.cancelled_caught and committed

    key, cancelled_after_commit = run(main, backend=backend_lib)
    assert cancelled_after_commit
    record, outcomes = stored_intent(outbox, "mid-record")
    assert (record.state, record.lease_owner, record.attempts) == (State.SUCCEEDED, None, 1)
    assert outcomes == ["final"]

    async def drain() -> postonce.DrainReport:
        async with postonce.AsyncClient(server.base_url, outbox=outbox, retry=FAST) as c:
            return await c.drain()

    assert run(drain).claimed == 0
    assert len(server.effects_for(key)) == 1


@pytest.mark.parametrize("backend_lib", ["asyncio", "trio"])
def test_calls_cancelled_while_queued_leave_the_others_of_their_batch_woken(
    server: LoopbackServer, outbox: OutboxUnderTest, backend_lib: str
) -> None:
    """Store calls cancelled before their answer came, in one batch with calls that wait.

    A cancelled caller's wake-up finds its wait gone; the wake-ups of the others
    handed over with it still arrive (none waits forever), and so do later calls.
    """

    async def main() -> postonce.IntentRecord | None:
        async with postonce.AsyncClient(server.base_url, outbox=outbox, retry=FAST) as client:
            await client.post_once("/ietf/v1/charges", json={"amount": 2}, intent="a")

            async def cancelled_lookup() -> None:
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await client.lookup("a")

            async def lookup() -> None:
                with anyio.fail_after(5):
                    assert await client.lookup("a") is not None

            async with anyio.create_task_group() as group:
                for _ in range(5):
                    group.start_soon(cancelled_lookup)
                    group.start_soon(lookup)
            with anyio.move_on_after(0.0):
                await client.lookup("a")
            with anyio.fail_after(5):
                return await client.lookup("a")

    assert run(main, backend=backend_lib) is not None


def test_cancelled_during_a_retry_wait_releases_the_lease(outbox_path: Path) -> None:
    """Cancelled while sleeping before a retry: the attempt is kept, the lease is released."""
    slow = FAST.model_copy(update={"wait_initial": 5.0, "wait_max": 5.0})

    async def main() -> None:
        async with postonce.AsyncClient(
            "http://api.test",
            outbox=outbox_path,
            retry=slow,
            transport=httpx.MockTransport(
                lambda r: httpx.Response(503, headers={"Retry-After": "5"})
            ),
        ) as client:
            with anyio.move_on_after(0.3):
                await client.post_once("/c", json={}, intent="sleepy")

    run(main)
    store = SQLiteStore(outbox_path)
    record = store.get("sleepy")
    store.close()
    assert record is not None
    assert (record.state, record.lease_owner, record.attempts) == (State.PENDING, None, 1)


def test_two_hundred_concurrent_intents_with_dropped_answers(
    server: LoopbackServer, outbox_path: Path
) -> None:
    """200 concurrent intents, 10% of answers cut after the charge: all succeed, one charge each."""
    rng = random.Random(200)
    dropped = set(rng.sample(range(200), 20))

    async def main() -> list[httpx.Response]:
        out: list[httpx.Response] = []
        async with postonce.AsyncClient(
            server.base_url,
            outbox=outbox_path,
            retry=FAST,
            limits=httpx.Limits(max_connections=64),
        ) as client:

            async def one(i: int) -> None:
                body = {"amount": i, "_test": {"drop_first": i in dropped}}
                out.append(await client.post_once("/ietf/v1/charges", json=body, intent=f"l{i}"))

            async with anyio.create_task_group() as group:
                for i in range(200):
                    group.start_soon(one, i)
        return out

    responses = run(main)
    assert len(responses) == 200
    assert all(r.status_code == 201 for r in responses)
    ledger = server.ledger()
    for response in responses:
        key = response.extensions["postonce"].key
        assert len([e for e in ledger["effects"] if e["key"] == key]) == 1
    replayed = [r for r in responses if r.extensions["postonce"].replayed]
    assert len(replayed) == 20


def test_works_on_trio(server: LoopbackServer, outbox_path: Path) -> None:
    """AsyncClient runs under trio too, through anyio: a lost answer, one charge."""

    async def main() -> httpx.Response:
        async with postonce.AsyncClient(server.base_url, outbox=outbox_path, retry=FAST) as client:
            return await client.post_once(
                "/ietf/v1/charges", json={"amount": 7, "_test": {"drop_first": True}}, intent="t"
            )

    response = run(main, backend="trio")
    assert response.status_code == 201
    assert response.extensions["postonce"].replayed is True
    assert len(server.effects_for(response.extensions["postonce"].key)) == 1


def test_httpx_aiohttp_transport(server: LoopbackServer, outbox_path: Path) -> None:
    """The aiohttp-backed transport from httpx-aiohttp carries the same guarantees."""

    async def main() -> httpx.Response:
        async with postonce.AsyncClient(
            server.base_url,
            outbox=outbox_path,
            retry=FAST,
            transport=AiohttpTransport(),
            timeout=httpx.Timeout(5.0, read=0.5),
        ) as client:
            return await client.post_once(
                "/ietf/v1/charges", json={"amount": 8, "_test": {"delay": 1.0}}, intent="aio"
            )

    response = run(main)
    assert response.status_code == 201
    key = response.extensions["postonce"].key
    assert len(server.effects_for(key)) == 1
    assert len(server.requests_for(key)) >= 2


def test_a_ready_httpx_async_client_is_used_and_left_open(outbox_path: Path) -> None:
    """http= takes a configured httpx.AsyncClient; aclose leaves it open."""

    async def main() -> bool:
        http = httpx.AsyncClient(
            base_url="http://api.test",
            transport=httpx.MockTransport(lambda r: httpx.Response(201)),
        )
        client = postonce.AsyncClient(http=http, outbox=outbox_path, retry=FAST)
        assert (await client.post_once("/c", json={}, intent="own")).status_code == 201
        await client.aclose()
        closed = http.is_closed
        await http.aclose()
        return closed

    assert run(main) is False


def test_async_drain_stop_event_ends_a_forever_drain(
    server: LoopbackServer, outbox_path: Path
) -> None:
    """Setting stop ends drain(forever=True) after the attempts in flight."""

    async def main() -> postonce.DrainReport:
        async with postonce.AsyncClient(server.base_url, outbox=outbox_path, retry=FAST) as client:
            stop = anyio.Event()
            result: list[postonce.DrainReport] = []

            async def drainer() -> None:
                result.append(await client.drain(forever=True, interval=0.05, stop=stop))

            async with anyio.create_task_group() as group:
                group.start_soon(drainer)
                await pending_via_503(client, "fv")
                deadline = anyio.current_time() + 10
                while (record := await client.lookup("fv")) is not None and (
                    record.state is not State.SUCCEEDED
                ):
                    assert anyio.current_time() < deadline
                    await anyio.sleep(0.02)
                stop.set()
            return result[0]

    report = run(main)
    assert report.succeeded == 1


def test_a_stop_ends_an_async_drains_wait_for_a_rate_slot(
    server: LoopbackServer, outbox_path: Path
) -> None:
    """At 0.2 sends a second the second intent's slot is 5 s away; a stop 0.3 s in ends the
    wait, and the intent goes back pending, unsent, within the second."""

    async def main() -> tuple[postonce.DrainReport, float, list[postonce.IntentRecord | None]]:
        async with postonce.AsyncClient(server.base_url, outbox=outbox_path, retry=FAST) as client:
            for i in range(2):
                await pending_via_503(client, f"slot-{i}")
            stop = anyio.Event()
            began = anyio.current_time()
            async with anyio.create_task_group() as group:

                async def stop_soon() -> None:
                    await anyio.sleep(0.3)
                    stop.set()

                group.start_soon(stop_soon)
                report = await client.drain(rate=0.2, stop=stop)
            took = anyio.current_time() - began
            return report, took, [await client.lookup(f"slot-{i}") for i in range(2)]

    report, took, records = run(main)
    assert took < 3.0
    assert (report.claimed, report.sent, report.succeeded, report.pending) == (2, 1, 1, 1)
    states = sorted((r.state.value, r.lease_owner) for r in records if r is not None)
    assert states == [("pending", None), ("succeeded", None)]


def test_async_drain_flow_waiting_for_its_turn_when_stopped_sends_nothing(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped while it waited for the one turn to send, a claimed intent is released unsent.

    On PostgreSQL, whose drain runs one flow more than it sends.
    """
    from postonce._drain import AsyncTurns, Heard, Turn

    arrivals: list[object] = []
    take = AsyncTurns.take

    async def counted(self: AsyncTurns, heard: Heard | None = None) -> Turn:
        arrivals.append(self)
        return await take(self, heard)

    monkeypatch.setattr(AsyncTurns, "take", counted)

    async def main() -> tuple[postonce.DrainReport, list[postonce.IntentRecord | None], int]:
        async with postonce.AsyncClient(server.base_url, outbox=outbox, retry=FAST) as client:
            for i in range(2):
                await pending_via_503(client, f"aturn-{i}")
            stop = anyio.Event()
            original = client._http.send

            async def send_when_both_wait(
                request: httpx.Request, **kwargs: object
            ) -> httpx.Response:
                # This flow holds the turn; the other task has come to wait for it.
                with anyio.fail_after(10):
                    while len(arrivals) < 2:
                        await anyio.sleep(0.005)
                stop.set()
                return await original(request)

            client._http.send = send_when_both_wait  # type: ignore[method-assign]
            report = await client.drain(stop=stop)
            records = [await client.lookup(f"aturn-{i}") for i in range(2)]
            client._http.send = original  # type: ignore[method-assign]
            again = (await client.drain()).succeeded
            return report, records, again

    with pg_schema() as outbox:
        report, records, again = run(main)
    assert (report.claimed, report.sent, report.succeeded, report.pending) == (2, 1, 1, 1)
    states = sorted((r.state.value, r.attempts, r.lease_owner) for r in records if r is not None)
    assert states == [("pending", 1, None), ("succeeded", 2, None)]
    assert again == 1


class _Halt(BaseException):
    """Not an Exception: what a worker must still answer its caller with."""


class _RemoteStub:
    """The least of a remote store: its calls run side by side on two workers."""

    remote = True
    parallel_calls = 2

    def halt(self) -> None:
        raise _Halt

    def echo(self, value: int) -> int:
        return value

    def slow_echo(self, value: int, seconds: float) -> int:
        time.sleep(seconds)
        return value


def test_a_remote_stores_worker_answers_even_a_base_exception() -> None:
    """A call that ends in a BaseException wakes its caller with OutboxError, not never."""
    thread = StoreThread(_RemoteStub())  # type: ignore[arg-type]

    async def main() -> None:
        with anyio.fail_after(10):
            await thread.call("halt", {})

    try:
        with pytest.raises(postonce.OutboxError, match="halt") as raised:
            run(main)
        assert isinstance(raised.value.__cause__, _Halt)
        # The worker lived on: the next call is answered.
        assert run(lambda: thread.call("echo", {"value": 7})) == 7
        assert {w.name for w in thread._workers} == {"postonce-outbox-writer"}
        assert all(w.daemon for w in thread._workers)
    finally:
        thread.close()


class _LocalStub:
    """The least of a local store: one writer runs its calls (one by one: no run_batch)."""

    def echo(self, value: int) -> int:
        return value

    def slow_echo(self, value: int, seconds: float) -> int:
        time.sleep(seconds)
        return value


@pytest.mark.parametrize("store", [_RemoteStub, _LocalStub])
def test_a_call_outliving_its_event_loop_leaves_the_store_thread_serving(store: type) -> None:
    """A call still running when its ``asyncio.run`` ends: the loop is closed when it finishes.

    There is nobody to wake there; the writer (or worker) must not die of it:
    a call from the next event loop is answered (it used to wait forever).
    """
    thread = StoreThread(store())

    async def leave_calls_behind() -> None:
        for _ in range(2):  # one on each of a remote store's workers
            asyncio.get_running_loop().create_task(
                thread.call("slow_echo", {"value": 1, "seconds": 0.3})
            )
        await asyncio.sleep(0.05)  # handed over; then this loop ends, and closes

    try:
        asyncio.run(leave_calls_behind())
        time.sleep(0.5)  # the slow calls finish on a closed loop

        async def next_loop() -> int:
            with anyio.fail_after(5):
                answer: int = await thread.call("echo", {"value": 2})
                return answer

        assert run(next_loop) == 2
    finally:
        thread.close()


@pytest.mark.parametrize("store", [_RemoteStub, _LocalStub])
def test_a_store_thread_refuses_calls_once_closed(store: type) -> None:
    """After close() a call is refused at once, and no thread is started again."""
    thread = StoreThread(store())
    assert run(lambda: thread.call("echo", {"value": 1})) == 1
    workers = [*thread._workers, *([thread._thread] if thread._thread else [])]
    assert workers
    thread.close()
    assert not any(w.is_alive() for w in workers)

    async def after_close() -> None:
        with anyio.fail_after(10):
            await thread.call("echo", {"value": 2})

    with pytest.raises(postonce.OutboxError, match="closed"):
        run(after_close)
    assert thread._workers == []
    assert thread._thread is None


def test_a_call_not_yet_handed_to_the_writer_is_run_by_close() -> None:
    """close() in the loop turn of a submit: the call is still run and answered.

    (It used to reach the writer's queue after close's stop mark: never answered.)
    """
    thread = StoreThread(_LocalStub())  # type: ignore[arg-type]

    async def main() -> int:
        ticket = thread.submit("echo", {"value": 3})  # handed over at the turn's end
        thread.close()
        with anyio.fail_after(10):
            answer: int = await ticket.wait()
            return answer

    assert run(main) == 3
