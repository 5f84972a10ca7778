"""make test's lane runner (tools/run_steps.py) on a Makefile of its own: lanes side by side, a failed step skips the
rest of its lane only, logs per step, the timing table and the closing count."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "run_steps.py"

MAKEFILE = """\
first:
\t@echo first-output
first-again:
\t@echo first-again-output
broken:
\t@echo broken-output; exit 3
after-broken:
\t@touch after-broken-ran
# Each waits (20 s at most) for the other to have started: they pass only when they run at the same time.
meet-a:
\t@touch a-started; for i in $$(seq 200); do [ -e b-started ] && exit 0; sleep 0.1; done; exit 1
meet-b:
\t@touch b-started; for i in $$(seq 200); do [ -e a-started ] && exit 0; sleep 0.1; done; exit 1
"""


def _run(tmp_path: Path, *lanes: str) -> subprocess.CompletedProcess:
    (tmp_path / "Makefile").write_text(MAKEFILE)
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--directory", str(tmp_path), *lanes],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_a_failed_step_skips_the_rest_of_its_lane_and_fails_the_run(tmp_path):
    run = _run(tmp_path, "first,broken,after-broken", "first-again")
    assert run.returncode == 1
    assert not (tmp_path / "after-broken-ran").exists()
    assert "lane 1: broken FAILED (exit 2)" in run.stdout  # make's own status for a failed recipe
    assert "    broken-output" in run.stdout  # the failed step's log tail
    assert (tmp_path / "build" / "steps" / "first.log").read_text() == "first-output\n"
    table = run.stdout[run.stdout.index("Step timings") :]
    assert re.search(r"after-broken\s+1\s+-\s+-\s+skipped \(broken failed\)", table)
    assert re.search(r"first-again\s+2\s+0:\d\d\s+\d+\s+passed", table)
    assert run.stdout.rstrip().splitlines()[-1] == "steps: 2 passed, 2 failed"


def test_lanes_run_side_by_side(tmp_path):
    run = _run(tmp_path, "meet-a", "meet-b")
    assert run.returncode == 0, run.stdout
    assert run.stdout.rstrip().splitlines()[-1] == "steps: 2 passed, 0 failed"


def test_a_target_named_twice_is_refused(tmp_path):
    run = _run(tmp_path, "first", "first")
    assert run.returncode == 2
    assert "each target may appear once" in run.stderr


def test_a_cancelled_run_stops_its_running_steps(tmp_path):
    (tmp_path / "Makefile").write_text("long:\n\t@sleep 30; touch long-finished\n")
    runner = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--directory", str(tmp_path), "long"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert "long started" in runner.stdout.readline()
    runner.terminate()
    assert runner.wait(timeout=20) == 128 + 15
    # make and its recipe were stopped with the runner (their signal handling takes a moment on a busy machine)
    for _ in range(50):
        sleeping = subprocess.run(["pgrep", "-f", "sleep 30; touch long-finished"], capture_output=True, check=False)
        if not sleeping.stdout:
            break
        time.sleep(0.2)
    assert sleeping.stdout == b""
