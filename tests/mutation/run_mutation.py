#!/usr/bin/env python3
"""Mutation testing of the core (`make mutation`): mutmut mutates each file, the unit tests must fail on each mutant.

Two suites, each run by mutmut in a scratch copy under build/mutation/ (mutmut writes a `mutants/` tree next to
its config, and the repository stays untouched):
- collection: plugins/module_utils/{spec,placement,planner,runner,pod_requests}.py. The copy is laid out as
  ansible_collections/gpufleet/mig/ so that the tests import the mutated files under their real module names;
- extender: extender/src/gpufleet_extender/{scoring,pods,wire,snapshot,settings_contract,plugin_args}.py with the
  extender's unit tests.

It prints the killed share per file. A surviving mutant is either killed by a new test or listed in
tests/mutation/equivalent.yml with the reason it cannot change behaviour; listed ones leave the count.
Survivors (with their diffs) are written to build/mutation/survivors.txt. The figure is printed, never asserted:
this takes tens of minutes on two cores, so it is its own target, outside `make test`.

    python tests/mutation/run_mutation.py [--suite collection|extender] [--jobs 2] [--report-only]
    python tests/mutation/run_mutation.py --file wire.py   # one file, with only the tests written for it

With --file, mutmut mutates that file alone and runs the tests listed for it in its suite's `tests_by_file` (its
mirrored test file and the few others that exercise it directly) in a scratch copy of its own, so that the stats
collection (one traced run of the selected tests) and the mutants of one file take minutes, not the whole suite.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from configparser import ConfigParser
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "mutation"
MUTMUT = Path(sys.executable).with_name("mutmut")
COLLECTION = "ansible_collections/gpufleet/mig"


@dataclass(frozen=True)
class Suite:
    name: str
    files: tuple[str, ...]  # paths inside the scratch copy
    tests: tuple[str, ...]  # test files inside the scratch copy (mutmut picks, per mutant, those that reach it)
    copies: tuple[tuple[str, str], ...]  # (path in the repo, path in the scratch copy)
    pytest_args: tuple[str, ...] = ()
    tests_by_file: tuple[tuple[str, tuple[str, ...]], ...] = ()  # file name -> its own tests, for --file

    def narrowed(self, name: str) -> Suite:
        """This suite for one of its files (by name, e.g. `wire.py`), with the tests written for that file."""
        path = next(path for path in self.files if Path(path).name == name)
        tests = dict(self.tests_by_file)[name]
        return Suite(
            f"{self.name}.{Path(name).stem}", (path,), tests, self.copies, self.pytest_args, self.tests_by_file
        )


UNIT = f"{COLLECTION}/tests/unit/plugins"

SUITES = {
    "collection": Suite(
        "collection",
        tuple(
            f"{COLLECTION}/plugins/module_utils/{name}.py"
            for name in ("spec", "placement", "planner", "runner", "pod_requests")
        ),
        (
            f"{UNIT}/module_utils/test_spec.py",
            f"{UNIT}/module_utils/test_placement.py",
            f"{UNIT}/module_utils/test_planner.py",
            f"{UNIT}/module_utils/test_advisor.py",
            f"{UNIT}/module_utils/test_runner.py",
            f"{UNIT}/module_utils/test_layout.py",
            f"{UNIT}/test_bench_mig.py",
            f"{UNIT}/modules/test_nvidia_mig.py",
            f"{UNIT}/module_utils/test_pod_requests.py",
        ),
        (
            ("plugins", f"{COLLECTION}/plugins"),
            ("benchmarks", f"{COLLECTION}/benchmarks"),
            ("pytest.ini", f"{COLLECTION}/pytest.ini"),
            ("tests/unit/plugins", f"{COLLECTION}/tests/unit/plugins"),
        ),
        # The exhaustive search-vs-brute-force test takes 20-40 s a run; per mutant that is hours on two cores.
        # The random transitions and bench-mig tests check the same search against the same brute force.
        # The module's end-to-end test starts ansible-playbook (seconds a run); the module tests beside it call the
        # same code in-process.
        ("-k", "not brute_force_on_every_request and not ansible_cli_end_to_end"),
        (
            ("spec.py", (f"{UNIT}/module_utils/test_spec.py",)),
            ("placement.py", (f"{UNIT}/module_utils/test_placement.py", f"{UNIT}/module_utils/test_planner.py")),
            ("planner.py", (f"{UNIT}/module_utils/test_planner.py",)),
            # The module's tests drive the runner through every apply path (resets, pending modes, failures).
            ("runner.py", (f"{UNIT}/module_utils/test_runner.py", f"{UNIT}/modules/test_nvidia_mig.py")),
            ("pod_requests.py", (f"{UNIT}/module_utils/test_pod_requests.py",)),
        ),
    ),
    "extender": Suite(
        "extender",
        tuple(
            f"src/gpufleet_extender/{name}.py"
            for name in ("scoring", "pods", "wire", "snapshot", "settings_contract", "plugin_args")
        ),
        tuple(
            f"tests/{name}.py"
            for name in (
                "test_scoring",
                "test_scoring_shared",
                "test_scoring_claims",
                "test_pods",
                "test_wire",
                "test_snapshot",
                "test_strategies",
                "test_service",
                "test_service_differential",
                "test_metrics_source",
                "test_dcgm_captures",
                "test_app",
                "test_config",
                "test_plugin_args",
                "test_settings_contract_file",
            )
        ),
        (
            ("extender/src", "src"),
            ("extender/tests", "tests"),
            ("extender/pyproject.toml", "pyproject.toml"),
            # What the settings' and the args' tests compare the code with: the README's table, GPUScore's args.
            ("extender/README.md", "README.md"),
            ("k8s/gpuscore/args_types.go", "k8s/gpuscore/args_types.go"),
        ),
        ("-m", "not integration"),
        (
            (
                "scoring.py",
                (
                    "tests/test_scoring.py",
                    "tests/test_strategies.py",
                    "tests/test_scoring_shared.py",
                    "tests/test_scoring_claims.py",
                ),
            ),
            ("pods.py", ("tests/test_pods.py",)),
            ("wire.py", ("tests/test_wire.py", "tests/test_pods.py")),
            ("snapshot.py", ("tests/test_snapshot.py",)),
            ("settings_contract.py", ("tests/test_settings_contract_file.py", "tests/test_config.py")),
            ("plugin_args.py", ("tests/test_plugin_args.py",)),
        ),
    ),
}

KILLED = {1, 3, 24, -24, 36, 152, 255}  # a failing test, pytest's internal error, or a timeout (mutmut's view)
STATUS = {0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", None: "not checked"}


def prepare(suite: Suite) -> Path:
    """A fresh scratch copy with mutmut's config (setup.cfg)."""
    scratch = WORK / suite.name
    shutil.rmtree(scratch, ignore_errors=True)
    for source, target in suite.copies:
        origin, destination = REPO / source, scratch / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(origin, destination, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, destination)
    config = ConfigParser()
    top = sorted({target.split("/")[0] for _source, target in suite.copies})
    config["mutmut"] = {
        "source_paths": "\n" + "\n".join(suite.files),
        "pytest_add_cli_args_test_selection": "\n" + "\n".join(suite.tests),
        "also_copy": "\n" + "\n".join(top),
        "pytest_add_cli_args": "\n" + "\n".join(("-p", "no:cacheprovider", *suite.pytest_args)),
    }
    with open(scratch / "setup.cfg", "w", encoding="utf-8") as handle:
        config.write(handle)
    return scratch


def results(scratch: Path, suite: Suite) -> dict[str, dict[str, int | None]]:
    """file -> {mutant name: exit code}, from mutmut's per-file .meta records."""
    found = {}
    for path in suite.files:
        meta = scratch / "mutants" / f"{path}.meta"
        found[path] = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    return found


def load_equivalent() -> dict[str, str]:
    listed = yaml.safe_load((REPO / "tests" / "mutation" / "equivalent.yml").read_text()) or {}
    return {entry["mutant"]: entry["reason"] for entry in listed.get("equivalent", [])}


def show(scratch: Path, mutant: str) -> str:
    answer = subprocess.run([str(MUTMUT), "show", mutant], cwd=scratch, capture_output=True, text=True, check=False)
    return answer.stdout.strip() or answer.stderr.strip()


def report(suite: Suite, scratch: Path, equivalent: dict[str, str], survivors_file) -> list[tuple[str, int, int, int]]:
    figures = []
    for path, codes in results(scratch, suite).items():
        considered = {name: code for name, code in codes.items() if name not in equivalent}
        killed = sum(1 for code in considered.values() if code in KILLED)
        unchecked = sum(1 for code in considered.values() if code is None)
        figures.append((path.removeprefix(f"{COLLECTION}/"), killed, len(considered), unchecked))
        for name, code in sorted(considered.items()):
            if code not in KILLED and code is not None:
                survivors_file.write(f"## {name}: {STATUS.get(code, f'exit {code}')}\n{show(scratch, name)}\n\n")
        for name in sorted(set(codes) & set(equivalent)):
            if codes[name] in KILLED:
                survivors_file.write(f"## {name}: listed as equivalent but killed: remove it from equivalent.yml\n\n")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), action="append", help="default: both")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--report-only", action="store_true", help="report the last run again")
    parser.add_argument(
        "--file",
        action="append",
        choices=sorted(Path(path).name for suite in SUITES.values() for path in suite.files),
        help="only this file, with its own tests (repeatable); default: every file of the chosen suites",
    )
    args = parser.parse_args()
    if not MUTMUT.exists():
        print(f"mutmut is not installed next to {sys.executable}: run `make venv`", file=sys.stderr)
        return 2
    equivalent = load_equivalent()
    suites = [SUITES[name] for name in (args.suite or sorted(SUITES))]
    if args.file:
        suites = [suite.narrowed(name) for suite in suites for name in args.file if name in dict(suite.tests_by_file)]
    rows = []
    WORK.mkdir(parents=True, exist_ok=True)
    # Runs of single files (they may run side by side) keep their survivors apart.
    survivors = WORK / (
        "survivors.txt" if not args.file else f"survivors-{'-'.join(Path(f).stem for f in args.file)}.txt"
    )
    with open(survivors, "w", encoding="utf-8") as survivors_file:
        for suite in suites:
            scratch = WORK / suite.name
            if not args.report_only:
                scratch = prepare(suite)
                print(f"mutmut: {suite.name} ({', '.join(Path(f).name for f in suite.files)})", flush=True)
                run = subprocess.run([str(MUTMUT), "run", "--max-children", str(args.jobs)], cwd=scratch, check=False)
                if run.returncode != 0:
                    print(f"mutmut run failed for {suite.name} (exit {run.returncode})", file=sys.stderr)
                    return 1
            rows += report(suite, scratch, equivalent, survivors_file)
    width = max(len(row[0]) for row in rows)
    print(f"\n{'file':<{width}}  killed / mutants")
    for path, killed, total, unchecked in rows:
        share = 100.0 * killed / total if total else 100.0
        note = f"  ({unchecked} not checked: the run was cut short)" if unchecked else ""
        print(f"{path:<{width}}  {killed:>6} / {total:<6} {share:5.1f} %{note}")
    killed, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{'all':<{width}}  {killed:>6} / {total:<6} {100.0 * killed / max(total, 1):5.1f} %")
    print(f"{len(equivalent)} equivalent mutants left out (tests/mutation/equivalent.yml)")
    print(f"survivors and their diffs: {survivors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
