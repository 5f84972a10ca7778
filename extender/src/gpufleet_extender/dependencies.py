"""FastAPI dependencies: the per-app objects the lifespan created, as Annotated aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gpufleet_extender.service import Extender


def get_extender(request: Request) -> Extender:
    extender: Extender = request.app.state.extender
    return extender


ExtenderDep = Annotated[Extender, Depends(get_extender)]
