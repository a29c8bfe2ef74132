"""An application for the crash tests: each order and its charge written in one transaction.

Usage: python -m tests.enqueue_app BACKEND OUTBOX APP ORDERS BASE_URL PREFIX COUNT

BACKEND is ``sqlite`` (APP: the database file) or ``postgres`` (APP: its URL).
For each of COUNT orders it opens a transaction, inserts the order, enqueues
its charge, and commits; it prints ``ready`` first, then ``committed N``
after each commit. The tests SIGKILL it at random moments: an order and its
charge must be committed both or neither, and a drain must send every
committed charge exactly once.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

import psycopg

import postonce


def main(argv: list[str]) -> int:
    backend, outbox, app, orders, base_url, prefix, count = argv
    with postonce.Client(base_url, outbox=outbox) as client:
        conn: Any = (
            sqlite3.connect(app, timeout=30) if backend == "sqlite" else psycopg.connect(app)
        )
        mark = "?" if backend == "sqlite" else "%s"
        print("ready", flush=True)
        for n in range(int(count)):
            order = f"{prefix}-{n}"
            conn.execute(f"INSERT INTO {orders} (id, state) VALUES ({mark}, 'new')", (order,))
            client.enqueue(
                "/ietf/v1/charges", connection=conn, intent=f"{order}/charge", json={"amount": n}
            )
            conn.commit()
            print(f"committed {n}", flush=True)
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
