"""End to end: every transport, every provider's 5xx rule, a changed provider.

A server that executes a charge and then drops the connection leaves an
ambiguous attempt on httpx, httpx2 and httpx-aiohttp alike: operator cancel is
refused and nothing is sent past the horizon. Provider emulators answer 5xx the
way each family documents, and postonce reads each as its profile says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from httpx_aiohttp import AiohttpTransport

import postonce
from postonce import Outcome, State
from postonce._intent import IllegalMove
from tests.conftest import FAST, LoopbackServer, _serve
from tests.provider_emulators import Emulator

ONCE = FAST.model_copy(update={"attempts": 1})
DAY = 86400.0


def _transport(kind: str) -> Any:
    if kind == "aiohttp":
        return AiohttpTransport()
    if kind == "httpx2":
        return httpx2.AsyncHTTPTransport()
    return httpx.AsyncHTTPTransport()


@pytest.mark.parametrize("kind", ["httpx", "httpx2", "aiohttp"])
def test_drop_after_execution_is_ambiguous_on_every_transport(
    kind: str, server: LoopbackServer, tmp_path: Path
) -> None:
    """Executed, then the connection dropped: ambiguous, cancel refused, none past the horizon."""
    now = [1_800_000_000.0]
    outbox = tmp_path / "o.sqlite3"

    async def main() -> tuple[Any, Any]:
        async with postonce.AsyncClient(
            server.base_url,
            transport=_transport(kind),
            outbox=outbox,
            retry=ONCE,
            retry_budget=False,
            clock=lambda: now[0],
        ) as client:
            with pytest.raises(postonce.IntentPending):
                await client.post_once(
                    "/ietf/v1/charges",
                    json={"amount": 1, "_test": {"drop_first": True}},
                    intent="dropped",
                )
            record = await client.lookup("dropped")
            attempts = client.outbox.attempts("dropped")
            with pytest.raises(IllegalMove, match="may have been delivered"):
                client.outbox.operator_move("dropped", State.CANCELLED, now=now[0], note="operator")
            now[0] += 3 * DAY  # past ietf_draft's 24 h retention
            report = await client.drain()
            return record, (attempts, report, await client.lookup("dropped"))

    record, (attempts, report, after) = anyio.run(main)
    assert [a.outcome for a in attempts] == [Outcome.AMBIGUOUS]
    assert record.first_delivery_at is not None  # the horizon started
    assert after.state is State.EXPIRED
    assert report.claimed == 1
    assert len(server.requests_for(record.key)) == 1
    assert len(server.effects_for(record.key)) == 1


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, tuple[Emulator, str]]]:
    """One emulator per 5xx family, each on its own loopback port."""
    made: dict[str, tuple[Emulator, str]] = {}
    servers = []
    for family in ("replayed", "retry", "not_stored", "hint"):
        app = Emulator(family)
        uv, thread, port = _serve(app)  # type: ignore[arg-type]
        servers.append((uv, thread))
        made[family] = (app, f"http://127.0.0.1:{port}")
    yield made
    for uv, thread in servers:
        uv.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize(
    ("family", "provider", "script", "status", "requests", "effects", "state"),
    [
        pytest.param(
            "replayed",
            "stripe",
            {"fail": 1},
            500,
            2,
            1,
            State.INDETERMINATE,
            id="stripe-500-replayed",
        ),
        pytest.param(
            "replayed",
            "stripe",
            {"fail": 1, "should_retry": False},
            500,
            1,
            1,
            State.INDETERMINATE,
            id="stripe-should-retry-false",
        ),
        pytest.param(
            "retry", "aws_client_token", {"fail": 2}, 201, 3, 1, State.SUCCEEDED, id="aws"
        ),
        pytest.param(
            "retry", "paypal_orders", {"fail": 1}, 201, 2, 1, State.SUCCEEDED, id="paypal"
        ),
        pytest.param(
            "not_stored", "checkout", {"fail": 1}, 201, 2, 1, State.SUCCEEDED, id="checkout"
        ),
        pytest.param(
            "not_stored",
            "modern_treasury",
            {"fail": 1},
            201,
            2,
            1,
            State.SUCCEEDED,
            id="modern_treasury",
        ),
        pytest.param("hint", "adyen", {"fail": 1}, 500, 1, 0, State.INDETERMINATE, id="adyen-500"),
        pytest.param(
            "hint",
            "adyen",
            {"fail": 1, "transient": True},
            201,
            2,
            1,
            State.SUCCEEDED,
            id="adyen-transient",
        ),
    ],
)
def test_each_provider_5xx_rule_against_its_emulator(
    emulators: dict[str, tuple[Emulator, str]],
    tmp_path: Path,
    family: str,
    provider: str,
    script: dict[str, Any],
    status: int,
    requests: int,
    effects: int,
    state: State,
) -> None:
    """A 5xx is retried with the same key where the provider says so, else left indeterminate."""
    app, url = emulators[family]
    profile = postonce.get_provider(provider)
    header = profile.key_field if profile.key_transport == "header" else "Idempotency-Key"
    app.key_header = header.lower().encode()
    with postonce.Client(url, provider=provider, outbox=tmp_path / "o.sqlite3", retry=FAST) as c:
        if profile.key_transport == "body":
            # The body-key families put the key in the JSON; the emulator reads a header.
            key = "0b6cb1f4-7f1e-4ac4-9d7a-5f0d9f2f0a11"
            response = c.post_once(
                "/charges", json=script, intent=family, key=key, headers={header: key}
            )
        elif state is State.INDETERMINATE:  # not retried, and not handed back as an answer
            with pytest.raises(postonce.IntentIndeterminate) as raised:
                c.post_once("/charges", json=script, intent=family)
            assert raised.value.response is not None
            response = raised.value.response
        else:
            response = c.post_once("/charges", json=script, intent=family)
        record = c.lookup(family)
    assert record is not None
    key = record.key
    assert response.status_code == status
    assert app.requests[key] == requests
    assert app.effects.get(key, 0) == effects
    assert record is not None
    assert record.state is state


def test_resuming_under_another_provider_is_refused(server: LoopbackServer, tmp_path: Path) -> None:
    """stripe, then paypal_orders for the same intent: IntentConflict naming both, nothing sent."""
    outbox = tmp_path / "o.sqlite3"
    with postonce.Client(
        server.base_url, provider="stripe", outbox=outbox, retry=ONCE, retry_budget=False
    ) as client:
        with pytest.raises(postonce.IntentPending):
            client.post_once(
                "/stripe/v1/charges",
                json={"amount": 1, "_test": {"before": [{"status": 503}]}},
                intent="moved",
            )
        record = client.lookup("moved")
        assert record is not None
        with pytest.raises(postonce.IntentConflict, match=r"'stripe'.*'paypal_orders'"):
            client.post_once(
                "/stripe/v1/charges",
                json={"amount": 1, "_test": {"before": [{"status": 503}]}},
                intent="moved",
                provider="paypal_orders",
            )
        custom = postonce.get_provider("stripe").model_copy(update={"key_field": "X-Other"})
        with pytest.raises(postonce.IntentConflict):
            client.post_once(
                "/stripe/v1/charges",
                json={"amount": 1, "_test": {"before": [{"status": 503}]}},
                intent="moved",
                provider=custom,
            )
        assert len(server.requests_for(record.key)) == 1
        same_facts = postonce.get_provider("stripe").model_copy(update={"in_flight": ()})
        response = client.post_once(
            "/stripe/v1/charges",
            json={"amount": 1, "_test": {"before": [{"status": 503}]}},
            intent="moved",
            provider=same_facts,
        )
    assert response.status_code == 201
    assert len(server.effects_for(record.key)) == 1
