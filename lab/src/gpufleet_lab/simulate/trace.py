"""Workload traces: which pods arrive when, what they ask for, and the load they drive on their devices.

One pod per entry. Fields (CSV header names, JSONL keys):

- ``arrival``: seconds from the start of the trace;
- ``namespace``: where the pod runs; its tenant (from the inventory's ``gpufleet_tenants``) decides which pool
  the pod may use. ``tenant`` instead names the tenant directly;
- ``resource``: ``nvidia.com/gpu``, ``nvidia.com/mig-2g.20gb``; short forms ``gpu`` and ``2g.20gb`` work too;
- ``count``: devices of that resource (default 1);
- ``duration``: seconds the pod runs once started;
- ``util``: utilisation the pod drives on each of its devices, 0..1;
- ``mem_gb``: memory the pod uses on each of its devices, GB;
- ``name``: optional, defaults to ``pod-<line>``.

``util`` and ``mem_gb`` may vary over the pod's life: a number, or a piecewise-constant schedule of
``offset:value`` steps (seconds since the pod started) - ``"0:0.2 60:0.9 120:0.2"`` in CSV,
``[[0, 0.2], [60, 0.9], [120, 0.2]]`` in JSONL.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet_extender.pods import ResourceRequest

from gpufleet_lab.mig_utils.names import RESOURCE_FORMS, resource_name
from gpufleet_lab.simulate.errors import SimulationError

CSV_FIELDS = ("arrival", "namespace", "tenant", "resource", "count", "duration", "util", "mem_gb", "name")


class TraceError(SimulationError):
    """A trace entry cannot be used; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A piecewise-constant value over a pod's life: ``values[i]`` holds from ``offsets[i]`` on."""

    offsets: tuple[float, ...]
    values: tuple[float, ...]

    @classmethod
    def constant(cls, value: float) -> Schedule:
        return cls((0.0,), (value,))

    def at(self, elapsed: float) -> float:
        if len(self.values) == 1:
            return self.values[0]
        return self.values[max(0, bisect.bisect_right(self.offsets, elapsed) - 1)]

    def at_until(self, elapsed: float) -> tuple[float, float]:
        """The value at ``elapsed`` and the offset where it next changes (inf when it never does)."""
        if len(self.values) == 1:
            return self.values[0], math.inf
        index = max(0, bisect.bisect_right(self.offsets, elapsed) - 1)
        following = self.offsets[index + 1] if index + 1 < len(self.offsets) else math.inf
        return self.values[index], following

    def to_json(self) -> float | list[list[float]]:
        if len(self.values) == 1:
            return self.values[0]
        return [[o, v] for o, v in zip(self.offsets, self.values, strict=True)]

    def to_text(self) -> str:
        if len(self.values) == 1:
            return f"{self.values[0]:g}"
        return " ".join(f"{o:g}:{v:g}" for o, v in zip(self.offsets, self.values, strict=True))


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    arrival: float
    namespace: str
    resource: str
    count: int
    duration: float
    util: Schedule
    mem_gb: Schedule
    tenant: str | None = None  # set when the trace names a tenant instead of a namespace

    @property
    def request(self) -> tuple[ResourceRequest, ...]:
        """The pod's request in the extender's own shape (scoring.evaluate_node takes it as is)."""
        return (ResourceRequest(self.resource, self.count),)

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "arrival": self.arrival}
        entry.update({"tenant": self.tenant} if self.tenant else {"namespace": self.namespace})
        entry.update(
            resource=self.resource,
            count=self.count,
            duration=self.duration,
            util=self.util.to_json(),
            mem_gb=self.mem_gb.to_json(),
        )
        return entry


@dataclass(frozen=True, slots=True)
class Trace:
    pods: tuple[PodSpec, ...]  # sorted by arrival, then name
    source: str = ""

    @property
    def end(self) -> float:
        """When the last pod would finish if every pod started on arrival."""
        return max((p.arrival + p.duration for p in self.pods), default=0.0)


def normalise_resource(name: str) -> str:
    """The device plugin's resource for a trace's ``resource`` (short forms allowed), or TraceError."""
    resource: str | None = resource_name(name)
    if resource is None:
        raise TraceError(f"resource {name.strip()!r} is not {RESOURCE_FORMS}")
    return resource


def _number(value: Any, what: str, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, bool):
        raise TraceError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number) or (low is not None and number < low) or (high is not None and number > high):
        bounds = f" in {low:g}..{high:g}" if high is not None else f" >= {low:g}" if low is not None else ""
        raise TraceError(f"{what} must be a finite number{bounds}, got {value!r}")
    return number


def parse_schedule(value: Any, what: str, high: float | None) -> Schedule:
    """A number, ``"0:0.2 60:0.9"`` or ``[[0, 0.2], [60, 0.9]]`` -> Schedule (first step at offset 0)."""
    if isinstance(value, str) and ":" in value:
        steps: Sequence[Any] = [part.split(":", 1) for part in value.replace(";", " ").split()]
    elif isinstance(value, list):
        steps = value
    else:
        return Schedule.constant(_number(value, what, 0.0, high))
    offsets, values = [], []
    for step in steps:
        if not isinstance(step, (list, tuple)) or len(step) != 2:
            raise TraceError(f"{what}: each step must be offset:value, got {step!r}")
        offsets.append(_number(step[0], f"{what} offset", 0.0))
        values.append(_number(step[1], what, 0.0, high))
    if not offsets or offsets[0] != 0 or any(b <= a for a, b in itertools.pairwise(offsets)):
        raise TraceError(f"{what}: steps must start at offset 0 and increase, got {value!r}")
    return Schedule(tuple(offsets), tuple(values))


def pod_from_mapping(entry: Mapping[str, Any], default_name: str) -> PodSpec:
    unknown = set(entry) - set(CSV_FIELDS)
    if unknown:
        raise TraceError(f"unknown field(s) {sorted(unknown)} (known: {', '.join(CSV_FIELDS)})")
    namespace = str(entry.get("namespace") or "").strip()
    tenant = str(entry.get("tenant") or "").strip() or None
    if not namespace and not tenant:
        raise TraceError("needs a namespace or a tenant")
    count = _number(entry.get("count", 1), "count", 1.0)
    if not count.is_integer():
        raise TraceError(f"count must be a whole number, got {entry.get('count')!r}")
    duration = _number(entry.get("duration"), "duration", 0.0)
    if duration <= 0:
        raise TraceError("duration must be above 0")
    return PodSpec(
        name=str(entry.get("name") or default_name),
        arrival=_number(entry.get("arrival"), "arrival", 0.0),
        namespace=namespace or str(tenant),  # a tenant-only entry runs in a namespace named after it
        resource=normalise_resource(str(entry.get("resource") or "")),
        count=int(count),
        duration=duration,
        util=parse_schedule(entry.get("util", 0), "util", 1.0),
        mem_gb=parse_schedule(entry.get("mem_gb", 0), "mem_gb", None),
        tenant=tenant,
    )


def make_trace(pods: Iterable[PodSpec], source: str = "") -> Trace:
    ordered = tuple(sorted(pods, key=lambda p: (p.arrival, p.name)))
    names = [p.name for p in ordered]
    if len(set(names)) != len(names):
        raise TraceError(f"{source or 'trace'}: pod names must be unique")
    return Trace(ordered, source)


def _entries(path: Path) -> Iterable[tuple[int, Mapping[str, Any]]]:
    with path.open(encoding="utf-8", newline="") as handle:
        if path.suffix == ".csv":
            reader = csv.DictReader(handle)
            missing = {"arrival", "resource", "duration"} - set(reader.fieldnames or [])
            if missing:
                raise TraceError(f"{path}: CSV header lacks {sorted(missing)} (columns: {', '.join(CSV_FIELDS)})")
            for row in reader:
                yield reader.line_num, {k: v for k, v in row.items() if k and v not in (None, "")}
        else:
            for number, line in enumerate(handle, 1):
                if line.strip() and not line.lstrip().startswith("#"):
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise TraceError(f"{path}:{number}: not JSON: {exc}") from None
                    if not isinstance(entry, dict):
                        raise TraceError(f"{path}:{number}: each line must be a JSON object")
                    yield number, entry


def load_trace(path: str | Path) -> Trace:
    """Read a ``.csv`` or ``.jsonl`` trace; TraceError names the line of the first bad entry."""
    file_path = Path(path)
    if file_path.suffix not in (".csv", ".jsonl", ".json"):
        raise TraceError(f"trace {file_path}: use a .csv or .jsonl file")
    pods = []
    try:
        for number, entry in _entries(file_path):
            try:
                pods.append(pod_from_mapping(entry, f"pod-{number}"))
            except TraceError as exc:
                raise TraceError(f"{file_path}:{number}: {exc}") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {file_path}: {exc.strerror or exc}") from None
    if not pods:
        raise TraceError(f"trace {file_path} has no pods")
    return make_trace(pods, str(file_path))


def write_trace(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` as JSONL (or CSV when the name ends in .csv) that load_trace reads back unchanged."""
    file_path = Path(path)
    file_path.parent.mkdir(parents=True, exist_ok=True)
    with file_path.open("w", encoding="utf-8", newline="") as handle:
        if file_path.suffix == ".csv":
            writer = csv.writer(handle)
            writer.writerow(CSV_FIELDS)
            for p in trace.pods:
                namespace = "" if p.tenant else p.namespace
                row = [p.arrival, namespace, p.tenant or "", p.resource, p.count, p.duration]
                writer.writerow([*row, p.util.to_text(), p.mem_gb.to_text(), p.name])
        else:
            for p in trace.pods:
                handle.write(json.dumps(p.to_json(), separators=(",", ":")) + "\n")
