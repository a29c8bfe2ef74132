"""A custom provider profile: teach postonce another API's idempotency contract.

Run it from the repository root::

    python examples/custom_provider.py

"Ledger" is a made-up internal API whose contract no built-in profile covers:

* the key travels in the JSON body as ``request_id``: 20 to 64 letters, digits or ``-``;
* it remembers a key for 48 hours (postonce never retries after ~43 of them);
* ``409`` means two things, told apart by the error code: ``request_in_progress``
  (wait and retry the same key) and ``request_id_reused`` (never retry);
* it answers ``529`` when overloaded and wants that retried;
* it marks replays with ``Ledger-Replayed: true``.

Here the Ledger is an ``httpx.MockTransport`` handler (no network at all) that
answers the first request ``529`` and loses the answer to the second. The
outboxes are temporary files.
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import postonce
from postonce import Provider, StatusRule

LEDGER = Provider(
    name="ledger",
    key_transport="body",
    key_field="request_id",
    key_min_length=20,
    key_max_length=64,
    key_pattern=r"[A-Za-z0-9-]+",
    retention=timedelta(hours=48),
    in_flight=(StatusRule(status=409, code="request_in_progress"),),
    mismatch=(StatusRule(status=409, code="request_id_reused"),),
    retryable_statuses=frozenset({503, 529}),
    replay_headers=("Ledger-Replayed",),
    sources=("https://ledger.internal.example/docs/idempotency",),
)


class LedgerAPI:
    """The Ledger's side: one posting per request_id, saved answers replayed."""

    def __init__(self) -> None:
        self.saved: dict[str, tuple[dict[str, object], bytes]] = {}
        self.postings: list[dict[str, object]] = []
        self.requests: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        params = json.loads(request.content)
        key = params.pop("request_id")
        self.requests.append(key)
        if len(self.requests) == 1:  # scripted trouble: overloaded, nothing done
            return httpx.Response(529, json={"code": "overloaded"})
        if key in self.saved:
            first_params, answer = self.saved[key]
            if first_params != params:
                return httpx.Response(409, json={"code": "request_id_reused"})
            return httpx.Response(201, content=answer, headers={"Ledger-Replayed": "true"})
        posting = {"id": f"post_{len(self.postings) + 1}", **params}
        self.postings.append(posting)
        self.saved[key] = (params, json.dumps(posting).encode())
        if len(self.requests) == 2:  # scripted trouble: posted, then the answer is lost
            raise httpx.ReadTimeout("the answer never came", request=request)
        return httpx.Response(201, json=posting)


def ledger_client(ledger: LedgerAPI, outbox: Path) -> postonce.Client:
    return postonce.Client(
        "http://ledger.internal.example",
        provider=LEDGER,
        outbox=outbox,
        transport=httpx.MockTransport(ledger),
        retry=postonce.RetryPolicy(wait_initial=0.05, wait_max=0.2),
    )


def main() -> None:
    ledger = LedgerAPI()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ledger_client(ledger, Path(tmp) / "outbox.sqlite3") as client,
        ledger_client(ledger, Path(tmp) / "another-system.sqlite3") as other,
    ):
        posting = {"account": "acct_7", "amount": 4200}
        response = client.post_once("/postings", json=posting, intent="order-1001/post")
        info = response.extensions["postonce"]
        print(f"HTTP {response.status_code} {response.json()}, request_id {info.key}")
        outcomes = [a.outcome.value for a in client.outbox.attempts("order-1001/post")]
        print(f"attempts: {' -> '.join(outcomes)}, replayed: {info.replayed}")

        # A key you choose is checked against the profile before anything is stored.
        try:
            client.post_once("/postings", json=posting, intent="order-1002/post", key="short")
        except postonce.InvalidKey as exc:
            print(f"key='short': {type(exc).__name__}: {exc.message}")
        else:
            raise AssertionError("a key shorter than the profile allows was accepted")

        # Another system reuses our request_id for another posting. The Ledger's 409
        # carries request_id_reused: a mismatch, never retried (not "in flight").
        try:
            other.post_once(
                "/postings", json={**posting, "amount": 1}, intent="their-7/post", key=info.key
            )
        except postonce.IdempotencyKeyMismatch as exc:
            print(f"request_id reused elsewhere: {type(exc).__name__}, not retried")
        else:
            raise AssertionError("the reused request_id was not reported as a mismatch")

    # What this example shows, checked: the profile drove every decision.
    assert len(ledger.postings) == 1
    assert ledger.requests == [info.key] * 4  # 3 sends of ours, 1 of the other system
    assert outcomes == ["retryable", "ambiguous", "final"]
    assert response.status_code == 201
    assert info.replayed
    print(f"the Ledger made {len(ledger.postings)} posting: posted once")


if __name__ == "__main__":
    main()
