"""httpx or httpx2: which HTTP library a client speaks, found from what the caller passed.

httpx2 is httpx's maintained continuation with the same API under another
import name. postonce depends on httpx and uses it by default; a caller who
passes an ``httpx2`` client (``http=``) or transport (``transport=``) gets a
client that builds httpx2 requests, sends with httpx2 and returns httpx2
responses. Nothing changes what ``import httpx`` means in the process.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import httpx

__all__ = ["LIBRARIES", "adapt_timeout", "library_of"]

#: The top-level package names postonce knows to share httpx's API.
LIBRARIES = ("httpx", "httpx2")


def library_of(obj: object) -> ModuleType:
    """The library (module) an httpx-like client or transport belongs to; httpx by default.

    Looks along the class's bases, so a transport written elsewhere that
    subclasses ``httpx2.BaseTransport`` counts as httpx2.
    """
    if obj is None:
        return httpx
    for cls in type(obj).__mro__:
        top = cls.__module__.partition(".")[0]
        if top in LIBRARIES:
            return importlib.import_module(top)
    return httpx


def adapt_timeout(value: object, lib: ModuleType) -> object:
    """A ``Timeout`` of the other library as ``lib``'s own; anything else unchanged.

    Code written for httpx passes ``httpx.Timeout(...)``; an httpx2 client
    cannot read it (nor the reverse), so it is rebuilt with the same values.
    """
    kind = type(value)
    if kind.__name__ != "Timeout" or kind is lib.Timeout:
        return value
    if kind.__module__.partition(".")[0] not in LIBRARIES:
        return value
    return lib.Timeout(**value.as_dict())  # type: ignore[attr-defined]
