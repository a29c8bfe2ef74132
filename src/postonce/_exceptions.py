"""The one exception tree of postonce.

Every error postonce raises derives from :class:`PostonceError`::

    PostonceError
    ├── ConfigurationError        a programmer error in how a client was set up
    │   └── UnknownProvider       a provider name with no built-in profile
    ├── InvalidRequest            this call's input was refused before anything was stored
    │   └── InvalidKey            a key the provider cannot take raw on the wire
    ├── OutboxError               the outbox failed, and nothing was stored or sent
    ├── UnknownIntent             no intent of this client has that name (also a KeyError)
    └── IntentError               what became of one stored intent
        ├── IntentConflict        same intent, different request (nothing sent)
        ├── IntentPending         stored, not finished here: the drain finishes it
        ├── IntentExpired         the provider may have forgotten the key: reconcile by hand
        ├── IntentIndeterminate   the answer leaves the effect unknown (a stored 5xx): reconcile
        ├── IntentCancelled       never delivered and stopped (operator or deadline)
        ├── IntentPurged          finished long ago; only its tombstone is left
        ├── IntentResolved        expired or indeterminate, then resolved; no answer to give
        └── IdempotencyKeyMismatch the server says the key was used with another request

Errors raised while handling an intent carry the caller's name for it as
``intent`` (what was passed as ``intent=``, else the key) and, once a key
exists, its ``key``, and name both in their message (an ``IntentError``
always has both). ``reference`` is a deprecated alias of ``intent``; the
constructors take ``intent=`` and, as before, ``reference=``. Delivery
outcomes that are answers (a 402, a 4xx the provider gives) are not errors:
they come back as the ``httpx.Response``. An answer that leaves the effect
unknown (a 5xx the provider stored and replays) is ``IntentIndeterminate``.
"""

from __future__ import annotations

import warnings

import httpx

__all__ = [
    "ConfigurationError",
    "IdempotencyKeyMismatch",
    "IntentCancelled",
    "IntentConflict",
    "IntentError",
    "IntentExpired",
    "IntentIndeterminate",
    "IntentPending",
    "IntentPurged",
    "IntentResolved",
    "InvalidKey",
    "InvalidRequest",
    "OutboxError",
    "PostonceError",
    "UnknownIntent",
    "UnknownProvider",
]


def _one_name(intent: str | None, reference: str | None) -> str | None:
    """``intent=``, or the older ``reference=`` spelling; both must agree when both are given."""
    if intent is not None and reference is not None and intent != reference:
        raise TypeError(f"intent={intent!r} and reference={reference!r} disagree; pass intent=")
    return intent if intent is not None else reference


class PostonceError(Exception):
    """Root of every error postonce raises.

    ``intent`` names the intent (``None`` when the error is not about one),
    ``key`` its idempotency key once one exists.
    """

    intent: str | None

    def __init__(
        self,
        message: str,
        *,
        intent: str | None = None,
        key: str | None = None,
        reference: str | None = None,
    ) -> None:
        self.intent = _one_name(intent, reference)
        self.key = key
        self.message = message
        super().__init__(self._render())

    @property
    def reference(self) -> str | None:
        """Deprecated alias of :attr:`intent`."""
        warnings.warn(
            "PostonceError.reference is deprecated; use .intent", DeprecationWarning, stacklevel=2
        )
        return self.intent

    def _render(self) -> str:
        named = []
        if self.intent is not None:
            named.append(f"intent {self.intent!r}")
        if self.key is not None:
            named.append(f"key {self.key}")
        return f"{self.message} ({', '.join(named)})" if named else self.message


class ConfigurationError(PostonceError):
    """The client, a profile or a policy was set up wrongly."""


class UnknownProvider(ConfigurationError):
    """A provider was named that has no built-in profile."""


class InvalidRequest(PostonceError):
    """The request could not become an intent: nothing was stored or sent."""


class InvalidKey(InvalidRequest):
    """The key breaks the provider's rules or cannot travel raw on the wire."""


class OutboxError(PostonceError):
    """The outbox could not be opened, read or written, and nothing was stored or sent.

    From a ``*_once`` call it means exactly that: the intent is not in the
    outbox (a write-ahead that raised is tried again and read back before this
    is raised) and no request left. A failure after the intent was stored is
    :class:`IntentPending` instead, chained from this error. From a read
    (``lookup``, ``wait``, the CLI) it says only that the read failed.
    """


class UnknownIntent(PostonceError, KeyError):
    """No intent of this client is stored under the name asked for.

    Also a ``KeyError``, which ``wait()``, ``resolve()`` and ``cancel()`` raised
    before: code that caught that still catches this.
    """

    def __str__(self) -> str:
        # KeyError's own str() is the repr of its argument: the message in quotes.
        return self._render()


class IntentError(PostonceError):
    """Something about one stored intent stops this call. Names its intent and key."""

    intent: str
    key: str
    #: The error stands for an ending read from the outbox: nothing ended in this call.
    from_outbox: bool = False

    def __init__(
        self,
        message: str,
        *,
        intent: str | None = None,
        key: str,
        reference: str | None = None,
    ) -> None:
        name = _one_name(intent, reference)
        if name is None:
            raise TypeError(f"{type(self).__name__} needs intent=")
        super().__init__(message, intent=name, key=key)

    @property
    def reference(self) -> str:
        """Deprecated alias of :attr:`intent`."""
        warnings.warn(
            "IntentError.reference is deprecated; use .intent", DeprecationWarning, stacklevel=2
        )
        return self.intent


class IntentConflict(IntentError):
    """The reference is already stored for a different request; nothing was sent."""


class IntentPending(IntentError):
    """The intent is stored and not finished by this call: the drain finishes it, same key.

    Raised when the foreground budget ran out, when another worker holds the
    intent, and when the outbox failed after the write-ahead (recording an
    answer, say: chained from the :class:`OutboxError`). One case says less:
    when the write-ahead raised and the outbox cannot even be read, the
    message says the intent *may* be stored; calling again with the same
    ``intent=`` finds out (never retry it under a new one). ``due_at`` is the
    Unix time at which the intent may next be sent, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        intent: str | None = None,
        key: str,
        due_at: float | None = None,
        reference: str | None = None,
    ) -> None:
        self.due_at = due_at
        super().__init__(message, intent=intent, key=key, reference=reference)


class IntentExpired(IntentError):
    """Delivery was ambiguous and the provider may have forgotten the key.

    The intent is never sent again, with this key or any other: a person or a
    reconciliation job must look up whether the provider executed it.
    """


class IntentIndeterminate(IntentError):
    """The provider's answer ends the intent without saying whether it took effect.

    A 5xx the provider stored for the key and replays (Stripe calls a 500
    indeterminate), or one it says not to retry: no retry can change it, and
    it does not prove the charge absent. It is not a failure: never act on it
    as one. A drain's reconciler (``reconcile=``) asks the provider and
    resolves the intent to succeeded or failed; ``response`` is the answer.
    """

    def __init__(
        self,
        message: str,
        *,
        intent: str | None = None,
        key: str,
        response: httpx.Response | None = None,
        reference: str | None = None,
    ) -> None:
        self.response = response
        super().__init__(message, intent=intent, key=key, reference=reference)


class IntentCancelled(IntentError):
    """The intent was never delivered and will not be: cancelled or past its deadline."""


class IntentPurged(IntentError):
    """The intent finished and was purged; its tombstone refuses a second execution."""


class IntentResolved(IntentError):
    """The intent expired or was indeterminate, and was resolved; there is no answer to return.

    ``state`` is what the operator or the reconciler recorded (succeeded or
    failed), ``note`` why.
    """

    def __init__(
        self,
        message: str,
        *,
        intent: str | None = None,
        key: str,
        state: str = "",
        note: str = "",
        reference: str | None = None,
    ) -> None:
        self.state = state
        self.note = note
        super().__init__(message, intent=intent, key=key, reference=reference)


class IdempotencyKeyMismatch(IntentError):
    """The server reports the key was first used with a different request.

    ``response`` is the server's answer. This is never retried.
    """

    def __init__(
        self,
        message: str,
        *,
        intent: str | None = None,
        key: str,
        response: httpx.Response | None = None,
        reference: str | None = None,
    ) -> None:
        self.response = response
        super().__init__(message, intent=intent, key=key, reference=reference)
