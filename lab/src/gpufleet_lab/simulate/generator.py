"""A seeded generator of realistic mixed traces, sized to the fleet it will run on.

Each tenant pool gets, for each resource its nodes expose, the workload that resource is there for:

- whole GPUs (``nvidia.com/gpu``, the LLM pool): tensor-parallel inference pods on 4 or 8 GPUs, 30-120 min,
  high steady utilisation (0.70-0.92, drifting a little every 5 min), 55-72 GB per GPU;
- 2g/3g/4g MIG instances (image generation): pods arriving in bursts of 4-12 within 20 s (a batch job or a
  traffic spike), 5-25 min, utilisation alternating between idle (0.05-0.15) and generating (0.85-0.98),
  memory 50-85 % of the instance;
- 1g instances (finance NLP, previews): many short pods (1-10 min) of steady moderate load (0.25-0.65), 30-80 %
  of the instance's memory; on a time-sliced 1g instance the same pods hold a BERT-class model's memory instead
  (``nlp_memory_gb``: 1.1-3.9 GB), since replicas share the instance's memory.

How many run at once follows a load curve over the trace (quiet at the start and end, busiest in the middle):
at each moment the expected devices in use are ``curve(t) x devices`` of the resource, fewer when pods share
devices (time-slicing) so that the expected device utilisation, not the slot count, follows the curve. The
default curve peaks at 80 %: busy but not saturated, so placement quality matters. Arrivals are a
non-homogeneous Poisson process (thinning), one ``random.Random`` per trace, so a seed gives the same trace.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from gpufleet_extender.pods import MIG_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE

from gpufleet_lab.simulate.fleet import Fleet
from gpufleet_lab.simulate.trace import PodSpec, Schedule, Trace, make_trace


@dataclass(frozen=True, slots=True)
class LoadCurve:
    """Share of a pool's devices in use over the trace: ``base`` at the ends, ``peak`` in the middle."""

    base: float = 0.35
    peak: float = 0.80

    def at(self, fraction: float) -> float:
        return self.base + (self.peak - self.base) * math.sin(math.pi * fraction) ** 2


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """How one kind of pod looks; ``make`` draws one pod's (count, duration, util, mem_gb)."""

    kind: str
    mean_count: float
    mean_duration: float  # seconds
    mean_util: float
    burst: tuple[int, int] | None  # pods per burst (min, max), or None for independent arrivals
    make: Callable[[random.Random, float, int], tuple[int, float, Schedule, Schedule]]


def _llm(rng: random.Random, memory_gb: float, max_count: int) -> tuple[int, float, Schedule, Schedule]:
    count = 8 if max_count >= 8 and rng.random() < 0.3 else min(4, max_count)
    duration = rng.uniform(30 * 60, 120 * 60)
    base = rng.uniform(0.70, 0.92)
    offsets = [float(o) for o in range(0, int(duration), 300)]
    utils = [round(min(0.98, max(0.5, base + rng.uniform(-0.04, 0.04))), 3) for _ in offsets]
    mem = round(rng.uniform(55, 72) * memory_gb / 80.0, 1)
    return count, round(duration), Schedule(tuple(offsets), tuple(utils)), Schedule.constant(mem)


def _burst(rng: random.Random, memory_gb: float, max_count: int) -> tuple[int, float, Schedule, Schedule]:
    duration = rng.uniform(5 * 60, 25 * 60)
    offsets, utils, at, busy = [], [], 0.0, rng.random() < 0.7  # most pods start with a request waiting
    while at < duration:
        offsets.append(round(at))
        utils.append(round(rng.uniform(0.85, 0.98) if busy else rng.uniform(0.05, 0.15), 3))
        at = round(at) + (rng.uniform(30, 120) if busy else rng.uniform(20, 90))
        busy = not busy
    mem = round(memory_gb * rng.uniform(0.5, 0.85), 1)
    return 1, round(duration), Schedule(tuple(float(o) for o in offsets), tuple(utils)), Schedule.constant(mem)


def _small(rng: random.Random, memory_gb: float, max_count: int) -> tuple[int, float, Schedule, Schedule]:
    duration = rng.uniform(60, 600)
    util = round(rng.uniform(0.25, 0.65), 3)
    mem = round(memory_gb * rng.uniform(0.3, 0.8), 1)
    return 1, round(duration), Schedule.constant(util), Schedule.constant(mem)


# The models a time-sliced 1g pool serves (finance NLP): BERT-class classifiers and embedding models, by share of
# pods, with their parameter counts (millions, from the model cards) and bytes per parameter at the precision they
# run in (docs/simulator.md, "Memory and slowdown on shared devices").
NLP_MODELS = (
    ("all-MiniLM-L6-v2 embeddings, fp32", 0.25, 22.7, 4),
    ("bert-base classifier, fp32", 0.30, 110.0, 4),
    ("bert-base classifier, fp16", 0.15, 110.0, 2),
    ("bge-large / e5-large embeddings, fp16", 0.20, 335.0, 2),
    ("bert-large classifier, fp32", 0.10, 340.0, 4),
)
NLP_CONTEXT_GB = 0.5  # the CUDA context and framework a PyTorch process holds before any model (assumed)
NLP_ACTIVATIONS_GB = (0.5, 2.0)  # peak activations kept by the caching allocator, batch 32-128 x 128-512 tokens


def nlp_memory_gb(rng: random.Random, scale: float = 1.0) -> float:
    """One BERT-class pod's GPU memory (GB): CUDA context + weights at its precision + peak activations, x scale."""
    draw, params, width = rng.random(), NLP_MODELS[-1][2], NLP_MODELS[-1][3]
    for _, share, model_params, model_width in NLP_MODELS:
        if draw < share:
            params, width = model_params, model_width
            break
        draw -= share
    weights = params * 1e6 * width / 1e9
    return round(scale * (NLP_CONTEXT_GB + weights + rng.uniform(*NLP_ACTIVATIONS_GB)), 2)


def _nlp(rng: random.Random, memory_gb: float, max_count: int) -> tuple[int, float, Schedule, Schedule]:
    """A time-sliced 1g pod: the small pods' life and load, a BERT-class model's memory (held from start to end)."""
    duration = rng.uniform(60, 600)
    util = round(rng.uniform(0.25, 0.65), 3)
    return 1, round(duration), Schedule.constant(util), Schedule.constant(nlp_memory_gb(rng))


LLM = WorkloadClass("llm", 4 * 0.7 + 8 * 0.3, 75 * 60, 0.81, None, _llm)

# The tp-mix trace's LLM pool: tensor-parallel degree 1, 2, 4 or 8, by share of pods (docs/simulator.md).
TP_MIX = ((1, 0.40), (2, 0.25), (4, 0.20), (8, 0.15))


def _llm_tp_mix(rng: random.Random, memory_gb: float, max_count: int) -> tuple[int, float, Schedule, Schedule]:
    draw, count = rng.random(), TP_MIX[-1][0]
    for degree, share in TP_MIX:
        if draw < share:
            count = degree
            break
        draw -= share
    _, duration, util, mem = _llm(rng, memory_gb, max_count)  # same life, load and memory as the LLM pods
    return min(count, max_count), duration, util, mem


LLM_TP_MIX = WorkloadClass("llm-tp", sum(d * s for d, s in TP_MIX), 75 * 60, 0.81, None, _llm_tp_mix)
IMAGE_BURST = WorkloadClass("image-burst", 1, 15 * 60, 0.53, (4, 12), _burst)
SMALL = WorkloadClass("small", 1, 330, 0.45, None, _small)
NLP_SHARED = WorkloadClass("nlp", 1, 330, 0.45, None, _nlp)


def workload_for(resource: str, replicas: int = 1) -> WorkloadClass:
    """The workload a resource is there for; a time-sliced 1g instance serves BERT-class NLP models."""
    if resource == WHOLE_GPU_RESOURCE:
        return LLM
    compute = resource.removeprefix(MIG_RESOURCE_PREFIX).split("g.", 1)[0]
    if compute != "1":
        return IMAGE_BURST
    return NLP_SHARED if replicas > 1 else SMALL


def _arrival_times(
    rng: random.Random, rate: Callable[[float], float], peak_rate: float, duration: float
) -> Iterator[float]:
    """Non-homogeneous Poisson arrivals in [0, duration) by thinning."""
    if peak_rate <= 0:
        return
    now = 0.0
    while True:
        now += rng.expovariate(peak_rate)
        if now >= duration:
            return
        if rng.random() * peak_rate <= rate(now):
            yield now


@dataclass(frozen=True, slots=True)
class _Stream:
    """The pods of one resource in one tenant pool."""

    tenant: str
    namespace: str
    pod_tenant: str | None  # set when the fleet lists no namespace for the tenant
    resource: str
    devices: int
    max_count: int  # most devices of the resource on one node
    memory_gb: float
    work: WorkloadClass
    pods_per_device: float

    def rate(self, t: float, duration: float, curve: LoadCurve) -> float:
        """Pod arrivals per second (bursts count as one) that keep ``curve`` x devices busy (Little's law)."""
        burst = (self.work.burst[0] + self.work.burst[1]) / 2 if self.work.burst else 1.0
        in_flight = curve.at(t / duration) * self.devices * self.pods_per_device
        return in_flight / (self.work.mean_count * self.work.mean_duration * burst)


def _streams(fleet: Fleet, workloads: Mapping[str, WorkloadClass] | None = None) -> list[_Stream]:
    streams = []
    for tenant in fleet.tenants():
        namespaces = fleet.namespaces_of(tenant)
        pool = [n for n in fleet.nodes if n.tenant == tenant]
        for resource in fleet.resources_of(tenant):
            replicas = fleet.replicas_for(tenant, resource)
            work = (workloads or {}).get(resource) or workload_for(resource, replicas)
            # Exclusive devices hold one pod each; shared ones hold as many as keep the expected utilisation on
            # the curve, never more than their slots.
            per_device = min(float(replicas), 1.0 / work.mean_util) if replicas > 1 else 1.0
            streams.append(
                _Stream(
                    tenant=tenant,
                    namespace=namespaces[0] if namespaces else tenant,
                    pod_tenant=None if namespaces else tenant,
                    resource=resource,
                    devices=sum(len(n.devices_of(resource)) for n in pool),
                    max_count=max(len(n.devices_of(resource)) for n in pool),
                    memory_gb=next(d.memory_gb for n in pool for d in n.devices_of(resource)),
                    work=work,
                    pods_per_device=per_device,
                )
            )
    return streams


def generate_trace(
    fleet: Fleet,
    seed: int,
    duration: float = 4 * 3600,
    curve: LoadCurve = LoadCurve(),
    scenario: str = "mixed",
    workloads: Mapping[str, WorkloadClass] | None = None,
) -> Trace:
    """A mixed trace for every tenant pool of ``fleet``; the same arguments always give the same trace.

    ``scenario`` only names the trace in its source line; ``curve`` decides how busy it is; ``workloads`` replaces
    the workload of some resources (``SCENARIO_WORKLOADS``).
    """
    rng = random.Random(f"gpufleet-sim/{seed}")
    pods: list[PodSpec] = []

    def add(stream: _Stream, at: float, life: float = 1.0) -> None:
        count, pod_duration, util, mem = stream.work.make(rng, stream.memory_gb, stream.max_count)
        name = f"{stream.tenant}-{stream.work.kind}-{len(pods) + 1:05d}"
        pod_duration = max(30, round(pod_duration * life))
        pods.append(
            PodSpec(
                name, round(at, 1), stream.namespace, stream.resource, count, pod_duration, util, mem, stream.pod_tenant
            )
        )

    for stream in _streams(fleet, workloads):
        # Warm start: the pods already running when the trace begins arrive in its first minute with what is left
        # of their life, so the fleet starts at the curve's base load instead of empty.
        running_at_start = curve.at(0.0) * stream.devices * stream.pods_per_device / stream.work.mean_count
        for _ in range(round(running_at_start)):
            add(stream, rng.uniform(0, 60), life=rng.random())
        peak = max(stream.rate(duration * i / 200, duration, curve) for i in range(201))

        def rate(t: float, s: _Stream = stream) -> float:
            return s.rate(t, duration, curve)

        for arrival in _arrival_times(rng, rate, peak, duration):
            for _ in range(rng.randint(*stream.work.burst) if stream.work.burst else 1):
                add(stream, arrival + (rng.uniform(0, 20) if stream.work.burst else 0.0))
    return make_trace(pods, source=f"generated: {scenario}, seed {seed}, {duration / 3600:g} h")


# Named traces the CLI offers: the same workload mix, at different levels over the trace.
SCENARIOS: dict[str, LoadCurve] = {
    # Busy but not saturated: 35 % of the devices in use at the ends, 80 % in the middle.
    "mixed": LoadCurve(),
    # A night: 25 % in use in the evening, falling to 10 % in the small hours and back (a peak below the base).
    "quiet-night": LoadCurve(base=0.25, peak=0.10),
    # The busiest hours: 70 % in use, rising to 92 % in the middle, where pods start to wait.
    "peak-hour": LoadCurve(base=0.70, peak=0.92),
    # The mixed curve with tensor-parallel degrees 1, 2, 4 and 8 in the LLM pool (fragmentation).
    "tp-mix": LoadCurve(),
}
# Scenarios whose workload differs from ``workload_for``'s for some resources.
SCENARIO_WORKLOADS: dict[str, dict[str, WorkloadClass]] = {"tp-mix": {WHOLE_GPU_RESOURCE: LLM_TP_MIX}}
