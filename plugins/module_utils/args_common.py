"""Options shared by the modules (documented once in doc_fragments/nvml_backend.py)."""

from __future__ import annotations

import copy
from typing import Any

_NVML_BACKEND_ARGS = {
    "nvml_sim_state": {"type": "path", "required": False},
    "nvml_sim_on_gpu_host": {"type": "bool", "default": False},
}


def nvml_backend_args() -> dict[str, Any]:
    return copy.deepcopy(_NVML_BACKEND_ARGS)
