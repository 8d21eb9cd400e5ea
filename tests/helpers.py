"""Helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Sequence

from shardplan.cli.main import main
from shardplan.ir import Objective, Plan, Stage


def run_cli(argv: Sequence[str]) -> int:
    """Run the real ``shardplan`` command line in-process; returns its exit status
    (argparse's own exits included)."""
    try:
        return main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2


def hand_plan(cuts: Sequence[int], num_nodes: int, replicas: int = 1,
              **execution: object) -> Plan:
    """A hand-made pipeline plan of a chain of ``num_nodes`` nodes cut before each of
    ``cuts``, each stage replicated ``replicas`` times (replica r of stage s on device
    ``r * stages + s``), with ``execution`` overriding its settings."""
    bounds = [0, *cuts, num_nodes]
    k = len(bounds) - 1
    stages = tuple(Stage(tuple(range(bounds[s], bounds[s + 1])),
                         tuple(r * k + s for r in range(replicas))) for s in range(k))
    plan = Plan("gpt", "flat", "hand", stages, Objective("x", 0.0))
    if execution:
        plan = plan.with_settings(plan.settings.override(**execution)[0])
    return plan

