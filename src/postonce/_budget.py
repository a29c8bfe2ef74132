"""A client-wide retry budget: an outage must not turn every caller into a retry storm.

Modelled on botocore's "standard" retry mode. Every client starts with
``capacity`` tokens. A retry in the foreground costs ``retry_cost`` tokens
(``timeout_cost`` after a timeout or another send that may have been written,
since those are the retries that load a struggling server most). A success
puts back what its retries cost, or ``success_refund`` token when it needed no
retry, up to ``capacity``. First sends are never charged: only retries are.

With the budget spent, a retry is not sent now: the intent is left pending,
due when the retry would have gone, and the call raises ``IntentPending``.
The drain sends it later at its own pace (the drain is not charged). Nothing
refills with time alone: successes refill the bucket, as in botocore.
"""

from __future__ import annotations

import threading

from ._intent import Outcome

__all__ = ["RetryBudget"]


class RetryBudget:
    """A token bucket shared by every call of one client. Thread-safe."""

    def __init__(
        self,
        capacity: int = 500,
        *,
        retry_cost: int = 5,
        timeout_cost: int = 10,
        success_refund: int = 1,
    ) -> None:
        if capacity < 0 or retry_cost < 0 or timeout_cost < 0 or success_refund < 0:
            raise ValueError("retry budget amounts must not be negative")
        self.capacity = capacity
        self.retry_cost = retry_cost
        self.timeout_cost = timeout_cost
        self.success_refund = success_refund
        self._tokens = capacity
        self._lock = threading.Lock()

    @property
    def available(self) -> int:
        """Tokens left now."""
        return self._tokens

    def cost_of(self, outcome: Outcome) -> int:
        """What retrying after this outcome costs."""
        return self.timeout_cost if outcome is Outcome.AMBIGUOUS else self.retry_cost

    def withdraw(self, outcome: Outcome) -> int | None:
        """Take the cost of one retry after ``outcome``; None if the budget cannot pay it."""
        cost = self.cost_of(outcome)
        with self._lock:
            if cost > self._tokens:
                return None
            self._tokens -= cost
            return cost

    def deposit(self, spent: int) -> None:
        """A call succeeded: refund what its retries cost, or ``success_refund`` if none."""
        with self._lock:
            self._tokens = min(self.capacity, self._tokens + (spent or self.success_refund))

    def __repr__(self) -> str:
        return f"RetryBudget(available={self._tokens}, capacity={self.capacity})"
