"""Hooks, logging and the retry budget: what postonce reports, and how it holds back."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce import (
    AttemptDetail,
    EndDetail,
    ExpiryDetail,
    GiveUpDetail,
    Hooks,
    Outcome,
    ReplayDetail,
    RetryBudget,
    RetryDetail,
    StartDetail,
    State,
)
from tests.conftest import FAST


class Script:
    """A transport answering from a list of (status, headers) in turn, then the last forever."""

    def __init__(self, *answers: int | tuple[int, dict[str, str]]) -> None:
        self.answers = [a if isinstance(a, tuple) else (a, {}) for a in answers]
        self.keys: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.keys.append(request.headers["Idempotency-Key"])
        status, headers = self.answers[min(len(self.keys), len(self.answers)) - 1]
        return httpx.Response(status, headers=headers, json={"n": len(self.keys)})


class Seen:
    """Every detail every hook received, in order."""

    def __init__(self) -> None:
        self.details: list[Any] = []

    def hooks(self) -> Hooks:
        add = self.details.append
        return Hooks(
            on_attempt=add,
            on_retry_scheduled=add,
            on_replayed=add,
            on_expired=add,
            on_give_up=add,
            on_start=add,
            on_end=add,
        )

    def kinds(self) -> list[str]:
        return [type(d).__name__ for d in self.details]


def client(outbox_path: Path, script: Callable[[httpx.Request], httpx.Response], **kw: Any) -> Any:
    # origins=: the tests drain what they sent, and a drain needs the client's origins.
    options: dict[str, Any] = {"retry": FAST, "origins": ["https://api.test"], **kw}
    return postonce.Client(outbox=outbox_path, transport=httpx.MockTransport(script), **options)


def test_hooks_see_each_attempt_the_retry_and_the_replay(outbox_path: Path) -> None:
    seen = Seen()
    script = Script(503, (201, {"Idempotent-Replayed": "true"}))
    with client(outbox_path, script, hooks=seen.hooks()) as c:
        c.post_once("https://api.test/c", json={}, intent="h-1")
    assert seen.kinds() == [
        "StartDetail",
        "AttemptDetail",
        "RetryDetail",
        "AttemptDetail",
        "ReplayDetail",
        "EndDetail",
    ]
    start, first, retry, second, replay, end = seen.details
    assert start == StartDetail("h-1", script.keys[0], "ietf_draft", 0, drain=False)
    assert (first.attempt, first.status, first.outcome, first.state) == (
        1,
        503,
        Outcome.RETRYABLE,
        State.SENDING,
    )
    assert isinstance(retry, RetryDetail)
    assert retry.in_foreground
    assert retry.wait >= 0
    assert retry.attempt == 1
    assert (second.attempt, second.status, second.replayed, second.state) == (
        2,
        201,
        True,
        State.SUCCEEDED,
    )
    assert replay == ReplayDetail("h-1", script.keys[0], 2, 201)
    assert end == EndDetail("h-1", script.keys[0], State.SUCCEEDED, 2, None, "ietf_draft", False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.attempt = 9


def test_give_up_then_the_drain_is_bracketed_too(outbox_path: Path) -> None:
    seen = Seen()
    script = Script(503, 503, 201)
    one_try = FAST.model_copy(update={"attempts": 1})
    now = [1_000_000.0]
    with client(outbox_path, script, hooks=seen.hooks(), clock=lambda: now[0]) as c:
        with pytest.raises(postonce.IntentPending):
            c.post_once("https://api.test/c", json={}, intent="h-2", retry=one_try)
        gave_up = [d for d in seen.details if isinstance(d, GiveUpDetail)]
        assert len(gave_up) == 1
        assert gave_up[0].attempts == 1
        assert gave_up[0].due_at is not None
        assert isinstance(seen.details[-1], EndDetail)
        assert seen.details[-1].state is State.PENDING
        assert seen.details[-1].error == "IntentPending"
        seen.details.clear()
        now[0] += 60.0
        c.drain(interval=0.01)
    starts = [d for d in seen.details if isinstance(d, StartDetail)]
    assert starts
    assert all(s.drain for s in starts)
    assert not any(isinstance(d, GiveUpDetail) for d in seen.details)  # the drain never gives up


def test_expiry_is_reported(outbox_path: Path) -> None:
    """Past the horizon the intent expires: on_expired, and a warning naming it."""
    seen = Seen()
    now = [1_000_000.0]
    script = Script(503)
    one_try = FAST.model_copy(update={"attempts": 1})
    with client(outbox_path, script, hooks=seen.hooks(), clock=lambda: now[0]) as c:
        with pytest.raises(postonce.IntentPending):
            c.post_once("https://api.test/c", json={}, intent="h-3", retry=one_try)
        now[0] += 30 * 24 * 3600.0  # long past any provider's retention
        with pytest.raises(postonce.IntentExpired):
            c.post_once("https://api.test/c", json={}, intent="h-3", retry=one_try)
    (expiry,) = [d for d in seen.details if isinstance(d, ExpiryDetail)]
    assert expiry.intent == "h-3"
    assert "horizon" in expiry.reason


def test_a_failing_hook_is_logged_and_changes_nothing(
    outbox_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(detail: AttemptDetail) -> None:
        raise RuntimeError("hook bug")

    script = Script(201)
    with (
        caplog.at_level(logging.ERROR, logger="postonce"),
        client(outbox_path, script, hooks=[Hooks(on_attempt=broken)]) as c,
    ):
        response = c.post_once("https://api.test/c", json={}, intent="h-4")
    assert response.status_code == 201
    assert "on_attempt failed" in caplog.text
    assert len(script.keys) == 1


def test_hooks_must_be_hooks(outbox_path: Path) -> None:
    with pytest.raises(postonce.ConfigurationError, match="hooks="):
        postonce.Client(outbox=outbox_path, hooks=[print])  # type: ignore[list-item]


def test_log_records_carry_structured_fields(
    outbox_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = Script(503, 201)
    with caplog.at_level(logging.DEBUG, logger="postonce"), client(outbox_path, script) as c:
        c.post_once("https://api.test/c", json={}, intent="h-5")
    retry = [r for r in caplog.records if getattr(r, "outcome", None) == "retry"]
    assert len(retry) == 1
    record: Any = retry[0]
    assert (record.intent, record.key, record.attempt) == ("h-5", script.keys[0], 1)
    assert record.wait >= 0
    attempts = [r for r in caplog.records if getattr(r, "outcome", None) == "retryable"]
    assert len(attempts) == 1
    assert attempts[0].levelno == logging.DEBUG


# -- the retry budget ----------------------------------------------------------


@pytest.mark.parametrize(
    ("ops", "left"),
    [
        pytest.param([("w", Outcome.RETRYABLE)], 5, id="retry-costs-5"),
        pytest.param([("w", Outcome.AMBIGUOUS)], 0, id="timeout-costs-10"),
        pytest.param([("w", Outcome.AMBIGUOUS), ("w", Outcome.RETRYABLE)], 0, id="refused-empty"),
        pytest.param([("w", Outcome.RETRYABLE), ("d", 5)], 10, id="success-refunds-cost"),
        pytest.param([("d", 0)], 10, id="capped-at-capacity"),
        pytest.param([("w", Outcome.RETRYABLE), ("d", 0)], 6, id="first-try-success-adds-1"),
    ],
)
def test_budget_table(ops: list[tuple[str, Any]], left: int) -> None:
    budget = RetryBudget(10)
    for op, arg in ops:
        if op == "w":
            budget.withdraw(arg)
        else:
            budget.deposit(arg)
    assert budget.available == left


def test_spent_budget_leaves_retries_to_the_drain(outbox_path: Path) -> None:
    """An outage: after the budget is spent, calls stop retrying; the drain finishes them."""
    script = Script(503)
    budget = RetryBudget(10, retry_cost=5)
    now = [1_000_000.0]
    with client(outbox_path, script, retry_budget=budget, clock=lambda: now[0]) as c:
        with pytest.raises(postonce.IntentPending, match="retry budget"):
            c.post_once("https://api.test/c", json={}, intent="b-1")
        assert len(script.keys) == 3  # 1 first send + 2 paid retries, not FAST's 5 attempts
        assert budget.available == 0
        with pytest.raises(postonce.IntentPending, match="retry budget"):
            c.post_once("https://api.test/c", json={}, intent="b-2")
        assert len(script.keys) == 4  # first sends are never held back
        record = c.lookup("b-2")
        assert record is not None
        assert record.state is State.PENDING
        assert record.due_at is not None
        script.answers = [(201, {})]
        now[0] += 60.0  # both are due
        report = c.drain(interval=0.01)
        assert report.succeeded == 2
        # The drain is not charged; its successes refill a token each, as any success does.
        assert budget.available == 2


def test_budget_off_and_shared(outbox_path: Path, tmp_path: Path) -> None:
    assert postonce.Client(outbox=outbox_path, retry_budget=False).retry_budget is None
    shared = RetryBudget(100)
    a = postonce.Client(outbox=outbox_path, retry_budget=shared)
    b = postonce.Client(outbox=tmp_path / "b.sqlite3", retry_budget=shared)
    assert a.retry_budget is b.retry_budget is shared
    assert isinstance(postonce.Client(outbox=outbox_path).retry_budget, RetryBudget)
    with pytest.raises(ValueError, match="negative"):
        RetryBudget(-1)
