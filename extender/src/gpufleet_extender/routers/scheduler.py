"""POST /filter and POST /prioritize: kube-scheduler's extender verbs.

The routes take the raw body (no pydantic model of a whole Pod and NodeList: msgspec decodes only what
the extender reads) and answer ready-encoded JSON. Every refusal is a 4xx with a message saying what is
wrong; kube-scheduler treats any non-200 as the extender failing for that pod.

They are plain Starlette routes on the router: kube-scheduler waits on every call, and FastAPI's per-request
dependency and signature handling costs more than the handler itself on a memo hit.
"""

from __future__ import annotations

import logging
import re
import time

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from gpufleet_extender.service import Extender
from gpufleet_extender.wire import WireError

log = logging.getLogger(__name__)
router = APIRouter(tags=["scheduler"])

# Bodies above this are decided on a worker thread: a few MB of node names take a second of Python, which on
# the event loop would stall /healthz and every other request with it. Small bodies stay inline (no hop).
THREAD_BODY_BYTES = 256 * 1024
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")


class BodyTooLarge(WireError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than MAX_BODY_BYTES ({limit} bytes)", 413)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        # ASCII digits only, and few: "²".isdigit() is True and int() of 5,000 digits raises.
        if not _CONTENT_LENGTH.fullmatch(declared):
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
        handle = extender.filter if verb == "filter" else extender.prioritize
        answer = handle(body) if len(body) <= THREAD_BODY_BYTES else await run_in_threadpool(handle, body)
    except WireError as exc:
        extender.telemetry.bad_requests.labels(verb, str(exc.status)).inc()
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)
    except Exception:  # a bug, not the client's fault: still answered and counted like every non-200
        log.exception("%s failed", verb)
        extender.telemetry.bad_requests.labels(verb, "500").inc()
        return JSONResponse({"detail": f"internal error in {verb}; see the extender's log"}, status_code=500)
    extender.telemetry.observe_request(verb, time.perf_counter() - started)
    return Response(content=answer, media_type="application/json")


async def filter_nodes(request: Request) -> Response:
    """kube-scheduler filter verb (ExtenderArgs -> ExtenderFilterResult)."""
    return await _answer("filter", request)


async def prioritize_nodes(request: Request) -> Response:
    """kube-scheduler prioritize verb (ExtenderArgs -> HostPriorityList)."""
    return await _answer("prioritize", request)


async def wrong_method(request: Request) -> Response:
    """405 for the verbs' paths, counted like every other non-200 answer to them."""
    extender: Extender = request.app.state.extender
    verb = request.url.path.strip("/")
    extender.telemetry.bad_requests.labels(verb, "405").inc()
    return JSONResponse(
        {"detail": f"{request.method} not allowed: kube-scheduler POSTs ExtenderArgs to /{verb}"},
        status_code=405,
        headers={"Allow": "POST"},
    )


router.add_route("/filter", filter_nodes, methods=["POST"], include_in_schema=False)
router.add_route("/prioritize", prioritize_nodes, methods=["POST"], include_in_schema=False)
for _path in ("/filter", "/prioritize"):
    router.add_route(_path, wrong_method, methods=["GET", "PUT", "PATCH", "DELETE"], include_in_schema=False)
