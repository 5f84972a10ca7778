from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  nvml_sim_state:
    description:
      - Path of an NVML simulator state file. When set, the module talks to the simulator instead of
        C(libnvidia-ml) (see C(docs/nvml_simulator.md)); a missing file is created as 8 x NVIDIA H100 80GB HBM3 with
        MIG disabled (C(GPUFLEET_NVML_SIM_GPUS) and C(GPUFLEET_NVML_SIM_PRODUCT) change those defaults).
      - When unset, the real NVML library is used through nvidia-ml-py (C(pynvml)), which must be installed for the
        module's Python. The simulator is chosen by this option only; the environment variable C(GPUFLEET_NVML_SIM)
        is ignored (with a warning).
    type: path
  nvml_sim_on_gpu_host:
    description:
      - Allow O(nvml_sim_state) on a host where an NVIDIA driver is loaded (C(/proc/driver/nvidia/version) or
        C(/dev/nvidiactl) exists). Without it the module refuses the simulator there, since a layout applied to the
        simulator would be reported as done while no GPU changed.
    type: bool
    default: false
requirements:
  - nvidia-ml-py (pynvml) on the managed host, unless the NVML simulator is used
"""
