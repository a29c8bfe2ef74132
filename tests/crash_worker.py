"""A sending process for the crash tests: post_once a run of intents, then exit.

Usage: python -m tests.crash_worker OUTBOX BASE_URL PREFIX COUNT DELAY LEASE [skip-known]

Prints ``ready`` once its client exists, so the tests can time kills from
then. With ``skip-known`` it leaves intents already in the outbox alone, as a
restarted application would: finishing those is the drain's job.
The tests SIGKILL it at random moments and finish its intents elsewhere.
"""

from __future__ import annotations

import sys

import postonce


def main(argv: list[str]) -> int:
    outbox, base_url, prefix, count, delay, lease, *flags = argv
    retry = postonce.RetryPolicy(
        wait_initial=0.01, wait_max=0.05, in_flight_initial=0.02, in_flight_max=0.1
    )
    with postonce.Client(
        base_url, outbox=outbox, retry=retry, lease_seconds=float(lease)
    ) as client:
        client.outbox  # open it before saying ready  # noqa: B018
        print("ready", flush=True)
        for i in range(int(count)):
            reference = f"{prefix}-{i}"
            if "skip-known" in flags and client.lookup(reference) is not None:
                continue
            client.post_once(
                "/ietf/v1/charges",
                json={"amount": i, "_test": {"delay": float(delay)}},
                intent=reference,
            )
            print(f"done {reference}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
