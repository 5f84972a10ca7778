"""POST /filter and POST /prioritize: kube-scheduler's extender verbs.

The routes take the raw body (no pydantic model of a whole Pod and NodeList: msgspec decodes only what
the extender reads) and answer ready-encoded JSON. Every refusal is a 4xx with a message saying what is
wrong; kube-scheduler treats any non-200 as the extender failing for that pod.

Each verb is a plain ASGI app behind a Starlette route (405 for other methods): kube-scheduler waits on every
call, so they skip FastAPI's dependency solving and Starlette's Request and Response objects (the handler
itself takes ~0.05 ms on a memo hit).
"""

from __future__ import annotations

import time

from fastapi import APIRouter
from starlette.types import Receive, Scope, Send

from gpufleet_extender.service import Extender
from gpufleet_extender.wire import WireError, encode

router = APIRouter(tags=["scheduler"])


class BodyTooLarge(WireError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than MAX_BODY_BYTES ({limit} bytes)", 413)


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request body (None: the client went away), refusing more than ``limit`` bytes before reading them all."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit():
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
            answer = extender.filter(body) if self.verb == "filter" else extender.prioritize(body)
            extender.telemetry.observe_request(self.verb, time.perf_counter() - started)
        except WireError as exc:
            extender.telemetry.bad_requests.labels(self.verb, str(exc.status)).inc()
            status, answer = exc.status, encode({"detail": str(exc)})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


# kube-scheduler extender filter verb (ExtenderArgs -> ExtenderFilterResult) and prioritize verb
# (ExtenderArgs -> HostPriorityList).
router.add_route("/filter", _Verb("filter"), methods=["POST"], include_in_schema=False)
router.add_route("/prioritize", _Verb("prioritize"), methods=["POST"], include_in_schema=False)
