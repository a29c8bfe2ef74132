"""Retry policy: Retry-After, jittered backoff and the retry horizon."""

from __future__ import annotations

import email.utils
import random
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from postonce._exceptions import ConfigurationError
from postonce._intent import Outcome
from postonce._policy import RetryPolicy, backoff, horizon_at, retry_after
from postonce.providers import BUILTIN_PROVIDERS, Provider

NOW = 1_700_000_000.0


def _date(at: float) -> str:
    return email.utils.formatdate(at, usegmt=True)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"Retry-After": "3"}, 3.0, id="seconds"),
        pytest.param({"retry-after": " 7 "}, 7.0, id="seconds-padded"),
        pytest.param({"Retry-After": "0"}, 0.0, id="zero"),
        pytest.param({"Retry-After": _date(NOW + 10)}, 10.0, id="date-ahead"),
        pytest.param({"Retry-After": _date(NOW - 3600)}, 0.0, id="date-past"),
        pytest.param({"Retry-After": "Sun Nov  6 08:49:37 1994"}, 0.0, id="asctime-past"),
        pytest.param({"Retry-After": "garbage"}, None, id="garbage"),
        pytest.param({"Retry-After": "-5"}, None, id="negative"),
        pytest.param({"Retry-After": "1e9x"}, None, id="exponent-junk"),
        pytest.param({"Retry-After": "3.5"}, None, id="fractional"),
        pytest.param({"Retry-After": ""}, None, id="empty"),
        pytest.param({"Retry-After": "x" * 200}, None, id="200-chars"),
        pytest.param({"Retry-After": "1" * 200}, None, id="200-digits"),
        pytest.param({}, None, id="absent"),
        pytest.param({"retry-after-ms": "1500"}, 1.5, id="millis"),
        pytest.param({"retry-after-ms": "250.5"}, 0.2505, id="millis-fraction"),
        pytest.param({"retry-after-ms": "1500", "Retry-After": "30"}, 1.5, id="millis-first"),
        pytest.param({"retry-after-ms": "soon", "Retry-After": "30"}, 30.0, id="millis-unreadable"),
    ],
)
def test_retry_after(headers: dict[str, str], expected: float | None) -> None:
    """Retry-After and retry-after-ms are read as delays; anything unreadable is None."""
    got = retry_after(httpx.Headers(headers), NOW)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("policy", "value", "expected"),
    [
        pytest.param(RetryPolicy(), "999999", 60.0, id="default-cap"),
        pytest.param(RetryPolicy(retry_after_max=5.0), "999999", 5.0, id="custom-cap"),
        pytest.param(RetryPolicy(), "3", 3.0, id="below-cap"),
        pytest.param(RetryPolicy(retry_after_max=0.0), "3", 0.0, id="zero-cap"),
    ],
)
@pytest.mark.parametrize("outcome", [Outcome.RETRYABLE, Outcome.IN_PROGRESS, Outcome.AMBIGUOUS])
def test_backoff_honours_retry_after_up_to_cap(
    policy: RetryPolicy, value: str, expected: float, outcome: Outcome
) -> None:
    """With Retry-After, the wait is min(value, retry_after_max), for any outcome."""
    headers = httpx.Headers({"Retry-After": value})
    for attempt in (1, 4):
        assert backoff(policy, outcome, attempt, headers, NOW) == expected


def _samples(policy: RetryPolicy, outcome: Outcome, attempt: int, n: int = 400) -> list[float]:
    random.seed(20240601 + attempt)
    return [backoff(policy, outcome, attempt, httpx.Headers(), NOW) for _ in range(n)]


def _assert_full_jitter(samples: list[float], high: float) -> None:
    assert all(0.0 <= s <= high for s in samples), (min(samples), max(samples), high)
    assert len(set(samples)) > 1
    # Full jitter over [0, high]: the samples reach near both ends.
    assert max(samples) > 0.9 * high
    assert min(samples) < 0.1 * high


@pytest.mark.parametrize(
    ("policy", "attempt", "high"),
    [
        pytest.param(RetryPolicy(wait_initial=0.5, wait_max=8.0), 1, 0.5, id="n1"),
        pytest.param(RetryPolicy(wait_initial=0.5, wait_max=8.0), 2, 1.0, id="n2"),
        pytest.param(RetryPolicy(wait_initial=0.5, wait_max=8.0), 3, 2.0, id="n3"),
        pytest.param(RetryPolicy(wait_initial=0.5, wait_max=8.0), 5, 8.0, id="n5-at-max"),
        pytest.param(RetryPolicy(wait_initial=0.5, wait_max=8.0), 9, 8.0, id="n9-capped"),
        pytest.param(RetryPolicy(wait_initial=0.5, wait_max=5.0), 4, 4.0, id="n4-below-cap"),
        pytest.param(RetryPolicy(wait_initial=0.5, wait_max=5.0), 5, 5.0, id="n5-cap-5"),
        pytest.param(
            RetryPolicy(wait_initial=1.0, wait_max=100.0, wait_exp_base=3.0), 3, 9.0, id="base-3"
        ),
        pytest.param(RetryPolicy(wait_initial=1.0, wait_max=100.0), 200, 100.0, id="huge-attempt"),
    ],
)
def test_backoff_full_jitter_bounds(policy: RetryPolicy, attempt: int, high: float) -> None:
    """Without Retry-After, attempt n waits uniformly in [0, min(wait_max, initial*base**(n-1))]."""
    _assert_full_jitter(_samples(policy, Outcome.RETRYABLE, attempt), high)


@pytest.mark.parametrize(
    ("attempt", "high"),
    [pytest.param(1, 0.25, id="n1"), pytest.param(3, 1.0, id="n3"), pytest.param(6, 2.0, id="n6")],
)
def test_backoff_in_progress_uses_in_flight_scale(attempt: int, high: float) -> None:
    """An IN_PROGRESS wait follows in_flight_initial/in_flight_max, not wait_*."""
    policy = RetryPolicy(
        wait_initial=10.0, wait_max=100.0, in_flight_initial=0.25, in_flight_max=2.0
    )
    _assert_full_jitter(_samples(policy, Outcome.IN_PROGRESS, attempt), high)
    assert max(_samples(policy, Outcome.RETRYABLE, attempt)) > 2.0


def test_backoff_zero_attempt_waits_like_first() -> None:
    """An attempt number below 1 is treated as the first attempt."""
    policy = RetryPolicy(wait_initial=0.5, wait_max=8.0)
    _assert_full_jitter(_samples(policy, Outcome.RETRYABLE, 0), 0.5)


def test_backoff_is_reproducible_under_seed() -> None:
    """The jitter draws from the random module, so seeding it repeats the waits."""
    policy = RetryPolicy()
    assert _samples(policy, Outcome.AMBIGUOUS, 3) == _samples(policy, Outcome.AMBIGUOUS, 3)


def test_horizon_at_stripe_default_margin() -> None:
    """Stripe's 24 h retention less the default 10 % margin closes the horizon at 21.6 h."""
    anchor = NOW
    got = horizon_at(anchor, BUILTIN_PROVIDERS["stripe"], RetryPolicy())
    assert got == pytest.approx(anchor + 21.6 * 3600)


@pytest.mark.parametrize(
    ("retention", "margin", "offset"),
    [
        pytest.param(timedelta(hours=24), 0.0, 86400.0, id="no-margin"),
        pytest.param(timedelta(seconds=100), 0.5, 50.0, id="half"),
        pytest.param(timedelta(days=7), 0.25, 7 * 86400 * 0.75, id="week-quarter"),
    ],
)
def test_horizon_at_custom(retention: timedelta, margin: float, offset: float) -> None:
    """horizon_at = anchor + retention * (1 - horizon_margin)."""
    provider = Provider(name="t", retention=retention)
    policy = RetryPolicy(horizon_margin=margin)
    assert horizon_at(1000.0, provider, policy) == pytest.approx(1000.0 + offset)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"attempts": 0}, id="zero-attempts"),
        pytest.param({"attempts": -1}, id="negative-attempts"),
        pytest.param({"wait_initial": 10.0, "wait_max": 1.0}, id="initial-above-max"),
        pytest.param({"in_flight_initial": 3.0, "in_flight_max": 2.0}, id="in-flight-above-max"),
        pytest.param({"wait_initial": -0.1}, id="negative-wait"),
        pytest.param({"wait_exp_base": 0.5}, id="shrinking-base"),
        pytest.param({"timeout": 0}, id="zero-timeout"),
        pytest.param({"horizon_margin": 1.0}, id="margin-one"),
        pytest.param({"horizon_margin": -0.1}, id="negative-margin"),
        pytest.param({"retry_after_max": -1}, id="negative-retry-after-max"),
        pytest.param({"retries": 3}, id="unknown-field"),
    ],
)
def test_retry_policy_rejects(fields: Mapping[str, Any]) -> None:
    """An inconsistent or out-of-range RetryPolicy raises ConfigurationError (postonce's words)."""
    with pytest.raises(ConfigurationError):
        RetryPolicy.model_validate(fields)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"attempts": 1}, id="one-attempt"),
        pytest.param({"wait_initial": 1.0, "wait_max": 1.0}, id="initial-equals-max"),
        pytest.param({"timeout": None}, id="no-timeout"),
        pytest.param({"horizon_margin": 0.0}, id="no-margin"),
    ],
)
def test_retry_policy_accepts(fields: Mapping[str, Any]) -> None:
    """A consistent RetryPolicy validates and keeps the values given."""
    policy = RetryPolicy.model_validate(fields)
    for name, value in fields.items():
        assert getattr(policy, name) == value


def test_retry_policy_is_frozen() -> None:
    """A RetryPolicy cannot be changed after construction."""
    policy = RetryPolicy()
    with pytest.raises(ValidationError):
        policy.attempts = 9  # type: ignore[misc]
