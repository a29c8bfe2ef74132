"""--app targets that are wrong in the ways a real application is: for tests/test_cli.py."""

from __future__ import annotations

import fastapi

import postonce

#: A web application where the client was meant: "is a FastAPI application".
app = fastapi.FastAPI()


def broken_factory() -> postonce.Client:
    """A factory that fails the way a missing setting does."""
    raise RuntimeError("STRIPE_API_KEY is empty")


async def broken_async_factory() -> postonce.AsyncClient:
    """An async factory that fails the way a missing setting does."""
    raise RuntimeError("ADYEN_API_KEY is empty")


def not_a_factory() -> int:
    """A factory that returns something else."""
    return 42
