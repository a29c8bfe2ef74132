"""httpx2: a caller who moved to httpx2 passes its client or transport and keeps every guarantee.

Each scenario runs on httpx and on httpx2 against the real loopback server, so
the two libraries are held to the same ledger.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import httpx2
import pytest

import postonce
from postonce import Outcome, State
from postonce._http import library_of
from tests.conftest import FAST, LoopbackServer

LIBS = [pytest.param(httpx, id="httpx"), pytest.param(httpx2, id="httpx2")]


@pytest.mark.parametrize("lib", LIBS)
def test_lost_answer_is_replayed_once(
    lib: ModuleType, server: LoopbackServer, tmp_path: Path
) -> None:
    """Read timeout, same key again, the server's replay: one effect, the caller's Response type."""
    http = lib.Client(base_url=server.base_url, timeout=lib.Timeout(5.0, read=0.5))
    with postonce.Client(http=http, outbox=tmp_path / "o.sqlite3", retry=FAST) as client:
        response = client.post_once(
            "/ietf/v1/charges", json={"amount": 5, "_test": {"delay": 1.0}}, intent="h2-lost"
        )
        attempts = client.outbox.attempts("h2-lost")
    http.close()
    assert type(response) is lib.Response
    info = response.extensions["postonce"]
    assert info.replayed is True
    assert attempts[0].outcome is Outcome.AMBIGUOUS
    assert attempts[0].error_type == "ReadTimeout"
    assert len(server.effects_for(info.key)) == 1


@pytest.mark.parametrize("lib", LIBS)
def test_refused_connection_is_not_sent_and_answer_from_outbox(
    lib: ModuleType, server: LoopbackServer, tmp_path: Path
) -> None:
    """A refused connection is NOT_SENT (no horizon anchor); a repeat comes from the outbox."""
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    one = FAST.model_copy(update={"attempts": 1})
    outbox = tmp_path / "o.sqlite3"
    with postonce.Client(
        transport=lib.HTTPTransport(), outbox=outbox, retry=one, retry_budget=False
    ) as client:
        with pytest.raises(postonce.IntentPending):
            client.post_once(f"http://127.0.0.1:{dead}/ietf/v1/charges", json={}, intent="h2-down")
        record = client.lookup("h2-down")
        assert record is not None
        assert record.first_delivery_at is None  # never delivered: no horizon anchor
        assert client.outbox.attempts("h2-down")[0].outcome is Outcome.NOT_SENT

        first = client.post_once(f"{server.base_url}/ietf/v1/charges", json={}, intent="h2-up")
        again = client.post_once(f"{server.base_url}/ietf/v1/charges", json={}, intent="h2-up")
    assert type(again) is lib.Response
    assert again.extensions["postonce"].from_outbox is True
    assert again.json() == first.json()


@pytest.mark.parametrize("lib", LIBS)
def test_drain_with_the_callers_library(
    lib: ModuleType, server: LoopbackServer, tmp_path: Path
) -> None:
    one = FAST.model_copy(update={"attempts": 1})
    with postonce.Client(
        server.base_url, transport=lib.HTTPTransport(), outbox=tmp_path / "o.sqlite3", retry=one
    ) as client:
        with pytest.raises(postonce.IntentPending):
            client.post_once(
                "/ietf/v1/charges",
                json={"_test": {"before": [{"status": 503, "retry_after": "0"}]}},
                intent="h2-drain",
            )
        report = client.drain()
        record = client.lookup("h2-drain")
    assert report.succeeded == 1
    assert record is not None
    assert record.state is State.SUCCEEDED
    assert len(server.effects_for(record.key)) == 1


@pytest.mark.parametrize("lib", LIBS)
def test_async_client_mismatch_and_success(
    lib: ModuleType, server: LoopbackServer, tmp_path: Path
) -> None:
    async def main() -> tuple[Any, Any]:
        made = []
        for name in ("a", "b"):  # another system (its own outbox) reusing our key
            made.append(
                postonce.AsyncClient(
                    http=lib.AsyncClient(base_url=server.base_url),
                    provider="stripe",
                    outbox=tmp_path / f"{name}.sqlite3",
                    retry=FAST,
                )
            )
        ours, theirs = made
        async with ours, theirs:
            ok = await ours.post_once("/stripe/v1/charges", json={"amount": 1}, intent="h2-a")
            key = ok.extensions["postonce"].key
            with pytest.raises(postonce.IdempotencyKeyMismatch) as refused:
                await theirs.post_once(
                    "/stripe/v1/charges", json={"amount": 2}, intent="h2-b", key=key
                )
            return ok, refused.value.response

    ok, refused = anyio.run(main)
    assert type(ok) is lib.Response
    assert type(refused) is lib.Response
    assert len(server.effects_for(ok.extensions["postonce"].key)) == 1


def test_library_is_read_from_the_class_bases() -> None:
    class MyTransport(httpx2.BaseTransport):
        def handle_request(self, request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(200)

    assert library_of(MyTransport()) is httpx2
    assert library_of(httpx.MockTransport(lambda r: httpx.Response(200))) is httpx
    assert library_of(None) is httpx
    assert library_of(object()) is httpx


def test_postonce_does_not_change_what_import_httpx_means() -> None:
    """No import hook: after postonce meets httpx2, httpx is still httpx."""
    code = (
        "import httpx, httpx2, postonce\n"
        "c = postonce.Client(transport=httpx2.MockTransport(lambda r: httpx2.Response(200)))\n"
        "import sys\n"
        "assert sys.modules['httpx'] is httpx and httpx.Client is not httpx2.Client\n"
        "assert httpx.__name__ == 'httpx' and 'httpx2' not in httpx.__file__\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_an_httpx_timeout_is_read_by_an_httpx2_client(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """Code written for httpx passes httpx.Timeout; with an httpx2 transport it still applies."""
    with postonce.Client(
        server.base_url,
        transport=httpx2.HTTPTransport(),
        timeout=httpx.Timeout(5.0, read=0.5),
        outbox=tmp_path / "o.sqlite3",
        retry=FAST,
    ) as client:
        response: Any = client.post_once(  # an httpx2.Response; the annotations say httpx
            "/ietf/v1/charges",
            json={"amount": 1, "_test": {"delay": 1.0}},
            intent="h2-timeout",
            timeout=httpx.Timeout(5.0, read=0.5),
        )
        attempts = client.outbox.attempts("h2-timeout")
    assert type(response) is httpx2.Response
    assert attempts[0].error_type == "ReadTimeout"  # the 0.5 s read timeout applied
    assert len(server.effects_for(response.extensions["postonce"].key)) == 1
