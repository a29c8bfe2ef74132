"""A configured client for the CLI tests: ``postonce drain --app tests.drain_app:client``.

Configured from the environment, as a real application would be.
"""

from __future__ import annotations

import os

import postonce
from tests.http_library import default_transport

client = postonce.Client(
    os.environ.get("POSTONCE_TEST_BASE_URL", "http://127.0.0.1:9"),
    transport=default_transport(),  # httpx2 in CI's second pass
    outbox=os.environ.get("POSTONCE_TEST_OUTBOX"),
    headers={"X-Worker": os.environ.get("POSTONCE_TEST_WORKER", "drain")},
    lease_seconds=float(os.environ.get("POSTONCE_TEST_LEASE", "10")),
    retry=postonce.RetryPolicy(
        wait_initial=0.01, wait_max=0.05, in_flight_initial=0.02, in_flight_max=0.1
    ),
)


def make_client() -> postonce.Client:
    """A factory, for --app tests.drain_app:make_client."""
    return client


not_a_client = 42


#: The same client for asyncio applications: ``--app tests.drain_app:async_client``.
async_client = postonce.AsyncClient(
    os.environ.get("POSTONCE_TEST_BASE_URL", "http://127.0.0.1:9"),
    transport=default_transport("async"),
    outbox=os.environ.get("POSTONCE_TEST_OUTBOX"),
    headers={"X-Worker": os.environ.get("POSTONCE_TEST_WORKER", "drain")},
    lease_seconds=float(os.environ.get("POSTONCE_TEST_LEASE", "10")),
    retry=client.retry,
)


async def make_async_client() -> postonce.AsyncClient:
    """An async factory, for --app tests.drain_app:make_async_client."""
    return async_client
