"""Chaos: a seeded fault-injecting proxy between postonce and the real loopback server.

The proxy (``tests/fault_proxy.py``) drops answers, holds them, resets
connections before forwarding, and answers 503/429 itself. The small tests
pin down what each fault does, against the real server; the chaos run sends
``POSTONCE_CHAOS_INTENTS`` intents (300 by default) through 20 % faults from
a worker process SIGKILLed five times at seeded moments, drains the rest
through the same faults, and lets the server's ledger judge: every intent
executed exactly once, none lost, none concurrent with itself.

``POSTONCE_CHAOS_SEED`` picks the seed (the fault decisions and the kill
moments); the summary line names it, so a failing run can be repeated.
``POSTONCE_CHAOS_CLIENT=async`` makes the worker send through AsyncClient;
``POSTONCE_CHAOS_FAULT_RATE`` changes the fault rate (0.2).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce import State
from tests.conftest import FAST, LoopbackServer
from tests.fault_proxy import FAULT_KINDS, KINDS, FaultProxy, Message

ROOT = Path(__file__).resolve().parent.parent
SEED = int(os.environ.get("POSTONCE_CHAOS_SEED", "20261130"))


@pytest.fixture
def proxy(server: LoopbackServer) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's server, injecting only what a test scripts."""
    with FaultProxy(server.base_url, seed=SEED, fault_rate=0.0, delay_hold=1.0) as p:
        yield p
    assert p.active_connections() == 0


def charge(client: postonce.Client, intent: str) -> tuple[httpx.Response, str]:
    """One charge intent through ``client``: its answer and its key."""
    response = client.post_once("/ietf/v1/charges", json={"amount": 1}, intent=intent)
    return response, response.extensions["postonce"].key


# -- each fault does what it says -----------------------------------------------------------


def test_pass_relays_the_answer_untouched(
    proxy: FaultProxy, server: LoopbackServer, outbox_path: Path
) -> None:
    """No fault: the server's answer is relayed as is, one request, one effect, no replay."""
    with postonce.Client(proxy.url, outbox=outbox_path, retry=FAST) as client:
        response, key = charge(client, "pass")
        assert response.status_code == 201
        assert response.extensions["postonce"].replayed is False
        assert [a.outcome.value for a in client.outbox.attempts("pass")] == ["final"]
    assert len(server.requests_for(key)) == 1
    assert response.json()["id"] == server.effects_for(key)[0]["id"]
    assert proxy.counts() == {"pass": 1}
    assert proxy.faults() == []


def test_drop_response_is_ambiguous_and_the_retry_is_replayed(
    proxy: FaultProxy, server: LoopbackServer, outbox_path: Path
) -> None:
    """The server executes, the proxy drops its answer: ambiguous, retried, replayed, one effect."""
    proxy.script("drop_response")
    with postonce.Client(proxy.url, outbox=outbox_path, retry=FAST) as client:
        response, key = charge(client, "drop")
        attempts = client.outbox.attempts("drop")
    assert response.status_code == 201
    assert response.extensions["postonce"].replayed is True
    assert [(a.outcome.value, a.error_type) for a in attempts] == [
        ("ambiguous", "RemoteProtocolError"),
        ("final", None),
    ]
    assert len(server.requests_for(key)) == 2  # the server saw the dropped one too
    assert [e["id"] for e in server.effects_for(key)] == [response.json()["id"]]
    assert proxy.faults() == [("drop_response", key)]


@pytest.mark.parametrize(
    ("read_timeout", "error_type"),
    [(0.3, "ReadTimeout"), (5.0, "RemoteProtocolError")],
    ids=["client-times-out", "proxy-closes-after-hold"],
)
def test_delay_is_ambiguous_and_the_retry_is_replayed(
    proxy: FaultProxy,
    server: LoopbackServer,
    outbox_path: Path,
    read_timeout: float,
    error_type: str,
) -> None:
    """A held answer: a read timeout, or the close after the 1 s hold, is ambiguous; one effect.

    With a read timeout under the hold the client gives up first; with httpx's
    default 5 s, as in the chaos run, the proxy closes the connection after
    holding the answer 1 s. Both are ambiguous, and the retry is replayed.
    """
    proxy.script("delay")
    timeout = httpx.Timeout(5.0, read=read_timeout)
    with postonce.Client(proxy.url, outbox=outbox_path, retry=FAST, timeout=timeout) as client:
        began = time.monotonic()
        response, key = charge(client, "delay")
        took = time.monotonic() - began
        attempts = client.outbox.attempts("delay")
    assert response.status_code == 201
    assert response.extensions["postonce"].replayed is True
    assert [(a.outcome.value, a.error_type) for a in attempts] == [
        ("ambiguous", error_type),
        ("final", None),
    ]
    assert min(read_timeout, proxy.delay_hold) <= took < 4.0
    assert len(server.requests_for(key)) == 2
    assert len(server.effects_for(key)) == 1
    assert proxy.faults() == [("delay", key)]


def test_reset_before_never_reaches_the_server(
    proxy: FaultProxy, server: LoopbackServer, outbox_path: Path
) -> None:
    """A reset before forwarding: a real RST, ambiguous to the client, unseen by the server.

    The retry is therefore the first execution, not a replay.
    """
    proxy.script("reset_before")
    with postonce.Client(proxy.url, outbox=outbox_path, retry=FAST) as client:
        response, key = charge(client, "reset")
        attempts = client.outbox.attempts("reset")
    assert response.status_code == 201
    assert response.extensions["postonce"].replayed is False
    # ReadError (ECONNRESET), not RemoteProtocolError (a FIN): the RST is real.
    assert [(a.outcome.value, a.error_type) for a in attempts] == [
        ("ambiguous", "ReadError"),
        ("final", None),
    ]
    assert len(server.requests_for(key)) == 1  # only the retry
    assert len(server.effects_for(key)) == 1
    assert proxy.faults() == [("reset_before", key)]


@pytest.mark.parametrize("kind", ["answer_503", "answer_429"])
def test_proxy_answers_are_retried_and_never_reach_the_server(
    proxy: FaultProxy, server: LoopbackServer, outbox_path: Path, kind: str
) -> None:
    """A 503/429 with Retry-After: 0 from the proxy: retryable, retried at once, unseen upstream."""
    proxy.script(kind)
    with postonce.Client(proxy.url, outbox=outbox_path, retry=FAST) as client:
        response, key = charge(client, kind)
        attempts = client.outbox.attempts(kind)
    status = int(kind.removeprefix("answer_"))
    assert response.status_code == 201
    assert response.extensions["postonce"].replayed is False
    assert [(a.outcome.value, a.status) for a in attempts] == [
        ("retryable", status),
        ("final", 201),
    ]
    assert len(server.requests_for(key)) == 1
    assert len(server.effects_for(key)) == 1
    assert proxy.faults() == [(kind, key)]


def test_one_seed_gives_one_sequence_of_decisions_at_the_configured_rates() -> None:
    """Two proxies with one seed decide alike; 20 % faults split evenly over the five kinds."""
    draws = 20000
    a = FaultProxy("http://127.0.0.1:9", seed=7, fault_rate=0.2)
    b = FaultProxy("http://127.0.0.1:9", seed=7, fault_rate=0.2)
    sequence = [a.decide(None) for _ in range(draws)]
    assert sequence == [b.decide(None) for _ in range(draws)]
    assert sequence != [FaultProxy("http://127.0.0.1:9", seed=8).decide(None) for _ in range(draws)]
    counts = a.counts()
    assert set(counts) == set(KINDS)
    assert abs(counts["pass"] / draws - 0.8) < 0.015
    for kind in FAULT_KINDS:
        assert abs(counts[kind] / draws - 0.04) < 0.008, (kind, counts)
    assert len(a.faults()) == draws - counts["pass"]


def test_the_proxy_refuses_anything_but_loopback() -> None:
    """The proxy only ever forwards to a loopback upstream."""
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("http://example.com:80", seed=1)


def test_stop_ends_every_connection_even_held_ones(server: LoopbackServer) -> None:
    """stop() ends idle, half-sent and held connections, and their tasks, within a second or two."""
    proxy = FaultProxy(server.base_url, seed=1, fault_rate=0.0, delay_hold=60.0)
    proxy.start()
    port = int(proxy.url.rsplit(":", 1)[1])
    idle = socket.create_connection(("127.0.0.1", port))
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"POST /ietf/v1/charges HTTP/1.1\r\nHost: x\r\n")
    proxy.script("delay")
    held = socket.create_connection(("127.0.0.1", port))
    held.sendall(
        b"POST /ietf/v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: held-"
        + uuid.uuid4().hex.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    )
    deadline = time.monotonic() + 5
    while proxy.counts().get("delay", 0) == 0 or proxy.active_connections() < 3:
        assert time.monotonic() < deadline, proxy.counts()
        time.sleep(0.01)
    began = time.monotonic()
    proxy.stop()
    assert time.monotonic() - began < 2.0
    assert proxy.active_connections() == 0
    for sock in (idle, half, held):
        sock.settimeout(2)
        assert sock.recv(1) == b""  # closed by the proxy, nothing relayed
        sock.close()


def test_stop_ends_a_connection_that_swallowed_its_first_cancellation(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Python 3.11 ``asyncio.wait_for`` can swallow a cancellation that meets its inner
    result (the upstream's answer arriving as stop() cancels the forward). The connection
    then goes on to hold its delayed answer for ``delay_hold``; stop() cancels again until
    every connection has ended (before: it waited 10 s for the hold, then raised)."""
    swallowed = threading.Event()

    async def forward_swallowing(self: FaultProxy, request: Any) -> Message:
        try:
            await asyncio.sleep(60)  # the upstream, still answering when stop() cancels
        except asyncio.CancelledError:
            swallowed.set()  # ... and wait_for returned its answer instead
        return Message(raw=b"HTTP/1.1 201 Created\r\n\r\n", start_line="", headers=())

    monkeypatch.setattr(FaultProxy, "_forward", forward_swallowing)
    proxy = FaultProxy(server.base_url, seed=1, fault_rate=0.0, delay_hold=60.0)
    proxy.start()
    proxy.script("delay")
    held = socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])))
    held.sendall(b"POST /ietf/v1/charges HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    deadline = time.monotonic() + 5
    while proxy.counts().get("delay", 0) == 0:
        assert time.monotonic() < deadline, proxy.counts()
        time.sleep(0.01)
    began = time.monotonic()
    proxy.stop()
    assert time.monotonic() - began < 2.0
    assert swallowed.is_set()
    assert proxy.active_connections() == 0
    held.settimeout(2)
    assert held.recv(1) == b""
    held.close()


# -- the chaos run --------------------------------------------------------------------------

KILLS = 5  # SIGKILLs of the sending worker, at seeded moments
# The share of requests that get a fault, split evenly over the five kinds.
FAULT_RATE = float(os.environ.get("POSTONCE_CHAOS_FAULT_RATE", "0.2"))
# The worker's client reads with httpx's default 5 s timeout; holding each
# delayed answer that long would make ~4 % of requests cost 5 s. The proxy
# holds a delayed answer 1 s and then closes the connection instead: still an
# ambiguous outcome, and the run stays bounded.
DELAY_HOLD = 1.0
SERVER_DELAY = 0.005  # seconds the server takes per execution (the worker's DELAY)
WORKER_LEASE = 0.5  # seconds; a killed worker's leases run out quickly for the drain
# POSTONCE_CHAOS_CLIENT=async sends through AsyncClient in the worker instead of Client.
WORKER_FLAGS = ("async",) if os.environ.get("POSTONCE_CHAOS_CLIENT") == "async" else ()
FORWARDED = frozenset({"pass", "drop_response", "delay"})  # decisions the server sees


@dataclass
class Worker:
    """One run of tests/crash_worker.py, its output in files so that no pipe fills up."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def lines(self) -> list[str]:
        return self.stdout.read_text().splitlines()

    def done(self) -> int:
        return sum(1 for line in self.lines() if line.startswith("done "))

    def started(self) -> bool:
        """It said ``ready`` (its outbox is open), or it already ended."""
        return "ready" in self.lines() or self.process.poll() is not None

    def reached(self, intents: int) -> bool:
        """It finished ``intents`` intents, or it already ended."""
        return self.done() >= intents or self.process.poll() is not None


@dataclass
class ChaosRun:
    """What the run did, for the summary line."""

    intents: int
    kills: int = 0
    kills_mid_request: int = 0
    gave_up: int = 0  # worker runs that ended in IntentPending (budget spent on faults)
    workers: int = 0
    drain_passes: int = 0
    drain_sent: int = 0
    faults: dict[str, int] = field(default_factory=dict)


def start_worker(
    outbox: Path, base_url: str, prefix: str, count: int, n: int, logs: Path
) -> Worker:
    out, err = logs / f"worker{n}.out", logs / f"worker{n}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.crash_worker",
                str(outbox),
                base_url,
                prefix,
                str(count),
                str(SERVER_DELAY),
                str(WORKER_LEASE),
                "skip-known",
                *WORKER_FLAGS,
            ],
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
        )
    return Worker(process=process, stdout=out, stderr=err)


def wait_until(deadline: float, what: str, done: Callable[[], bool]) -> None:
    """Poll ``done`` until it is true; fail once the run's hard deadline has passed."""
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"chaos run past its hard deadline while waiting for {what}")
        time.sleep(0.005)


def sending_count(outbox: Path) -> int:
    """Intents left ``sending`` in the outbox (a killed sender's, until their leases lapse)."""
    conn = sqlite3.connect(outbox)
    try:
        (n,) = conn.execute("SELECT count(*) FROM intents WHERE state = 'sending'").fetchone()
    finally:
        conn.close()
    return int(n)


def run_workers(
    proxy: FaultProxy, outbox: Path, prefix: str, run: ChaosRun, logs: Path, deadline: float
) -> None:
    """Send every intent from worker processes, SIGKILLing them KILLS times at seeded moments.

    Kill k comes once the workers together have finished a seeded random number
    of intents, plus a seeded pause of up to 30 ms, so that kills land mid-run
    (and often mid-request) whatever the machine's speed. A worker whose retry
    budget runs out on faults (IntentPending) is restarted like a killed one.
    """
    rng = random.Random(SEED)
    # Within the first 90 %, so that the last kill never races the worker's normal end.
    targets = sorted(rng.sample(range(1, max(KILLS + 1, run.intents * 9 // 10)), KILLS))
    finished_before = 0  # intents finished by workers that are gone
    orphans = 0
    while True:
        worker = start_worker(outbox, proxy.url, prefix, run.intents, run.workers, logs)
        run.workers += 1
        try:
            wait_until(deadline, "a worker to start", worker.started)
            if run.kills < KILLS:
                # This worker's share of the intents to finish before kill k.
                share = targets[run.kills] - finished_before
                wait_until(deadline, f"kill {run.kills + 1}", partial(worker.reached, share))
                time.sleep(rng.uniform(0.0, 0.03))
                if worker.process.poll() is None:
                    worker.process.send_signal(signal.SIGKILL)
                    worker.process.wait(timeout=10)
                    run.kills += 1
                    sending = sending_count(outbox)
                    run.kills_mid_request += int(sending > orphans)
                    orphans = sending
                    finished_before += worker.done()
                    continue
            remaining = deadline - time.monotonic()
            assert remaining > 0, "chaos run past its hard deadline"
            worker.process.wait(timeout=remaining)
        finally:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait(timeout=10)
        finished_before += worker.done()
        if worker.process.returncode == 0:
            return
        errors = worker.stderr.read_text()
        assert "postonce.IntentPending" in errors or "IntentPending:" in errors, errors
        run.gave_up += 1


def drain_all(
    proxy: FaultProxy, outbox: Path, run: ChaosRun, deadline: float
) -> list[postonce.DrainReport]:
    """Drain through the proxy, faults still on, until nothing is pending or sending."""
    reports = []
    with postonce.Client(
        proxy.url, outbox=outbox, retry=FAST, lease_seconds=WORKER_LEASE, timeout=5.0
    ) as client:
        while True:
            report = client.drain()
            reports.append(report)
            run.drain_passes += 1
            run.drain_sent += report.sent
            states = client.outbox.stats(now=time.time())["states"]
            if states["pending"] == 0 and states["sending"] == 0:
                return reports
            assert time.monotonic() < deadline, f"chaos run past its hard deadline: {states}"
            time.sleep(0.05)  # a dead sender's lease runs out, a due time comes


def test_chaos_run_every_intent_once_through_faults_and_kills(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """N intents, 20 % injected faults, a sender SIGKILLed 5 times, then a drain: each exactly once.

    Judged by the server's ledger: every intent's key has exactly one effect
    (none lost, none duplicated), the outbox holds every intent as succeeded
    with the answer of that one effect, and no key ever had two requests open
    at once. An expired intent would be reported, not counted as lost; with
    the default provider's 24 h retention there must be none.
    """
    intents = int(os.environ.get("POSTONCE_CHAOS_INTENTS", "300"))
    assert intents > KILLS
    # A hard deadline: 90 s for the CI size (it takes ~25 s), scaled for larger runs.
    budget = 90.0 * max(1.0, intents / 300)
    began = time.monotonic()
    deadline = began + budget
    outbox = tmp_path / "chaos.sqlite3"
    prefix = f"chaos{SEED}x{uuid.uuid4().hex[:8]}"
    run = ChaosRun(intents=intents)
    with FaultProxy(
        server.base_url, seed=SEED, fault_rate=FAULT_RATE, delay_hold=DELAY_HOLD
    ) as proxy:
        run_workers(proxy, outbox, prefix, run, tmp_path, deadline)
        reports = drain_all(proxy, outbox, run, deadline)
        run.faults = proxy.fault_counts()
        counts = proxy.counts()
        logged = proxy.faults()
        decisions = proxy.decisions()
    assert proxy.active_connections() == 0
    duration = time.monotonic() - began

    references = [f"{prefix}-{i}" for i in range(intents)]
    store = postonce.SQLiteStore(outbox)
    try:
        records = {ref: store.get(ref) for ref in references}
    finally:
        store.close()
    ledger = server.ledger()
    effects: dict[str, list[dict[str, Any]]] = {}
    for effect in ledger["effects"]:
        effects.setdefault(effect["key"], []).append(effect)
    keys = {ref: r.key for ref, r in records.items() if r is not None}
    missing = [ref for ref, r in records.items() if r is None]
    lost = missing + [ref for ref, key in keys.items() if not effects.get(key)]
    duplicated = [ref for ref, key in keys.items() if len(effects.get(key, [])) > 1]
    expired = [ref for ref, r in records.items() if r is not None and r.state is State.EXPIRED]
    wrong = {
        ref: (r.state.value, r.response.status if r.response else None)
        for ref, r in records.items()
        if r is not None and r.state not in (State.SUCCEEDED, State.EXPIRED)
    }
    concurrent = {
        ref: ledger["max_concurrent"].get(key, 0)
        for ref, key in keys.items()
        if ledger["max_concurrent"].get(key, 0) > 1
    }
    # The server saw exactly the requests the proxy forwarded: never one that
    # was reset before forwarding or answered 503/429 by the proxy.
    forwarded: dict[str, int] = {}
    for kind, key in decisions:
        if key is not None and kind in FORWARDED:
            forwarded[key] = forwarded.get(key, 0) + 1
    seen: dict[str, int] = {}
    for request in ledger["requests"]:
        seen[request["key"]] = seen.get(request["key"], 0) + 1
    unexpected = {
        ref: (seen.get(key, 0), forwarded.get(key, 0))
        for ref, key in keys.items()
        if seen.get(key, 0) != forwarded.get(key, 0)
    }
    # The answer kept in the outbox is the answer of the one effect.
    mismatched = [
        ref
        for ref, r in records.items()
        if r is not None
        and r.state is State.SUCCEEDED
        and len(effects.get(r.key, [])) == 1
        and (r.response is None or _answer_id(r.response.body) != effects[r.key][0]["id"])
    ]
    faults = " ".join(f"{k}={v}" for k, v in run.faults.items())
    print(
        f"\nchaos: seed={SEED} client={WORKER_FLAGS[0] if WORKER_FLAGS else 'sync'} "
        f"rate={FAULT_RATE} intents={intents} requests={sum(counts.values())} "
        f"faults={sum(run.faults.values())} ({faults}) kills={run.kills} "
        f"(mid-request {run.kills_mid_request}) gave_up={run.gave_up} "
        f"drain_sent={run.drain_sent} lost={len(lost)} duplicated={len(duplicated)} "
        f"expired={len(expired)} not_terminal={len(wrong)} duration={duration:.1f}s"
    )
    assert lost == [], lost[:20]
    assert duplicated == [], [(ref, effects[keys[ref]]) for ref in duplicated[:20]]
    assert wrong == {}, list(wrong.items())[:20]
    assert expired == [], expired[:20]
    assert concurrent == {}, concurrent
    assert mismatched == [], mismatched[:20]
    assert unexpected == {}, unexpected
    assert all(r.failed == r.errors == 0 for r in reports), reports
    # The run really was chaotic: every fault kind fired, the kills all landed.
    assert run.kills == KILLS
    assert all(run.faults[kind] > 0 for kind in FAULT_KINDS), run.faults
    assert counts.get("upstream_error", 0) == 0, counts
    assert len(logged) == sum(run.faults.values())
    assert duration < budget


def _answer_id(body: bytes) -> str | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    value = parsed.get("id") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else None
