"""Leases: a dead sender's intents are taken over in seconds, a live send never is.

Real processes, real SIGKILLs, the real loopback server and (across hosts)
the real PostgreSQL server. Times are measured and printed (``-s``), never
asserted against a wall-clock threshold: the bound each test asserts is the
one the library promises (a lease it could not have waited out, a horizon).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import postonce
from postonce import State
from postonce._heartbeat import Heartbeat
from postonce._outbox.base import Lease
from postonce._outbox.locate import open_store
from tests.conftest import FAST, LoopbackServer, pg_schema

ROOT = Path(__file__).resolve().parent.parent


def worker(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lease_worker", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_killed_senders_intent_is_taken_over_at_once_on_the_same_host(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """SIGKILL mid-request; the restarted process's post_once finishes without waiting the lease.

    With the default 15 s lease and a 5 s budget for the call, waiting the lease
    out would raise IntentPending: finishing proves the lease was broken at once.
    """
    outbox = tmp_path / "outbox.sqlite3"
    reference = f"k9-{time.time_ns()}"
    proc = worker("send", str(outbox), server.base_url, "/ietf/v1/charges", reference, "0.3")
    store = open_store(outbox)
    try:
        wait_for(lambda: store.get(reference) is not None, "the sender never wrote its intent")
        record = store.get(reference)
        assert record is not None
        wait_for(lambda: server.requests_for(record.key), "the sender never reached the server")
    finally:
        store.close()
    assert proc.poll() is None, "the sender finished before it could be killed mid-request"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    retry = FAST.model_copy(update={"timeout": 5.0})
    with postonce.Client(server.base_url, outbox=outbox, name="lease-tests", retry=retry) as client:
        response = client.post_once(
            "/ietf/v1/charges", json={"amount": 1, "_test": {"delay": 0.3}}, intent=reference
        )
        took = time.monotonic() - killed
        key = response.extensions["postonce"].key
    print(f"\nsame-host recovery after SIGKILL: {took:.3f} s")
    assert response.status_code == 201
    assert len(server.effects_for(key)) == 1


def test_a_slow_send_is_renewed_and_never_sent_twice_at_once(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """A server slower than the lease: the heartbeat keeps it, a busy drain never takes it."""
    outbox = tmp_path / "outbox.sqlite3"
    options: dict[str, Any] = {"outbox": outbox, "name": "slow", "retry": FAST}
    sender = postonce.Client(server.base_url, lease_seconds=1.0, heartbeat=0.25, **options)
    drainer = postonce.Client(server.base_url, lease_seconds=1.0, heartbeat=0.25, **options)
    stop = threading.Event()
    reports: list[postonce.DrainReport] = []
    loop = threading.Thread(
        target=lambda: reports.append(drainer.drain(forever=True, interval=0.05, stop=stop))
    )
    loop.start()
    try:
        response = sender.post_once(
            "/ietf/v1/charges", json={"amount": 1, "_test": {"delay": 2.5}}, intent="slow"
        )
    finally:
        stop.set()
        loop.join()
    key = response.extensions["postonce"].key
    assert response.status_code == 201
    assert server.ledger()["max_concurrent"][key] == 1
    assert len(server.requests_for(key)) == 1
    assert sender._heartbeat.renewals >= 4  # 2.5 s at a 0.25 s beat, 1 s lease
    assert reports[0].claimed == 0
    sender.close()
    drainer.close()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        pytest.param({"heartbeat": None, "timeout": None}, "heartbeat=None", id="no-timeout"),
        pytest.param({"heartbeat": None, "timeout": 20.0}, "exceeds lease", id="timeout-too-long"),
        pytest.param({"heartbeat": 10.0}, "twice before it runs out", id="beat-too-slow"),
        pytest.param({"heartbeat": 0}, "twice before it runs out", id="beat-zero"),
    ],
)
def test_a_send_that_could_outlive_its_lease_is_refused(
    tmp_path: Path, options: dict[str, Any], match: str
) -> None:
    """No heartbeat and no timeout inside the lease: ConfigurationError when built."""
    with pytest.raises(postonce.ConfigurationError, match=match):
        postonce.Client("http://api.test", outbox=tmp_path / "o.sqlite3", **options)


def test_without_a_heartbeat_a_timeout_inside_the_lease_is_accepted(tmp_path: Path) -> None:
    """heartbeat=None with every phase bounded inside the lease is a valid choice."""
    client = postonce.Client(
        "http://api.test", outbox=tmp_path / "o.sqlite3", heartbeat=None, timeout=2.0
    )
    assert client.heartbeat is None
    with pytest.raises(postonce.ConfigurationError, match="exceeds lease"):
        client.post_once("/c", json={}, intent="t", timeout=60.0)
    client.close()


def test_an_answer_returned_survives_kill_9(server: LoopbackServer, tmp_path: Path) -> None:
    """2xx, then SIGKILL at once; the server never replays a completed key (409 forever).

    After the restart the intent is succeeded with its answer, nothing re-sends
    it, and the server executed it once. (With the answer written behind the
    call, the drain re-sent it and got 409 forever: a stuck intent.)
    """
    outbox = tmp_path / "outbox.sqlite3"
    reference = f"die-{time.time_ns()}"
    proc = worker("answer-then-die", str(outbox), server.base_url, "/noreplay/v1/c", reference)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    assert "answered 201" in out
    with postonce.Client(server.base_url, outbox=outbox, name="lease-tests") as client:
        record = client.lookup(reference)
        assert record is not None
        assert record.state is State.SUCCEEDED
        assert record.response is not None
        assert record.response.status == 201
        report = client.drain()
        assert report.claimed == 0
        again = client.post_once("/noreplay/v1/c", json={"amount": 1, "_test": {"delay": 0.0}},
                                 intent=reference)  # fmt: skip
        assert again.extensions["postonce"].from_outbox
    assert len(server.effects_for(record.key)) == 1
    assert len(server.requests_for(record.key)) == 1


class _Stalled(httpx.AsyncBaseTransport):
    """An async transport that waits before taking the request's body: cancelled there."""

    def __init__(self) -> None:
        self.entered = anyio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.entered.set()
        await anyio.sleep(30)  # e.g. waiting for a pooled connection
        raise AssertionError("never reached: the test cancels first")


def test_a_call_cancelled_before_the_transport_took_the_body_sent_nothing(
    tmp_path: Path,
) -> None:
    """No possibly-delivered attempt is recorded; the operator can then cancel the intent."""
    transport = _Stalled()

    async def main() -> None:
        async with (
            postonce.AsyncClient(
                "http://api.test", outbox=tmp_path / "o.sqlite3", transport=transport
            ) as client,
            anyio.create_task_group() as group,
        ):
            group.start_soon(lambda: client.post_once("/c", json={"a": 1}, intent="c-1"))
            await transport.entered.wait()
            group.cancel_scope.cancel()

    anyio.run(main)
    store = open_store(tmp_path / "o.sqlite3")
    try:
        record = store.get("c-1")
        assert record is not None
        assert (record.state, record.first_delivery_at) == (State.PENDING, None)
        assert store.attempts("c-1") == []
        moved = store.operator_move("c-1", State.CANCELLED, now=time.time(), note="test")
        assert moved.state is State.CANCELLED
    finally:
        store.close()


def test_the_drain_and_stats_count_intents_in_flight_elsewhere(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """An intent another live owner holds is reported, with its lease expiry, not hidden."""
    outbox = tmp_path / "outbox.sqlite3"
    options: dict[str, Any] = {"outbox": outbox, "name": "census", "retry": FAST}
    slow = postonce.Client(server.base_url, **options)
    sending = threading.Thread(
        target=lambda: slow.post_once(
            "/ietf/v1/charges", json={"amount": 1, "_test": {"delay": 1.0}}, intent="busy"
        )
    )
    sending.start()
    with postonce.Client(server.base_url, **options) as other:
        wait_for(lambda: other.lookup("busy") is not None, "the intent was never written")
        report = other.drain()
        stats = other.outbox.stats(now=time.time())
    sending.join()
    slow.close()
    assert (report.claimed, report.in_flight_elsewhere) == (0, 1)
    assert report.next_lease_expiry is not None
    assert report.ok  # nothing this drain could have finished failed
    assert stats["in_flight"] == 1
    assert stats["next_lease_expiry"] == report.next_lease_expiry


def test_a_dead_hosts_intent_is_taken_over_by_another_host_within_its_lease(
    server: LoopbackServer,
) -> None:
    """Two hosts on one PostgreSQL outbox; one is SIGKILLed mid-send; the other takes over.

    The hosts differ by POSTONCE_HOST, so the survivor cannot see the dead
    process and must wait for the lease (1.5 s, renewed every 0.5 s while the
    send lived): takeover within a few heartbeats, measured and printed.
    """
    with pg_schema() as url:
        reference = f"host-{time.time_ns()}"
        lease = ["--lease", "1.5", "--heartbeat", "0.5"]
        dying = worker("send", url, server.base_url, "/ietf/v1/charges", reference, "0.2",
                       *lease, env={"POSTONCE_HOST": "host-a"})  # fmt: skip
        store = open_store(url)
        try:
            wait_for(lambda: store.get(reference) is not None, "host-a never wrote its intent")
            time.sleep(0.1)  # mid-request: the server takes 0.2 s to execute
            dying.send_signal(signal.SIGKILL)
            dying.wait()
            killed = time.monotonic()
            survivor = worker(
                "drain", url, server.base_url, *lease, env={"POSTONCE_HOST": "host-b"}
            )
            try:
                wait_for(
                    lambda: (r := store.get(reference)) is not None and r.state is State.SUCCEEDED,
                    "host-b never finished host-a's intent",
                )
                took = time.monotonic() - killed
            finally:
                survivor.send_signal(signal.SIGTERM)
                survivor.communicate(timeout=30)
            record = store.get(reference)
        finally:
            store.close()
    assert record is not None
    print(f"\ncross-host takeover after SIGKILL: {took:.3f} s (lease 1.5 s, heartbeat 0.5 s)")
    assert len(server.effects_for(record.key)) == 1


def test_a_client_forked_into_a_child_names_the_child_as_owner(tmp_path: Path) -> None:
    """After fork() a client's lease owner is the child, so a live child is never seen dead.

    (Found by review: a client built before a daemonizing fork kept the parent's
    pid; once the parent exited, a drain took the child's in-flight send.)
    """
    client = postonce.Client("http://api.test", outbox=tmp_path / "o.sqlite3")
    parent = client.owner
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its owner id, and leave without cleanup
        os.close(read)
        os.write(write, client.owner.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    client.close()
    assert child != parent
    assert f"/{pid}/" in child
    assert f"/{os.getpid()}/" in parent


def test_a_holding_block_holds_its_lease_once_and_lets_it_go() -> None:
    """``Heartbeat.holding``: the lease is held inside the block only, also when the block
    raises; no lease holds nothing; one holding entered twice is refused rather than
    leaving its first lease renewed for good."""
    beat = Heartbeat(every=3600.0, lease_for=15.0, clock=time.time)
    lease = Lease(1, "token", "owner", time.time() + 15.0)
    try:
        held = beat.holding(object(), lease)
        with held:
            assert len(beat._held) == 1
            with pytest.raises(RuntimeError, match="entered once"), held:
                pass
            assert len(beat._held) == 1
        assert beat._held == {}
        with pytest.raises(ValueError, match="the send failed"), beat.holding(object(), lease):
            raise ValueError("the send failed")
        assert beat._held == {}
        with beat.holding(object(), None):
            assert beat._held == {}
    finally:
        beat.close()


def test_a_closed_heartbeat_never_starts_again() -> None:
    """Closed with its client, a heartbeat starts no thread for a send under way after that."""
    beat = Heartbeat(every=3600.0, lease_for=15.0, clock=time.time)
    lease = Lease(1, "token", "owner", time.time() + 15.0)
    with beat.holding(object(), lease):
        assert beat._thread is not None
    beat.close()
    with beat.holding(object(), lease):
        assert beat._thread is None
