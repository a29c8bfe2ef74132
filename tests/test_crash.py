"""Crash safety, tested by crashing: SIGKILL a sending process, finish its intents elsewhere.

The server's ledger is the judge: every intent executed exactly once, with
the key minted by the process that died.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import postonce
from postonce import State
from tests.conftest import FAST, LoopbackServer

ROOT = Path(__file__).resolve().parent.parent


def start_worker(
    outbox: Path,
    server: LoopbackServer,
    prefix: str,
    count: int,
    delay: float,
    lease: float | str,
    *flags: str,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.crash_worker",
            str(outbox),
            server.base_url,
            prefix,
            str(count),
            str(delay),
            str(lease),
            *flags,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


@KINDS
def test_sigkill_mid_request_is_finished_with_the_same_key(
    server: LoopbackServer, outbox_path: Path, kind: str
) -> None:
    """Killed while the server is still charging: a new process resumes it, one charge."""
    worker = start_worker(outbox_path, server, "kill-mid", 1, 2.0, 1.0, kind)
    store = postonce.SQLiteStore(outbox_path) if outbox_path.exists() else None
    deadline = time.monotonic() + 20
    key = None
    while key is None or not server.requests_for(key):
        assert time.monotonic() < deadline, "the worker never reached the server"
        time.sleep(0.02)
        if store is None and outbox_path.exists():
            store = postonce.SQLiteStore(outbox_path)
        record = store.get("kill-mid-0") if store is not None else None
        key = record.key if record is not None else None
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    assert store is not None
    store.close()

    with postonce.Client(server.base_url, outbox=outbox_path, retry=FAST, lease_seconds=1.0) as c:
        response = c.post_once(
            "/ietf/v1/charges", json={"amount": 0, "_test": {"delay": 2.0}}, intent="kill-mid-0"
        )
    assert response.status_code == 201
    assert response.extensions["postonce"].key == key
    effects = server.effects_for(key)
    assert len(effects) == 1
    assert response.json()["id"] == effects[0]["id"]


@KINDS
def test_random_sigkills_lose_nothing_and_charge_once(
    server: LoopbackServer, tmp_path: Path, kind: str
) -> None:
    """Seeded random SIGKILLs of a sending process: every intent ends with one charge."""
    rng = random.Random(20261130)
    rounds, count = 6, 6
    outbox = tmp_path / "crash.sqlite3"
    references: list[str] = []
    for r in range(rounds):
        prefix = f"chaos{kind}{r}"
        worker = start_worker(outbox, server, prefix, count, 0.03, 0.5, kind)
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == b"ready", worker.communicate()
        time.sleep(rng.uniform(0.0, 0.4))
        if worker.poll() is not None:
            assert worker.returncode == 0, worker.stderr.read() if worker.stderr else ""
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        references += [f"{prefix}-{i}" for i in range(count)]

    # The workers really worked and really died mid-run: the outbox holds intents
    # they started, some of them finished and some cut off.
    conn = sqlite3.connect(outbox)
    states = dict(conn.execute("SELECT state, count(*) FROM intents GROUP BY state").fetchall())
    conn.close()
    assert sum(states.values()) > rounds, states
    assert states.get("succeeded", 0) > 0, states
    assert states.get("sending", 0) + states.get("pending", 0) > 0, states

    keys = {}
    with postonce.Client(server.base_url, outbox=outbox, retry=FAST, lease_seconds=0.5) as c:
        for ref in references:
            i = int(ref.rsplit("-", 1)[1])
            response = c.post_once(
                "/ietf/v1/charges", json={"amount": i, "_test": {"delay": 0.03}}, intent=ref
            )
            assert response.status_code == 201, ref
            keys[ref] = response.extensions["postonce"].key
            record = c.lookup(ref)
            assert record is not None
            assert record.state is State.SUCCEEDED
    ledger = httpx.get(f"{server.base_url}/_ledger").json()
    for ref, key in keys.items():
        mine = [e for e in ledger["effects"] if e["key"] == key]
        assert len(mine) == 1, (ref, mine)


@KINDS
def test_kill_9_twenty_times_then_drain_three_hundred_intents(
    server: LoopbackServer, tmp_path: Path, kind: str
) -> None:
    """300 intents, a sender SIGKILLed at 20+ seeded random moments, then a drain: one each.

    With the library's default lease settings (15 s, renewed while sending): a
    dead sender on this host is seen dead, so nothing waits its lease out.
    """
    rng = random.Random(9)
    outbox = tmp_path / "kill9.sqlite3"
    count, kills, mid_request, orphans = 300, 0, 0, 0
    while True:
        worker = start_worker(
            outbox, server, f"k9{kind}", count, 0.03, "default", "skip-known", kind
        )
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == b"ready", worker.communicate()
        if kills >= 20:
            _, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, err
            break
        time.sleep(rng.uniform(0.0, 0.6))
        if worker.poll() is not None:
            assert worker.returncode == 0, worker.communicate()
            break
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        kills += 1
        conn = sqlite3.connect(outbox)
        (sending,) = conn.execute("SELECT count(*) FROM intents WHERE state = 'sending'").fetchone()
        conn.close()
        mid_request += int(sending > orphans)  # this kill left a send unfinished
        orphans = sending
    assert kills >= 20
    assert mid_request >= 5, f"only {mid_request} of {kills} kills landed mid-request"

    began = time.monotonic()
    with postonce.Client(server.base_url, outbox=outbox, retry=FAST) as c:
        deadline = time.monotonic() + 60
        while True:
            report = c.drain()
            stats = c.outbox.stats(now=time.time())["states"]
            if stats["pending"] == 0 and stats["sending"] == 0:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.2)  # dead senders' leases run out
        records = [c.lookup(f"k9{kind}-{i}") for i in range(count)]
        not_succeeded = [
            (
                r.reference,
                r.state.value,
                r.response.status if r.response else None,
                r.response.body[:200] if r.response else None,
                c.outbox.attempts(r.reference),
            )
            for r in records
            if r is not None and r.state is not State.SUCCEEDED
        ]
    assert not_succeeded == []
    assert report.failed == report.expired == report.errors == 0
    ledger = server.ledger()
    effects: dict[str, int] = {}
    for effect in ledger["effects"]:
        effects[effect["key"]] = effects.get(effect["key"], 0) + 1
    lost = [r for r in records if r is None or r.state is not State.SUCCEEDED]
    twice = [r.key for r in records if r is not None and effects.get(r.key, 0) > 1]
    never = [r.key for r in records if r is not None and effects.get(r.key, 0) == 0]
    print(
        f"kill -9: {kills} kills ({mid_request} mid-request), {count} intents, "
        f"{len(twice)} duplicated, {len(lost) + len(never)} lost; "
        f"final drain {time.monotonic() - began:.2f} s with default leases"
    )
    assert lost == []
    assert twice == []
    assert never == []
    assert all(ledger["max_concurrent"].get(r.key, 0) <= 1 for r in records if r is not None)
