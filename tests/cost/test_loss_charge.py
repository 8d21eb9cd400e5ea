"""The training loss a profiled graph records (``meta["loss"]``), charged by the cost model
to the node producing the model's output: every planner and the simulator see it; graphs
without it are priced exactly as before."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.cost import CostModel, loss_charge, split_work
from shardplan.ir import Device, ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.simulate import simulate

LF, LB = 2e-3, 5e-3  # the loss's seconds at batch 4


def _graph(loss: dict | None = None, batch: int = 4) -> Graph:
    g = Graph.from_arrays(name="g", batch_size=batch, fwd_flops=[1e9, 2e9, 3e9],
                          src=[0, 1], dst=[1, 2], names=["emb", "fc", "head"],
                          output_bytes=[1000, 1000, 0], param_bytes=[400, 400, 400])
    g = g.replace(fwd_seconds=np.array([1e-3, 2e-3, 3e-3]),
                  bwd_seconds=np.array([2e-3, 4e-3, 6e-3]))
    if loss is not None:
        g = g.replace(meta={"loss": loss})
    return g


LOSS = {"function": "cross_entropy", "output": "head", "batch_size": 4,
        "fwd_seconds": LF, "bwd_seconds": LB}


def _topo(n: int) -> Topology:
    devs = tuple(Device(f"d{i}", 1e9, 1e12) for i in range(n))
    bw = np.full((n, n), 1e9) - np.diag(np.full(n, 1e9))
    return Topology(name="t", devices=devs, bandwidth=bw, latency=np.zeros((n, n)))


def test_split_work_charges_the_loss_to_the_output_node() -> None:
    plain, with_loss = split_work(_graph()), split_work(_graph(LOSS))
    fm, ff, bm, bf = with_loss
    assert fm.tolist() == pytest.approx([1e-3, 2e-3, 3e-3 + LF])
    assert bm.tolist() == pytest.approx([2e-3, 4e-3, 6e-3 + LB])
    assert np.array_equal(ff, plain[1]) and np.array_equal(bf, plain[3])
    assert loss_charge(_graph()) is None  # no loss recorded: the old arrays exactly
    assert all(np.array_equal(a, b) for a, b in zip(split_work(_graph()), plain, strict=True))


def test_the_loss_scales_with_the_batch_and_follows_the_node() -> None:
    g = _graph(LOSS)
    assert loss_charge(g.at_batch_size(8)) == (2, pytest.approx(2 * LF), pytest.approx(2 * LB))
    assert loss_charge(g.subgraph([0, 1])) is None  # the output is not in it
    assert loss_charge(g.subgraph([2, 0])) == (0, LF, LB)
    assert loss_charge(_graph({**LOSS, "output": "nowhere"})) is None
    assert loss_charge(_graph({**LOSS, "fwd_seconds": "x"})) is None  # unreadable: ignored


def test_a_module_level_graph_charges_the_node_holding_the_output_operator() -> None:
    g = Graph.from_arrays(name="g", batch_size=4, fwd_flops=[1.0, 1.0], src=[0], dst=[1],
                          names=["blocks.0", "lm_head"])
    extra = ({"ops": [[0, "linear", "linear", "blocks.0.fc"]]},
             {"ops": [[1, "layer_norm", "layer_norm", "ln"], [2, "linear_1", "linear",
                                                              "lm_head"]]})
    g = g.replace(node_extra=extra, meta={"loss": {**LOSS, "output": "linear_1"}})
    assert loss_charge(g) == (1, LF, LB)


def test_the_simulator_charges_the_loss_every_microbatch_on_the_last_stage() -> None:
    topo = _topo(2)
    settings = ExecutionSettings(microbatches=3, optimizer="sgd", efficiency=1.0)
    one = Plan("g", "t", "hand", (Stage((0, 1, 2), (0,)),), Objective("x", 0.0))
    base = simulate(one.with_settings(settings), _graph(), topo).iteration_seconds
    more = simulate(one.with_settings(settings), _graph(LOSS), topo).iteration_seconds
    assert more - base == pytest.approx(3 * (LF + LB))
    two = Plan("g", "t", "hand", (Stage((0, 1), (0,)), Stage((2,), (1,))), Objective("x", 0))
    cm = CostModel.from_settings(_graph(LOSS), topo, settings)
    f, b = cm.partition_compute_seconds([0, 0, 1], [0, 1])
    assert f.tolist() == pytest.approx([3e-3, 3e-3 + LF])
    assert b.tolist() == pytest.approx([6e-3, 6e-3 + LB])
    r = simulate(two.with_settings(settings), _graph(LOSS), topo, timeline=True)
    last = [iv.end - iv.start for iv in r.intervals if iv.kind == "F" and iv.device == 1]
    assert last == pytest.approx([3e-3 + LF] * 3)


def test_a_strategy_computes_the_whole_loss_on_every_device() -> None:
    """A strategy stage splits its nodes' work over its devices, but the program returns
    the whole output to every device, each of which computes the whole loss."""
    topo = _topo(2)
    settings = ExecutionSettings(microbatches=3, optimizer="sgd", efficiency=1.0)
    plan = Plan("g", "t", "pase", (Stage((0, 1, 2), (0, 1)),), Objective("x", 0.0),
                strategy={"0": [2], "1": [2], "2": [2]}).with_settings(settings)
    base = simulate(plan, _graph(), topo).iteration_seconds
    more = simulate(plan, _graph(LOSS), topo).iteration_seconds
    assert more - base == pytest.approx(3 * (LF + LB))


@pytest.mark.parametrize("field,value", [("fwd_seconds", float("nan")),
                                         ("bwd_seconds", float("inf")),
                                         ("fwd_seconds", -1e-3), ("bwd_seconds", -1e-3),
                                         ("batch_size", 1e-320)])  # scale overflows
def test_a_loss_with_a_bad_number_is_not_charged(field, value) -> None:
    assert loss_charge(_graph({**LOSS, field: value})) is None


def test_a_free_loss_is_charged_as_zero() -> None:
    assert loss_charge(_graph({**LOSS, "fwd_seconds": 0.0, "bwd_seconds": 0.0})) == (
        2, 0.0, 0.0)


def test_a_module_level_graph_without_the_output_operator_charges_nothing() -> None:
    g = _graph(LOSS).replace(names=["a", "b", "c"], node_extra=[
        {"ops": [[0, "x", "aten.mm", "m"]]}, {"ops": []}, {}])
    assert loss_charge(g) is None
    g = g.replace(node_extra=[{"ops": [[0, "x", "aten.mm", "m"]]}, {},
                              {"ops": [[1, "head", "aten.mm", "m"]]}])
    assert loss_charge(g) == (2, LF, LB)
