"""Helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Sequence

from shardplan.cli.main import main
from shardplan.importers._run import RunConfig
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


def plan_of_run(run: RunConfig, num_nodes: int) -> Plan:
    """An imported run's LLM plan laid out by hand on a chain graph of ``num_nodes`` nodes
    (embedding, the blocks, norm, head): blocks by ``layers_per_stage``, the embedding with
    the first virtual stage, the norm and head with the last; its settings and provenance
    as an import records them."""
    par = run.parallel
    per = par.layers_per_stage(run.model.num_layers)
    width = par.devices_per_rank
    stages, start = [], 1
    for j, count in enumerate(per):
        nodes = list(range(start, start + count))
        if j == 0:
            nodes.insert(0, 0)
        if j == len(per) - 1:
            nodes += [num_nodes - 2, num_nodes - 1]
        r = j % par.pp
        stages.append(Stage(tuple(nodes), tuple(range(r * width, (r + 1) * width))))
        start += count
    settings, _ = run.settings()
    meta = {"imported_from": {"tool": "test", "model": run.model.spec,
                              "execution": dict(run.execution)}}
    return Plan("llm", "cluster", "import", tuple(stages), Objective("x", 0.0),
                execution=settings, parallel=par, meta=meta)
