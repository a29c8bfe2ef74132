"""A sending process for the crash tests: post_once a run of intents, then exit.

Usage: python -m tests.crash_worker OUTBOX BASE_URL PREFIX COUNT DELAY LEASE [skip-known] [async]
(LEASE: seconds, or ``default`` for the library's own lease and heartbeat.)

Prints ``ready`` once its client exists, so the tests can time kills from
then. With ``skip-known`` it leaves intents already in the outbox alone, as a
restarted application would: finishing those is the drain's job.
With ``async`` it sends through AsyncClient instead of Client.
The tests SIGKILL it at random moments and finish its intents elsewhere.
"""

from __future__ import annotations

import sys

import anyio

import postonce
from tests.http_library import default_transport


def main(argv: list[str]) -> int:
    outbox, base_url, prefix, count, delay, lease, *flags = argv
    retry = postonce.RetryPolicy(
        wait_initial=0.01, wait_max=0.05, in_flight_initial=0.02, in_flight_max=0.1
    )
    options: dict[str, object] = {"outbox": outbox, "retry": retry}
    if lease != "default":  # "default": the library's own lease and heartbeat
        options["lease_seconds"] = float(lease)
    transport = default_transport("async" if "async" in flags else "sync")
    if transport is not None:  # the CI pass on httpx2
        options["transport"] = transport
    references = [f"{prefix}-{i}" for i in range(int(count))]

    def body(reference: str) -> dict[str, object]:
        return {"amount": int(reference.rsplit("-", 1)[1]), "_test": {"delay": float(delay)}}

    if "async" in flags:

        async def run_async() -> None:
            async with postonce.AsyncClient(base_url, **options) as client:  # type: ignore[arg-type]
                await client.lookup("-")  # open the outbox before saying ready
                print("ready", flush=True)
                for reference in references:
                    if "skip-known" in flags and await client.lookup(reference) is not None:
                        continue
                    await client.post_once(
                        "/ietf/v1/charges", json=body(reference), intent=reference
                    )
                    print(f"done {reference}", flush=True)

        anyio.run(run_async)
        return 0

    with postonce.Client(base_url, **options) as client:  # type: ignore[arg-type]
        client.lookup("-")  # open the outbox before saying ready
        print("ready", flush=True)
        for reference in references:
            if "skip-known" in flags and client.lookup(reference) is not None:
                continue
            client.post_once("/ietf/v1/charges", json=body(reference), intent=reference)
            print(f"done {reference}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
