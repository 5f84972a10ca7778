"""The run's outputs: the table on stdout, results.json, and the per-node load plot (PNG)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufleet_lab.simulate.metrics import GoalCheck, PolicySummary
from gpufleet_lab.simulate.model import RunResult
from gpufleet_lab.simulate.verdict import why_not_met

_COLUMNS = (
    # header, width, how to show the summary's value
    ("policy", 17, lambda s: s.policy),
    ("placed", 7, lambda s: str(s.placed)),
    ("never", 6, lambda s: str(s.never_placed)),
    ("wait p50", 9, lambda s: _seconds(s.wait_p50_s)),
    ("wait p95", 9, lambda s: _seconds(s.wait_p95_s)),
    ("hot", 5, lambda s: str(s.hot_placements)),
    ("held", 6, lambda s: str(s.held)),
    ("load CoV", 9, lambda s: f"{s.load_cov:.3f}"),
    ("mean load", 9, lambda s: f"{s.mean_node_load:.3f}"),
    ("dev p95", 8, lambda s: _fraction(s.device_load_p95)),
    ("dev max", 8, lambda s: _fraction(s.device_load_max)),
)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_table(summaries: Sequence[PolicySummary]) -> str:
    header = "  ".join(
        name.ljust(width) if i == 0 else name.rjust(width) for i, (name, width, _) in enumerate(_COLUMNS)
    )
    lines = [header, "-" * len(header)]
    for summary in summaries:
        cells = [show(summary) for _, _, show in _COLUMNS]
        lines.append(
            "  ".join(
                cell.ljust(width) if i == 0 else cell.rjust(width)
                for i, (cell, (_, width, _)) in enumerate(zip(cells, _COLUMNS, strict=True))
            )
        )
    return "\n".join(lines)


LEGEND = "\n".join(
    (
        "placed / never: pods started / still waiting at the end; wait: arrival to start, placed pods",
        "hot: placements onto a device at or above a threshold while a cooler free device existed in the pool",
        "held: pods that fitted somewhere by count but waited because the extender passed no node",
        "load CoV: coefficient of variation of node load within each tenant pool, time-weighted",
        "mean load: mean node load; dev p95 / max: device load (w_util x util + w_mem x mem) over all samples",
    )
)


def format_goals(checks: Sequence[GoalCheck]) -> str:
    marks = {True: "met", False: "NOT MET", None: "not judged"}
    lines = []
    for check in checks:
        lines.append(f"  [{marks[check.passed]}] {check.goal}: {check.detail}")
        if check.passed is False:
            lines.append(f"      why: {why_not_met(check.key)}")
    return "\n".join(lines)


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def plot_node_load(path: Path, results: Sequence[RunResult], summaries: Mapping[str, PolicySummary]) -> None:
    """Heat maps of per-node load over time, one per policy side by side; nodes grouped by tenant pool.

    Raises ImportError when matplotlib is missing (the ``sim`` extra).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    first = results[0]
    order = sorted(range(len(first.node_names)), key=lambda i: (first.node_tenants[i] or "", first.node_names[i]))
    hours = [t / 3600 for t in first.sample_times]
    extent = (hours[0], hours[-1] if len(hours) > 1 else hours[0] + 1 / 240, len(order) - 0.5, -0.5)
    columns = len(results)
    figure, axes = plt.subplots(
        1, columns, figsize=(4.2 * columns + 1.2, 0.28 * len(order) + 2.2), sharey=True, squeeze=False
    )
    image = None
    for axis, result in zip(axes[0], results, strict=True):
        rows = [[sample[i] for sample in result.node_load] for i in order]
        image = axis.imshow(
            rows, aspect="auto", interpolation="nearest", vmin=0.0, vmax=1.0, cmap="inferno", extent=extent
        )
        summary = summaries[result.policy]
        axis.set_title(f"{result.policy}\nCoV {summary.load_cov:.3f}, hot {summary.hot_placements}", fontsize=10)
        axis.set_xlabel("hours")
    labels = [f"{first.node_names[i]} ({first.node_tenants[i] or 'shared'})" for i in order]
    axes[0][0].set_yticks(range(len(order)), labels, fontsize=7)
    assert image is not None  # results is not empty
    figure.colorbar(image, ax=axes[0].tolist(), label="node load (memory-weighted mean device load)", shrink=0.9)
    figure.suptitle("Per-node GPU load over time, by placement policy", fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
