"""`gpufleet-lab COMMAND ...`: each command is its module's main, given the rest of the command line."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from gpufleet_lab import cli


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_runs_its_modules_main_with_the_rest_of_the_line(name, capsys):
    module = importlib.import_module(cli.COMMANDS[name][0])
    assert callable(module.main)
    with pytest.raises(SystemExit) as stopped:
        cli.main([name, "--help"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: gpufleet-lab {name} ")


def test_a_command_says_its_own_errors_and_exit_code(tmp_path, capsys):
    assert cli.main(["verdict", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"lab verdict: {tmp_path}/sim/results.json is missing: the simulator step did not run\n"
    )


def test_an_unknown_command_is_one_line_and_exit_2():
    ran = subprocess.run(
        [sys.executable, "-m", "gpufleet_lab", "simulat"], capture_output=True, text=True, check=False, timeout=60
    )
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert ran.stderr.splitlines()[-1].startswith("gpufleet-lab: error: argument COMMAND: invalid choice: 'simulat'")
