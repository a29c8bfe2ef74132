"""How many intents a drain claims at once: about BATCH_SECONDS of its own work."""

from __future__ import annotations

from typing import Any

import pytest

from postonce import SQLiteStore
from postonce._drain import BATCH_SECONDS, MOST_CLAIMED, flows_for, least_batch, next_batch
from postonce._outbox.postgres import PostgresStore
from postonce._outbox.store import StoreBase
from postonce.testing import MemoryOutbox
from tests.conftest import ClientFactory, LoopbackServer
from tests.test_drain import pending_via_503


def test_a_quick_drain_claims_more_a_pass_up_to_the_most() -> None:
    """At 1000 intents a second, 16 grows fourfold a pass to what 0.25 s takes, then stops."""
    assert BATCH_SECONDS == 0.25
    assert next_batch(16, 16, 0.016, least=16) == 64
    assert next_batch(64, 64, 0.064, least=16) == 250
    assert next_batch(250, 250, 0.25, least=16) == 250
    assert next_batch(250, 250, 0.05, least=16) == MOST_CLAIMED


def test_a_slow_drain_claims_its_least() -> None:
    """Sends of a second each: back to the least (concurrency * 4, at least 16)."""
    assert next_batch(256, 256, 64.0, least=32) == 32
    assert next_batch(16, 16, 16.0, least=16) == 16


def test_a_short_batch_measures_nothing() -> None:
    """The backlog's last few (or a clock that did not move) leave the batch as it was."""
    assert next_batch(64, 3, 0.001, least=16) == 64
    assert next_batch(64, 64, 0.0, least=16) == 64


def test_the_least_batch_is_four_per_send_and_sixteen_at_least() -> None:
    assert [least_batch(c) for c in (1, 4, 5, 64, 100)] == [16, 16, 20, 256, MOST_CLAIMED]


@pytest.mark.parametrize(
    ("store", "concurrency", "flows"),
    [
        (PostgresStore, 1, 2),  # a record's round trip overlaps the next send
        (PostgresStore, 8, 9),
        (SQLiteStore, 1, 1),  # a local record has no wait to overlap
        (SQLiteStore, 8, 8),
        (MemoryOutbox, 4, 4),
        (object(), 4, 4),  # a store of the caller's own, which says nothing
    ],
)
def test_a_drain_runs_one_flow_more_than_it_sends_only_on_a_remote_store(
    store: object, concurrency: int, flows: int
) -> None:
    assert flows_for(store, concurrency) == flows


def test_both_drains_claim_paced_batches(
    server: LoopbackServer, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sync and async alike: the first claim takes the least batch, later ones the pace's.

    (The async drain claimed ``concurrency * 4`` at a time, 4 at concurrency 1:
    a durable claim commit for every 4 intents.)
    """
    limits: list[int] = []
    claim_due = StoreBase.claim_due

    def counted(self: StoreBase, **kwargs: Any) -> Any:
        limits.append(kwargs["limit"])
        return claim_due(self, **kwargs)

    client = make_client(server.base_url, durability="normal")
    for i in range(40):
        pending_via_503(client, f"paced-{i}")
    monkeypatch.setattr(StoreBase, "claim_due", counted)
    assert client.drain().succeeded == 40
    assert limits[0] == least_batch(1) == 16
    assert len(limits) <= 4  # 16, then as many as the pace allows (at most 64), then none due
