"""gpufleet.mig.phases: one line per play for long runs over many hosts (what `make lab` uses).

The default callback prints a banner per task and a line per host and loop item, skipped ones included: over
20 hosts that is thousands of lines in which a failure or a warning is easy to miss. This one prints what a
person reads: a line per play with its hosts and what changed, a task's failure in full (as the default callback
prints it), the message of a `Warn ...` task that ran (the roles name the tasks that ask the user to act that
way), and a recap.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: phases
type: stdout
short_description: One line per play, failures in full, and the warnings a user must act on
description:
  - Prints one line per play (its hosts, and how many hosts each task changed), a failed task's result in full
    as the default callback does, the message of every C(ansible.builtin.debug) task named C(Warn ...) that ran,
    and a one-line recap. Skipped tasks, per-item results and unchanged results are not printed.
  - Used by C(make lab) (C(ANSIBLE_STDOUT_CALLBACK=gpufleet.mig.phases)); any playbook can use it.
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout callback in configuration
"""

import re
import textwrap
from collections import Counter

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

# Task names may end in a templated detail per host ("Write the layout (/path/of/hk-gpu-07)"): grouped without it.
_DETAIL = re.compile(r"\s*\([^()]*\)$")
_WIDTH = 118  # a play's line wraps here, continued indented


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "gpufleet.mig.phases"

    def __init__(self):
        super().__init__()
        self._phase: str | None = None
        self._phase_hosts: set[str] = set()
        self._phase_changed: Counter = Counter()  # task name -> hosts it changed, in the order they ran
        self._phase_failed: set[str] = set()

    # --- the play line ---------------------------------------------------------------------------------------
    def _flush(self) -> None:
        if self._phase is None:
            return
        hosts = len(self._phase_hosts)
        line = f"{self._phase}: {hosts} host{'s' if hosts != 1 else ''}"
        if self._phase_changed:
            line += "; changed: " + ", ".join(f"{task} ({count})" for task, count in self._phase_changed.items())
        else:
            line += "; nothing changed"
        if self._phase_failed:
            line += f"; FAILED on {', '.join(sorted(self._phase_failed))}"
        self._display.display(textwrap.fill(line, _WIDTH, subsequent_indent="    ", break_on_hyphens=False))
        self._phase, self._phase_hosts, self._phase_changed, self._phase_failed = None, set(), Counter(), set()

    def v2_playbook_on_play_start(self, play):
        name = play.get_name().strip()
        if name != self._phase:  # a play with `serial` starts once per batch: one line for all of them
            self._flush()
            self._phase = name
        self._play = play

    def v2_playbook_on_stats(self, stats):
        self._flush()
        hosts = sorted(stats.processed)
        changed = sum(1 for h in hosts if stats.summarize(h)["changed"])
        failed = [h for h in hosts if stats.summarize(h)["failures"] or stats.summarize(h)["unreachable"]]
        line = f"Recap: {len(hosts)} hosts, changes on {changed}, "
        line += f"failed or unreachable: {', '.join(failed)}" if failed else "none failed"
        self._display.display(line)

    # --- per task and host: counted, not printed -------------------------------------------------------------
    def v2_playbook_on_task_start(self, task, is_conditional):
        pass

    def v2_playbook_on_handler_task_start(self, task):
        pass

    def v2_playbook_on_include(self, included_file):
        pass

    def v2_playbook_on_no_hosts_matched(self):
        pass

    def v2_playbook_on_start(self, playbook):
        pass

    def v2_runner_retry(self, result):
        pass

    def v2_runner_on_start(self, host, task):
        pass

    def v2_runner_item_on_ok(self, result):
        pass

    def v2_runner_item_on_skipped(self, result):
        pass

    def v2_runner_on_skipped(self, result):
        self._phase_hosts.add(result.host.get_name())

    def v2_runner_on_ok(self, result):
        self._phase_hosts.add(result.host.get_name())
        task = result.task
        name = task.get_name().split(" : ", 1)[-1]  # without the role's name
        if result.result.get("changed", False):
            self._phase_changed[_DETAIL.sub("", name)] += 1
        if task.action in ("debug", "ansible.builtin.debug") and name.startswith("Warn") and "msg" in result.result:
            self._display.warning(f"{result.host.get_name()}: {result.result['msg']}")
        self._handle_warnings_and_exception(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._phase_hosts.add(result.host.get_name())
        if ignore_errors:  # the task expects it (a probe); the default callback would print it and "...ignoring"
            return
        self._phase_failed.add(result.host.get_name())
        super().v2_runner_on_failed(result, ignore_errors)

    def v2_runner_on_unreachable(self, result):
        self._phase_hosts.add(result.host.get_name())
        self._phase_failed.add(result.host.get_name())
        super().v2_runner_on_unreachable(result)
