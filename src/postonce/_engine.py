"""The decisions of an intent's life, as pure functions of data and ``now``.

The shells (``Client`` today; the drain and ``AsyncClient`` later) do the I/O
and ask these two functions what comes next:

* :func:`gate` — may this intent be sent now at all?
* :func:`decide` — after an attempt, what is the next step?
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import NamedTuple

from ._intent import Outcome, State
from ._policy import RetryPolicy, backoff, horizon_at
from .providers import Provider

__all__ = ["CLOCK_TOLERANCE", "Budget", "Step", "StepKind", "decide", "gate"]

#: Seconds a wall clock may step back (an NTP correction, or the skew between
#: hosts sharing a PostgreSQL outbox) before postonce treats it as a jump and
#: stops trusting times recorded earlier. Small next to every horizon margin.
CLOCK_TOLERANCE = 60.0


class StepKind(str, enum.Enum):
    FINISH = "finish"  # a final answer: store it, return it
    MISMATCH = "mismatch"  # the key was refused as reused: store, raise, never retry
    RETRY = "retry"  # wait ``wait`` seconds in the foreground, then send the same key
    DEFER = "defer"  # the foreground budget is spent: pending, due at ``due_at``
    EXPIRE = "expire"  # delivery ambiguous past the horizon or deadline: reconcile
    CANCEL = "cancel"  # never delivered and past the caller's deadline


class Step(NamedTuple):
    kind: StepKind
    state: State
    wait: float = 0.0
    due_at: float | None = None
    reason: str = ""


class Budget(NamedTuple):
    """What is left of one foreground call."""

    attempts_left: int
    ends_at: float | None  # wall-clock time; None: attempts only


def gate(
    now: float,
    *,
    anchor: float | None,
    deadline_at: float | None,
    provider: Provider,
    policy: RetryPolicy,
) -> Step | None:
    """None if a send is allowed now; else the terminal step that forbids it.

    ``anchor`` is the start of the first attempt that may have been delivered.
    A wall clock that now reads earlier than the anchor (by more than
    ``CLOCK_TOLERANCE``) went backwards: the real time since the first send
    cannot be known, so the horizon is taken as passed. Never late, at the
    price of reconciling an intent that might still have been retried.
    """
    if anchor is not None and now < anchor - CLOCK_TOLERANCE:
        return Step(
            StepKind.EXPIRE,
            State.EXPIRED,
            reason="the clock went back past the first send; the time since it is unknown",
        )
    if anchor is not None and now >= horizon_at(anchor, provider, policy):
        return Step(
            StepKind.EXPIRE,
            State.EXPIRED,
            reason=f"past the retry horizon: {provider.name} may have forgotten the key",
        )
    if deadline_at is not None and now >= deadline_at:
        if anchor is None:
            return Step(StepKind.CANCEL, State.CANCELLED, reason="past its deadline, never sent")
        return Step(
            StepKind.EXPIRE,
            State.EXPIRED,
            reason="past its deadline with delivery ambiguous",
        )
    return None


def decide(
    outcome: Outcome,
    *,
    status: int | None,
    headers: Mapping[str, str],
    now: float,
    attempt: int,
    anchor: float | None,
    deadline_at: float | None,
    provider: Provider,
    policy: RetryPolicy,
    budget: Budget | None,
) -> Step:
    """The next step after attempt number ``attempt`` ended with ``outcome``.

    ``anchor`` must already include this attempt when it may have been
    delivered. ``budget=None`` means no foreground caller waits (the drain):
    every retry becomes a due time instead of a sleep.
    """
    if outcome is Outcome.FINAL:
        assert status is not None
        state = State.SUCCEEDED if 200 <= status < 300 else State.FAILED
        return Step(StepKind.FINISH, state)
    if outcome is Outcome.INDETERMINATE:
        # Stored, never retried, and never called failed: the effect may have happened.
        return Step(
            StepKind.FINISH,
            State.INDETERMINATE,
            reason=f"HTTP {status} from {provider.name} does not say whether the request took "
            "effect, and no retry can change it: reconcile it",
        )
    if outcome is Outcome.MISMATCH:
        return Step(StepKind.MISMATCH, State.FAILED, reason="the key was used for another request")
    wait = backoff(policy, outcome, attempt, headers, now)
    due_at = now + wait
    stop = gate(due_at, anchor=anchor, deadline_at=deadline_at, provider=provider, policy=policy)
    if stop is not None:
        return stop
    if (
        budget is None
        or budget.attempts_left <= 0
        or (budget.ends_at is not None and due_at > budget.ends_at)
    ):
        return Step(StepKind.DEFER, State.PENDING, wait=wait, due_at=due_at)
    return Step(StepKind.RETRY, State.SENDING, wait=wait, due_at=due_at)


def over_budget(step: Step) -> Step:
    """A retry the client's retry budget cannot pay for: left to the drain, due when it would go."""
    assert step.kind is StepKind.RETRY
    return Step(
        StepKind.DEFER,
        State.PENDING,
        wait=step.wait,
        due_at=step.due_at,
        reason="the client's retry budget is spent",
    )
