"""POST /filter and POST /prioritize: kube-scheduler's extender verbs.

The routes take the raw body (no pydantic model of a whole Pod and NodeList: msgspec decodes only what
the extender reads) and answer ready-encoded JSON. Every refusal is a 4xx with a message saying what is
wrong; kube-scheduler treats any non-200 as the extender failing for that pod.

Each verb is a plain ASGI app behind a Starlette route (405 for other methods): kube-scheduler waits on every
call, so they skip FastAPI's dependency solving and Starlette's Request and Response objects (the handler
itself takes ~0.05 ms on a memo hit).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import cast

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gpufleet_extender.service import Extender
from gpufleet_extender.wire import WireError, encode

_Endpoint = Callable[[Request], Awaitable[Response]]

log = logging.getLogger(__name__)
router = APIRouter(tags=["scheduler"])

# Bodies above this are decided on a worker thread: a few MB of node names take a second of Python, which on
# the event loop would stall /healthz and every other request with it. Small bodies stay inline (no hop).
THREAD_BODY_BYTES = 256 * 1024
# ASCII digits only, and few: "²".isdigit() is True and int() of 5,000 digits raises.
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,18}")


class BodyTooLarge(WireError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than MAX_BODY_BYTES ({limit} bytes)", 413)


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request body (None: the client went away), refusing more than ``limit`` bytes before reading them all."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not _CONTENT_LENGTH.fullmatch(value):
                raise WireError("invalid Content-Length header", 400)
            if int(value) > limit:
                raise BodyTooLarge(limit)
            break
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class _Verb:
    """One verb as a plain ASGI app behind its route: no Request or Response objects per call."""

    def __init__(self, verb: str) -> None:
        self.verb = verb

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extender: Extender = scope["app"].state.extender
        status = 200
        try:
            body = await read_body(scope, receive, extender.settings.MAX_BODY_BYTES)
            if body is None:
                return
            # Timed from the whole body in hand: reading it waits on the network and on other requests.
            started = time.perf_counter()
            handle = extender.filter if self.verb == "filter" else extender.prioritize
            answer = handle(body) if len(body) <= THREAD_BODY_BYTES else await run_in_threadpool(handle, body)
            extender.telemetry.observe_request(self.verb, time.perf_counter() - started)
        except WireError as exc:
            extender.telemetry.bad_requests.labels(self.verb, str(exc.status)).inc()
            status, answer = exc.status, encode({"detail": str(exc)})
        except Exception:  # a bug, not the client's fault: still answered and counted like every non-200
            log.exception("%s failed", self.verb)
            extender.telemetry.bad_requests.labels(self.verb, "500").inc()
            status, answer = 500, encode({"detail": f"internal error in {self.verb}; see the extender's log"})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


# kube-scheduler extender filter verb (ExtenderArgs -> ExtenderFilterResult) and prioritize verb
# (ExtenderArgs -> HostPriorityList).
class _WrongMethod:
    """405 for the verbs' paths, counted like every other non-200 answer to them (an ASGI app, as _Verb: Starlette
    would wrap a plain function as a Request endpoint)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _wrong_method(scope, send)


async def _wrong_method(scope: Scope, send: Send) -> None:
    extender: Extender = scope["app"].state.extender
    verb = scope["path"].strip("/")
    extender.telemetry.bad_requests.labels(verb, "405").inc()
    answer = encode({"detail": f"{scope['method']} not allowed: kube-scheduler POSTs ExtenderArgs to /{verb}"})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(answer)).encode()),
        (b"allow", b"POST"),
    ]
    await send({"type": "http.response.start", "status": 405, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


# Starlette serves an endpoint that is not a function as a raw ASGI app, but add_route's annotation admits only
# request handlers: the casts say what the call does.
router.add_route("/filter", cast(_Endpoint, _Verb("filter")), methods=["POST"], include_in_schema=False)
router.add_route("/prioritize", cast(_Endpoint, _Verb("prioritize")), methods=["POST"], include_in_schema=False)
for _path in ("/filter", "/prioritize"):
    router.add_route(
        _path, cast(_Endpoint, _WrongMethod()), methods=["GET", "PUT", "PATCH", "DELETE"], include_in_schema=False
    )
