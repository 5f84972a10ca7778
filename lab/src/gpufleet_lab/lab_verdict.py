"""The closing block of `make lab`: the fleet, the placement simulator's verdict, the goals, and where things are.

Reads what the lab's steps left in the lab directory (build/lab/<inventory>): fleet-summary.txt (written by
playbooks/site.yml when gpufleet_fleet_summary_file is set, as the lab's overrides do), sim/results.json and
sim-quiet/results.json (gpufleet-lab simulate), the rendered manifests, and the alert rules and dashboard
(monitoring/). The MIG re-layout comparison
(static layouts against a re-layout every 10 minutes on the day trace, docs/simulator.md) is read from
sim-relayout/results.json, which this script writes first by running the comparison's lab variant on the
inventory (x0.25, about a minute; `--reuse-relayout` reads the one already there instead). Every MIG pool of the
inventory gets the day trace by its layout's shape and size; on a fleet without a MIG pool the block says the
comparison was not run, and why.

A goal the simulator does not meet is a finding about the placement model, explained in docs/simulator.md, not a
fault of the lab: the block says so, and the exit status stays 0. `--enforce-goals` (`make lab LAB_GOALS=enforce`)
exits 1 when any goal is not met. A missing input (a step that did not run) exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import yaml

from gpufleet_lab.simulate.verdict import (
    DOCS,
    GAINS_SECTION,
    SENSITIVITY_SECTION,
    gains,
    goal_lines,
    goals_missed,
    limits,
    relayout_findings,
)

WIDTH = 118
RULE = "=" * WIDTH
# The simulator runs of `make lab`: output directory -> what it compares.
RUNS = {
    "sim": "mixed trace, count vs random-fit vs load",
    "sim-quiet": "quiet-night trace, spread vs pack vs auto",
    "sim-shared": "the inventory's time-slicing as deployed, count vs load",
    "sim-tp": "tensor-parallel LLM mix with interference, count vs spread vs auto",
    "sim-relayout": "MIG day trace (x0.25), static layouts vs a re-layout every 10 min",
}
# The gains in the order a user feels them: failures and slowdown, waiting, GPUs, free nodes.
GAINS_ORDER = ("sim-shared", "sim-tp", "sim-relayout", "sim-quiet", "sim")
# The re-layout's lab variant: the day trace's rates and the pools x0.25 (the full day takes minutes).
RELAYOUT_LAB_ARGS = ["--scale", "0.25", "--quiet"]


def _run_relayout(directory: Path, inventory: str) -> str | None:
    """The re-layout comparison's lab variant on the inventory into `directory` (its table in report.txt); None, or
    why it was not run (no MIG pool)."""
    import contextlib
    import io

    from gpufleet_lab.simulate.relayout import main as relayout_main

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").unlink(missing_ok=True)
    errors = io.StringIO()
    with (
        (directory / "report.txt").open("w", encoding="utf-8") as report,
        contextlib.redirect_stdout(report),
        contextlib.redirect_stderr(errors),
    ):
        status = relayout_main(["--inventory", inventory, *RELAYOUT_LAB_ARGS, "--output", str(directory)])
    if status == 0:
        return None
    reason = errors.getvalue().strip().removeprefix("relayout: ") or f"exit {status}"
    return f"not run on this fleet: {reason}"


def _fleet_lines(summary: Path) -> list[str]:
    """Per pool: its line and its total; a node's line only when it disagrees with its layout or waits for a reboot."""
    lines = []
    for line in summary.read_text(encoding="utf-8").splitlines():
        if line.startswith("tenant ") or "pool total" in line or "(!)" in line or "pending" in line:
            lines.append("  " + line)
    return lines


def _monitoring_line(lab: Path) -> str | None:
    """The alert rules and the dashboard the monitoring role wrote beside the manifests (None if it did not run)."""
    rules, dashboard = (
        lab / "monitoring" / "gpufleet-alerts.rules.yml",
        lab / "monitoring" / "gpufleet-fleet-dashboard.json",
    )
    if not (rules.is_file() and dashboard.is_file()):
        return None
    groups = yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]
    alerts = sum(1 for group in groups for rule in group["rules"] if "alert" in rule)
    panels = [p for p in json.loads(dashboard.read_text(encoding="utf-8"))["panels"] if p.get("type") != "row"]
    operator = lab / "manifests" / "monitoring"
    return (
        f"  monitoring  {rules} ({alerts} alert rules; as a PrometheusRule in {operator}/), "
        f"{dashboard} (Grafana, {len(panels)} panels; as a ConfigMap beside it): docs/monitoring.md"
    )


def _count_files(directory: Path) -> int:
    return sum(1 for path in directory.rglob("*") if path.is_file()) if directory.is_dir() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-lab verdict", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("lab_dir", type=Path, nargs="?", default=Path("build/lab/hongkong"))
    parser.add_argument("--inventory", default="inventories/hongkong", help="the inventory the lab ran")
    parser.add_argument("--enforce-goals", action="store_true", help="exit 1 when a simulator goal is not met")
    parser.add_argument(
        "--reuse-relayout", action="store_true", help="read sim-relayout/results.json instead of running it again"
    )
    args = parser.parse_args(argv)
    lab: Path = args.lab_dir

    summary = lab / "fleet-summary.txt"
    documents = {}
    skipped: dict[str, str] = {}
    for run in RUNS:
        path = lab / run / "results.json"
        if run == "sim-relayout" and not args.reuse_relayout:
            why = _run_relayout(lab / run, args.inventory)
            if why:
                skipped[run] = why
                continue
        if not path.is_file():
            print(f"lab verdict: {path} is missing: the simulator step did not run", file=sys.stderr)
            return 2
        documents[run] = json.loads(path.read_text(encoding="utf-8"))
    if not summary.is_file():
        print(f"lab verdict: {summary} is missing: playbooks/site.yml did not finish", file=sys.stderr)
        return 2

    out = [RULE, "make lab: the verdict", RULE]
    # The gains first, in what a user of the fleet feels; every figure is defined in docs/simulator.md.
    out.append(f"What the fleet gains, on the lab's fleet ({DOCS}#{GAINS_SECTION}):")
    gained = [line for run in GAINS_ORDER if run in documents for line in gains(documents[run])]
    out += [f"  + {line}" for line in gained] or ["  nothing on these runs"]
    out.append("Where load-awareness does not help, and why:")
    out += [f"  - {line}" for document in documents.values() for line in limits(document)]

    out.append(f"Fleet, read back from the simulated GPUs (per node: {summary}):")
    out += _fleet_lines(summary)

    out.append("Placement simulator runs (docs/simulator.md), tables in each run's report.txt:")
    for run, document in documents.items():
        out.append(f"  {run}: {RUNS[run]} ({document['trace']['pods']} pods)")
        if document.get("kind") == "mig-relayout":
            out += [f"    {line}" for line in relayout_findings(document)]
    for run, why in skipped.items():
        out.append(f"  {run}: {RUNS[run]}: {why}")

    advice = lab / "rebalance" / "advice.txt"
    if advice.is_file():
        out.append("MIG re-layout on a copy of one MIG pool's GPUs (docs/mig_rebalance.md), the advice applied:")
        out += [f"  {line}" for line in advice.read_text(encoding="utf-8").splitlines()]

    missed = sum(goals_missed(d) for d in documents.values())
    out.append("Goals:")
    for document in documents.values():
        out += [f"  {line}" for line in goal_lines(document)]
    if missed and args.enforce_goals:
        out.append(f"  {missed} goal(s) not met: make lab fails (LAB_GOALS=enforce).")
    elif missed:
        out.append(
            f"  {missed} goal(s) not met. That is what the model shows, not a fault of the lab, so make lab passes;"
            "\n  `make lab LAB_GOALS=enforce` makes a goal not met fail it."
        )
    else:
        out.append("  every goal judged on these traces is met.")

    out.append(
        f"  How each goal's ratio moves over +/-50 % of every model parameter: {DOCS}#{SENSITIVITY_SECTION} "
        "(python -m gpufleet_lab.simulate.sensitivity; about 20 min, so not run here)."
    )

    manifests = lab / "manifests"
    plots = sorted(str(p) for run in RUNS for p in (lab / run).glob("*.png"))
    out.append("Where:")
    out.append(f"  manifests   {manifests}/ ({_count_files(manifests)} files, one directory per role)")
    out.append(f"  plots       {', '.join(plots) if plots else 'none (matplotlib missing)'}")
    out.append(
        "  reports     "
        + ", ".join(f"{lab / run}/report.txt" for run in documents)
        + " (tables); results.json beside each"
    )
    monitoring = _monitoring_line(lab)
    if monitoring:
        out.append(monitoring)
    out.append(f"  host state  {lab / 'nvml'}/ (simulated GPUs), {lab / 'hosts'}/ (each node's files)")
    if advice.is_file():
        out.append(f"  re-layout   {lab / 'rebalance'}/ (the pool's GPUs after the advice)")
    out.append(RULE)
    for line in "\n".join(out).splitlines():
        lead = len(line) - len(line.lstrip())
        # A goal's text continues under itself, past its "met" / "NOT MET" label.
        indent = " " * (lead + (9 if line.lstrip().startswith(("met ", "NOT MET ")) else 2))
        print(textwrap.fill(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False))
    return 1 if missed and args.enforce_goals else 0


if __name__ == "__main__":
    sys.exit(main())
