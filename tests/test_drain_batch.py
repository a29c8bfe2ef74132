"""How many intents a drain claims at once: about BATCH_SECONDS of its own work."""

from __future__ import annotations

from postonce._drain import BATCH_SECONDS, MOST_CLAIMED, next_batch


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
