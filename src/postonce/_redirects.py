"""Redirects stay home, and an answer that arrived is an answer: the send's two rules.

Every send goes out with httpx's ``follow_redirects=False``. A client built to
follow redirects (``follow_redirects=True``, on postonce's client or on the
``http=`` client given) has them followed here, one hop at a time, only while
httpx's ``response.next_request`` is addressed to the origin the request went
to, and at most ``max_redirects`` hops: the hop is httpx's own request, so its
method and header rules apply. A redirect to another origin is never followed
(the intent's body, key and secret headers would go with it): it is the answer,
kept like any other, and a WARNING names both origins.

A response hook of the application (httpx's ``raise_for_status`` idiom) may
raise after the answer arrived. The flow puts an :class:`Answer` in each request
it sends (a request extension: httpx copies it, shallowly, into a redirect's
hop), and postonce's own response hook, first on the client it sends with,
reads the body and leaves the answer there. So the flow can tell "a hook raised
on an answer" (keep the answer, then raise the hook's error) from "no answer
came" (the send was ambiguous). Requests without an Answer (the application's
own, on an ``http=`` client it shares) are left alone: their bodies are not read.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from ._http import library_of
from ._sender import origin_of

__all__ = ["ANSWERED", "Answer", "expect_answer", "mark_answers", "next_hop"]

logger = logging.getLogger("postonce")

#: The request extension that holds a send's :class:`Answer`.
ANSWERED = "postonce.answered"


class Answer:
    """Where postonce's response hook leaves the answer that arrived for one send."""

    __slots__ = ("response",)

    def __init__(self) -> None:
        self.response: httpx.Response | None = None


def expect_answer(request: httpx.Request) -> Answer:
    """Put a fresh :class:`Answer` in ``request``; the hook fills it when an answer arrives."""
    answer = request.extensions[ANSWERED] = Answer()
    return answer


def _mark_answered(response: httpx.Response) -> None:
    answer = response.request.extensions.get(ANSWERED)
    if isinstance(answer, Answer):
        # Read here, before any hook of the application's: httpx closes the
        # answer unread when a later hook raises, and a kept answer needs its body.
        response.read()
        answer.response = response


async def _amark_answered(response: httpx.Response) -> None:
    answer = response.request.extensions.get(ANSWERED)
    if isinstance(answer, Answer):
        await response.aread()
        answer.response = response


def mark_answers(http: Any, *, asynchronous: bool) -> None:
    """Put postonce's marking hook first among ``http``'s response hooks (once).

    The client's hooks are replaced through httpx's ``event_hooks`` setter; a
    client given as ``http=`` and shared by two postonce clients gets it once.
    """
    mark = _amark_answered if asynchronous else _mark_answered
    hooks = http.event_hooks
    response_hooks = list(hooks.get("response", ()))
    if mark not in response_hooks:
        http.event_hooks = {**hooks, "response": [mark, *response_hooks]}


def next_hop(http: Any, response: httpx.Response, hops: int, intent: str) -> httpx.Request | None:
    """The same-origin redirect to send next, or None: ``response`` is the answer.

    ``http`` is the httpx client (its ``follow_redirects`` and ``max_redirects``
    decide); ``hops`` is how many were followed already. Raises httpx's
    ``TooManyRedirects`` past ``max_redirects``, as httpx does.
    """
    hop: httpx.Request | None = response.next_request
    if hop is None or not http.follow_redirects:
        return None
    here, there = origin_of(str(response.request.url)), origin_of(str(hop.url))
    if there is None or there != here:
        logger.warning(
            "intent %r: %s answered HTTP %d with a redirect to %s, another origin; not followed "
            "(the intent's body, key and credentials stay with %s): the redirect is the answer",
            intent,
            here,
            response.status_code,
            there or str(hop.url),
            here,
        )
        return None
    if hops >= http.max_redirects:
        # The last redirect stays the answer that arrived: it is kept before
        # httpx's error reaches the caller.
        raise library_of(http).TooManyRedirects("Exceeded maximum allowed redirects.", request=hop)
    answer = hop.extensions.get(ANSWERED)
    if isinstance(answer, Answer):
        # The hop shares the send's Answer: the redirect answered, the hop has not yet.
        answer.response = None
    return hop
