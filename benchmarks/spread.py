"""Honest reporting: the spread of a figure over repeats, and a flag when it is too wide.

Every benchmark repeats its measurement and prints, for each arm, the
min/median/max of the per-repeat figure. An arm whose repeats differ by more
than ``UNSTABLE_SPREAD`` (30%: max more than 1.3x min) is flagged ``UNSTABLE``:
on a shared machine that usually means a neighbour, not the code, moved the
figure, and the ratio should not be quoted without saying so.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["UNSTABLE_SPREAD", "Spread", "percentile", "verdict"]

UNSTABLE_SPREAD = 0.30


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@dataclass(frozen=True)
class Spread:
    """One figure measured once per repeat."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        kept = tuple(values)
        if not kept:
            raise ValueError("a spread needs at least one repeat")
        return cls(kept)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def width(self) -> float:
        """(max - min) / min: 0.3 means the largest repeat is 30% above the smallest."""
        low = self.min
        return (self.max - low) / low if low > 0 else float("inf")

    @property
    def unstable(self) -> bool:
        return len(self.values) > 1 and self.width > UNSTABLE_SPREAD

    def text(self, fmt: str = ".0f", *, flag: bool = True) -> str:
        """``min/median/max``, with `` UNSTABLE`` appended when the repeats disagree.

        ``flag=False`` leaves the flag off: for a difference of two figures,
        where "30% apart" means nothing (the figures' own spreads carry it).
        """
        body = f"{self.min:{fmt}}/{self.median:{fmt}}/{self.max:{fmt}}"
        return body + (" UNSTABLE" if flag and self.unstable else "")


def verdict(met: bool, *spreads: Spread) -> str:
    """``met``/``missed``, qualified when a figure behind it is unstable over repeats."""
    word = "met" if met else "missed"
    if any(s.unstable for s in spreads):
        return f"{word}, but UNSTABLE: re-run before quoting it"
    return word
