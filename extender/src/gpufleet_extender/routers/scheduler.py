"""POST /filter and POST /prioritize: kube-scheduler's extender verbs.

The routes take the raw body (no pydantic model of a whole Pod and NodeList: msgspec decodes only what
the extender reads) and answer ready-encoded JSON. Every refusal is a 4xx with a message saying what is
wrong; kube-scheduler treats any non-200 as the extender failing for that pod.

They are plain Starlette routes on the router: kube-scheduler waits on every call, so they skip FastAPI's
per-request dependency solving and signature handling (the handler itself takes ~0.05 ms on a memo hit).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gpufleet_extender.service import Extender
from gpufleet_extender.wire import WireError

router = APIRouter(tags=["scheduler"])


class BodyTooLarge(WireError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than MAX_BODY_BYTES ({limit} bytes)", 413)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise WireError("invalid Content-Length header", 400)
        if int(declared) > limit:
            raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _answer(verb: str, request: Request) -> Response:
    extender: Extender = request.app.state.extender
    try:
        body = await read_body(request, extender.settings.MAX_BODY_BYTES)
        # Timed from the whole body in hand: reading it waits on the network and on other requests.
        started = time.perf_counter()
        answer = extender.filter(body) if verb == "filter" else extender.prioritize(body)
    except WireError as exc:
        extender.telemetry.bad_requests.labels(verb, str(exc.status)).inc()
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)
    extender.telemetry.observe_request(verb, time.perf_counter() - started)
    return Response(content=answer, media_type="application/json")


async def filter_nodes(request: Request) -> Response:
    """kube-scheduler filter verb (ExtenderArgs -> ExtenderFilterResult)."""
    return await _answer("filter", request)


async def prioritize_nodes(request: Request) -> Response:
    """kube-scheduler prioritize verb (ExtenderArgs -> HostPriorityList)."""
    return await _answer("prioritize", request)


router.add_route("/filter", filter_nodes, methods=["POST"], include_in_schema=False)
router.add_route("/prioritize", prioritize_nodes, methods=["POST"], include_in_schema=False)
