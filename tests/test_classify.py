"""Classification of one attempt: exception or answer -> Outcome."""

from __future__ import annotations

import httpx
import pytest

from postonce._classify import classify_exception, classify_response, error_codes, is_replay
from postonce._intent import Outcome
from postonce.providers import BUILTIN_PROVIDERS

REQUEST = httpx.Request("POST", "http://x")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        pytest.param(
            httpx.ConnectError("refused", request=REQUEST), Outcome.NOT_SENT, id="ConnectError"
        ),
        pytest.param(
            httpx.ConnectTimeout("slow", request=REQUEST), Outcome.NOT_SENT, id="ConnectTimeout"
        ),
        pytest.param(
            httpx.PoolTimeout("full", request=REQUEST), Outcome.NOT_SENT, id="PoolTimeout"
        ),
        pytest.param(
            httpx.UnsupportedProtocol("ftp", request=REQUEST),
            Outcome.NOT_SENT,
            id="UnsupportedProtocol",
        ),
        pytest.param(
            httpx.ReadTimeout("slow", request=REQUEST), Outcome.AMBIGUOUS, id="ReadTimeout"
        ),
        pytest.param(
            httpx.WriteTimeout("slow", request=REQUEST), Outcome.AMBIGUOUS, id="WriteTimeout"
        ),
        pytest.param(httpx.ReadError("reset", request=REQUEST), Outcome.AMBIGUOUS, id="ReadError"),
        pytest.param(
            httpx.WriteError("broken", request=REQUEST), Outcome.AMBIGUOUS, id="WriteError"
        ),
        pytest.param(
            httpx.RemoteProtocolError("eof", request=REQUEST),
            Outcome.AMBIGUOUS,
            id="RemoteProtocolError",
        ),
        pytest.param(
            httpx.ProxyError("proxy", request=REQUEST), Outcome.AMBIGUOUS, id="ProxyError"
        ),
        pytest.param(RuntimeError("boom"), Outcome.AMBIGUOUS, id="RuntimeError"),
        pytest.param(OSError("io"), Outcome.AMBIGUOUS, id="OSError"),
    ],
)
def test_classify_exception(exc: BaseException, expected: Outcome) -> None:
    """Only failures before a connection are NOT_SENT; anything else is AMBIGUOUS."""
    assert classify_exception(exc) is expected


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
        pytest.param("stripe", 500, {}, b"", Outcome.FINAL, id="stripe-500"),
        pytest.param("stripe", 201, {}, b'{"id":"ch_1"}', Outcome.FINAL, id="stripe-201"),
        pytest.param(
            "stripe", 200, {}, IDEMPOTENCY_ERROR, Outcome.FINAL, id="stripe-200-code-ignored"
        ),
        pytest.param(
            "stripe",
            503,
            {"Stripe-Should-Retry": "false"},
            b"",
            Outcome.FINAL,
            id="stripe-503-hint-false",
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
            Outcome.IN_PROGRESS,
            id="stripe-hint-never-overrides-in-flight",
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
            Outcome.FINAL,
            id="adyen-503-not-transient",
        ),
        pytest.param("adyen", 500, {}, b"", Outcome.FINAL, id="adyen-500"),
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
        # Razorpay
        pytest.param(
            "razorpay_payouts",
            500,
            {},
            b'{"error":{"code":"SERVER_ERROR","reason":"idempotency_key_in_use"}}',
            Outcome.IN_PROGRESS,
            id="razorpay-500-in-use",
        ),
        pytest.param("razorpay_payouts", 500, {}, b"{}", Outcome.FINAL, id="razorpay-500-other"),
        # IETF draft
        pytest.param("ietf_draft", 422, {}, b"", Outcome.MISMATCH, id="ietf-422"),
        pytest.param("ietf_draft", 409, {}, b"", Outcome.IN_PROGRESS, id="ietf-409"),
        pytest.param("ietf_draft", 400, {}, b"", Outcome.FINAL, id="ietf-400"),
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
