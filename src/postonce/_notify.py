"""Providers' notifications: which identifier names the operation, and what one says of an intent.

Pure decisions. :func:`notification_ids` reads, from a notification the
application has already verified with the provider's own library, the
identifier a duplicate shares (the dedup key for ``receive_once``), the
delivery identifier (audit only: a redelivery may carry a new one), and what
the provider echoes of the request behind it. :func:`notification_move` says
what a notification's outcome means for a stored intent.

Each rule cites the provider document it comes from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._exceptions import ConfigurationError, InvalidRequest, UnknownIntent
from ._intent import IntentRecord, State

__all__ = [
    "NOTIFICATION_SOURCES",
    "NotificationIds",
    "Notified",
    "notification_ids",
    "notification_move",
    "notified_intent",
]


@dataclass(frozen=True, slots=True)
class NotificationIds:
    """What identifies one notification, read from its payload."""

    source: str  # the sender, the first half of the dedup key
    event_id: str  # the sender's identifier of the operation: a duplicate carries the same
    delivery_id: str | None = None  # this delivery's, for the audit log only
    idempotency_key: str | None = None  # the key of the request that caused it, if echoed
    reference: str | None = None  # the application's own reference, if echoed


def _text(payload: Mapping[str, Any], field: str, source: str) -> str:
    value = payload.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(
            f"this {source} notification has no {field!r} (a non-empty string): it cannot be "
            "told apart from another, so it is not received; was it verified and parsed "
            "with the provider's library?"
        )
    return value


def _optional(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _stripe(payload: Mapping[str, Any], headers: Mapping[str, str]) -> NotificationIds:
    # "Webhook endpoints might occasionally receive the same event more than once. You can
    # guard against duplicated event receipts by logging the event IDs you've processed."
    # https://docs.stripe.com/webhooks#handle-duplicate-events
    # The event's request.idempotency_key: "The idempotency key transmitted during the
    # request, if any" (populated since API version 2017-05-25).
    # https://docs.stripe.com/api/events/object ; docs.stripe.com/changelog/2017-05-25
    request = payload.get("request")
    key = request.get("idempotency_key") if isinstance(request, Mapping) else None
    return NotificationIds("stripe", _text(payload, "id", "stripe"), None, _optional(key))


def _adyen(payload: Mapping[str, Any], headers: Mapping[str, str]) -> NotificationIds:
    # One NotificationRequestItem (a webhook's notificationItems hold several): Adyen may
    # send the same event more than once; an event is its eventCode for its pspReference.
    # merchantReference is the application's own reference, echoed.
    # https://docs.adyen.com/development-resources/webhooks/handle-webhook-events
    # https://docs.adyen.com/development-resources/webhooks/webhook-types
    item = payload.get("NotificationRequestItem", payload)
    if not isinstance(item, Mapping):
        raise InvalidRequest("this adyen notification has no NotificationRequestItem")
    psp, code = _text(item, "pspReference", "adyen"), _text(item, "eventCode", "adyen")
    return NotificationIds(
        "adyen", f"{code}:{psp}", None, None, _optional(item.get("merchantReference"))
    )


def _paypal(payload: Mapping[str, Any], headers: Mapping[str, str]) -> NotificationIds:
    # The webhook event's id ("The ID of the webhook event notification"); each delivery's
    # PAYPAL-TRANSMISSION-ID header ("The ID of the HTTP transmission"). PayPal retries a
    # delivery up to 25 times over 3 days.
    # https://developer.paypal.com/api/rest/webhooks/rest/
    # https://developer.paypal.com/api/webhooks/v1/#verify-webhook-signature_post
    lowered = {name.lower(): value for name, value in headers.items()}
    delivery = _optional(lowered.get("paypal-transmission-id"))
    return NotificationIds("paypal", _text(payload, "id", "paypal"), delivery)


def _sslcommerz(payload: Mapping[str, Any], headers: Mapping[str, str]) -> NotificationIds:
    # SSLCOMMERZ's Instant Payment Notification: tran_id is the transaction, val_id the
    # validation id to check with its validation API (kept for audit). It documents no
    # retry policy: assume at least once.
    # https://developer.sslcommerz.com/doc/v4/#ipn (and the essay on idempotency keys, part 11)
    transaction, validation = _text(payload, "tran_id", "sslcommerz"), payload.get("val_id")
    return NotificationIds("sslcommerz", transaction, _optional(validation), None, transaction)


Reader = Callable[[Mapping[str, Any], Mapping[str, str]], NotificationIds]

#: Built-in profiles (and senders) whose notifications' identifiers are documented.
NOTIFICATION_SOURCES: dict[str, Reader] = {
    "stripe": _stripe,
    "adyen": _adyen,
    "paypal_orders": _paypal,
    "sslcommerz": _sslcommerz,
}


def notification_ids(
    provider: str, payload: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
) -> NotificationIds:
    """The identifiers of a verified, parsed notification from ``provider``.

    ``provider``: a profile name (``"stripe"``, ``"adyen"``, ``"paypal_orders"``)
    or ``"sslcommerz"``. ``headers``: the delivery's HTTP headers, where the
    provider puts its delivery id there (PayPal). A payload without the
    identifier is refused (:class:`InvalidRequest`): never fall back to a hash of
    the body, which two legitimate notifications can share.
    """
    reader = NOTIFICATION_SOURCES.get(provider.lower())
    if reader is None:
        raise ConfigurationError(
            f"no documented notification identifier for provider {provider!r}: known for "
            f"{', '.join(sorted(NOTIFICATION_SOURCES))}. Call receive_once with the "
            "sender's own operation identifier (its event or transaction id)"
        )
    if not isinstance(payload, Mapping):
        raise InvalidRequest(f"a {provider} notification is a parsed JSON object, not {payload!r}")
    return reader(payload, headers or {})


Move = Literal["resolve", "agrees", "contradicts", "unfinished"]


def notification_move(record: IntentRecord, state: State) -> tuple[Move, str]:
    """What a notification saying the operation ``state`` (succeeded or failed) does to
    ``record``: resolve it (expired or indeterminate), nothing (it agrees, or the intent is
    still being sent: its next send gets the provider's stored answer), or nothing and a
    contradiction to report (a stored ending says otherwise). And why, in words."""
    if state not in (State.SUCCEEDED, State.FAILED):
        raise ValueError(f"a notification says succeeded or failed, not {state.value}")
    if record.state in (State.EXPIRED, State.INDETERMINATE):
        return "resolve", f"{record.state.value}, resolved {state.value} by a notification"
    if record.state is state:
        return "agrees", f"already {state.value}"
    if record.state in (State.PENDING, State.SENDING):
        return "unfinished", (
            f"still {record.state.value}: its next send carries its key and gets the "
            "provider's answer, so the notification changes nothing"
        )
    return "contradicts", (
        f"the outbox holds {record.state.value}, and a notification says {state.value}: "
        "not applied (a stored ending is never overwritten); find out which is true"
    )


@dataclass(frozen=True, slots=True)
class Notified:
    """What ``resolve_from_notification`` did with a notification about an intent."""

    record: IntentRecord  # the intent as stored now
    applied: bool  # the notification resolved it; its settlement follows, as for any ending
    contradiction: str | None  # a stored ending that says otherwise: logged, not applied
    why: str  # in words


def notified_intent(
    record: IntentRecord | None, intent: str | None, key: str | None
) -> IntentRecord:
    """The intent a notification names (by ``intent`` or by idempotency ``key``), or raise."""
    if (intent is None) == (key is None):
        raise TypeError("resolve_from_notification takes intent= or key=, one of them")
    if record is None:
        named = f"intent {intent!r}" if intent is not None else f"idempotency key {key!r}"
        raise UnknownIntent(f"no intent of this outbox has the {named} the notification names")
    return record
