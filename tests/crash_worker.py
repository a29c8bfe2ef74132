"""A sending process for the crash tests: post_once a run of intents, then exit.

Usage: python -m tests.crash_worker OUTBOX BASE_URL PREFIX COUNT DELAY LEASE
The tests SIGKILL it at a random moment and finish its intents elsewhere.
"""

from __future__ import annotations

import sys

import postonce


def main(argv: list[str]) -> int:
    outbox, base_url, prefix, count, delay, lease = argv
    retry = postonce.RetryPolicy(
        wait_initial=0.01, wait_max=0.05, in_flight_initial=0.02, in_flight_max=0.1
    )
    with postonce.Client(
        base_url, outbox=outbox, retry=retry, lease_seconds=float(lease)
    ) as client:
        for i in range(int(count)):
            client.post_once(
                "/ietf/v1/charges",
                json={"amount": i, "_test": {"delay": float(delay)}},
                intent=f"{prefix}-{i}",
            )
            print(f"done {prefix}-{i}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
