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

import postonce
from postonce import State
from tests.conftest import FAST, LoopbackServer

ROOT = Path(__file__).resolve().parent.parent


def start_worker(
    outbox: Path, server: LoopbackServer, prefix: str, count: int, delay: float, lease: float
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
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_sigkill_mid_request_is_finished_with_the_same_key(
    server: LoopbackServer, outbox_path: Path
) -> None:
    """Killed while the server is still charging: a new process resumes it, one charge."""
    worker = start_worker(outbox_path, server, "kill-mid", 1, 2.0, 1.0)
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


def test_random_sigkills_lose_nothing_and_charge_once(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """Seeded random SIGKILLs of a sending process: every intent ends with one charge."""
    rng = random.Random(20261130)
    rounds, count = 6, 6
    outbox = tmp_path / "crash.sqlite3"
    references: list[str] = []
    for r in range(rounds):
        prefix = f"chaos{r}"
        worker = start_worker(outbox, server, prefix, count, 0.03, 0.5)
        time.sleep(rng.uniform(0.0, 0.6))
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
