"""A FastAPI app that charges each order once, through one AsyncClient for the whole app.

Run it from the repository root, with ``fastapi``, ``uvicorn`` and ``aiosqlite``
installed::

    python examples/fastapi_app.py

``create_app()`` builds the app: its lifespan opens one ``postonce.AsyncClient``
(one outbox writer thread) and closes it on shutdown. The shop's own SQLite file
holds its ``orders`` table and, beside it, the outbox (``?create=1``: postonce's
tables are named ``postonce_...``). ``POST /orders/{order_id}/pay`` writes the
order and enqueues its charge in one transaction, so an order committed just
before a crash still gets its charge (a drain sends it), then sends the charge
at once with ``post_once`` and the same intent, ``f"order-{order_id}/charge"``,
which resumes the enqueued intent: a retried request, a double click or a second
app process never charges an order twice. An answer that leaves the charge
unknown (``IntentIndeterminate``: a 500 Stripe saved for the key) is "under
review", never "failed".

The demo serves the Stripe emulator (``examples/stripe_emulator.py``) and this
app with uvicorn on 127.0.0.1, pays order 1001 while the emulator loses its first
answer, pays it again, double-clicks order 1002, then checks the emulator's ledger
and the shop's orders. The database is a temporary file.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import aiosqlite
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import postonce
from examples.stripe_emulator import StripeEmulator, serve


class Payment(BaseModel):
    amount: int = Field(ge=50)
    currency: str = "usd"


def create_app(stripe_url: str, *, api_key: str, database: Path) -> FastAPI:
    """The shop's API, its orders and its outbox in the SQLite file ``database``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with aiosqlite.connect(database) as db:
            await db.execute(
                "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, amount INTEGER,"
                " state TEXT NOT NULL)"
            )
            await db.commit()
        async with postonce.AsyncClient(
            stripe_url,
            provider="stripe",
            headers={"Authorization": f"Bearer {api_key}"},
            outbox=f"sqlite:///{database}?create=1",
            timeout=1.0,  # short, for the demo: a lost answer is retried after 1 s
        ) as stripe:
            stripe.outbox  # noqa: B018 (opened at start, before any transaction of the shop's)
            app.state.stripe = stripe
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders/{order_id}/pay", response_model=None)
    async def pay(
        order_id: int, payment: Payment, request: Request
    ) -> dict[str, Any] | JSONResponse:
        stripe: postonce.AsyncClient = request.app.state.stripe
        params = {
            "amount": payment.amount,
            "currency": payment.currency,
            "metadata[order_id]": order_id,
        }
        intent = f"order-{order_id}/charge"
        # The order and its charge commit together: if the process dies after this
        # commit, a drain still charges the order; before it, neither exists.
        async with aiosqlite.connect(database) as db:
            await db.execute(
                "INSERT INTO orders (id, amount, state) VALUES (?, ?, 'new')"
                " ON CONFLICT (id) DO NOTHING",
                (order_id, payment.amount),
            )
            await stripe.enqueue("/v1/payment_intents", connection=db, data=params, intent=intent)
            await db.commit()
        try:  # the answer now, in this request: resumes the enqueued intent with its key
            response = await stripe.post_once("/v1/payment_intents", data=params, intent=intent)
        except postonce.IntentPending:  # stored; the drain will finish it
            return JSONResponse({"order_id": order_id, "status": "pending"}, status_code=202)
        except postonce.IntentConflict:  # this order was charged with other parameters
            return JSONResponse({"order_id": order_id, "status": "conflict"}, status_code=409)
        except (postonce.IntentIndeterminate, postonce.IntentExpired):
            # Stripe's answer (a 500 it saved) or its silence leaves the charge unknown: it
            # may have been made. Under review until a reconciler or a person finds out;
            # never "failed", which would invite the customer to pay again.
            return JSONResponse({"order_id": order_id, "status": "under_review"}, status_code=202)
        except postonce.IntentResolved as exc:  # was under review; now found out
            status = "paid" if exc.state == "succeeded" else "payment_failed"
            return JSONResponse({"order_id": order_id, "status": status}, status_code=200)
        if response.is_error:  # a declined card (402) is Stripe's answer: pass it on
            return JSONResponse(response.json(), status_code=response.status_code)
        async with aiosqlite.connect(database) as db:
            await db.execute("UPDATE orders SET state = 'paid' WHERE id = ?", (order_id,))
            await db.commit()
        info = response.extensions["postonce"]
        return {
            "order_id": order_id,
            "payment_intent": response.json()["id"],
            "attempts": info.attempts,
            "replayed": info.replayed,
            "from_outbox": info.from_outbox,
        }

    return app


def main() -> None:
    stripe = StripeEmulator(lose_answers=1)
    with tempfile.TemporaryDirectory() as tmp, serve(stripe) as stripe_url:
        database = Path(tmp) / "shop.db"
        app = create_app(stripe_url, api_key="sk_test_emulator", database=database)
        with serve(app, lifespan="on") as shop_url, httpx.Client(base_url=shop_url) as shop:

            def pay(order_id: int) -> dict[str, Any]:
                answer = shop.post(f"/orders/{order_id}/pay", json={"amount": 4200}, timeout=30)
                assert answer.status_code == 200, answer.text
                print(f"POST /orders/{order_id}/pay -> {answer.status_code} {answer.text}")
                result: dict[str, Any] = answer.json()
                return result

            first = pay(1001)  # Stripe's first answer is lost: retried with the same key
            again = pay(1001)  # paid again: answered from the outbox
            stripe.processing_seconds = 0.3  # slow enough for two clicks to overlap
            with ThreadPoolExecutor(2) as pool:
                clicks = list(pool.map(pay, [1002, 1002]))

        # What this example shows, checked: one charge per order, whatever the clicks.
        orders = sorted(c["metadata"]["order_id"] for c in stripe.charges)
        assert orders == ["1001", "1002"], orders
        assert first["replayed"]
        assert again["from_outbox"]
        assert again["payment_intent"] == first["payment_intent"]
        assert clicks[0]["payment_intent"] == clicks[1]["payment_intent"]
        with closing(sqlite3.connect(database)) as db:
            paid = db.execute("SELECT id, state FROM orders ORDER BY id").fetchall()
        assert paid == [(1001, "paid"), (1002, "paid")], paid
        print(f"Stripe's ledger: {len(stripe.charges)} charges, 2 orders: charged once per order")


if __name__ == "__main__":
    main()
