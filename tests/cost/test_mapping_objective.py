"""``shardplan cost --objective max-stage`` on mapped plans: the views of the stage-time model
(Parmesan equations 6 and 7, equation 3, overlap) on a tiny instance worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.ir import Device, ExecutionSettings, Graph, Objective, Plan, Stage, Topology, save
from shardplan.objectives import evaluate
from tests.helpers import run_cli


def instance(name: str = "max_stage_seconds_p2p", **options) -> tuple[Graph, Topology, Plan]:
    # Stage 0 = node 0 (1e12 fwd + 2e12 bwd FLOPs, 4e8 parameter bytes), stage 1 = node 1
    # (2e12 + 4e12 FLOPs, 2e9 parameter bytes); one edge of 1e6 bytes between them.
    graph = Graph.from_arrays(name="g", fwd_flops=[1e12, 2e12], src=[0], dst=[1],
                              edge_bytes=[1_000_000], param_bytes=[400_000_000, 2_000_000_000])
    bw = np.full((4, 4), 1e9)
    bw[0, 1] = bw[1, 0] = 1e10
    bw[1, 3] = bw[3, 1] = 5e8
    lat = np.full((4, 4), 1e-3)
    topo = Topology(name="t", devices=tuple(Device(f"d{i}", 1e12, 1e12) for i in range(4)),
                    bandwidth=bw, latency=lat)
    plan = Plan(graph="g", topology="t", algorithm="x",
                stages=(Stage((0,), (0, 1)), Stage((1,), (2, 3))),
                objective=Objective(name, 0.0), options=options)
    return graph, topo, plan


def test_p2p_by_hand():
    graph, topo, plan = instance()
    name, value, details = evaluate(plan, graph, topo, "max-stage")
    # Replicas split the micro-batch: compute 3 s / 2 and 6 s / 2 per replica. Each replica
    # sends or receives half the 1e6-byte tensor forward and its gradient backward: replica
    # 0 on devices 0 <-> 2 (1 ms + 5e5 / 1e9 = 1.5 ms each way), replica 1 on 1 <-> 3
    # (1 ms + 5e5 / 5e8 = 2 ms each way); both stages pay both messages.
    assert name == "max_stage_seconds_p2p"
    assert np.allclose(details["replica_seconds"], [[1.503, 1.504], [3.003, 3.004]])
    assert value == pytest.approx(3.004)


def test_allreduce_by_hand():
    graph, topo, plan = instance("max_stage_seconds_allreduce")
    name, value, details = evaluate(plan, graph, topo, "max-stage")
    # Ring of R = 2: 2 (R - 1) (latency + P / (R B)). Stage 0 on 0, 1: 2 (1 ms + 2e8 / 1e10)
    # = 0.042 s; stage 1 on 2, 3: 2 (1 ms + 1e9 / 1e9) = 2.002 s; plus the replica's compute.
    assert name == "max_stage_seconds_allreduce"
    assert details["stage_seconds"] == pytest.approx([1.542, 5.002])
    assert details["allreduce_seconds"] == pytest.approx([0.042, 2.002])
    assert value == pytest.approx(5.002)


def test_overlap_and_eq3_by_hand():
    graph, topo, plan = instance("max_stage_seconds_overlap")
    name, value, details = evaluate(plan, graph, topo, "max-stage")
    # max(compute, sends) + all-reduce / (M + P - 1) with M = 8 micro-batches, P = 2 ranks.
    assert name == "max_stage_seconds_overlap"
    assert details["stage_seconds"] == pytest.approx([1.5 + 0.042 / 9, 3.0 + 2.002 / 9])
    # equation 3 is equation 6's slowest replica, at the same placement
    name, value, _ = evaluate(plan, graph, topo, "max-stage", model="eq3")
    assert name == "max_stage_seconds" and value == pytest.approx(3.004)


def test_model_option_overrides_the_recorded_name():
    graph, topo, plan = instance("max_stage_seconds_p2p")
    name, value, _ = evaluate(plan, graph, topo, "max-stage", model="allreduce")
    assert name == "max_stage_seconds_allreduce" and value == pytest.approx(5.002)


def test_settings_come_from_the_plan_unless_given():
    graph, topo, plan = instance(efficiency=0.5)  # an older plan: settings in its options
    assert evaluate(plan, graph, topo, "max-stage")[1] == pytest.approx(6.004)
    assert evaluate(plan, graph, topo, "max-stage", efficiency=1.0)[1] == pytest.approx(3.004)
    graph, topo, plan = instance()
    plan = plan.with_settings(ExecutionSettings(efficiency=0.25))
    assert evaluate(plan, graph, topo, "max-stage")[1] == pytest.approx(12.004)
    with pytest.raises(ShardplanError, match="bogus"):
        evaluate(plan, graph, topo, "max-stage", bogus=1)


def test_cli_cost_of_a_mapped_plan(tmp_path, capsys):
    graph, topo, plan = instance()
    for obj, fname in ((graph, "g.json"), (topo, "t.json"), (plan, "p.json")):
        save(obj, tmp_path / fname)
    files = [str(tmp_path / f) for f in ("p.json", "g.json", "t.json")]
    assert run_cli(["cost", *files, "--objective", "max-stage", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"] == "max_stage_seconds_p2p" and out["value"] == pytest.approx(3.004)
    assert run_cli(["cost", *files, "--objective", "max-stage", "--model", "allreduce",
                    "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["value"] == pytest.approx(5.002)
