"""A drain's settings are refused before anything is claimed when they make no sense."""

from __future__ import annotations

import math

import pytest

import postonce
from tests.conftest import ClientFactory


@pytest.mark.parametrize(
    ("concurrency", "interval"),
    [
        pytest.param(1, math.nan, id="nan-interval"),
        pytest.param(1, math.inf, id="inf-interval"),
        pytest.param(1, 0.0, id="zero-interval"),
        pytest.param(1, -1.0, id="negative-interval"),
        pytest.param(0, 1.0, id="no-concurrency"),
    ],
)
def test_a_drain_refuses_settings_that_would_spin_or_stall(
    make_client: ClientFactory, concurrency: int, interval: float
) -> None:
    """A NaN interval (a worker spinning on the outbox) and the like are ConfigurationError."""
    client = make_client()
    with pytest.raises(postonce.ConfigurationError, match="finite interval"):
        client.drain(forever=True, interval=interval, concurrency=concurrency)
