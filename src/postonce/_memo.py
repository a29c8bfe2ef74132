"""Answers kept by an object's identity: for frozen objects a service passes on every call.

A client's base URL and a provider profile are the same objects call after
call, and hashing them by value (printing a URL, walking a model's fields)
costs more than the answer saves. :class:`ByIdentity` keys an answer by the
object's ``id`` and keeps the object with it: while the answer is kept the
object lives, so no other object can have its id. Only an object that cannot
change may be asked about this way.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["ByIdentity"]

_V = TypeVar("_V")


class ByIdentity(Generic[_V]):
    """At most ``limit`` answers, each about one object (plus hashable ``extra`` parts).

    Full, it starts again empty. Safe from several threads: a lost or a
    repeated ``put`` only costs the answer being worked out again.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept: dict[tuple[Hashable, ...], tuple[object, _V]] = {}

    def get(self, about: object, *extra: Hashable) -> _V | None:
        found = self._kept.get((id(about), *extra))
        return found[1] if found is not None else None

    def put(self, about: object, answer: _V, *extra: Hashable) -> None:
        if len(self._kept) >= self._limit:
            self._kept.clear()
        slot = (id(about), *extra)
        self._kept[slot] = (about, answer)
