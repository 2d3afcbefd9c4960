"""A request reusing the token of one still under way from the same peer is refused 4.00, unless it
renews an observation of the same resource (RFC 7641 §3.3.1).

Why: aiocoap's token manager takes a new request on a held (token, peer) as the peer's loss of
interest in the old one, and stops it. When the old one had not started rendering yet (both
datagrams read in one wakeup), its task was cancelled before its first step: the old request was
never answered, and Python
printed "RuntimeWarning: coroutine 'Context._render_to_pipe' was never awaited" on stderr, with a
"New request came in while old request not ACKed yet" warning in the log. 50 pairs of GETs of
/q/lamps and /.well-known/core, each pair on one token from one port: 58-59 answers of 100, now 100
(aiocoap 0.4.17, 2026-12-07, /tmp/atk-coap/tokreuse50.py; aiocoap's message layer still sends the
first one's as a separate confirmable response, and logs that warning, once a minute here). Tokens
are the client's to keep distinct among its requests under way (RFC 7252 §5.3.1); a client that does
not is told so and its first request goes on. Left to aiocoap: renewals of one observation read in
one wakeup (the client asked that each replace the last; 20 at once printed the warning once, as
Python prints a warning once per place). aiocoap has no public hook for this: where its token
managers are not found, nothing is wrapped and aiocoap's behaviour stays.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import aiocoap
from aiocoap import Code
from aiocoap.tokenmanager import TokenManager

from adapters.coap.errors import refusal

Handler = Callable[[aiocoap.Message], None]
IN_USE = "the token is in use by another request of this peer"


def renews(held: aiocoap.Message, request: aiocoap.Message) -> bool:
    """Whether `request` renews (or ends) the observation `held`: both carry Observe, with the same
    method, query and resource. `held` is the request as its resource sees it once rendering began:
    aiocoap's Site puts the request with its path stripped of the resource's prefix in the pipe
    (`/q/lamps` is `lamps` then), so the path is compared from its end."""
    path = held.opt.uri_path
    return (
        request.opt.observe is not None
        and held.opt.observe is not None
        and request.code == held.code
        and request.opt.uri_path[len(request.opt.uri_path) - len(path) :] == path
        and request.opt.uri_query == held.opt.uri_query
    )


def attach(context: aiocoap.Context, count: Handler) -> int:
    """Wrap the request handler of `context`'s token managers; `count` is told of each refusal.
    How many were wrapped."""
    attached = 0
    for manager in context.request_interfaces:
        if isinstance(manager, TokenManager):
            manager.process_request = partial(_process, manager, manager.process_request, count)
            attached += 1
    return attached


def _process(manager: TokenManager, process: Handler, count: Handler, request: Any) -> None:
    held = manager.incoming_requests.get((request.token, request.remote))
    if held is None or renews(held[0].request, request):
        process(request)
        return
    count(request)
    response = refusal(Code.BAD_REQUEST, IN_USE)
    response.token, response.remote, response.request = request.token, request.remote.as_response_address(), request
    manager.token_interface.send_message(response, lambda: None)
