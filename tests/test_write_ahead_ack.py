"""Errors never lie about what happened: a lost acknowledgement, a failed record.

``OutboxError`` means nothing was stored and nothing sent. A PostgreSQL
COMMIT whose acknowledgement is lost (the server committed, the connection
died before the answer came back) must not be reported so: a TCP proxy
between the client and the real server withholds that one answer.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import postonce
from postonce import IntentPending, OutboxError, SQLiteStore, State
from tests.conftest import FAST, PG_URL, LoopbackServer, pg_schema


class AckDropper:
    """A loopback TCP proxy to PostgreSQL that loses the acknowledgement of one COMMIT.

    Bytes flow both ways untouched until the client sends a message holding
    ``marker`` (the write-ahead's INSERT); the next COMMIT on that connection
    reaches the server, whose answer is never passed on, and the proxy cuts
    the connection once the server had time to commit. Only the first marked
    transaction is cut; every other connection passes.
    """

    def __init__(self, upstream: tuple[str, int], marker: bytes) -> None:
        self.upstream = upstream
        self.marker = marker
        self.armed = threading.Event()
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closing = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            swallow = threading.Event()
            threading.Thread(target=self._up, args=(client, server, swallow), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, swallow), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, swallow: threading.Event) -> None:
        mine = False  # this connection carries the marked transaction
        try:
            while data := client.recv(65536):
                if self.marker in data and not self.armed.is_set():
                    self.armed.set()
                    mine = True
                if mine and b"COMMIT" in data and not self.cut.is_set():
                    self.cut.set()
                    swallow.set()
                    # The COMMIT goes through; its answer is lost, and then the line.
                    threading.Timer(0.5, self._close, args=(client, server)).start()
                server.sendall(data)
        except OSError:
            pass

    def _down(self, server: socket.socket, client: socket.socket, swallow: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if swallow.is_set():
                    continue  # the acknowledgement is lost on the way
                client.sendall(data)
        except OSError:
            pass

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._closing = True
        self.listener.close()


@pytest.fixture
def proxied_outbox() -> Iterator[tuple[str, str, AckDropper]]:
    """A PostgreSQL outbox reached through an AckDropper, and the same outbox reached directly."""
    with pg_schema() as direct:
        parts = urlsplit(direct)
        host, port = parts.hostname or "127.0.0.1", parts.port or 5432
        proxy = AckDropper((host, port), b"INSERT INTO")
        netloc = parts.netloc.replace(f"{host}:{port}", f"127.0.0.1:{proxy.port}")
        proxied = urlunsplit(parts._replace(netloc=netloc))
        postonce.Client(outbox=direct).outbox.close()  # migrated before the proxy arms
        try:
            yield proxied, direct, proxy
        finally:
            proxy.close()


def test_a_lost_write_ahead_acknowledgement_is_not_reported_as_nothing_stored(
    server: LoopbackServer, proxied_outbox: tuple[str, str, AckDropper]
) -> None:
    """The server committed the write-ahead, its answer was lost: the caller learns it is stored."""
    proxied, direct, proxy = proxied_outbox
    intent = f"order-{uuid.uuid4().hex[:8]}/charge"
    client = postonce.Client(server.base_url, outbox=proxied, retry=FAST, lease_seconds=1)
    with client, pytest.raises(IntentPending) as raised:
        client.post_once("/ietf/charges", json={"amount": 1}, intent=intent)
    assert proxy.cut.is_set()
    assert not isinstance(raised.value, OutboxError)
    assert raised.value.intent == intent
    assert "the intent is stored and this call sent nothing" in str(raised.value)
    assert raised.value.due_at is not None  # when this process's lease lets a drain take it
    assert isinstance(raised.value.__cause__, OutboxError)
    key = raised.value.key
    assert server.requests_for(key) == []  # nothing was sent

    # The drain (here: a call again with the same intent) sends it once, with the stored key.
    with postonce.Client(server.base_url, outbox=direct, retry=FAST) as client:
        record = client.lookup(intent)
        assert record is not None
        assert record.key == key
        response = client.post_once("/ietf/charges", json={"amount": 1}, intent=intent)
    assert response.status_code == 201
    assert len(server.effects_for(key)) == 1


def test_a_write_ahead_confirmed_absent_is_an_outbox_error(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """When the read-back shows no intent, OutboxError stands: nothing stored, nothing sent."""

    class RefusingStore(_Delegate):
        def open_intent(self, *args: Any, **kwargs: Any) -> Any:
            raise OutboxError("disk full")

    store = RefusingStore(SQLiteStore(tmp_path / "o.sqlite3"))
    with postonce.Client(server.base_url, outbox=store, retry=FAST) as client:
        with pytest.raises(OutboxError) as raised:
            client.post_once("/ietf/charges", json={"amount": 1}, intent="order-9/charge")
        assert client.lookup("order-9/charge") is None
    assert raised.value.intent == "order-9/charge"
    assert server.requests_for(raised.value.key or "") == []


def test_a_write_ahead_that_fails_once_is_tried_again_and_the_call_goes_on(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """One failed write-ahead is tried again: the intent is written and sent once."""

    class FlakyStore(_Delegate):
        failures = 1

        def open_intent(self, *args: Any, **kwargs: Any) -> Any:
            if self.failures:
                self.failures -= 1
                raise OutboxError("database is locked")
            return self._inner.open_intent(*args, **kwargs)

    with postonce.Client(
        server.base_url, outbox=FlakyStore(SQLiteStore(tmp_path / "o.sqlite3")), retry=FAST
    ) as client:
        response = client.post_once("/ietf/charges", json={"amount": 3}, intent="order-11/charge")
    assert response.status_code == 201
    assert len(server.effects_for(response.extensions["postonce"].key)) == 1


def test_an_outbox_that_cannot_say_is_not_reported_as_nothing_stored(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """Write-ahead and read-back both fail: IntentPending says it may be stored; nothing is sent."""

    class DownStore(_Delegate):
        def open_intent(self, *args: Any, **kwargs: Any) -> Any:
            raise OutboxError("connection refused")

        def get(self, *args: Any, **kwargs: Any) -> Any:
            raise OutboxError("connection refused")

    with (
        postonce.Client(
            server.base_url, outbox=DownStore(SQLiteStore(tmp_path / "o.sqlite3")), retry=FAST
        ) as client,
        pytest.raises(IntentPending) as raised,
    ):
        client.post_once("/ietf/charges", json={"amount": 4}, intent="order-12/charge")
    assert "may or may not be stored" in str(raised.value)
    assert isinstance(raised.value.__cause__, OutboxError)
    assert server.requests_for(raised.value.key) == []


class _Delegate:
    """A store that passes every call to a real one (a test overrides what it breaks)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_failed_record_after_the_send_is_intent_pending(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """An answer the outbox failed to record is IntentPending, chained; the drain finishes it."""

    class ForgetfulStore(_Delegate):
        failures = 1

        def record(self, *args: Any, **kwargs: Any) -> Any:
            if self.failures:
                self.failures -= 1
                raise OutboxError("the disk went away")
            return self._inner.record(*args, **kwargs)

    path = tmp_path / "o.sqlite3"
    store = ForgetfulStore(SQLiteStore(path))
    with postonce.Client(
        server.base_url,
        outbox=store,
        retry=FAST,
        lease_seconds=0.5,
    ) as client:
        with pytest.raises(IntentPending) as raised:
            client.post_once("/ietf/charges", json={"amount": 2}, intent="order-10/charge")
        assert isinstance(raised.value.__cause__, OutboxError)
        key = raised.value.key
        assert len(server.effects_for(key)) == 1  # the provider executed it
    with postonce.Client(server.base_url, outbox=path, retry=FAST) as drainer:
        import time

        time.sleep(0.6)  # the lease of the process that could not record runs out
        report = drainer.drain()
        record = drainer.lookup("order-10/charge")
    assert report.succeeded == 1
    assert record is not None
    assert record.state is State.SUCCEEDED
    assert len(server.effects_for(key)) == 1  # the server replayed it for the same key


def test_pg_url_is_the_real_server() -> None:
    """These tests talk to the real PostgreSQL server, never to a stand-in."""
    assert urlsplit(PG_URL).scheme == "postgresql"
