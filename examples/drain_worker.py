"""A drain worker: charges whose first sends failed are finished later, once each.

Run it from the repository root, with the ``test`` extra installed (for uvicorn)::

    python examples/drain_worker.py

1. Stripe (the emulator in ``examples/stripe_emulator.py``) is down: its port
   on 127.0.0.1 is reserved but nothing listens, so connections are refused.
   Two orders are charged; ``post_once``, told to try once in the foreground,
   leaves each pending in the outbox and raises ``IntentPending``.
2. Stripe is up but unwell: it answers ``503`` with ``Retry-After: 1``. A
   third order is left pending the same way.
3. Stripe recovers, and one drain pass, ``client.drain()``, sends every due
   intent with the key stored at its first try. ``postonce drain --app
   module:client`` runs the same pass from the command line, or a worker with
   ``--forever``.

The outbox is a temporary file.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import postonce
from examples.stripe_emulator import StripeEmulator, serve


def charge(client: postonce.Client, order_id: int) -> postonce.IntentPending:
    """Charge an order while Stripe is in trouble: the intent is left for the drain."""
    order = {"amount": 1000 + order_id, "currency": "usd", "metadata[order_id]": str(order_id)}
    try:
        client.post_once("/v1/payment_intents", data=order, intent=f"order-{order_id}/charge")
    except postonce.IntentPending as exc:
        print(f"{exc.intent}: pending, key {exc.key}")
        return exc
    raise AssertionError("Stripe was not supposed to answer")


def main() -> None:
    stripe = StripeEmulator()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # Stripe's address; nobody is listening on it yet
    stripe_url = "http://{}:{}".format(*sock.getsockname())
    with (
        tempfile.TemporaryDirectory() as tmp,
        postonce.Client(
            stripe_url,
            provider="stripe",
            headers={"Authorization": "Bearer sk_test_emulator"},  # the drain sends with these
            outbox=Path(tmp) / "outbox.sqlite3",
            retry=postonce.RetryPolicy(attempts=1, wait_initial=0.1, wait_max=0.5),
        ) as client,
    ):
        print("Stripe is down:")
        pending = [charge(client, 1), charge(client, 2)]
        with serve(stripe, sock):
            print("Stripe answers 503:")
            stripe.outage = True
            pending.append(charge(client, 3))

            print("Stripe is back; one drain pass:")
            stripe.outage = False
            # One pass takes the intents already due: wait for the last due time.
            time.sleep(max(0.0, max(p.due_at or 0.0 for p in pending) - time.time()))
            report = client.drain()
            print(report.model_dump_json())
            for p in pending:
                record = client.lookup(p.intent)
                assert record is not None
                print(f"{p.intent}: {record.state.value} after {record.attempts} attempt(s)")

        # What this example shows, checked: every order charged once, with its first key.
        keys = [p.key for p in pending]
        assert sorted(c["metadata"]["order_id"] for c in stripe.charges) == ["1", "2", "3"]
        sends = {keys[0]: 1, keys[1]: 1, keys[2]: 2}  # order 3 also got the 503
        assert Counter(stripe.keys_seen) == sends, "the drain must send the stored keys"
        assert report.ok
        assert report.claimed == report.succeeded == 3
        print(f"drained {report.succeeded} intents: each order charged once")


if __name__ == "__main__":
    main()
