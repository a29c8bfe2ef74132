"""Classification of one attempt: exception or answer -> Outcome."""

from __future__ import annotations

import json
from datetime import timedelta

import httpcore
import httpx
import pytest

from postonce._classify import (
    classify_exception,
    classify_response,
    error_codes,
    is_replay,
    link_rels,
)
from postonce._intent import Outcome
from postonce.providers import BUILTIN_PROVIDERS, Provider, StatusRule

#: The codes botocore's standard retry mode retries whatever the status
#: (github.com/boto/botocore botocore/retries/standard.py), copied here so a change to
#: the profile's list has to be made twice.
AWS_RETRYABLE = (
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

REQUEST = httpx.Request("POST", "http://x")


def _from(exc: Exception, cause: BaseException) -> Exception:
    """``exc`` raised from ``cause``, as httpx's transport raises it from httpcore's."""
    exc.__cause__ = cause
    return exc


def _aiohttp_drop() -> Exception:
    """What httpx-aiohttp raises when the server drops the connection after executing."""
    import aiohttp

    cause = aiohttp.ServerDisconnectedError()
    return _from(httpx.ConnectTimeout(str(cause), request=REQUEST), cause)


def _httpx2(name: str) -> Exception:
    import httpcore2
    import httpx2

    cause = getattr(httpcore2, name)("refused")
    return _from(getattr(httpx2, name)("refused"), cause)


@pytest.mark.parametrize(
    ("exc", "body_unread", "expected"),
    [
        # Provable by origin: httpx's transport maps httpcore's pre-write failures.
        pytest.param(
            _from(httpx.ConnectError("refused"), httpcore.ConnectError("refused")),
            False,
            Outcome.NOT_SENT,
            id="httpcore-ConnectError",
        ),
        pytest.param(
            _from(httpx.ConnectTimeout("slow"), httpcore.ConnectTimeout("slow")),
            False,
            Outcome.NOT_SENT,
            id="httpcore-ConnectTimeout",
        ),
        pytest.param(
            _from(httpx.PoolTimeout("full"), httpcore.PoolTimeout("full")),
            False,
            Outcome.NOT_SENT,
            id="httpcore-PoolTimeout",
        ),
        pytest.param(
            _from(httpx.UnsupportedProtocol("ftp"), httpcore.UnsupportedProtocol("ftp")),
            False,
            Outcome.NOT_SENT,
            id="httpcore-UnsupportedProtocol",
        ),
        # The same types from anywhere else prove nothing once the body was read.
        pytest.param(
            httpx.ConnectError("refused", request=REQUEST),
            False,
            Outcome.AMBIGUOUS,
            id="ConnectError-no-httpcore-cause",
        ),
        pytest.param(
            _aiohttp_drop(), False, Outcome.AMBIGUOUS, id="aiohttp-drop-as-ConnectTimeout"
        ),
        pytest.param(_httpx2("ConnectError"), False, Outcome.AMBIGUOUS, id="httpx2-ConnectError"),
        pytest.param(
            _from(httpx.ConnectError("x"), httpcore.ReadError("x")),
            False,
            Outcome.AMBIGUOUS,
            id="ConnectError-from-httpcore-ReadError",
        ),
        pytest.param(
            _from(httpx.ReadError("x"), httpcore.ReadError("x")),
            False,
            Outcome.AMBIGUOUS,
            id="httpcore-ReadError",
        ),
        # Provable by the watch: a body never read was never sent, whatever was raised.
        pytest.param(_aiohttp_drop(), True, Outcome.NOT_SENT, id="aiohttp-body-unread"),
        pytest.param(_httpx2("ConnectError"), True, Outcome.NOT_SENT, id="httpx2-body-unread"),
        pytest.param(RuntimeError("boom"), True, Outcome.NOT_SENT, id="custom-body-unread"),
        pytest.param(
            httpx.ReadTimeout("slow", request=REQUEST), False, Outcome.AMBIGUOUS, id="ReadTimeout"
        ),
        pytest.param(
            httpx.WriteTimeout("slow", request=REQUEST), False, Outcome.AMBIGUOUS, id="WriteTimeout"
        ),
        pytest.param(
            httpx.RemoteProtocolError("eof", request=REQUEST),
            False,
            Outcome.AMBIGUOUS,
            id="RemoteProtocolError",
        ),
        pytest.param(
            httpx.ProxyError("proxy", request=REQUEST), False, Outcome.AMBIGUOUS, id="ProxyError"
        ),
        pytest.param(RuntimeError("boom"), False, Outcome.AMBIGUOUS, id="RuntimeError"),
        pytest.param(OSError("io"), False, Outcome.AMBIGUOUS, id="OSError"),
    ],
)
def test_classify_exception(exc: BaseException, body_unread: bool, expected: Outcome) -> None:
    """NOT_SENT only when provable (body never read, or httpcore failed before writing)."""
    assert classify_exception(exc, body_unread=body_unread) is expected


IDEMPOTENCY_ERROR = b'{"error":{"type":"idempotency_error","message":"Keys for idempotent..."}}'
CARD_ERROR = b'{"error":{"type":"card_error","code":"card_declined"}}'
AWS_MISMATCH = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
    b"<Code>IdempotentParameterMismatch</Code><Message>reused</Message>"
    b"</Error></Errors><RequestID>r-1</RequestID></Response>"
)
AWS_OTHER = AWS_MISMATCH.replace(b"IdempotentParameterMismatch", b"InvalidParameterValue")


@pytest.mark.parametrize(
    ("provider", "status", "headers", "body", "expected"),
    [
        # Stripe
        pytest.param(
            "stripe", 400, {}, IDEMPOTENCY_ERROR, Outcome.MISMATCH, id="stripe-400-mismatch"
        ),
        pytest.param(
            "stripe", 404, {}, IDEMPOTENCY_ERROR, Outcome.MISMATCH, id="stripe-404-mismatch"
        ),
        pytest.param(
            "stripe",
            400,
            {},
            b'{"error":{"type":"invalid_request_error"}}',
            Outcome.FINAL,
            id="stripe-400-other-type",
        ),
        pytest.param("stripe", 402, {}, CARD_ERROR, Outcome.FINAL, id="stripe-402-card"),
        pytest.param("stripe", 400, {}, b"", Outcome.FINAL, id="stripe-400-empty"),
        pytest.param("stripe", 409, {}, b"{}", Outcome.IN_PROGRESS, id="stripe-409"),
        pytest.param("stripe", 429, {}, b"", Outcome.RETRYABLE, id="stripe-429"),
        pytest.param("stripe", 502, {}, b"", Outcome.RETRYABLE, id="stripe-502"),
        pytest.param("stripe", 503, {}, b"", Outcome.RETRYABLE, id="stripe-503"),
        pytest.param("stripe", 504, {}, b"", Outcome.RETRYABLE, id="stripe-504"),
        pytest.param("stripe", 500, {}, b"", Outcome.RETRYABLE, id="stripe-500-indeterminate"),
        pytest.param(
            "stripe",
            500,
            {"Idempotent-Replayed": "true"},
            b"",
            Outcome.INDETERMINATE,
            id="stripe-500-replayed",
        ),
        pytest.param("stripe", 201, {}, b'{"id":"ch_1"}', Outcome.FINAL, id="stripe-201"),
        pytest.param(
            "stripe", 200, {}, IDEMPOTENCY_ERROR, Outcome.FINAL, id="stripe-200-code-ignored"
        ),
        pytest.param(
            "stripe",
            503,
            {"Stripe-Should-Retry": "false"},
            b"",
            Outcome.INDETERMINATE,
            id="stripe-503-hint-false",
        ),
        pytest.param(
            "stripe",
            500,
            {"Stripe-Should-Retry": "false"},
            b'{"error":{"type":"api_error"}}',
            Outcome.INDETERMINATE,
            id="stripe-500-hint-false",
        ),
        pytest.param(
            "stripe",
            429,
            {"Stripe-Should-Retry": "false"},
            b"",
            Outcome.FINAL,
            id="stripe-429-hint-false-4xx-stays-final",
        ),
        pytest.param(
            "stripe",
            400,
            {"Stripe-Should-Retry": "false", "Idempotent-Replayed": "true"},
            b'{"error":{"type":"invalid_request_error"}}',
            Outcome.FINAL,
            id="stripe-400-replayed-4xx-stays-final",
        ),
        pytest.param(
            "stripe",
            500,
            {"Stripe-Should-Retry": "true"},
            b"",
            Outcome.RETRYABLE,
            id="stripe-500-hint-true",
        ),
        pytest.param(
            "stripe",
            500,
            {"stripe-should-retry": " TRUE "},
            b"",
            Outcome.RETRYABLE,
            id="stripe-500-hint-case",
        ),
        pytest.param(
            "stripe",
            503,
            {"Stripe-Should-Retry": "maybe"},
            b"",
            Outcome.RETRYABLE,
            id="stripe-503-hint-unreadable",
        ),
        pytest.param(
            "stripe",
            400,
            {"Stripe-Should-Retry": "true"},
            IDEMPOTENCY_ERROR,
            Outcome.MISMATCH,
            id="stripe-hint-never-overrides-mismatch",
        ),
        pytest.param(
            "stripe",
            409,
            {"Stripe-Should-Retry": "false"},
            b"",
            Outcome.INDETERMINATE,
            id="stripe-409-hint-false-not-retried",
        ),
        pytest.param(
            "stripe",
            409,
            {"Stripe-Should-Retry": "true"},
            b"",
            Outcome.IN_PROGRESS,
            id="stripe-409-hint-true-waits",
        ),
        pytest.param(
            "stripe",
            200,
            {"Stripe-Should-Retry": "true"},
            b"",
            Outcome.FINAL,
            id="stripe-hint-ignored-on-2xx",
        ),
        # Adyen
        pytest.param(
            "adyen",
            422,
            {},
            b'{"status":422,"errorCode":"704","message":"request already processed"}',
            Outcome.IN_PROGRESS,
            id="adyen-422-704",
        ),
        pytest.param(
            "adyen",
            422,
            {},
            b'{"status":422,"errorCode":"702"}',
            Outcome.FINAL,
            id="adyen-422-other",
        ),
        pytest.param(
            "adyen",
            500,
            {"transient-error": "true"},
            b"",
            Outcome.RETRYABLE,
            id="adyen-500-transient",
        ),
        pytest.param(
            "adyen",
            503,
            {"transient-error": "false"},
            b"",
            Outcome.INDETERMINATE,
            id="adyen-503-not-transient",
        ),
        pytest.param("adyen", 500, {}, b"", Outcome.INDETERMINATE, id="adyen-500-no-hint"),
        pytest.param(
            "adyen",
            409,
            {"transient-error": "false"},
            b"",
            Outcome.INDETERMINATE,
            id="adyen-409-not-transient",
        ),
        pytest.param(
            "adyen",
            400,
            {"transient-error": "false"},
            b'{"errorCode":"702"}',
            Outcome.FINAL,
            id="adyen-400-not-transient-stays-final",
        ),
        pytest.param("adyen", 409, {}, b"", Outcome.IN_PROGRESS, id="adyen-409"),
        # Increase
        pytest.param(
            "increase",
            409,
            {},
            b'{"type":"idempotency_key_already_used_error","status":409}',
            Outcome.MISMATCH,
            id="increase-409-reused",
        ),
        pytest.param("increase", 409, {}, b"", Outcome.IN_PROGRESS, id="increase-409-plain"),
        pytest.param(
            "increase",
            409,
            {},
            b'{"type":"conflict_error"}',
            Outcome.IN_PROGRESS,
            id="increase-409-other-type",
        ),
        # Square
        pytest.param(
            "square",
            400,
            {},
            b'{"errors":[{"category":"INVALID_REQUEST_ERROR","code":"IDEMPOTENCY_KEY_REUSED"}]}',
            Outcome.MISMATCH,
            id="square-400-reused",
        ),
        pytest.param(
            "square",
            400,
            {},
            b'{"errors":[{"code":"VALUE_TOO_LOW"},{"code":"IDEMPOTENCY_KEY_REUSED"}]}',
            Outcome.MISMATCH,
            id="square-400-reused-second-error",
        ),
        pytest.param(
            "square",
            400,
            {},
            b'{"errors":[{"code":"VALUE_TOO_LOW"}]}',
            Outcome.FINAL,
            id="square-400-other",
        ),
        # AWS ClientToken
        pytest.param(
            "aws_client_token", 400, {}, AWS_MISMATCH, Outcome.MISMATCH, id="aws-400-xml-mismatch"
        ),
        pytest.param(
            "aws_client_token",
            400,
            {},
            b'{"__type":"IdempotentParameterMismatch","message":"x"}',
            Outcome.MISMATCH,
            id="aws-400-json-mismatch",
        ),
        pytest.param("aws_client_token", 400, {}, AWS_OTHER, Outcome.FINAL, id="aws-400-xml-other"),
        pytest.param(
            "aws_client_token",
            400,
            {},
            AWS_MISMATCH.replace(b"IdempotentParameterMismatch", b"RequestLimitExceeded"),
            Outcome.RETRYABLE,
            id="aws-400-xml-throttled",
        ),
        pytest.param(
            "aws_client_token",
            400,
            {},
            b'{"__type":"com.amazon.coral.availability#ThrottlingException","message":"x"}',
            Outcome.RETRYABLE,
            id="aws-400-json-qualified-throttled",
        ),
        pytest.param(
            "aws_client_token",
            400,
            {},
            AWS_OTHER.replace(b"reused", b"ThrottlingConfig is not valid"),
            Outcome.FINAL,
            id="aws-400-code-as-part-of-a-word-is-not-it",
        ),
        pytest.param(
            "aws_client_token",
            503,
            {},
            b"<Error><Code>SlowDown</Code></Error>",
            Outcome.RETRYABLE,
            id="aws-503-slowdown",
        ),
        # Razorpay
        pytest.param(
            "razorpay_payouts",
            500,
            {},
            b'{"error":{"code":"SERVER_ERROR","reason":"idempotency_key_in_use"}}',
            Outcome.IN_PROGRESS,
            id="razorpay-500-in-use",
        ),
        pytest.param(
            "razorpay_payouts", 500, {}, b"{}", Outcome.RETRYABLE, id="razorpay-500-other"
        ),
        # IETF draft
        pytest.param(
            "ietf_draft",
            422,
            {"Content-Type": "application/problem+json"},
            b"{}",
            Outcome.MISMATCH,
            id="ietf-422-problem",
        ),
        pytest.param(
            "ietf_draft",
            422,
            {"Content-Type": "application/json"},
            b"{}",
            Outcome.FINAL,
            id="ietf-422-plain-validation",
        ),
        pytest.param("ietf_draft", 409, {}, b"", Outcome.IN_PROGRESS, id="ietf-409"),
        pytest.param("ietf_draft", 400, {}, b"", Outcome.FINAL, id="ietf-400"),
        pytest.param(
            "ietf_draft",
            422,
            {
                "Link": '<https://developer.example.com/idempotency>; rel="describedby"; '
                'type="text/html"'
            },
            b"",
            Outcome.MISMATCH,
            id="ietf-422-link-describedby",
        ),
        pytest.param(
            "ietf_draft",
            422,
            {"Link": "<https://developer.example.com/errors>; rel=help"},
            b"",
            Outcome.FINAL,
            id="ietf-422-link-other-rel",
        ),
        pytest.param(
            "ietf_draft",
            500,
            {"X-Idempotent-Replayed": "true"},
            b"",
            Outcome.INDETERMINATE,
            id="ietf-500-replayed",
        ),
        pytest.param("ietf_draft", 500, {}, b"", Outcome.RETRYABLE, id="ietf-500-unmarked"),
        pytest.param(
            "lithic",
            500,
            {"Idempotent-Replayed": "true"},
            b"",
            Outcome.INDETERMINATE,
            id="lithic-500-replayed",
        ),
    ],
)
def test_classify_response(
    provider: str, status: int, headers: dict[str, str], body: bytes, expected: Outcome
) -> None:
    """An answer is read through the provider's mismatch, in-flight, hint and status rules."""
    outcome = classify_response(status, httpx.Headers(headers), body, BUILTIN_PROVIDERS[provider])
    assert outcome is expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b'{"error":{"type":"x","code":"y"}}', frozenset({"x", "y"}), id="nested"),
        pytest.param(b'{"errors":[{"code":"A"},{"code":"B"}]}', frozenset({"A", "B"}), id="list"),
        pytest.param(b'{"errorCode":704}', frozenset({"704"}), id="int-code"),
        pytest.param(b'{"code":true,"type":null}', frozenset(), id="bool-and-null-ignored"),
        pytest.param(b'{"message":"code"}', frozenset(), id="other-keys-ignored"),
        pytest.param(
            b'{"a":{"b":{"c":{"d":{"e":{"code":"deep"}}}}}}', frozenset(), id="beyond-depth"
        ),
        pytest.param(
            b'{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"}',
            frozenset(
                {
                    "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                    "ProvisionedThroughputExceededException",
                }
            ),
            id="aws-qualified-type",
        ),
    ],
)
def test_error_codes_from_json(body: bytes, expected: frozenset[str]) -> None:
    """Codes are read from known keys anywhere within a few levels of a JSON body."""
    assert error_codes(body) == expected


def test_error_codes_non_json_is_text_head() -> None:
    """A body that is not JSON comes back as its (decoded) text."""
    assert error_codes(b"<Code>Oops</Code>") == "<Code>Oops</Code>"


def test_classify_response_survives_deeply_nested_body() -> None:
    """A hostile deeply nested error body is classified, not raised out of the classifier."""
    body = b"[" * 5000 + b"]" * 5000
    outcome = classify_response(400, httpx.Headers(), body, BUILTIN_PROVIDERS["stripe"])
    assert outcome is Outcome.FINAL
    unclosed = b"[" * 70000  # longer than the scan limit, never closed
    outcome = classify_response(400, httpx.Headers(), unclosed, BUILTIN_PROVIDERS["square"])
    assert outcome is Outcome.FINAL


@pytest.mark.parametrize(
    ("provider", "headers", "expected"),
    [
        pytest.param("stripe", {"Idempotent-Replayed": "true"}, True, id="stripe-true"),
        pytest.param("stripe", {"Idempotent-Replayed": "True"}, True, id="stripe-True"),
        pytest.param("stripe", {"idempotent-replayed": "true"}, True, id="stripe-lower-name"),
        pytest.param("stripe", {"Idempotent-Replayed": "false"}, False, id="stripe-false"),
        pytest.param("stripe", {"Idempotent-Replayed": "1"}, False, id="stripe-one"),
        pytest.param("stripe", {}, False, id="stripe-absent"),
        pytest.param("stripe", {"Idempotency-Replayed": "true"}, False, id="stripe-other-spelling"),
        pytest.param("ietf_draft", {"Idempotent-Replayed": "true"}, True, id="ietf-idempotent"),
        pytest.param("ietf_draft", {"Idempotency-Replayed": "true"}, True, id="ietf-idempotency"),
        pytest.param("ietf_draft", {"X-Idempotent-Replayed": "true"}, True, id="ietf-x-prefixed"),
        pytest.param("ietf_draft", {"X-Idempotent-Replayed": "false"}, False, id="ietf-x-false"),
        pytest.param("ietf_draft", {}, False, id="ietf-absent"),
        pytest.param("adyen", {"Idempotent-Replayed": "true"}, False, id="adyen-marks-none"),
    ],
)
def test_is_replay(provider: str, headers: dict[str, str], expected: bool) -> None:
    """Only the provider's replay headers saying true mark a replay."""
    assert is_replay(httpx.Headers(headers), BUILTIN_PROVIDERS[provider]) is expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param([("Idempotent-Replayed", "true")] * 2, False, id="repeated-joined"),
        pytest.param(
            [("Idempotent-Replayed", "false"), ("X-Idempotent-Replayed", "true")],
            True,
            id="one-name-of-several-true",
        ),
        pytest.param([("IDEMPOTENT-REPLAYED", " TRUE ")], True, id="case-and-space"),
    ],
)
def test_is_replay_reads_repeated_headers_as_httpx_joins_them(
    headers: list[tuple[str, str]], expected: bool
) -> None:
    """A repeated header reads as its values joined (``Headers.get``), which is not ``true``."""
    provider = BUILTIN_PROVIDERS["ietf_draft"]
    assert is_replay(httpx.Headers(headers), provider) is expected


def test_is_replay_reads_a_plain_mapping_by_name() -> None:
    """Headers without a raw list (a plain mapping) are looked up by each replay header's name."""
    stripe = BUILTIN_PROVIDERS["stripe"]
    assert is_replay({"Idempotent-Replayed": "true"}, stripe) is True
    assert is_replay({"Idempotent-Replayed": "false"}, stripe) is False


PROBLEM = {"Content-Type": "application/problem+json; charset=utf-8"}


@pytest.mark.parametrize(
    ("provider", "status", "headers", "body", "fresh"),
    [
        pytest.param("ietf_draft", 422, PROBLEM, b"{}", Outcome.FINAL, id="ietf-422-problem"),
        pytest.param(
            "stripe", 400, {}, IDEMPOTENCY_ERROR, Outcome.FINAL, id="stripe-400-idempotency_error"
        ),
        pytest.param(
            "square",
            400,
            {},
            b'{"errors":[{"code":"IDEMPOTENCY_KEY_REUSED"}]}',
            Outcome.FINAL,
            id="square",
        ),
        pytest.param(
            "increase",
            409,
            {},
            b'{"type":"idempotency_key_already_used_error"}',
            Outcome.IN_PROGRESS,  # its reuse status is also its in-flight status
            id="increase",
        ),
    ],
)
def test_key_reuse_needs_a_key_the_server_may_have_seen(
    provider: str, status: int, headers: dict[str, str], body: bytes, fresh: Outcome
) -> None:
    """Key reuse is MISMATCH after a possible delivery, an ordinary answer to a first send."""
    profile = BUILTIN_PROVIDERS[provider]
    seen = classify_response(status, httpx.Headers(headers), body, profile, key_seen=True)
    first = classify_response(status, httpx.Headers(headers), body, profile, key_seen=False)
    assert (seen, first) == (Outcome.MISMATCH, fresh)


@pytest.mark.parametrize("provider", sorted(BUILTIN_PROVIDERS))
@pytest.mark.parametrize(
    ("status", "headers"),
    [
        pytest.param(401, {}, id="401"),
        pytest.param(403, {}, id="403"),
        pytest.param(401, {"Stripe-Should-Retry": "false"}, id="401-hint-false"),
    ],
)
def test_a_credentials_refusal_after_a_possible_delivery_is_never_the_outcome(
    provider: str, status: int, headers: dict[str, str]
) -> None:
    """A 401/403 to a retry says nothing of the earlier send: retried, never final.

    To the first send of a fresh key it is the answer (FINAL): nothing was
    executed. After a send that may have been (a per-call key a drain lacked,
    a key rotated meanwhile), the intent stays pending rather than "failed".
    """
    profile = BUILTIN_PROVIDERS[provider]
    body = b'{"error":{"type":"authentication_error"}}'
    seen = classify_response(status, httpx.Headers(headers), body, profile, key_seen=True)
    first = classify_response(status, httpx.Headers(headers), body, profile, key_seen=False)
    assert (seen, first) == (Outcome.RETRYABLE, Outcome.FINAL)


#: The published table: each profile's reading of the answers the issue names, with the
#: key already seen by the server (a retry). "500r": a 500 marked as a replay.
MATRIX: dict[str, dict[str, Outcome]] = {}
R, F, M, W = Outcome.RETRYABLE, Outcome.FINAL, Outcome.MISMATCH, Outcome.IN_PROGRESS
I = Outcome.INDETERMINATE  # noqa: E741 - one letter, like its neighbours in the table
_COLUMNS = ("409", "422", "400+code", "429", "500", "500r", "502", "503", "504")
for _name, _row in {
    "stripe": (W, F, M, R, R, I, R, R, R),
    "adyen": (W, F, F, R, I, I, R, R, R),
    "checkout": (W, F, F, R, R, R, R, R, R),
    "mollie": (W, F, F, R, R, R, R, R, R),
    "modern_treasury": (W, F, F, R, R, R, R, R, R),
    "increase": (W, F, F, R, R, R, R, R, R),
    "lithic": (W, F, F, R, R, I, R, R, R),
    "paypal_orders": (W, F, F, R, R, R, R, R, R),
    "razorpay_payouts": (W, F, F, R, R, R, R, R, R),
    "square": (W, F, M, R, R, R, R, R, R),
    "aws_client_token": (W, F, M, R, R, R, R, R, R),
    "google_request_id": (W, F, F, R, R, R, R, R, R),
    "ietf_draft": (W, M, F, R, R, I, R, R, R),
}.items():
    MATRIX[_name] = dict(zip(_COLUMNS, _row, strict=True))

#: The body each profile's own key-reuse (or in-flight) answer carries.
_CODES = {
    "stripe": b'{"error":{"type":"idempotency_error"}}',
    "adyen": b'{"errorCode":"704"}',
    "increase": b'{"type":"idempotency_key_already_used_error"}',
    "square": b'{"errors":[{"code":"IDEMPOTENCY_KEY_REUSED"}]}',
    "aws_client_token": b'{"__type":"IdempotentParameterMismatch"}',
}


def _answer(provider: str, column: str) -> tuple[int, dict[str, str], bytes]:
    body = _CODES.get(provider, b'{"code":"some_error"}')
    if column == "400+code":
        return 400, {}, body
    if column == "500r":
        return 500, {"Idempotent-Replayed": "true"}, b"{}"
    if column in ("409", "422"):  # a generic error body, in the draft's problem shape
        return int(column), PROBLEM, b'{"code":"some_error"}'
    return int(column), {}, b"{}"


@pytest.mark.parametrize("provider", sorted(MATRIX))
def test_profile_by_answer_matrix(provider: str) -> None:
    """Each profile reads 409/422/400+code/429/5xx (to a seen key) as the published table says."""
    profile = BUILTIN_PROVIDERS[provider]
    got = {
        column: classify_response(
            *_answer(provider, column)[:1],
            httpx.Headers(_answer(provider, column)[1]),
            _answer(provider, column)[2],
            profile,
        )
        for column in _COLUMNS
    }
    assert got == MATRIX[provider]


# -- hint false beats in flight; documented "outcome unknown"; retried codes ----------------


@pytest.mark.parametrize(
    ("provider", "headers"),
    [
        pytest.param("stripe", {"Stripe-Should-Retry": "false"}, id="stripe"),
        pytest.param("adyen", {"transient-error": "false"}, id="adyen"),
    ],
)
def test_in_flight_with_a_false_hint_is_not_retried(provider: str, headers: dict[str, str]) -> None:
    """In flight + hint false: indeterminate if the key may be in use by us, else final."""
    profile = BUILTIN_PROVIDERS[provider]
    answer = (409, httpx.Headers(headers), b'{"error":{"code":"idempotency_key_in_use"}}')
    seen = classify_response(*answer, profile, key_seen=True)
    fresh = classify_response(*answer, profile, key_seen=False)
    assert (seen, fresh) == (Outcome.INDETERMINATE, Outcome.FINAL)


LEDGER = Provider(
    name="ledger",
    retention=timedelta(hours=48),
    mismatch=(StatusRule(status=422, code="key_reused"),),
    retryable=(StatusRule(status=400, code="ledger_locked"),),
    indeterminate=(
        StatusRule(status=500, code="outcome_unknown"),
        StatusRule(status=408, code="gave_up_waiting"),
    ),
    retry_hint_header="X-Should-Retry",
)


@pytest.mark.parametrize(
    ("status", "headers", "code", "expected"),
    [
        pytest.param(500, {}, "outcome_unknown", Outcome.INDETERMINATE, id="indeterminate-5xx"),
        pytest.param(408, {}, "gave_up_waiting", Outcome.INDETERMINATE, id="indeterminate-4xx"),
        pytest.param(500, {}, "other", Outcome.RETRYABLE, id="other-500-undocumented"),
        pytest.param(408, {}, "other", Outcome.FINAL, id="other-408"),
        pytest.param(
            500,
            {"X-Should-Retry": "true"},
            "outcome_unknown",
            Outcome.RETRYABLE,
            id="hint-true-retries-an-indeterminate-answer",
        ),
        pytest.param(
            408,
            {"X-Should-Retry": "false"},
            "gave_up_waiting",
            Outcome.INDETERMINATE,
            id="hint-false-keeps-it-indeterminate",
        ),
        pytest.param(400, {}, "ledger_locked", Outcome.RETRYABLE, id="retryable-code"),
        pytest.param(400, {}, "other", Outcome.FINAL, id="other-400"),
        pytest.param(
            400,
            {"X-Should-Retry": "false"},
            "ledger_locked",
            Outcome.FINAL,
            id="hint-false-beats-a-retryable-rule",
        ),
        pytest.param(
            422,
            {"X-Should-Retry": "true"},
            "key_reused",
            Outcome.MISMATCH,
            id="nothing-beats-mismatch",
        ),
    ],
)
def test_custom_profile_rules(
    status: int, headers: dict[str, str], code: str, expected: Outcome
) -> None:
    """A custom profile's indeterminate and retryable rules, read after the hint's verdict."""
    body = json.dumps({"error": {"code": code}}).encode()
    assert classify_response(status, httpx.Headers(headers), body, LEDGER) is expected


@pytest.mark.parametrize("code", AWS_RETRYABLE)
def test_aws_standard_mode_codes_are_retried(code: str) -> None:
    """Every code botocore's standard mode retries is RETRYABLE as a 400, XML or JSON."""
    profile = BUILTIN_PROVIDERS["aws_client_token"]
    xml = AWS_MISMATCH.replace(b"IdempotentParameterMismatch", code.encode())
    as_json = json.dumps({"__type": code, "message": "slow down"}).encode()
    for body in (xml, as_json):
        assert classify_response(400, httpx.Headers(), body, profile) is Outcome.RETRYABLE


def test_aws_mismatch_still_wins_over_retryable_codes() -> None:
    """A key-reuse answer is never retried, even one that also names a throttling code."""
    profile = BUILTIN_PROVIDERS["aws_client_token"]
    body = AWS_MISMATCH.replace(b"<Message>reused</Message>", b"<Message>Throttling</Message>")
    assert classify_response(400, httpx.Headers(), body, profile) is Outcome.MISMATCH


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param('<https://x/idem>; rel="describedby"', {"describedby"}, id="quoted"),
        pytest.param("<https://x/idem>; rel=DescribedBy", {"describedby"}, id="bare-case"),
        pytest.param(
            '<https://x/a>; rel="help", <https://x/b>; type="text/html"; rel="describedby"',
            {"help", "describedby"},
            id="two-links",
        ),
        pytest.param('<https://x/a>; rel="describedby help"', {"describedby", "help"}, id="multi"),
        pytest.param('<https://x/a;rel=fake>; title="rel=describedby"', set(), id="no-rel-param"),
        pytest.param("", set(), id="empty"),
    ],
)
def test_link_rels(value: str, expected: set[str]) -> None:
    """A Link header's relation types are read from each link-value's rel parameter."""
    assert link_rels(httpx.Headers({"Link": value} if value else {})) == expected


def test_link_rels_of_repeated_link_headers() -> None:
    """Link headers sent twice are read as one list (httpx joins them with a comma)."""
    headers = httpx.Headers(
        [("Link", "<https://x/a>; rel=help"), ("Link", "<https://x/b>; rel=describedby")]
    )
    assert link_rels(headers) == {"help", "describedby"}
