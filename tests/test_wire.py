"""The stored request is the one httpx would send."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from postonce._wire import merge_url


@pytest.mark.parametrize(
    ("base", "client_params", "url", "params"),
    [
        pytest.param("https://api.test", None, "/v1/charges", None, id="plain"),
        pytest.param("https://api.test/sub", None, "/v1/charges", None, id="base-path"),
        pytest.param("https://api.test/sub/", None, "v1/charges?x=1", None, id="query-in-url"),
        pytest.param("https://api.test", None, "https://other.test/a", {"b": "2"}, id="absolute"),
        pytest.param("https://api.test", {"k": "c"}, "/a?x=1", {"y": "2"}, id="merged-params"),
        pytest.param("", None, "http://h.test/a b", None, id="escaping"),
    ],
)
def test_merge_url_matches_httpx(
    base: str, client_params: dict[str, str] | None, url: str, params: Any
) -> None:
    """merge_url gives exactly the URL of httpx's own build_request."""
    with httpx.Client(base_url=base, params=client_params) as http:
        assert merge_url(http, url, params) == http.build_request("POST", url, params=params).url
