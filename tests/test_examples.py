"""The examples run as written, each on its own, and each checks what it demonstrates."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from examples.stripe_emulator import StripeEmulator

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "stripe_checkout.py": "charged once",
    "drain_worker.py": "drained 3 intents: each order charged once",
    "fastapi_app.py": "charged once per order",
    "custom_provider.py": "posted once",
}

# A broken postonce, for each example: the example's own checks must catch it.
FRESH_KEY_PER_SEND = """
import uuid
import postonce._flow as flow
real = flow.Send  # the effect the flow builds each send with (the shells keep the class)
def send(request, lease=None):
    request.headers["Idempotency-Key"] = str(uuid.uuid4())
    return real(request, lease)
flow.Send = send
"""
IGNORES_THE_PROFILE = """
import postonce._flow as flow
from postonce import BUILTIN_PROVIDERS
real = flow.classify_response
generic = BUILTIN_PROVIDERS["ietf_draft"].model_copy(update={"in_flight": ()})
flow.classify_response = lambda status, headers, body, provider, **kw: real(
    status, headers, body, generic, **kw
)
"""
BREAKAGE = {
    "stripe_checkout.py": FRESH_KEY_PER_SEND,
    "drain_worker.py": FRESH_KEY_PER_SEND,
    "fastapi_app.py": FRESH_KEY_PER_SEND,
    "custom_provider.py": IGNORES_THE_PROFILE,
}


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run with this Python, from elsewhere, with a data directory that must stay empty."""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("POSTONCE_OUTBOX", None)
    env.pop("PYTHONOPTIMIZE", None)  # the examples check with assert
    return subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs_and_checks_itself(example: str, tmp_path: Path) -> None:
    result = run([str(ROOT / "examples" / example)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert EXAMPLES[example] in result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "data").exists(), "an example used the user's default outbox"


@pytest.mark.parametrize("example", BREAKAGE)
def test_example_fails_on_a_broken_library(example: str, tmp_path: Path) -> None:
    path = ROOT / "examples" / example
    code = f"{BREAKAGE[example]}\nimport runpy\nrunpy.run_path({str(path)!r}, run_name='__main__')"
    result = run(["-c", code], tmp_path)
    assert result.returncode != 0, result.stdout
    assert "AssertionError" in result.stderr, result.stderr
    assert EXAMPLES[example] not in result.stdout


async def _stripe_rules() -> list[httpx.Response]:
    stripe = StripeEmulator(processing_seconds=0.2)
    auth = {"Authorization": "Bearer sk_test_emulator"}
    transport = httpx.ASGITransport(app=stripe)
    async with httpx.AsyncClient(transport=transport, base_url="http://stripe") as http:

        async def charge(key: str, amount: int) -> httpx.Response:
            headers = {**auth, "Idempotency-Key": key}
            data = {"amount": amount, "currency": "usd"}
            return await http.post("/v1/payment_intents", data=data, headers=headers)

        first = asyncio.create_task(charge("k1", 4200))
        await asyncio.sleep(0.05)
        in_flight = await charge("k1", 4200)
        answers = [await first, in_flight]
        answers += [await charge("k1", 4200), await charge("k1", 9900)]
        answers += [await charge("k2", 1), await charge("k2", 4200)]
        answers.append(await http.post("/v1/payment_intents", data={"amount": 4200}))
        answers.append(await http.get("/v1/payment_intents", headers=auth))
    return answers


def test_the_emulator_honours_keys_the_way_stripe_does() -> None:
    answers = asyncio.run(_stripe_rules())
    first, in_flight, replay, other_params, invalid, after_invalid, no_auth, ledger = answers
    assert first.status_code == 200
    assert "idempotent-replayed" not in first.headers
    assert in_flight.status_code == 409
    assert in_flight.json()["error"]["code"] == "idempotency_key_in_use"
    assert replay.status_code == 200
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.json() == first.json()
    assert other_params.status_code == 400
    assert other_params.json()["error"]["type"] == "idempotency_error"
    # A request that fails validation is not saved: the key runs afresh.
    assert invalid.status_code == 400
    assert after_invalid.status_code == 200
    assert no_auth.status_code == 401
    assert [c["id"] for c in ledger.json()["data"]] == ["pi_0001", "pi_0002"]
