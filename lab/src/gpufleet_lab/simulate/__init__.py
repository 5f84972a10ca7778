"""Placement simulator: does load-aware placement beat counting GPUs on this fleet and this workload?

``gpufleet-lab simulate`` (cli.py) builds the fleet from an inventory or a YAML file (fleet.py), takes a
trace from a file or the seeded generator (trace.py, generator.py), and replays it once per placement policy
(policies.py) through an event-driven model of the cluster (model.py, state.py). The ``load`` policies decide
with the extender's own ``scoring.evaluate_nodes`` on snapshots built from the model's state, so a change to
the scoring shows here unchanged. metrics.py turns each run into the report's figures and the goal checks;
report.py prints the table and writes results.json and the plot. docs/simulator.md has the details.
"""

from gpufleet_lab.simulate.cli import add_arguments, main, run

__all__ = ["add_arguments", "main", "run"]
