"""Host-side faults of a MIG change, injected at every step it can hit, on the NVML simulator.

Each case forks a real process that runs the nvidia_mig module (as Ansible would, in a process of its own) and dies
at a chosen point of the layout change:

- `kill`: SIGKILL right after the k-th NVML write (create, destroy, MIG mode switch, reset) returned;
- `torn write`: SIGKILL in the middle of writing the simulator's state after the k-th write (half the bytes out);
- `power loss`: SIGKILL after the k-th write, then what a power cycle leaves: every MIG instance and process gone,
  pending MIG modes applied (the simulator's reboot).

Then the host is recovered the two ways a fleet recovers it, each on its own copy: the next playbook run (the module
again) and the boot unit (boot_apply). Every case ends in the same invariants:

- the state file is readable right after the fault (the simulator's writes are atomic);
- the recovery run succeeds without waiting for a lock (the dead holder's lock went with it);
- every GPU is then in the declared layout (a check-mode run plans nothing);
- an instance a process uses is never destroyed (kill and torn-write cases: the process and its instance survive).

Concurrent runs (the boot unit and a playbook, two playbooks) are serialised by the host's lock: a run that started
second while the first is part-way through waits, then lays out the host from what the first left, so the host ends
in the second's layout; a run that gives up says who holds the lock and changes nothing.

`python tests/faults/host_faults.py` prints the table per class; tests/faults/test_host_faults.py asserts it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpufleet.mig.plugins.module_utils import boot_apply, nvml_sim
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, load_state, new_state
from ansible_collections.gpufleet.mig.plugins.modules import nvidia_mig

# The simulator's operations that write (each one NVML call of a layout change).
WRITES = (
    "set_mig_mode",
    "reset_gpu",
    "create_gpu_instance",
    "create_compute_instance",
    "destroy_compute_instance",
    "destroy_gpu_instance",
)
FAULTS = ("kill", "torn write", "power loss")
RECOVERIES = ("playbook", "boot unit")
BUSY_PID = 4242


@dataclass(frozen=True)
class Scenario:
    """A layout change on a host: the GPUs before (`prepare` lays them out), the declared layout, a busy instance."""

    name: str
    product: str
    config: list[dict[str, Any]]
    prepare: list[dict[str, Any]] | None = None  # applied first (no fault); None: GPUs fresh, MIG disabled
    busy: tuple[int, str, int] | None = None  # (gpu, profile, start) of an instance a process keeps using


SCENARIOS = (
    Scenario(
        "enable MIG and lay out",
        "NVIDIA H100 80GB HBM3",
        [
            {"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
            {"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1}},
        ],
    ),
    Scenario(
        "re-layout around a busy instance, MIG off on one GPU",
        "NVIDIA H100 80GB HBM3",
        [
            {"devices": [0], "mig_enabled": False},
            {"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 1, "1g.10gb": 5}},
        ],
        prepare=[
            {"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
            {"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1}},
        ],
        busy=(1, "2g.20gb", 0),
    ),
    Scenario(
        "H200: switch profiles on every GPU",
        "NVIDIA H200",
        [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.18gb": 7}}],
        prepare=[{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.71gb": 2}}],
    ),
)


@dataclass
class ClassTally:
    injected: int = 0
    converged: int = 0
    unreadable: int = 0
    busy_destroyed: int = 0
    lock_stuck: int = 0
    recovery_seconds: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.unreadable + self.busy_destroyed + (self.injected - self.converged)


# --- processes ----------------------------------------------------------------------------------------------------
def _fork(body: Callable[[], None], result_file: Path) -> int:
    """Start `body` in a child process whose stdout goes to `result_file`; returns its PID. The child exits with
    the code `body` exits with (AnsibleModule and the boot unit end with sys.exit), 70 on an exception."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 0
        try:
            with open(result_file, "w", encoding="utf-8") as out:
                sys.stdout = out
                try:
                    body()
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
                finally:
                    out.flush()
        except BaseException:
            traceback.print_exc()
            code = 70
        os._exit(code)
    return pid


def _forked(body: Callable[[], None], result_file: Path) -> int:
    """Run `body` as _fork does and wait for it; returns the raw wait status."""
    _, status = os.waitpid(_fork(body, result_file), 0)
    return status


def module_run(state: Path, config: list[dict[str, Any]], **options: Any) -> Callable[[], None]:
    """The nvidia_mig module's run on the simulated host `state` with `options`, as a body for _fork."""
    args = {"config": config, "nvml_sim_state": str(state), **options}

    def body() -> None:
        with patch_module_args(args):
            nvidia_mig.main()

    return body


def boot_unit_run(state: Path, config: list[dict[str, Any]], lock_timeout: int | None = None) -> Callable[[], None]:
    """The boot unit's run on the simulated host `state` (its own lock timeout when None), as a body for _fork."""
    request = state.with_name("mig-layout.json")
    argv = ["--config", str(request), "--nvml-sim-state", str(state)]
    argv += ["--lock-timeout", str(lock_timeout)] if lock_timeout is not None else []

    def body() -> None:
        request.write_text(json.dumps({"config": config}))
        sys.exit(boot_apply.main(argv))

    return body


def run_module(state: Path, config: list[dict[str, Any]], lock_timeout: int = 0, check: bool = False) -> dict:
    """The nvidia_mig module, in a process of its own, on the simulated host `state`; returns its result."""
    out = state.with_suffix(".result.json")
    status = _forked(module_run(state, config, lock_timeout=lock_timeout, _ansible_check_mode=check), out)
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    if os.WIFSIGNALED(status):
        return {"killed": os.WTERMSIG(status)}
    try:
        return json.loads(text)
    except ValueError:
        return {"failed": True, "msg": f"no result (exit status {os.WEXITSTATUS(status)}): {text[-400:]}"}


def run_module_dying(state: Path, config: list[dict[str, Any]], write: int, fault: str) -> dict:
    """The module, killed at its `write`-th NVML write (after it, or tearing the state file it writes)."""
    out = state.with_suffix(".result.json")
    run = module_run(state, config, lock_timeout=0)

    def body() -> None:
        arm_crash(write, torn=fault == "torn write")
        run()

    status = _forked(body, out)
    return {"killed": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"finished": os.WEXITSTATUS(status)}


def on_each_write(hook: Callable[[int, Callable[[], Any]], Any]) -> None:
    """In this (child) process: every simulator write goes through ``hook(rank, call)``, rank 1, 2, ... in order;
    the hook makes the call (or not) and returns its value."""
    seen = 0
    for name in WRITES:
        original = getattr(SimulatedNvml, name)

        def wrapped(self: SimulatedNvml, *args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            nonlocal seen
            seen += 1
            return hook(seen, lambda: _original(self, *args, **kwargs))

        setattr(SimulatedNvml, name, wrapped)


def arm_crash(write: int, torn: bool) -> None:
    """In this (child) process: SIGKILL at the `write`-th simulator write; `torn`: halfway through saving it."""

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def tearing_dump(obj: Any, handle: Any, **kwargs: Any) -> None:
        text = json.dumps(obj, **kwargs)
        handle.write(text[: len(text) // 2])
        handle.flush()
        os.fsync(handle.fileno())
        die()

    def hook(rank: int, call: Callable[[], Any]) -> Any:
        if rank == write and torn:
            nvml_sim.json = _JsonTearingDump(tearing_dump)  # the save at the end of this call tears
        try:
            return call()
        finally:
            if rank == write:
                die()

    on_each_write(hook)


class _JsonTearingDump:
    """nvml_sim's `json` with `dump` replaced (the rest of the module is json's)."""

    def __init__(self, dump: Callable[..., None]) -> None:
        self.dump = dump

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


def count_writes(state: Path, config: list[dict[str, Any]]) -> int:
    """How many NVML writes the change takes, by running it once on a copy (no fault)."""
    probe = state.with_name("probe.json")
    shutil.copyfile(state, probe)
    counter = state.with_name("probe.count")

    def counted(rank: int, call: Callable[[], Any]) -> Any:
        counter.write_text(str(rank))
        return call()

    run = module_run(probe, config, lock_timeout=0)

    def body() -> None:
        on_each_write(counted)
        run()

    status = _forked(body, state.with_name("probe.result.json"))
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        raise AssertionError(f"the change does not run without a fault: {state.with_name('probe.result.json')}")
    return int(counter.read_text()) if counter.exists() else 0


def run_boot_unit(state: Path, config: list[dict[str, Any]], lock_timeout: int = 0) -> int:
    status = _forked(boot_unit_run(state, config, lock_timeout), state.with_name("boot.out"))
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


# --- one scenario's host ------------------------------------------------------------------------------------------
def prepared_host(directory: Path, scenario: Scenario) -> Path:
    state = directory / "nvml-sim.json"
    state.write_text(json.dumps(new_state(gpus=2, product=scenario.product)))
    if scenario.prepare is not None:
        result = run_module(state, scenario.prepare)
        if result.get("failed") or "killed" in result:
            raise AssertionError(f"{scenario.name}: preparing the host failed: {result}")
    if scenario.busy is not None:
        gpu, profile, start = scenario.busy
        sim = SimulatedNvml(str(state))
        gi = next(
            g
            for g in sim.state["gpus"][gpu]["gpu_instances"]
            if g["start"] == start and sim._instance_row(sim.state["gpus"][gpu], g).name == profile
        )
        sim.add_process(gpu, BUSY_PID, gi["id"])
    return state


def busy_instance_alive(state: Path, scenario: Scenario) -> bool:
    if scenario.busy is None:
        return True
    gpu, _profile, start = scenario.busy
    data = load_state(str(state))["gpus"][gpu]
    process = next((p for p in data["processes"] if p["pid"] == BUSY_PID), None)
    if process is None:
        return False
    gi = next((g for g in data["gpu_instances"] if g["id"] == process["gpu_instance_id"]), None)
    return gi is not None and gi["start"] == start and bool(gi["compute_instances"])


def in_declared_layout(state: Path, config: list[dict[str, Any]]) -> tuple[bool, str]:
    result = run_module(state, config, check=True)
    if result.get("failed") or "killed" in result:
        return False, f"check-mode run failed: {result.get('msg', result)}"
    if result["changed"]:
        todo = [(g["index"], g["actions"]) for g in result["gpus"] if g["changed"]]
        return False, f"not converged, still to do: {todo}"
    return True, ""


def run_case(workdir: Path, scenario: Scenario, write: int, fault: str, recovery: str, tally: ClassTally) -> None:
    case = f"{scenario.name} / {fault} at write {write} / {recovery}"
    base = workdir / "base"
    directory = workdir / "case"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(base, directory)
    state = directory / "nvml-sim.json"
    tally.injected += 1
    outcome = run_module_dying(state, scenario.config, write, fault)
    if "killed" not in outcome:
        tally.problems.append(f"{case}: the fault was never hit ({outcome})")
        return
    try:
        load_state(str(state))
    except Exception as exc:
        tally.unreadable += 1
        tally.problems.append(f"{case}: state file unreadable after the fault: {exc}")
        return
    if fault == "power loss":
        SimulatedNvml(str(state)).reboot()
    started = time.monotonic()
    if recovery == "playbook":
        result = run_module(state, scenario.config, lock_timeout=0)
        failed = result.get("failed") or "killed" in result
        message = result.get("msg", "")
    else:
        status = run_boot_unit(state, scenario.config, lock_timeout=0)
        failed, message = status != 0, (directory / "boot.out").read_text(encoding="utf-8")[-400:]
    tally.recovery_seconds.append(time.monotonic() - started)
    if failed:
        if "another MIG change is running" in str(message):
            tally.lock_stuck += 1
        tally.problems.append(f"{case}: recovery failed: {message}")
        return
    ok, why = in_declared_layout(state, scenario.config)
    if not ok:
        tally.problems.append(f"{case}: {why}")
        return
    if fault != "power loss" and not busy_instance_alive(state, scenario):
        tally.busy_destroyed += 1
        tally.problems.append(f"{case}: the busy instance {scenario.busy} was destroyed")
        return
    tally.converged += 1


def crash_suite(
    workdir: Path, scenarios: tuple[Scenario, ...] = SCENARIOS, faults: tuple[str, ...] = FAULTS
) -> dict[str, ClassTally]:
    tallies = {fault: ClassTally() for fault in faults}
    for number, scenario in enumerate(scenarios):
        scenario_dir = workdir / f"scenario-{number}"
        base = scenario_dir / "base"
        base.mkdir(parents=True)
        state = prepared_host(base, scenario)
        writes = count_writes(state, scenario.config)
        if writes == 0:
            raise AssertionError(f"{scenario.name}: the change makes no NVML write; nothing to inject")
        for write in range(1, writes + 1):
            for fault in faults:
                for recovery in RECOVERIES:
                    run_case(scenario_dir, scenario, write, fault, recovery, tallies[fault])
    return tallies


# --- concurrent runs ----------------------------------------------------------------------------------------------
def concurrent_suite(workdir: Path) -> ClassTally:
    """Two changes at once on one host, the second starting while the first is part-way through its writes.

    First the boot unit then a playbook, then two playbooks, with the second starting after each of the first's
    writes in turn: the second waits for the lock, so the host ends in the second's layout. Then a run that will not
    wait: it fails naming the holder and changes nothing."""
    tally = ClassTally()
    first = SCENARIOS[0]
    second = [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.20gb": 4}}]
    base = workdir / "concurrent-base"
    base.mkdir(parents=True)
    writes = count_writes(prepared_host(base, first), first.config)
    for who in ("boot unit", "playbook"):
        for write in range(1, writes + 1):
            case = f"{who} paused after write {write}, then a playbook"
            directory = workdir / "concurrent"
            shutil.rmtree(directory, ignore_errors=True)
            shutil.copytree(base, directory)
            state = directory / "nvml-sim.json"
            tally.injected += 1
            started = time.monotonic()
            holder = _start_paused_change(state, first.config, write, who)
            result = run_module(state, second, lock_timeout=30)
            _, status = os.waitpid(holder, 0)
            tally.recovery_seconds.append(time.monotonic() - started)
            if status != 0 or result.get("failed") or "killed" in result:
                tally.problems.append(f"{case}: a run failed (first: status {status}; second: {result})")
                continue
            ok, why = in_declared_layout(state, second)
            if ok:
                tally.converged += 1
            else:
                tally.problems.append(f"{case}: {why}")
    # A run that will not wait changes nothing and names the holder.
    directory = workdir / "impatient"
    shutil.copytree(base, directory)
    state = directory / "nvml-sim.json"
    before = state.read_text()
    tally.injected += 1
    holder = _start_paused_change(state, first.config, 1, "boot unit", pause=2.0)
    result = run_module(state, second, lock_timeout=0)
    os.waitpid(holder, 0)
    message = str(result.get("msg", ""))
    if result.get("failed") and "the boot unit" in message and "Nothing was changed" in message:
        if state.read_text() != before and in_declared_layout(state, first.config)[0]:
            tally.converged += 1  # the first completed; the impatient one left no trace
        else:
            tally.problems.append("the impatient run: the first change did not complete")
    else:
        tally.problems.append(f"the impatient run did not give up cleanly: {result}")
    return tally


def _start_paused_change(state: Path, config: list[dict[str, Any]], write: int, who: str, pause: float = 0.6) -> int:
    """Fork a run (`boot unit` or `playbook`) of the first change that pauses after its `write`-th write; returns
    its PID once it is paused there (holding the host's lock)."""
    paused = state.with_name("paused")
    paused.unlink(missing_ok=True)
    run = boot_unit_run(state, config) if who == "boot unit" else module_run(state, config)

    def pausing(rank: int, call: Callable[[], Any]) -> Any:
        value = call()
        if rank == write:
            paused.touch()
            time.sleep(pause)
        return value

    def body() -> None:
        on_each_write(pausing)
        run()

    pid = _fork(body, state.with_name("first.out"))
    deadline = time.monotonic() + 30
    while not paused.exists():
        if time.monotonic() > deadline:
            raise AssertionError("the first change never reached its pause")
        time.sleep(0.01)
    return pid


# --- report -------------------------------------------------------------------------------------------------------
def report(tallies: dict[str, ClassTally]) -> str:
    lines = [
        f"{'fault class':<26} {'injected':>8} {'converged':>9} {'unreadable':>10} {'busy lost':>9} "
        f"{'lock stuck':>10} {'recovery p50/max':>17}"
    ]
    for name, tally in tallies.items():
        times = sorted(tally.recovery_seconds) or [0.0]
        lines.append(
            f"{name:<26} {tally.injected:>8} {tally.converged:>9} {tally.unreadable:>10} {tally.busy_destroyed:>9} "
            f"{tally.lock_stuck:>10} {times[len(times) // 2]:>8.2f}s/{times[-1]:.2f}s"
        )
    return "\n".join(lines)


def run_all(workdir: Path) -> dict[str, ClassTally]:
    tallies = crash_suite(workdir)
    tallies["concurrent runs"] = concurrent_suite(workdir)
    return tallies


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gpufleet-host-faults-") as directory:
        tallies = run_all(Path(directory))
    print(report(tallies))
    problems = [p for t in tallies.values() for p in t.problems]
    for problem in problems:
        print("FAULT NOT SURVIVED:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
