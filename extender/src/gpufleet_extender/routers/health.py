"""GET /healthz (the process serves), /readyz (decisions can be trusted), /metrics (prometheus-client).

/readyz is 503 while metrics are required and missing (ON_MISSING_METRICS=deny), while the Kubernetes API refuses
a list or watch the extender needs (``kube_api_errors``: kind -> the API's message), or until each kind it watches
has been listed once since the start (``kube_api_unsynced``: bound pods among them, so that a restarted extender's
first decisions count the bindings made before it started). ``metrics_blind`` is true while
decisions use no GPU metrics at all (none loaded, or all older than METRICS_MAX_AGE_SECONDS), whatever the policy;
``metrics_stale_nodes`` counts the nodes in that state while others are fresh (``metrics_stale_node_names``: the first).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufleet_extender.dependencies import ExtenderDep

router = APIRouter(tags=["health"])


async def healthz(request: Request) -> Response:
    """Liveness: answers as soon as the server listens, the first snapshot loaded or not."""
    return Response(b'{"status":"ok"}', media_type="application/json")


router.add_route("/healthz", healthz, methods=["GET"], include_in_schema=False)


@router.get("/readyz")
async def readyz(extender: ExtenderDep, request: Request) -> JSONResponse:
    age = extender.metrics_age()
    blind = extender.blind_reason()
    stale = extender.stale_nodes()
    # Lists/watches the Kubernetes API refuses (missing RBAC): decisions would ignore what they feed.
    refused: dict[str, str] = getattr(request.app.state, "kube_api_refused", dict)()
    # Kinds not listed yet since the start: bound pods among them, the in-flight bindings are not rebuilt yet.
    unsynced: list[str] = getattr(request.app.state, "kube_api_unsynced", list)()
    body = {
        "ready": extender.ready() and not refused and not unsynced,
        "loading": extender.loading(),
        "metrics_age_seconds": None if age == float("inf") else round(age, 3),
        # Decisions use no metrics at all: under ON_MISSING_METRICS=allow the extender still answers (ready), but
        # places like a scheduler without it. Not a 503: that would take the extender out of its Service.
        "metrics_blind": blind is not None,
        "metrics_blind_reason": blind,
        # Blind for some nodes only (their samples aged out while others' did not): the count and the first names.
        "metrics_stale_nodes": stale.count,
        "metrics_stale_node_names": list(stale.named),
        "on_missing_metrics": extender.policy.missing_policy_name,
        "metrics_source": extender.settings.METRICS_SOURCE.value,
        "metrics_source_error": extender.source_error(),
        "metrics_source_warnings": extender.source_warnings(),
        "kube_api_errors": refused,
        "kube_api_unsynced": unsynced,
    }
    return JSONResponse(body, status_code=200 if body["ready"] else 503)


@router.get("/metrics")
async def metrics(extender: ExtenderDep) -> Response:
    return Response(generate_latest(extender.telemetry.registry), media_type=CONTENT_TYPE_LATEST)
