"""An application for the settlement crash test: ``postonce drain --app tests.settle_app:client``.

Its settlement handler is the application's own side: it appends ``done REF``
to a ledger file (``POSTONCE_TEST_SETTLE_LEDGER``) after a short piece of work,
flushed to disk, so a SIGKILL can land between the intent's terminal record
and the handler's completion. The test deduplicates the ledger by intent.
"""

from __future__ import annotations

import os
import time

import postonce
from tests.http_library import default_transport


def settled(settlement: postonce.Settlement) -> None:
    """Mark the order paid: here, a line in the ledger (idempotent by intent downstream)."""
    time.sleep(0.01)  # the application's own work: a window for the kills
    with open(os.environ["POSTONCE_TEST_SETTLE_LEDGER"], "a") as ledger:
        ledger.write(f"done {settlement.intent} {settlement.state.value}\n")
        ledger.flush()
        os.fsync(ledger.fileno())


client = postonce.Client(
    os.environ.get("POSTONCE_TEST_BASE_URL", "http://127.0.0.1:9"),
    name="settle-crash",
    transport=default_transport(),
    outbox=os.environ.get("POSTONCE_TEST_OUTBOX"),
    lease_seconds=1.0,  # a killed drain's settlements are taken over within a second
    on_settled=settled,
)
