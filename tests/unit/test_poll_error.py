"""A failed status poll of a remote gateway is said plainly in the router's reasons and logs (issue 39: a stale
gateway token read as ``HTTPStatusError``)."""

from __future__ import annotations

import httpx

from prfaas_router.state.signals import poll_error


def _status_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "https://gw.example/status")
    response = httpx.Response(code, request=request)
    return httpx.HTTPStatusError(f"{code}", request=request, response=response)


def test_a_refused_token_says_so() -> None:
    for code in (401, 403):
        what = poll_error(_status_error(code))
        assert what.startswith(f"HTTP {code}") and "token" in what and "tokenFile" in what
        assert "HTTPStatusError" not in what


def test_other_failures_name_the_status_or_the_kind() -> None:
    assert poll_error(_status_error(503)) == "HTTP 503"
    assert "connection refused" in poll_error(httpx.ConnectError("boom"))
    assert poll_error(httpx.ReadTimeout("slow")).startswith("ReadTimeout: no answer in time")
    assert "not a gateway status" in poll_error(ValueError("junk"))
