"""Stripe-style checkout: the answer to a charge is lost, postonce retries, Stripe charges once.

Run it from the repository root, with the ``test`` extra installed (for uvicorn)::

    python examples/stripe_checkout.py

It starts the Stripe-shaped emulator (``examples/stripe_emulator.py``) on a
free port on 127.0.0.1, set to lose its first answer: the charge is made, but
the answer never arrives and the client's read timeout fires. ``post_once``
retries with the same ``Idempotency-Key``, the emulator replays the saved
answer, and its ledger shows one charge. The outbox is a temporary file.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import postonce
from examples.stripe_emulator import StripeEmulator, serve

# Stripe's v1 API takes form-encoded parameters: pass them as data=, as with httpx.
ORDER = {"amount": 4200, "currency": "usd", "metadata[order_id]": "1001"}


def main() -> None:
    stripe = StripeEmulator(lose_answers=1)
    with (
        tempfile.TemporaryDirectory() as tmp,
        serve(stripe) as stripe_url,
        postonce.Client(
            stripe_url,  # "https://api.stripe.com" in production
            provider="stripe",
            headers={"Authorization": "Bearer sk_test_emulator"},  # never written to disk
            outbox=Path(tmp) / "outbox.sqlite3",
            timeout=1.0,  # httpx's timeout: how long to wait for an answer
        ) as client,
    ):
        response = client.post_once("/v1/payment_intents", data=ORDER, intent="order-1001/charge")
        info = response.extensions["postonce"]
        payment = response.json()
        print(f"HTTP {response.status_code}: {payment['id']} {payment['status']}, key {info.key}")
        for attempt in client.outbox.attempts("order-1001/charge"):
            print(f"  attempt: {attempt.outcome.value:<10} {attempt.status or attempt.error_type}")
        print(f"replayed by Stripe: {info.replayed}")

        # The customer clicks "Pay" again: the answer comes from the outbox, nothing is sent.
        again = client.post_once("/v1/payment_intents", data=ORDER, intent="order-1001/charge")
        from_outbox = again.extensions["postonce"].from_outbox
        print(f"same intent again: {again.json()['id']}, from the outbox: {from_outbox}")

        # The same order with another amount is another request: refused, nothing is sent.
        try:
            client.post_once(
                "/v1/payment_intents", data={**ORDER, "amount": 9900}, intent="order-1001/charge"
            )
        except postonce.IntentConflict as exc:
            print(f"another amount for the same intent: {type(exc).__name__}")
        else:
            raise AssertionError("a changed request under the same intent was not refused")

        # What this example shows, checked: one charge, one key, the lost answer replayed.
        assert [c["id"] for c in stripe.charges] == [payment["id"]]
        assert stripe.keys_seen == [info.key, info.key]
        assert info.replayed
        assert from_outbox
        assert again.json() == payment
        print(f"Stripe's ledger: {len(stripe.charges)} charge: charged once")


if __name__ == "__main__":
    main()
