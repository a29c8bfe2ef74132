"""Shared fixtures: a real loopback server, fresh outboxes, client factories."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

import postonce
from tests.idem_server import IdempotentApp

# Tests never wait long: the policy is the library's, only the numbers are small.
FAST = postonce.RetryPolicy(
    attempts=6,
    timeout=20.0,
    wait_initial=0.01,
    wait_max=0.05,
    in_flight_initial=0.05,
    in_flight_max=0.2,
)


@dataclass
class LoopbackServer:
    """A uvicorn server on 127.0.0.1 serving the idempotent test API."""

    app: IdempotentApp
    base_url: str

    def ledger(self) -> dict[str, Any]:
        """The server's own record of what it executed, read over HTTP."""
        return httpx.get(f"{self.base_url}/_ledger").json()  # type: ignore[no-any-return]

    def effects_for(self, key: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger()["effects"] if e["key"] == key]

    def requests_for(self, key: str) -> list[dict[str, Any]]:
        return [r for r in self.ledger()["requests"] if r["key"] == key]


def _serve(app: IdempotentApp) -> tuple[uvicorn.Server, threading.Thread, int]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="loopback-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the loopback test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, int(port)


@pytest.fixture(scope="session")
def server() -> Iterator[LoopbackServer]:
    """One real HTTP server on 127.0.0.1 for the whole session."""
    app = IdempotentApp()
    uv, thread, port = _serve(app)
    yield LoopbackServer(app=app, base_url=f"http://127.0.0.1:{port}")
    uv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def outbox_path(tmp_path: Path) -> Path:
    """A fresh outbox file for one test."""
    return tmp_path / "outbox.sqlite3"


ClientFactory = Callable[..., postonce.Client]


@pytest.fixture
def make_client(outbox_path: Path) -> Iterator[ClientFactory]:
    """Build clients on this test's outbox with fast retries; closes them afterwards."""
    made: list[postonce.Client] = []

    def factory(base_url: str = "http://api.test", **kwargs: Any) -> postonce.Client:
        kwargs.setdefault("outbox", outbox_path)
        kwargs.setdefault("retry", FAST)
        client = postonce.Client(base_url, **kwargs)
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close()
