from __future__ import annotations

import numpy as np
import pytest

from shardplan import registry
from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir import Device, Graph, Objective, Plan, Stage, Topology


def _topo(n: int) -> Topology:
    return Topology(name="t", devices=tuple(Device(f"d{i}", 1e9, 1e12) for i in range(n)),
                    bandwidth=np.full((n, n), 1e9), latency=np.full((n, n), 1e-5))


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", {f: {} for f in registry.FAMILIES})
    monkeypatch.setattr(registry, "_loaded", True)

    @registry.register("partition", "everything-on-one")
    def one(graph, topology, *, options, seed, time_limit, progress=None):
        nodes = tuple(range(graph.num_nodes)) if not options.get("drop") else (0,)
        plan = Plan(graph=graph.name, topology=topology.name, algorithm="everything-on-one",
                    stages=(Stage(nodes, (0,)),),
                    objective=Objective("x", float(graph.fwd_flops.sum())), status="optimal")
        return registry.Result(plan, {"seed": seed})

    return one


def test_register_lookup_run(toy, diamond: Graph) -> None:
    assert registry.available("partition") == ["everything-on-one"]
    res = registry.run("partition", "everything-on-one", diamond, _topo(2), seed=3)
    assert res.objective == 10.0 and res.status == "optimal" and res.stats == {"seed": 3}
    with pytest.raises(ValueError, match="twice"):
        registry.register("partition", "everything-on-one")(toy)


def test_run_validates_the_plan(toy, diamond: Graph) -> None:
    with pytest.raises(InvalidFileError, match="in no stage"):
        registry.run("partition", "everything-on-one", diamond, _topo(2), drop=True)


def test_unknown_names_are_one_line_errors(toy, diamond: Graph) -> None:
    with pytest.raises(ShardplanError, match="available: everything-on-one"):
        registry.get("partition", "nope")
    with pytest.raises(ShardplanError, match="none yet"):
        registry.get("map", "optimal")
    with pytest.raises(ShardplanError, match="time limit"):
        registry.run("partition", "everything-on-one", diamond, _topo(1), time_limit=0)
