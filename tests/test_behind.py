"""The record of a 2xx answer is committed behind the caller: in order, and repairable."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce import State
from postonce._outbox.base import NewIntent
from postonce._outbox.behind import WriteBehind
from postonce._outbox.sqlite import SQLiteStore
from tests.conftest import FAST, ClientFactory, LoopbackServer


def test_a_second_call_reads_the_first_calls_deferred_record(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """The same intent again, at once: answered from the outbox, never sent twice."""
    client = make_client(server.base_url)
    first = client.post_once("/ietf/v1/charges", json={"amount": 7}, intent="wb-again")
    second = client.post_once("/ietf/v1/charges", json={"amount": 7}, intent="wb-again")
    key = first.extensions["postonce"].key
    assert second.extensions["postonce"].from_outbox is True
    assert second.json() == first.json()
    assert len(server.requests_for(key)) == 1
    record = client.outbox.get("wb-again")
    assert record is not None
    assert record.state is State.SUCCEEDED


def test_outbox_access_commits_the_queue(outbox_path: Path) -> None:
    """A direct read of client.outbox sees every answer already returned to the caller."""
    transport = httpx.MockTransport(lambda request: httpx.Response(201, json={"ok": True}))
    with postonce.Client(outbox=outbox_path, transport=transport, retry=FAST) as client:
        for i in range(20):
            client.post_once("https://api.test/c", json={"i": i}, intent=f"wb-{i}")
        states = client.outbox.stats(now=0.0)["states"]
    assert states["succeeded"] == 20


def test_close_commits_the_queue(outbox_path: Path) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(201, json={"ok": True}))
    client = postonce.Client(outbox=outbox_path, transport=transport, retry=FAST)
    client.post_once("https://api.test/c", json={}, intent="wb-close")
    client.close()
    store = SQLiteStore(outbox_path)
    try:
        record = store.get("wb-close")
        assert record is not None
        assert record.state is State.SUCCEEDED
    finally:
        store.close()


def test_a_call_runs_after_everything_queued_before_it(outbox_path: Path) -> None:
    """WriteBehind keeps order, whether its thread or the caller runs the queue."""
    store = SQLiteStore(outbox_path)
    writer = WriteBehind(store)
    for i in range(50):
        new = NewIntent(
            reference=f"o-{i}", key=f"k-{i}", key_given=True, provider="ietf_draft",
            method="POST", url="https://api.test/c", headers=(), body=b"{}",
            fingerprint="f", deadline_at=None,
        )  # fmt: skip
        opened = writer.call(
            "open_intent", {"new": new, "owner": "me", "now": 1.0, "lease_for": 60}
        )
        writer.defer(
            "settle", {"lease": opened.lease, "now": 2.0, "state": State.CANCELLED, "note": "x"}
        )
        record = writer.call("get", {"reference": f"o-{i}"})
        assert record.state is State.CANCELLED
    writer.close()
    store.close()


def test_a_lost_deferred_record_is_repaired_by_the_drain(
    server: LoopbackServer,
    outbox_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 2xx record fails to commit: logged; the intent stays sending; the drain gets the replay.

    This is the crash window of write-behind (the process dies before the
    record commits), made deterministic: one charge, and the outbox ends
    succeeded with the provider's replayed answer.
    """
    now = [1_000_000.0]
    client = postonce.Client(
        server.base_url, outbox=outbox_path, retry=FAST, clock=lambda: now[0], lease_seconds=30
    )
    store = client._writer_for().store
    real_batch = store.run_batch  # type: ignore[attr-defined]

    def failing(calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        if calls[0][0] == "record":
            return [(False, postonce.OutboxError("disk full (simulated)"))] * len(calls)
        results: list[tuple[bool, Any]] = real_batch(calls)
        return results

    monkeypatch.setattr(store, "run_batch", failing)
    with caplog.at_level(logging.WARNING, logger="postonce"):
        response = client.post_once("/ietf/v1/charges", json={"amount": 3}, intent="wb-lost")
        client._writer_for().flush()
    assert response.status_code == 201
    assert "deferred record failed" in caplog.text
    monkeypatch.setattr(store, "run_batch", real_batch)
    record = client.lookup("wb-lost")
    assert record is not None
    assert record.state is State.SENDING  # under our lease, which expires

    now[0] += 31  # the lease expires
    report = client.drain()
    assert report.succeeded == 1
    key = response.extensions["postonce"].key
    assert len(server.requests_for(key)) == 2
    assert len(server.effects_for(key)) == 1
    final = client.lookup("wb-lost")
    assert final is not None
    assert final.state is State.SUCCEEDED
    client.close()


def test_with_nothing_queued_calls_reach_the_store_in_parallel() -> None:
    """A drain's worker threads share one client: they must not queue behind one lock."""
    both_inside = threading.Barrier(2, timeout=5)

    class SlowStore:
        def get(self, reference: str) -> None:
            both_inside.wait()  # raises BrokenBarrierError if the calls were serialised

    writer = WriteBehind(SlowStore())  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            writer.call("get", {"reference": name})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    assert errors == []
