"""Settlements survive SIGKILL: every ended intent's handler completes at least once.

Drains are SIGKILLed at seeded random moments (between an intent's terminal
record and its handler's completion among them); a last drain finishes. The
handler's own ledger, deduplicated by intent, holds exactly one entry per
intent, and the outbox holds every settlement as delivered.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import postonce
from postonce import State
from tests.conftest import LoopbackServer, loopback_intent

ROOT = Path(__file__).resolve().parent.parent


def test_settlements_survive_sigkilled_drains(server: LoopbackServer, tmp_path: Path) -> None:
    """60 intents, drains SIGKILLed 15 times at seeded moments: each handler done, none lost."""
    rng = random.Random(16)
    outbox, ledger = tmp_path / "settle.sqlite3", tmp_path / "ledger.txt"
    ledger.touch()
    count, prefix = 60, f"sc{time.time_ns()}"
    store = postonce.SQLiteStore(outbox, durability="normal")
    for i in range(count):
        store.open_intent(
            loopback_intent(
                server,
                f"{prefix}-{i}",
                key=f"{prefix}-{i:04d}-key",
                sender="settle-crash",
                body=b'{"amount":1,"_test":{"delay":0.01}}',
                fingerprint=f"{i:064d}",
            ),
            owner="crashed-host/1",
            now=time.time() - 60,
            lease_for=1,
        )
    store.close()
    env = {
        **os.environ,
        "POSTONCE_TEST_BASE_URL": server.base_url,
        "POSTONCE_TEST_OUTBOX": str(outbox),
        "POSTONCE_TEST_SETTLE_LEDGER": str(ledger),
    }
    command = [sys.executable, "-m", "postonce", "drain", "--app", "tests.settle_app:client"]
    kills = 0
    for _ in range(15):
        proc = subprocess.Popen(
            [*command, "--forever", "--interval", "50ms"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.2, 0.9))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=30)
    store = postonce.SQLiteStore(outbox)
    deadline = time.monotonic() + 60
    try:
        while True:
            # A last, unkilled drain: settlements a killed drain held are taken over
            # once their 1 s hold runs out.
            subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=60, check=False)
            records = [store.get(f"{prefix}-{i}") for i in range(count)]
            if all(r is not None and r.settled_at is not None for r in records):
                break
            assert time.monotonic() < deadline, [r for r in records if r and not r.settled_at]
            time.sleep(0.5)
    finally:
        store.close()
    lines = ledger.read_text().split()
    done = [lines[i + 1] for i in range(0, len(lines), 3) if lines[i] == "done"]
    assert all(r is not None and r.state is State.SUCCEEDED for r in records)
    assert sorted(set(done)) == sorted(f"{prefix}-{i}" for i in range(count))
    effects: dict[str, int] = {}
    for effect in server.ledger()["effects"]:
        effects[effect["key"]] = effects.get(effect["key"], 0) + 1
    assert all(effects.get(f"{prefix}-{i:04d}-key") == 1 for i in range(count))
    print(
        f"\nsettlements under SIGKILL: {kills} kills, {count} intents, {len(done)} handler "
        f"completions ({len(done) - count} repeated after a kill), 0 lost, 0 charged twice"
    )
