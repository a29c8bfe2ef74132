"""The engine's pure decisions: gate (may we send?) and decide (what next?)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

import httpx
import pytest

from postonce._engine import Budget, Step, StepKind, decide, gate
from postonce._intent import Outcome, State
from postonce._policy import RetryPolicy
from postonce.providers import Provider

# Retention 100 s and the default 10 % margin: the horizon is anchor + 90 s.
PROVIDER = Provider(name="t", retention=timedelta(seconds=100))
POLICY = RetryPolicy(wait_initial=1.0, wait_max=1.0, retry_after_max=1000.0)
NOW = 10_000.0
HORIZON = 90.0
WAIT = 5.0  # every decide below gets "Retry-After: 5", so waits are exact
PLENTY = Budget(attempts_left=3, ends_at=None)


@dataclass(frozen=True)
class Case:
    outcome: Outcome
    kind: StepKind
    state: State
    status: int | None = None
    anchor: float | None = None
    deadline_at: float | None = None
    budget: Budget | None = PLENTY
    now: float = NOW
    waits: bool = False  # the step carries wait=WAIT and due_at=now+WAIT


CASES = [
    pytest.param(Case(Outcome.FINAL, StepKind.FINISH, State.SUCCEEDED, status=200), id="final-200"),
    pytest.param(Case(Outcome.FINAL, StepKind.FINISH, State.SUCCEEDED, status=201), id="final-201"),
    pytest.param(Case(Outcome.FINAL, StepKind.FINISH, State.SUCCEEDED, status=299), id="final-299"),
    pytest.param(Case(Outcome.FINAL, StepKind.FINISH, State.FAILED, status=402), id="final-402"),
    pytest.param(Case(Outcome.FINAL, StepKind.FINISH, State.FAILED, status=500), id="final-500"),
    pytest.param(Case(Outcome.FINAL, StepKind.FINISH, State.FAILED, status=302), id="final-302"),
    pytest.param(Case(Outcome.FINAL, StepKind.FINISH, State.FAILED, status=199), id="final-199"),
    pytest.param(
        Case(
            Outcome.FINAL,
            StepKind.FINISH,
            State.SUCCEEDED,
            status=200,
            anchor=NOW - 10 * HORIZON,
            deadline_at=NOW - 1,
            budget=Budget(0, NOW - 1),
        ),
        id="final-answer-beats-horizon-deadline-budget",
    ),
    pytest.param(
        Case(Outcome.MISMATCH, StepKind.MISMATCH, State.FAILED, status=400), id="mismatch"
    ),
    pytest.param(
        Case(Outcome.MISMATCH, StepKind.MISMATCH, State.FAILED, status=400, budget=None),
        id="mismatch-no-budget",
    ),
    pytest.param(
        Case(Outcome.MISMATCH, StepKind.MISMATCH, State.FAILED, status=400, budget=Budget(0, None)),
        id="mismatch-budget-spent",
    ),
    pytest.param(
        Case(
            Outcome.MISMATCH,
            StepKind.MISMATCH,
            State.FAILED,
            status=422,
            anchor=NOW - 10 * HORIZON,
            deadline_at=NOW - 1,
        ),
        id="mismatch-past-horizon-and-deadline",
    ),
    pytest.param(
        Case(Outcome.RETRYABLE, StepKind.RETRY, State.SENDING, status=503, waits=True),
        id="retryable-retry",
    ),
    pytest.param(
        Case(
            Outcome.IN_PROGRESS, StepKind.RETRY, State.SENDING, status=409, anchor=NOW, waits=True
        ),
        id="in-progress-retry",
    ),
    pytest.param(
        Case(Outcome.AMBIGUOUS, StepKind.RETRY, State.SENDING, anchor=NOW - 80, waits=True),
        id="ambiguous-within-horizon-retry",
    ),
    pytest.param(
        Case(
            Outcome.RETRYABLE,
            StepKind.RETRY,
            State.SENDING,
            status=503,
            budget=Budget(1, NOW + WAIT),
            waits=True,
        ),
        id="due-exactly-at-budget-end-retry",
    ),
    pytest.param(
        Case(
            Outcome.RETRYABLE,
            StepKind.DEFER,
            State.PENDING,
            status=503,
            budget=Budget(0, None),
            waits=True,
        ),
        id="no-attempts-left-defer",
    ),
    pytest.param(
        Case(
            Outcome.RETRYABLE,
            StepKind.DEFER,
            State.PENDING,
            status=503,
            budget=Budget(3, NOW + WAIT - 0.1),
            waits=True,
        ),
        id="due-beyond-budget-end-defer",
    ),
    pytest.param(
        Case(Outcome.RETRYABLE, StepKind.DEFER, State.PENDING, status=429, budget=None, waits=True),
        id="no-budget-defer",
    ),
    pytest.param(
        Case(Outcome.AMBIGUOUS, StepKind.DEFER, State.PENDING, anchor=NOW, budget=None, waits=True),
        id="ambiguous-no-budget-defer",
    ),
    pytest.param(
        Case(Outcome.AMBIGUOUS, StepKind.EXPIRE, State.EXPIRED, anchor=NOW - HORIZON + WAIT - 1),
        id="ambiguous-wait-passes-horizon-expire",
    ),
    pytest.param(
        Case(
            Outcome.RETRYABLE, StepKind.EXPIRE, State.EXPIRED, status=503, anchor=NOW - 2 * HORIZON
        ),
        id="retryable-past-horizon-expire",
    ),
    pytest.param(
        Case(
            Outcome.IN_PROGRESS,
            StepKind.EXPIRE,
            State.EXPIRED,
            status=409,
            anchor=NOW - HORIZON + 1,
            budget=None,
        ),
        id="in-progress-wait-passes-horizon-expire",
    ),
    pytest.param(
        Case(Outcome.NOT_SENT, StepKind.RETRY, State.SENDING, now=1e12, waits=True),
        id="not-sent-far-future-never-expires",
    ),
    pytest.param(
        Case(Outcome.NOT_SENT, StepKind.DEFER, State.PENDING, now=1e12, budget=None, waits=True),
        id="not-sent-far-future-defers",
    ),
    pytest.param(
        Case(Outcome.NOT_SENT, StepKind.CANCEL, State.CANCELLED, deadline_at=NOW - 1),
        id="not-sent-past-deadline-cancel",
    ),
    pytest.param(
        Case(Outcome.NOT_SENT, StepKind.CANCEL, State.CANCELLED, deadline_at=NOW + WAIT - 1),
        id="not-sent-wait-passes-deadline-cancel",
    ),
    pytest.param(
        Case(
            Outcome.NOT_SENT, StepKind.RETRY, State.SENDING, deadline_at=NOW + WAIT + 1, waits=True
        ),
        id="not-sent-before-deadline-retry",
    ),
    pytest.param(
        Case(Outcome.AMBIGUOUS, StepKind.EXPIRE, State.EXPIRED, anchor=NOW, deadline_at=NOW - 1),
        id="ambiguous-past-deadline-expire",
    ),
    pytest.param(
        Case(
            Outcome.RETRYABLE,
            StepKind.EXPIRE,
            State.EXPIRED,
            status=503,
            anchor=NOW - 1,
            deadline_at=NOW + 1,
        ),
        id="delivered-wait-passes-deadline-expire",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_decide(case: Case) -> None:
    """decide maps outcome, horizon, deadline and budget to the next step."""
    step = decide(
        case.outcome,
        status=case.status,
        headers=httpx.Headers({"Retry-After": str(int(WAIT))}),
        now=case.now,
        attempt=2,
        anchor=case.anchor,
        deadline_at=case.deadline_at,
        provider=PROVIDER,
        policy=POLICY,
        budget=case.budget,
    )
    assert (step.kind, step.state) == (case.kind, case.state)
    if case.waits:
        assert step.wait == WAIT
        assert step.due_at == case.now + WAIT
    else:
        assert step.wait == 0.0
        assert step.due_at is None


@pytest.mark.parametrize(
    "outcome", [Outcome.RETRYABLE, Outcome.AMBIGUOUS, Outcome.NOT_SENT, Outcome.IN_PROGRESS]
)
def test_decide_jittered_wait_sets_due_at(outcome: Outcome) -> None:
    """Without Retry-After the jittered wait lies in [0, wait_max] and due_at = now + wait."""
    random.seed(11)
    waits: set[float] = set()
    for _ in range(50):
        step = decide(
            outcome,
            status=None,
            headers=httpx.Headers(),
            now=NOW,
            attempt=1,
            anchor=NOW,
            deadline_at=None,
            provider=PROVIDER,
            policy=POLICY,
            budget=PLENTY,
        )
        assert step.kind is StepKind.RETRY
        assert step.state is State.SENDING
        assert 0.0 <= step.wait <= 1.0
        assert step.due_at == NOW + step.wait
        waits.add(step.wait)
    assert len(waits) > 1


@dataclass(frozen=True)
class GateCase:
    anchor: float | None
    deadline_at: float | None
    expected: tuple[StepKind, State] | None
    now: float = NOW


GATE_CASES = [
    pytest.param(GateCase(None, None, None), id="fresh"),
    pytest.param(GateCase(None, None, None, now=1e12), id="never-sent-far-future"),
    pytest.param(GateCase(NOW - HORIZON + 1, None, None), id="within-horizon"),
    pytest.param(GateCase(NOW - HORIZON, None, (StepKind.EXPIRE, State.EXPIRED)), id="at-horizon"),
    pytest.param(
        GateCase(NOW - 2 * HORIZON, None, (StepKind.EXPIRE, State.EXPIRED)), id="past-horizon"
    ),
    pytest.param(GateCase(None, NOW + 1, None), id="before-deadline"),
    pytest.param(
        GateCase(None, NOW, (StepKind.CANCEL, State.CANCELLED)), id="at-deadline-never-sent"
    ),
    pytest.param(
        GateCase(None, NOW - 1, (StepKind.CANCEL, State.CANCELLED)), id="past-deadline-never-sent"
    ),
    pytest.param(
        GateCase(NOW - 1, NOW - 1, (StepKind.EXPIRE, State.EXPIRED)), id="past-deadline-delivered"
    ),
    pytest.param(
        GateCase(NOW - 2 * HORIZON, NOW - 1, (StepKind.EXPIRE, State.EXPIRED)),
        id="past-horizon-and-deadline",
    ),
    pytest.param(GateCase(NOW - 1, NOW + 1, None), id="delivered-before-deadline"),
]


@pytest.mark.parametrize("case", GATE_CASES)
def test_gate(case: GateCase) -> None:
    """gate returns None when a send is allowed, else the terminal step forbidding it."""
    step: Step | None = gate(
        case.now, anchor=case.anchor, deadline_at=case.deadline_at, provider=PROVIDER, policy=POLICY
    )
    if case.expected is None:
        assert step is None
    else:
        assert step is not None
        assert (step.kind, step.state) == case.expected
        assert step.reason


def test_gate_horizon_uses_policy_margin() -> None:
    """A larger horizon_margin closes the horizon earlier."""
    anchor = NOW - 60.0
    assert gate(NOW, anchor=anchor, deadline_at=None, provider=PROVIDER, policy=POLICY) is None
    strict = RetryPolicy(horizon_margin=0.5)
    step = gate(NOW, anchor=anchor, deadline_at=None, provider=PROVIDER, policy=strict)
    assert step is not None
    assert step.kind is StepKind.EXPIRE
