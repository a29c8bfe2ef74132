"""Helpers for testing code that uses postonce.

:class:`MemoryOutbox` is an outbox held in memory: pass it as ``outbox=`` to a
client in a unit test and nothing is written to disk or to a database, and
nothing is left behind. It keeps the same rules as the SQLite outbox, so the
states, keys, attempts and leases a test sees are the ones production would
store. It does not survive the process and no other process can see it: it
is for tests only, never for production.

:func:`set_testing` removes backoff waits, so a test of your retry handling
runs in milliseconds with the policy you ship, and with ``attempts=N`` caps
each foreground call at N sends, as stamina's ``set_testing`` does.
Everything else stays real: the same key on every retry, the horizon, the
write-ahead.

Example:

```python
import httpx
import postonce
from postonce.testing import MemoryOutbox, set_testing

answers = iter([503, 503, 201])
transport = httpx.MockTransport(lambda request: httpx.Response(next(answers)))

with set_testing(), postonce.Client(
    "https://api.example", outbox=MemoryOutbox(), transport=transport
) as client:
    response = client.post_once("/charges", json={"amount": 100}, intent="order-1/charge")
    assert response.status_code == 201
    assert client.lookup("order-1/charge").attempts == 3
```
"""

from __future__ import annotations

from types import TracebackType

from ._exceptions import ConfigurationError
from ._outbox.memory import MemoryOutbox
from ._policy import TESTING

__all__ = ["MemoryOutbox", "is_testing", "set_testing"]


class set_testing:  # a function to call that is also a context manager
    """Turn testing mode on (or off with ``set_testing(False)``), for the whole process.

    In testing mode retries do not wait: no backoff and no Retry-After wait;
    an in-flight answer (e.g. 409) waits 10 ms. ``attempts=N`` also caps
    every foreground call at N sends (a policy asking for fewer keeps its
    number), so a test of "the call gives up and the drain finishes it"
    needs no policy of its own; ``None`` (the default) leaves the policy's
    count. Call it once in a test suite's set-up, or use it as a context
    manager, which restores the previous mode on exit.
    """

    def __init__(self, on: bool = True, *, attempts: int | None = None) -> None:
        if attempts is not None and (isinstance(attempts, bool) or attempts < 1):
            raise ConfigurationError(f"set_testing(attempts=) must be 1 or more, not {attempts!r}")
        self._before = (TESTING.on, TESTING.attempts)
        TESTING.on = on
        TESTING.attempts = attempts if on else None

    def __enter__(self) -> set_testing:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        TESTING.on, TESTING.attempts = self._before


def is_testing() -> bool:
    """Whether testing mode is on."""
    return TESTING.on
