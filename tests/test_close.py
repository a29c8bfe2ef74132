"""Closing a client while it works: calls under way finish, drains stop, nothing is stranded.

``close()`` / ``aclose()`` used to close the httpx client and the outbox under
calls still running: a send failed on the closed httpx client (a bare
``RuntimeError``, its intent left pending as maybe delivered), or an answer
already received could not be recorded (the intent left leased, to be sent
again by a drain), and a ``forever`` drain went on claiming from a closed
outbox. Now close waits for calls under way, stops drains as ``stop.set()``
does, and only then closes; later calls are refused before anything is stored.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import anyio
import httpx
import pytest

import postonce
from postonce import State
from postonce._outbox.locate import open_store
from postonce.testing import MemoryOutbox
from tests.conftest import FAST, OutboxUnderTest

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

BASE = "http://api.test"


def stored_state(outbox: OutboxUnderTest, intent: str) -> tuple[State, str | None]:
    store = open_store(outbox)
    try:
        record = store.get(intent)
        assert record is not None
        return record.state, record.lease_owner
    finally:
        store.close()  # a MemoryOutbox keeps its data


def held_at_the_server(sending: anyio.Event, release: anyio.Event) -> httpx.MockTransport:
    """An async transport that says when a request arrived, and answers once ``release`` is set."""

    async def answer(request: httpx.Request) -> httpx.Response:
        sending.set()
        await release.wait()
        return httpx.Response(201, json={"id": "ch_1"})

    return httpx.MockTransport(answer)


def drain_under_way(client: postonce.Client | postonce.AsyncClient) -> None:
    """Wait (at most 5 s) until a drain of ``client`` has begun (counted as a call under way)."""
    deadline = time.monotonic() + 5
    while not client._live:
        assert time.monotonic() < deadline, "the drain never began"
        time.sleep(0.01)


def post_once_in_a_thread(
    client: postonce.Client, intent: str
) -> tuple[threading.Thread, list[BaseException]]:
    """A started daemon thread making one post_once, and the list its error lands in."""
    raised: list[BaseException] = []

    def call() -> None:
        try:
            client.post_once("/c", json={}, intent=intent)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, raised


def idle_drain_seen(client: postonce.Client | postonce.AsyncClient) -> threading.Event:
    """An event set when a drain of ``client`` found nothing due and is about to wait.

    (Its aftercare runs right before the wait.) A close before that would be
    seen by the drain's own check, and would not test that close() stops it.
    """
    seen = threading.Event()
    aftercare = client._aftercare

    def noting(tally: Any) -> Any:
        seen.set()
        return aftercare(tally)

    client._aftercare = noting  # type: ignore[method-assign]
    return seen


def close_beside(client: postonce.Client, drain: threading.Thread, idle: threading.Event) -> None:
    """close() ``client`` while ``drain`` waits idle: both end within 5 s (a hang fails)."""
    assert idle.wait(5), "the drain never began"
    time.sleep(0.1)  # into its wait
    closing = threading.Thread(target=client.close, daemon=True)
    closing.start()
    closing.join(5)
    drain.join(5)
    assert not drain.is_alive(), "the drain did not stop on close()"
    assert not closing.is_alive()


def test_close_waits_for_a_call_under_way_and_keeps_its_answer(outbox: OutboxUnderTest) -> None:
    """close() from another thread while a send is at the server: the call ends as usual first."""
    sending, release = threading.Event(), threading.Event()

    def slow(request: httpx.Request) -> httpx.Response:
        sending.set()
        release.wait(5)
        return httpx.Response(201, json={"id": "ch_1"})

    client = postonce.Client(BASE, outbox=outbox, retry=FAST, transport=httpx.MockTransport(slow))
    answers: list[httpx.Response] = []
    call = threading.Thread(
        target=lambda: answers.append(client.post_once("/c", json={}, intent="under-way")),
        daemon=True,
    )
    call.start()
    assert sending.wait(5)
    closing = threading.Thread(target=client.close, daemon=True)
    closing.start()
    closing.join(0.3)
    assert closing.is_alive(), "close() did not wait for the call under way"
    release.set()
    call.join(5)
    closing.join(5)
    assert not call.is_alive()
    assert not closing.is_alive()
    (response,) = answers
    assert response.status_code == 201
    assert response.extensions["postonce"].state is State.SUCCEEDED
    assert stored_state(outbox, "under-way") == (State.SUCCEEDED, None)
    with pytest.raises(postonce.ConfigurationError, match="closed"):
        client.post_once("/c", json={}, intent="after")


def test_aclose_waits_for_a_call_under_way_and_keeps_its_answer(outbox: OutboxUnderTest) -> None:
    """aclose() from another task while a send is at the server: the call ends as usual first."""

    async def main() -> None:
        sending, release = anyio.Event(), anyio.Event()
        client = postonce.AsyncClient(
            BASE, outbox=outbox, retry=FAST, transport=held_at_the_server(sending, release)
        )
        answers: list[httpx.Response] = []
        closed = anyio.Event()

        async def call() -> None:
            answers.append(await client.post_once("/c", json={}, intent="under-way"))

        async def close() -> None:
            await client.aclose()
            closed.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await sending.wait()
                group.start_soon(close)
                await anyio.sleep(0.3)
                assert not closed.is_set(), "aclose() did not wait for the call under way"
                release.set()
        (response,) = answers
        assert response.status_code == 201
        assert response.extensions["postonce"].state is State.SUCCEEDED
        with pytest.raises(postonce.ConfigurationError, match="closed"):
            await client.post_once("/c", json={}, intent="after")

    anyio.run(main)
    assert stored_state(outbox, "under-way") == (State.SUCCEEDED, None)


def test_close_stops_a_forever_drain(outbox: OutboxUnderTest) -> None:
    """A drain(forever=True) in another thread ends at once when its client is closed.

    Its interval is long: only close()'s stop, not the drain's next look, ends it in time.
    """
    answer = httpx.MockTransport(lambda r: httpx.Response(201))
    client = postonce.Client(BASE, outbox=outbox, retry=FAST, transport=answer)
    reports: list[postonce.DrainReport] = []
    idle = idle_drain_seen(client)
    drain = threading.Thread(
        target=lambda: reports.append(client.drain(forever=True, interval=30.0)), daemon=True
    )
    drain.start()
    close_beside(client, drain, idle)
    assert len(reports) == 1


def test_aclose_stops_a_forever_drain(outbox: OutboxUnderTest) -> None:
    """An AsyncClient drain(forever=True) ends at once when closed from its own loop."""

    async def main() -> None:
        client = postonce.AsyncClient(
            BASE,
            outbox=outbox,
            retry=FAST,
            transport=httpx.MockTransport(lambda r: httpx.Response(201)),
        )
        reports: list[postonce.DrainReport] = []
        idle = idle_drain_seen(client)

        async def drain() -> None:
            reports.append(await client.drain(forever=True, interval=30.0))

        with anyio.fail_after(5):  # far below the drain's interval
            async with anyio.create_task_group() as group:
                group.start_soon(drain)
                while not idle.is_set():
                    await anyio.sleep(0.01)
                await anyio.sleep(0.1)  # into its wait
                await client.aclose()
        assert len(reports) == 1

    anyio.run(main)


def test_close_inside_the_clients_own_call_is_refused_not_a_deadlock(tmp_path: object) -> None:
    """close() from within a call (here its transport) would wait for itself: it raises instead."""
    client: postonce.Client

    def closing(request: httpx.Request) -> httpx.Response:
        client.close()
        return httpx.Response(201)

    client = postonce.Client(
        BASE, outbox=f"{tmp_path}/o.sqlite3", retry=FAST, transport=httpx.MockTransport(closing)
    )
    worker, raised = post_once_in_a_thread(client, "self-close")
    worker.join(10)
    assert not worker.is_alive(), "close() inside the call deadlocked"
    (error,) = raised
    assert isinstance(error, postonce.ConfigurationError)
    assert "wait for itself" in str(error)
    client.close()  # from outside, it closes


def test_aclose_inside_the_clients_own_call_is_refused_not_a_deadlock(tmp_path: object) -> None:
    """aclose() from within a call would wait for itself: it raises instead."""

    async def main() -> None:
        client: postonce.AsyncClient

        async def closing(request: httpx.Request) -> httpx.Response:
            await client.aclose()
            return httpx.Response(201)

        client = postonce.AsyncClient(
            BASE, outbox=f"{tmp_path}/o.sqlite3", retry=FAST, transport=httpx.MockTransport(closing)
        )
        with pytest.raises(postonce.ConfigurationError, match="itself"):
            await client.post_once("/c", json={}, intent="self-close")
        await client.aclose()
        finished.set()

    # In a thread of its own: a deadlock (aclose waiting in a worker thread) would
    # not yield to fail_after, and must fail this test rather than hang the run.
    finished = threading.Event()
    runner = threading.Thread(target=anyio.run, args=(main,), daemon=True)
    runner.start()
    runner.join(10)
    assert finished.is_set(), "aclose() inside the call deadlocked or raised nothing"


def test_a_cancelled_aclose_still_lets_go_of_everything(tmp_path: object) -> None:
    """aclose() cancelled while it waits for a call: the httpx client, thread and outbox go."""

    async def main() -> None:
        sending, never = anyio.Event(), anyio.Event()
        stuck = held_at_the_server(sending, never)
        client = postonce.AsyncClient(
            BASE, outbox=f"{tmp_path}/o.sqlite3", retry=FAST, transport=stuck
        )
        ends: list[str] = []

        async def call() -> None:
            try:
                await client.post_once("/c", json={}, intent="stuck")
            except postonce.IntentPending as exc:
                # Its clean-up record found the outbox let go of: the intent is stored
                # and stays leased until the lease runs out, then a drain sends it again.
                ends.append(
                    "outbox let go" if isinstance(exc.__cause__, postonce.OutboxError) else "other"
                )

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await sending.wait()
                with anyio.move_on_after(0.2) as scope:
                    await client.aclose()
                assert scope.cancelled_caught  # it was still waiting for the call
                assert client._http.is_closed
                assert client._thread is None
                assert client._store is None
                group.cancel_scope.cancel()
            await client.aclose()  # a repeat is harmless
        assert ends == ["outbox let go"]

    anyio.run(main)


def test_aclose_from_another_event_loop_stops_a_drain_at_once(tmp_path: object) -> None:
    """A drain on one loop (thread), aclose() on another: it ends now, not at its interval."""
    answer = httpx.MockTransport(lambda r: httpx.Response(201))
    client = postonce.AsyncClient(
        BASE, outbox=f"{tmp_path}/o.sqlite3", retry=FAST, transport=answer
    )
    reports: list[postonce.DrainReport] = []
    ended = threading.Event()

    async def drain() -> None:
        reports.append(await client.drain(forever=True, interval=30.0))
        ended.set()

    drainer = threading.Thread(target=anyio.run, args=(drain,), daemon=True)
    drainer.start()
    drain_under_way(client)
    began = time.monotonic()
    anyio.run(client.aclose)
    assert ended.wait(10), "the drain did not stop"
    assert time.monotonic() - began < 5  # far below its 30 s interval
    drainer.join(5)
    assert len(reports) == 1


def test_aclose_in_a_task_that_outlived_its_call_is_allowed(tmp_path: object) -> None:
    """A task started inside a call inherits its context; after the call, it may close."""

    async def main() -> None:
        outcome: list[str] = []
        call_over = anyio.Event()

        async def later() -> None:
            await call_over.wait()  # the call that started this task is over
            try:
                await client.aclose()
                outcome.append("closed")
            except postonce.ConfigurationError as exc:
                outcome.append(str(exc))

        tasks: list[asyncio.Task[None]] = []

        async def starting(request: httpx.Request) -> httpx.Response:
            tasks.append(asyncio.get_running_loop().create_task(later()))
            return httpx.Response(201)

        client = postonce.AsyncClient(
            BASE,
            outbox=f"{tmp_path}/o.sqlite3",
            retry=FAST,
            transport=httpx.MockTransport(starting),
        )
        with anyio.fail_after(10):
            await client.post_once("/c", json={}, intent="starts-a-task")
            call_over.set()
            await tasks[0]
        assert outcome == ["closed"]

    anyio.run(main)


def test_close_leaves_a_callers_own_stop_event_alone(outbox: OutboxUnderTest) -> None:
    """A drain given the caller's stop= ends on close(), at its next look; the event stays unset."""
    answer = httpx.MockTransport(lambda r: httpx.Response(201))
    client = postonce.Client(BASE, outbox=outbox, retry=FAST, transport=answer)
    theirs = threading.Event()  # say, the application's shutdown event
    idle = idle_drain_seen(client)
    drain = threading.Thread(
        target=lambda: client.drain(forever=True, interval=0.1, stop=theirs), daemon=True
    )
    drain.start()
    close_beside(client, drain, idle)
    assert not theirs.is_set()


def test_a_send_after_an_interrupted_close_is_refused_typed() -> None:
    """A retry due after close() let go of the httpx client (Ctrl-C cut its wait): typed error.

    It used to reach the closed httpx client and leave with its bare
    RuntimeError. The outbox is the caller's (a MemoryOutbox), so it stays open
    and the intent is kept pending for a drain.
    """
    first = threading.Event()

    def busy(request: httpx.Request) -> httpx.Response:
        first.set()
        return httpx.Response(503, headers={"Retry-After": "1"})

    outbox = MemoryOutbox()
    client = postonce.Client(
        BASE,
        outbox=outbox,
        retry=FAST.model_copy(update={"attempts": 3, "wait_max": 2.0, "timeout": 10.0}),
        transport=httpx.MockTransport(busy),
    )
    caller, ends = post_once_in_a_thread(client, "retrying")
    assert first.wait(5)  # the call now sleeps before its retry
    # What close() does when Ctrl-C interrupts its wait: closed, then let go in its finally.
    client._closing()
    client._release()
    caller.join(10)
    assert not caller.is_alive()
    (error,) = ends
    assert isinstance(error, postonce.ConfigurationError), repr(error)
    assert "closed while the call was under way" in str(error)
    record = outbox.get("retrying")
    assert record is not None
    assert record.state is State.PENDING
