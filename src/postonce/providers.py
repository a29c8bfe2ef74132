"""Provider profiles: the facts of each API's idempotency-key contract.

A :class:`Provider` says how the key travels (a header or a JSON body field),
which keys the API takes, how long it remembers a key (the floor of its
documented retention, which bounds postonce's retry horizon), which answers
mean "still in flight" or "key reused with another request", and how it marks
replays, which answers are retried with the same key although their status
says otherwise, and which leave the effect unknown. Built-in profiles are looked
up by name (case-insensitively); every fact cites its source.

Where a provider does not document a fact, the profile takes the value that
errs on the safe side and its docstring says so: a *shorter* retention (the
horizon closes early and the intent is surfaced for reconciliation rather than
re-sent into a forgotten key), a *shorter* maximum key length (36, the length
of the canonical UUIDv4 postonce mints), and "in flight" for an unexplained 409
(waiting and re-sending the same key is safe where a new key would not be).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ._exceptions import UnknownProvider
from ._memo import ByIdentity

__all__ = [
    "BUILTIN_PROVIDERS",
    "Provider",
    "ServerErrors",
    "StatusRule",
    "get_provider",
    "provider_identity",
    "same_provider",
]

_HOUR = 3600.0
_DAY = 24 * _HOUR
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
#: The error codes the AWS SDKs' standard retry mode retries whatever their status
#: (botocore/retries/standard.py: transient, then throttling codes).
_AWS_RETRYABLE_CODES = (
    "RequestTimeout",
    "RequestTimeoutException",
    "PriorRequestNotComplete",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "EC2ThrottledException",
)


class StatusRule(BaseModel):
    """An answer recognised by its status, its error code in the body, or both.

    ``status=None`` matches any status; ``code=None`` matches any body. A code
    matches a string value under a key such as ``code``, ``type``, ``errorCode``
    or ``reason`` anywhere in a JSON error body (an AWS ``__type`` such as
    ``com.amazon.coral.availability#ThrottlingException`` also as the part after
    ``#``), or, for a body that is not JSON, the code appearing in its text as a
    whole word (``<Code>Throttling</Code>``). ``content_type``, when set, must be
    the answer's media type too (parameters such as ``charset`` ignored), e.g.
    ``application/problem+json`` for the error shape the IETF draft describes.
    ``link_rel``, when set, the answer must carry a ``Link`` header with that
    relation type (compared case-insensitively), e.g. ``describedby`` for the
    draft's other error shape, ``Link: <https://...>; rel="describedby"``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: int | None = None
    code: str | None = None
    content_type: str | None = None
    link_rel: str | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> StatusRule:
        if self.status is None and self.code is None:
            raise ValueError("a StatusRule needs a status, a code, or both")
        return self


#: What a provider documents about a 5xx answer, and so how postonce reads one
#: that no other rule of the profile matched (see :class:`Provider`).
ServerErrors = Literal["retry", "not_stored", "replayed", "hint", "undocumented"]


class Provider(BaseModel):
    """The idempotency contract of one API, as postonce needs to know it.

    An answer of 400 or more is read in this order (``postonce._classify``):

    1. ``mismatch``: the key was used with another request (believed only when
       an earlier attempt with the key may have reached the server); never
       retried, whatever the retry hint says.
    2. ``in_flight``: an earlier request with the key is still running; wait and
       send the same key again. If the retry hint says ``false``, the provider
       asks not to: the intent ends *indeterminate* when an earlier attempt with
       the key may have reached the server (its effect is unknown), *final* when
       none can have.
    3. The retry hint header (``retry_hint_header``) saying ``true``: retried with
       the same key.
    4. ``indeterminate``: answers the provider documents as "outcome unknown";
       never retried, never called failed, reconciled.
    5. The retry hint saying ``false``: a 5xx is indeterminate (it may have been
       executed), any other answer final.
    6. ``retryable`` rules, then ``retryable_statuses``: retried with the same key.
    7. Any other 5xx: ``server_errors`` decides.
    8. Anything else is a final answer.

    Example, a custom profile for an internal service:

    ```python
    Provider(
        name="ledger",
        key_field="X-Request-Key",
        key_max_length=64,
        retention=timedelta(hours=48),
        in_flight=(StatusRule(status=409),),
        mismatch=(StatusRule(status=422),),
        retryable=(StatusRule(status=400, code="ledger_locked"),),
        indeterminate=(StatusRule(status=500, code="outcome_unknown"),),
    )
    ```
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    key_transport: Literal["header", "body"] = "header"
    #: The header name, or the top-level JSON body field, that carries the key.
    key_field: str = "Idempotency-Key"
    key_min_length: int = Field(default=1, ge=1)
    key_max_length: int = Field(default=255, ge=1)
    #: A regular expression the whole key must match, on top of the universal rule
    #: (printable ASCII without quotes, backslashes or spaces).
    key_pattern: str | None = None
    #: The floor of the provider's documented key retention.
    retention: timedelta
    #: Answers meaning "a request with this key is still being processed": wait, same key.
    in_flight: tuple[StatusRule, ...] = (StatusRule(status=409),)
    #: Answers meaning "this key was used with another request": never retried.
    mismatch: tuple[StatusRule, ...] = ()
    #: Answers retried with the same key whatever their status says, matched by status
    #: and/or error code: e.g. AWS's throttling errors, which arrive as a 400.
    retryable: tuple[StatusRule, ...] = ()
    #: Answers the provider documents as "outcome unknown": the request may or may not
    #: have taken effect, and sending it again would not tell. Never retried and never
    #: called failed: the intent ends ``indeterminate`` and is reconciled.
    indeterminate: tuple[StatusRule, ...] = ()
    #: Statuses retried with the same key when no rule above matched.
    retryable_statuses: frozenset[int] = frozenset({429, 502, 503, 504})
    #: What the provider documents about a 5xx answer, which decides how postonce
    #: reads one that no rule above and no retry hint settled:
    #:
    #: - ``"retry"``: the provider says to retry a 5xx with the same key: retryable.
    #: - ``"not_stored"``: only successes are stored, so nothing stands behind the key
    #:   and the same key is executed again: retryable.
    #: - ``"replayed"``: a 5xx produced while executing is stored and replayed: retryable
    #:   (the first 5xx may be a proxy's, or the result indeterminate), until an answer
    #:   carries a replay marker (``replay_headers``): that is the stored answer, and
    #:   it leaves the effect unknown: indeterminate (never retried, reconciled).
    #: - ``"hint"``: only the retry hint header (``retry_hint_header: true``) says retry;
    #:   a 5xx without it is not retried, as the provider documents, and leaves the
    #:   effect unknown: indeterminate.
    #: - ``"undocumented"``: retryable, the safe reading: the same key again can only be
    #:   deduplicated or answered alike, while a caller handed a 5xx might retry with a
    #:   new key and pay twice.
    #:
    #: Every 5xx read as retryable counts as possibly delivered: it starts the horizon.
    server_errors: ServerErrors = "undocumented"
    #: Headers whose value ``true`` marks an answer as a replay.
    replay_headers: tuple[str, ...] = ("Idempotent-Replayed",)
    #: A header saying ``true``/``false`` whether to retry. It overrides every rule but
    #: ``mismatch``: ``true`` retries with the same key (even an ``indeterminate`` rule's
    #: answer); ``false`` stops retries, even of an in-flight answer (see the order above).
    retry_hint_header: str | None = None
    #: Request headers that carry this provider's credentials besides ``Authorization``
    #: (which is always secret): never stored, compared only as a slow hash for the
    #: sender identity, supplied again by whoever sends.
    credential_headers: frozenset[str] = frozenset()
    #: What this provider's ``Authorization`` header carries, which decides whether a
    #: client's default sender identity may be derived from it (see the senders guide):
    #:
    #: - ``"api_key"``: a long-lived secret key (Stripe's ``sk_...``): the same in every
    #:   process until someone rolls it, so a slow hash of it names the account.
    #: - ``"token"``: an access token that is fetched at start-up and refreshed (OAuth 2.0,
    #:   AWS temporary credentials): a hash of it would change at each refresh and leave
    #:   the previous process's intents to no one, so it never names a sender.
    #: - ``None``: not documented, or both are in use: postonce cannot tell.
    #:
    #: ``Basic`` credentials (a user and password) are long-lived whatever this says; a
    #: JWT access token names its account by its ``iss`` and ``sub`` claims.
    credentials: Literal["api_key", "token"] | None = None
    #: Request headers that choose the account a key acts for (Stripe's
    #: ``Stripe-Account``): not secret, so stored and sent again by drains, and part of
    #: the intent's fingerprint, so the same intent for another account is a conflict.
    scope_headers: frozenset[str] = frozenset()
    sources: tuple[str, ...] = ()

    @field_validator("credential_headers", "scope_headers")
    @classmethod
    def _lower(cls, value: frozenset[str]) -> frozenset[str]:
        # Header names compare case-insensitively: kept in the one spelling compared.
        return frozenset(name.lower() for name in value)

    @field_validator("key_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:  # not a ValueError: pydantic would let it escape
                raise ValueError(f"key_pattern is not a regular expression: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _lengths(self) -> Provider:
        if self.key_min_length > self.key_max_length:
            raise ValueError("key_min_length is greater than key_max_length")
        if self.retention <= timedelta(0):
            raise ValueError("retention must be positive")
        both = self.scope_headers & self.credential_headers
        if both:
            # A scope header is stored and sent again by drains; a credential never is.
            raise ValueError(
                f"{', '.join(sorted(both))} cannot be both a scope header (stored) and a "
                "credential header (never stored)"
            )
        if self.key_transport == "header" and self.key_field.lower() in self.scope_headers:
            raise ValueError(f"the key's own header {self.key_field!r} cannot be a scope header")
        return self


def _profiles() -> dict[str, Provider]:
    stripe = Provider(
        # Stripe API v1. Key charset not documented: the universal rule applies. Stripe
        # calls a 500 indeterminate, and stripe-python retries >= 500 with the same key.
        # stripe-python and stripe-node read Stripe-Should-Retry before their 409 and
        # 5xx rules: "false" is never retried, a 409 included.
        name="stripe",
        key_max_length=255,
        retention=timedelta(hours=24),  # "at least 24 hours old" before pruning
        in_flight=(StatusRule(status=409),),  # idempotency_key_in_use, unless Should-Retry: false
        mismatch=(
            StatusRule(status=400, code="idempotency_error"),
            StatusRule(status=404, code="idempotency_error"),  # stripe-python maps both
        ),
        server_errors="replayed",  # saved and replayed "including 500 errors"; see the notes
        replay_headers=("Idempotent-Replayed",),
        retry_hint_header="Stripe-Should-Retry",
        credentials="api_key",  # secret (sk_) and restricted (rk_) keys, as Bearer or Basic
        # Connect: the connected account a platform's key acts for; keys are unique per
        # account, so another account's request with the same key is another request.
        # Stripe-Context supersedes Stripe-Account.
        scope_headers=frozenset({"stripe-account", "stripe-context"}),
        sources=(
            "https://docs.stripe.com/api/idempotent_requests",
            "https://docs.stripe.com/idempotency",
            "https://docs.stripe.com/error-codes#idempotency-key-in-use",
            "https://docs.stripe.com/error-low-level#server-errors",
            "https://docs.stripe.com/keys",
            "https://docs.stripe.com/connect/authentication",
            "https://docs.stripe.com/context",
            "github.com/stripe/stripe-python stripe/_api_requestor.py, stripe/_http_client.py",
            "github.com/stripe/stripe-node src/RequestSender.ts (_shouldRetry)",
            "https://github.com/stripe/stripe-ruby/issues/503",
        ),
    )
    adyen = Provider(
        # Mismatch and 5xx replay are not documented: an unknown 4xx is a final answer.
        # Retry only on "transient-error: true" (then with the same key); without it,
        # Adyen says not to retry.
        name="adyen",
        key_max_length=64,
        retention=timedelta(days=7),  # "minimum period of 7 days" (legacy page: 31)
        in_flight=(StatusRule(status=409), StatusRule(status=422, code="704")),
        mismatch=(),
        server_errors="hint",  # "transient-error: true" => retry; else do not: indeterminate
        replay_headers=(),  # Adyen echoes idempotency-key, it marks no replay
        retry_hint_header="transient-error",
        credential_headers=frozenset({"x-api-key"}),  # "an API key in an x-API-key header"
        credentials="api_key",  # an API key, or basic auth with a web service user's password
        sources=(
            "https://docs.adyen.com/development-resources/api-idempotency",
            "https://docs.adyen.com/development-resources/api-authentication",
        ),
    )
    checkout = Provider(
        # Max key length not documented: 36 (a UUIDv4, which Checkout.com recommends).
        name="checkout",
        key_field="Cko-Idempotency-Key",
        key_max_length=36,
        retention=timedelta(hours=24),  # default expiry, sandbox and production
        in_flight=(StatusRule(status=409),),  # formerly 429, which is retryable anyway
        server_errors="not_stored",  # only 2xx cached; after a 4xx/5xx "the payment is reattempted"
        replay_headers=(),
        # Secret keys, or OAuth 2.0 access tokens fetched with an access key pair: both
        # travel in Authorization, so postonce cannot tell which a client carries.
        credentials=None,
        sources=(
            "https://www.checkout.com/docs/payments/manage-payments/idempotency",
            "https://www.checkout.com/docs/payments/manage-payments/retry-a-payment",
            "https://support.checkout.com/hc/en-us/articles/24570669653010",
            "https://www.checkout.com/docs/developer-resources/api/manage-api-keys/oauth-2-0-client-credentials",
        ),
    )
    mollie = Provider(
        # Mollie answers a reused key with 400, like any validation error, with no
        # documented code: postonce cannot tell them apart, so a 400 is a final answer.
        # Max key length not documented: 36.
        name="mollie",
        key_max_length=36,
        retention=timedelta(hours=24),  # "Keys older than 24 hours will be removed"
        in_flight=(StatusRule(status=409),),
        replay_headers=("Idempotent-Replayed",),
        sources=(
            "https://docs.mollie.com/reference/api-idempotency",
            "github.com/mollie/api-documentation source/overview/api-idempotency.rst",
        ),
    )
    modern_treasury = Provider(
        # Max key length not documented: 36. Only successes are saved and replayed.
        name="modern_treasury",
        key_max_length=36,
        retention=timedelta(hours=24),
        in_flight=(StatusRule(status=409),),
        server_errors="not_stored",  # "only successful executions are saved"
        sources=("https://docs.moderntreasury.com/reference/idempotent-requests",),
    )
    increase = Provider(
        # Retention not documented: 24 hours. In-flight answer not documented: a 409
        # without the key-reuse code is taken as in flight.
        name="increase",
        key_max_length=200,
        retention=timedelta(hours=24),
        in_flight=(StatusRule(status=409),),
        mismatch=(StatusRule(status=409, code="idempotency_key_already_used_error"),),
        replay_headers=("Idempotent-Replayed",),
        sources=(
            "https://increase.com/documentation/idempotency-keys",
            "https://www.increase.com/documentation/unique_identifiers",
        ),
    )
    lithic = Provider(
        # Current docs require a valid UUID; retention from the earlier docs (24 h).
        name="lithic",
        key_max_length=36,
        key_pattern=_UUID,
        retention=timedelta(hours=24),
        in_flight=(StatusRule(status=409),),
        server_errors="replayed",  # earlier docs: "even if those results are 500 errors"
        sources=(
            "https://docs.lithic.com/docs/idempotent-requests",
            "Lithic changelog 2023-08-15 and 2026-01-21",
        ),
    )
    paypal_orders = Provider(
        # Orders v2. In-flight and mismatch answers not documented ("might fail the
        # second request"). PayPal returns the latest status, not a verbatim replay.
        name="paypal_orders",
        key_field="PayPal-Request-Id",
        key_max_length=108,
        retention=timedelta(hours=6),  # extendable to 72 h by the account manager
        in_flight=(StatusRule(status=409),),
        server_errors="retry",  # retry 5xx "for as long as the server stores the ID"
        replay_headers=(),
        # A JWT naming the merchant a partner acts for: authority, so never stored.
        credential_headers=frozenset({"paypal-auth-assertion"}),
        # OAuth 2.0: the client ID and secret are exchanged for an access token that is
        # valid for the number of seconds the token call answers; then fetched again.
        credentials="token",
        sources=(
            "https://developer.paypal.com/api/rest/requests/",
            "https://developer.paypal.com/reference/guidelines/idempotency",
            "https://developer.paypal.com/api/rest/reference/idempotency",
            "github.com/paypal/paypal-rest-api-specifications openapi/checkout_orders_v2.json",
            "https://developer.paypal.com/api/rest/authentication/",
        ),
    )
    razorpay_payouts = Provider(
        # RazorpayX payouts. Razorpay allows spaces in keys; postonce never sends a
        # key with a space (it could not travel raw), so the pattern leaves them out.
        # In-flight: an unverified server fixture answers 500 idempotency_key_in_use;
        # waiting on it with the same key is the safe reading.
        name="razorpay_payouts",
        key_field="X-Payout-Idempotency",
        key_min_length=4,
        key_max_length=36,
        key_pattern=r"[A-Za-z0-9_-]+",
        retention=timedelta(days=7),
        in_flight=(StatusRule(status=409), StatusRule(status=500, code="idempotency_key_in_use")),
        replay_headers=(),
        sources=(
            "https://razorpay.com/docs/api/x/payout-idempotency/",
            "https://razorpay.com/docs/razorpayx/api/idempotency/",
        ),
    )
    square = Provider(
        # Key in the JSON body. Lengths differ per endpoint (CreatePayment 45 is the
        # shortest common one). Retention is not published: 24 hours. The HTTP status
        # of IDEMPOTENCY_KEY_REUSED is not documented, so the code alone decides.
        name="square",
        key_transport="body",
        key_field="idempotency_key",
        key_max_length=45,
        retention=timedelta(hours=24),
        in_flight=(StatusRule(status=409),),
        mismatch=(StatusRule(code="IDEMPOTENCY_KEY_REUSED"),),
        replay_headers=(),
        # A Bearer access token: an OAuth one expires in 30 days and is refreshed (every
        # 7 days, Square recommends); a personal one does not, and looks the same.
        credentials="token",
        sources=(
            "https://developer.squareup.com/docs/build-basics/common-api-patterns/idempotency",
            "github.com/square/connect-api-specification api.json",
            "https://developer.squareup.com/docs/build-basics/access-tokens",
            "https://developer.squareup.com/docs/oauth-api/refresh-revoke-limit-scope",
        ),
    )
    aws_client_token = Provider(
        # EC2-style ClientToken in the request body. Retention: the older API
        # reference's 24 hours (the current guide gives none). Throttling and
        # transient errors arrive as a 4xx (mostly 400) with an error code; the AWS
        # SDKs' standard retry mode retries them, with the same token: so does
        # postonce. The codes are botocore's (TransientRetryableChecker and
        # ThrottledRetryableChecker); IDPCommunicationError is left out, botocore
        # retries it for STS only, which takes no client token.
        name="aws_client_token",
        key_transport="body",
        key_field="ClientToken",
        key_max_length=64,
        retention=timedelta(hours=24),
        in_flight=(StatusRule(status=409),),
        mismatch=(StatusRule(code="IdempotentParameterMismatch"),),
        retryable=tuple(StatusRule(code=code) for code in _AWS_RETRYABLE_CODES),
        server_errors="retry",  # retry table: "5xx: retry with backoff", same client token
        replay_headers=(),
        # Signature Version 4: the signature, the temporary session token, and the
        # date the signature covers (a stored one would go stale besides).
        credential_headers=frozenset({"x-amz-security-token", "x-amz-date"}),
        # A SigV4 Authorization is a signature made anew for every request, with keys
        # that are often temporary (STS): nothing in it names the account for long.
        credentials="token",
        sources=(
            "https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-signing-elements.html",
            "https://docs.aws.amazon.com/IAM/latest/UserGuide/id_credentials_temp.html",
            "https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-idempotency.html",
            "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/Run_Instance_Idempotency.html",
            "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html",
            "https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html",
            "github.com/boto/botocore botocore/retries/standard.py, botocore/retries/special.py",
        ),
    )
    google_request_id = Provider(
        # Google Cloud requestId (AIP-155): a non-zero UUID, kept "at least 60 minutes".
        name="google_request_id",
        key_transport="body",
        key_field="requestId",
        key_max_length=36,
        key_pattern=_UUID,
        retention=timedelta(minutes=60),
        in_flight=(StatusRule(status=409),),
        replay_headers=(),
        credential_headers=frozenset({"x-goog-api-key"}),  # an API key sent as a header
        # Authorization carries OAuth 2.0 access tokens, which expire (after an hour, by
        # default) and are refreshed; an API key (x-goog-api-key) is long-lived.
        credentials="token",
        sources=(
            "github.com/aip-dev/google.aip.dev aip/general/0155.md",
            "https://cloud.google.com/docs/authentication/api-keys-use",
            "https://developers.google.com/identity/protocols/oauth2",
        ),
    )
    ietf_draft = Provider(
        # draft-ietf-httpapi-idempotency-key-header-07. The draft types the header as
        # an sf-string (quoted); postonce sends keys raw, as every provider expects.
        # Retention is resource-defined: 24 hours unless you configure your server's.
        # Max key length not defined: 36. Also recognises replay-marker spellings
        # seen in the wild.
        name="ietf_draft",
        key_max_length=36,
        retention=timedelta(hours=24),
        in_flight=(StatusRule(status=409),),
        mismatch=(  # the draft's two shapes only: any other 422 is a validation answer
            StatusRule(status=422, content_type="application/problem+json"),
            StatusRule(status=422, link_rel="describedby"),
        ),
        server_errors="replayed",  # a retry gets "the previous result, success or an error"
        replay_headers=("Idempotent-Replayed", "Idempotency-Replayed", "X-Idempotent-Replayed"),
        sources=(
            "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07",
            "github.com/ietf-wg-httpapi/idempotency draft-ietf-httpapi-idempotency-key-header.md"
            ' (error handling: 422 with problem+json, or Link rel="describedby")',
        ),
    )
    profiles = [
        stripe,
        adyen,
        checkout,
        mollie,
        modern_treasury,
        increase,
        lithic,
        paypal_orders,
        razorpay_payouts,
        square,
        aws_client_token,
        google_request_id,
        ietf_draft,
    ]
    return {p.name: p for p in profiles}


#: Every built-in profile by name.
BUILTIN_PROVIDERS: Mapping[str, Provider] = _profiles()
_BY_FOLDED = {name.casefold(): profile for name, profile in BUILTIN_PROVIDERS.items()}


def get_provider(provider: str | Provider) -> Provider:
    """Return ``provider`` itself, or the built-in profile of that name (any letter case).

    An unknown name raises :class:`~postonce.UnknownProvider` naming the closest
    built-in name, if one is close, and listing them all.
    """
    if isinstance(provider, Provider):
        return provider
    found = BUILTIN_PROVIDERS.get(provider) or _BY_FOLDED.get(provider.casefold())
    if found is not None:
        return found
    known = sorted(BUILTIN_PROVIDERS)
    close = difflib.get_close_matches(provider.casefold(), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownProvider(f"no built-in provider {provider!r}{hint}; known: {', '.join(known)}")


def _key_facts(provider: Provider) -> dict[str, object]:
    """The facts an intent's key depends on: where it travels, and how long it is kept.

    Changing one of them under a pending intent would send its key where the
    server does not look (a second effect) or retry past what the server keeps.
    Header names are case-insensitive, so they are compared in lower case.
    """
    field = provider.key_field.lower() if provider.key_transport == "header" else provider.key_field
    return {
        "key_transport": provider.key_transport,
        "key_field": field,
        "retention": provider.retention.total_seconds(),
    }


def provider_identity(provider: Provider) -> str:
    """The string an intent stores as its provider: its name, plus its key facts when they differ.

    A built-in profile (or a copy whose key facts match the built-in of that
    name) is its plain name, as outboxes have always stored it. Any other
    profile is ``name#digest``, the digest a short hash of its key facts, so a
    custom ``Provider`` is compared by those facts rather than by object identity.
    """
    # Computed once per profile object, for Provider itself (frozen); a subclass
    # may have thawed its model, so its facts are read every time.
    frozen = type(provider) is Provider
    known = _IDENTITIES.get(provider) if frozen else None
    if known is not None:
        return known
    builtin = BUILTIN_PROVIDERS.get(provider.name)
    facts = _key_facts(provider)
    if builtin is not None and _key_facts(builtin) == facts:
        identity = provider.name
    else:
        canonical = json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()
        identity = f"{provider.name}#{hashlib.sha256(canonical).hexdigest()[:12]}"
    if frozen:
        _IDENTITIES.put(provider, identity)
    return identity


_IDENTITIES: ByIdentity[str] = ByIdentity(256)


def same_provider(stored: str, identity: str) -> bool:
    """Whether an intent stored under ``stored`` may be sent under the profile ``identity``.

    Equal strings match. So does a bare custom name written before identities
    carried a digest (``"ledger"`` against ``"ledger#..."``): its facts were
    never recorded, and the name is all it has. A bare built-in name never
    matches a digest: its facts are known, and they differ.
    """
    if stored == identity:
        return True
    name, _, digest = identity.partition("#")
    return bool(digest) and "#" not in stored and stored not in BUILTIN_PROVIDERS and stored == name
