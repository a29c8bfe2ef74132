"""postonce quickstart: a charge whose answer is lost, retried safely, charged once.

Run it from the repository root: ``python examples/quickstart.py``. The outbox
is the embedded SQLite default (under your user data directory).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import postonce
from examples.demo_server import demo_server


def main() -> None:
    with (
        demo_server(lose_first_response=True) as api,
        postonce.Client(api.url, provider="stripe") as client,
    ):
        intent = f"order-{api.run_id}/charge"
        response = client.post_once(
            "/v1/payment_intents", json={"amount": 4200, "currency": "usd"}, intent=intent
        )
        info = response.extensions["postonce"]
        print(f"intent {intent}: HTTP {response.status_code} {response.json()}")
        print(f"key {info.key}, {info.attempts} attempts, replayed by the server: {info.replayed}")
        for attempt in client.outbox.attempts(intent):
            print(f"  attempt: {attempt.outcome.value:<10} {attempt.status or attempt.error_type}")

        again = client.post_once(
            "/v1/payment_intents", json={"amount": 4200, "currency": "usd"}, intent=intent
        )
        from_outbox = again.extensions["postonce"].from_outbox
        print(f"same intent again: answered from the outbox: {from_outbox}")
        print(f"the server charged {api.charges} time(s)")
        print(f"outbox: {getattr(client.outbox, 'path', client.outbox)}")


if __name__ == "__main__":
    main()
