"""The gpufleet.mig.phases stdout callback (make lab's output), run by ansible-playbook on a small playbook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import COLLECTIONS_PATH, REPO

PLAYBOOK = """
- name: First phase
  hosts: all
  gather_facts: false
  tasks:
    - name: Write a file ({{ inventory_hostname }})
      ansible.builtin.copy:
        content: "{{ inventory_hostname }}\\n"
        dest: "{{ out }}/{{ inventory_hostname }}.txt"
        mode: "0644"
    - name: Skipped everywhere
      ansible.builtin.debug:
        msg: never shown
      when: false
    - name: Loop with skipped items
      ansible.builtin.debug:
        msg: "{{ item }}"
      loop: [1, 2, 3]
      when: item > 5
    - name: Show a plan nobody must act on
      ansible.builtin.debug:
        msg: plan of {{ inventory_hostname }}
    - name: Warn that one host needs a reboot
      ansible.builtin.debug:
        msg: reboot {{ inventory_hostname }} now
      when: inventory_hostname == 'h2'
    - name: A probe that may fail
      ansible.builtin.command: "false"
      changed_when: false
      ignore_errors: true  # noqa: ignore-errors

- name: Second phase
  hosts: h1
  gather_facts: false
  tasks:
    - name: Fail on purpose
      ansible.builtin.fail:
        msg: the reason, in full
"""


def test_one_line_per_play_warnings_and_failures_in_full(tmp_path):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_PATH,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="gpufleet.mig.phases",
        ANSIBLE_NOCOLOR="1",
    )
    cmd = [
        str(Path(sys.executable).with_name("ansible-playbook")),
        "-i",
        "h1,h2,h3,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={sys.executable} out={tmp_path}",
        str(tmp_path / "play.yml"),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert run.returncode == 2  # the failed task still fails the run
    lines = run.stdout.splitlines()
    # The per-host detail of the task name is dropped, so the three hosts' changes count under one name.
    assert "First phase: 3 hosts; changed: Write a file (3)" in lines
    assert any(line.startswith("Second phase: 1 host; nothing changed; FAILED on h1") for line in lines)
    assert "Recap: 3 hosts, changes on 3, failed or unreachable: h1" in lines
    everything = run.stdout + run.stderr
    assert "the reason, in full" in everything  # the failure as the default callback prints it
    assert "h2: reboot h2 now" in everything  # a Warn task that ran
    assert "never shown" not in everything and "skipping" not in everything and "plan of" not in everything
    assert "ignoring" not in everything and "PLAY [" not in everything
    assert everything.count("TASK [") == 1 and "TASK [Fail on purpose]" in everything  # only the failed task's banner
