"""Run the suite's make steps in lanes side by side, and say how long each took.

    python tools/run_steps.py LANE [LANE ...]

A LANE is a comma-separated list of make targets run one after the other (`k8s-assets,go-test,integration`);
lanes run side by side. The suite is split this way because its steps wait on different things: the control
plane's Go build uses every core, molecule mostly waits for containers, the playbook tests for Python. One after
the other they took longer than CI allows on two cores.

Each step's output goes to build/steps/<target>.log. When a step ends, one line says so (with the tail of its log
when it failed); a failed step skips the rest of its lane (later steps there build on it) while the other lanes go
on. At the end: a table of every step (lane, start, seconds, result), then `steps: N passed, N failed`. The exit
status is 1 when any step failed or was skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAILED_LOG_TAIL = 80  # lines of a failed step's log printed with its result


@dataclass
class Step:
    target: str
    lane: int
    log: Path
    start: float | None = None  # seconds since the run began
    seconds: float | None = None
    result: str = "not run"  # passed, failed (exit N), skipped


class Runner:
    def __init__(self, lanes: list[list[str]], directory: Path) -> None:
        self.began = time.monotonic()
        self.directory = directory
        self.log_dir = directory / "build" / "steps"
        self.lanes = [
            [Step(target, number, self.log_dir / f"{target}.log") for target in lane]
            for number, lane in enumerate(lanes, start=1)
        ]
        # Reentrant: stop() runs as a signal handler in the main thread, which may hold it (printing) when interrupted.
        self.print_lock = threading.RLock()
        self.running: set[subprocess.Popen[bytes]] = set()

    def stop(self, signum: int, _frame: object) -> None:
        """SIGINT/SIGTERM: stop every running step's process group, then exit as the signal asks."""
        with self.print_lock:
            for process in self.running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
            for process in self.running:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        print(f"run_steps: stopped by signal {signum}; running steps were sent SIGTERM", flush=True)
        os._exit(128 + signum)

    def say(self, text: str) -> None:
        with self.print_lock:
            print(text, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def run_lane(self, steps: list[Step]) -> None:
        for index, step in enumerate(steps):
            step.start = self.elapsed()
            self.say(f"[{_clock(step.start)}] lane {step.lane}: {step.target} started")
            with step.log.open("w") as log:
                # A session of its own, so that a cancelled run stops the whole step (make and all it started).
                # Started and registered under the lock stop() takes: a signal arriving meanwhile waits for the
                # step to be registered, then stops it (else it would outlive the run in its own session).
                with self.print_lock:
                    process = subprocess.Popen(
                        ["make", "--no-print-directory", step.target],
                        cwd=self.directory,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                    self.running.add(process)
                status = process.wait()
                with self.print_lock:
                    self.running.discard(process)
            step.seconds = self.elapsed() - step.start
            if status == 0:
                step.result = "passed"
                self.say(f"[{_clock(self.elapsed())}] lane {step.lane}: {step.target} passed in {step.seconds:.0f} s")
                continue
            step.result = f"failed (exit {status})"
            tail = step.log.read_text(errors="replace").splitlines()[-FAILED_LOG_TAIL:]
            where = step.log.relative_to(self.directory)
            headline = (
                f"[{_clock(self.elapsed())}] lane {step.lane}: {step.target} FAILED (exit {status}) "
                f"after {step.seconds:.0f} s; the last {len(tail)} lines of {where}:"
            )
            self.say("\n".join([headline, *(f"    {line}" for line in tail)]))
            for later in steps[index + 1 :]:
                later.result = f"skipped ({step.target} failed)"
            return

    def run(self) -> int:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGTERM, self.stop)
        threads = [threading.Thread(target=self.run_lane, args=(lane,)) for lane in self.lanes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return self.report()

    def report(self) -> int:
        steps = [step for lane in self.lanes for step in lane]
        width = max(len(step.target) for step in steps)
        lines = [
            "",
            f"Step timings (lanes side by side; wall time {_clock(self.elapsed())}, logs in build/steps/):",
            f"  {'step':<{width}}  lane  start  seconds  result",
        ]
        for step in sorted(steps, key=lambda s: (s.start is None, s.start or 0.0, s.lane)):
            start = _clock(step.start) if step.start is not None else "-"
            seconds = f"{step.seconds:.0f}" if step.seconds is not None else "-"
            lines.append(f"  {step.target:<{width}}  {step.lane:>4}  {start:>5}  {seconds:>7}  {step.result}")
        passed = sum(step.result == "passed" for step in steps)
        lines.append(f"steps: {passed} passed, {len(steps) - passed} failed")
        self.say("\n".join(lines))
        return 0 if passed == len(steps) else 1


def _clock(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}:{rest:02d}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lanes", nargs="+", metavar="LANE", help="make targets of one lane, comma-separated")
    parser.add_argument("--directory", type=Path, default=REPO, help="where make runs (default: the repository)")
    args = parser.parse_args(argv)
    lanes = [[target for target in lane.split(",") if target] for lane in args.lanes]
    targets = [target for lane in lanes for target in lane]
    if not all(lanes) or len(set(targets)) != len(targets):
        parser.error(f"each lane needs at least one target and each target may appear once: {args.lanes}")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return Runner(lanes, args.directory.resolve()).run()


if __name__ == "__main__":
    sys.exit(main())
