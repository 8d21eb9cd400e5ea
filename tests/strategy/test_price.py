"""One price (issue 33): PaSE's search, the hybrid and the simulator charge a plan that splits
layers the same seconds, at the batch and precision the plan runs, with one gradient sync.

Each test names the cause of the issue it guards against; each fails on the code before it."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan import registry
from shardplan.generate import alexnet, transformer
from shardplan.ir import Device, ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.simulate import simulate
from shardplan.strategy._price import SimulatorCostModel, StagePricer, local_statistics
from shardplan.strategy.spaces import Space, configurations
from shardplan.strategy.tables import graph_spaces
from shardplan.topology import build


def _topo(n: int = 4, *, bw: float = 1e10, lat: float = 1e-6) -> Topology:
    t = build("flat", num_devices=n, bandwidth=bw, latency=lat)
    return t


def _dp_plan(g: Graph, n: int, settings: ExecutionSettings) -> Plan:
    return Plan(graph=g.name, topology="t", algorithm="data-parallel",
                stages=(Stage(tuple(range(g.num_nodes)), tuple(range(n))),),
                objective=Objective("x", 0.0)).with_settings(settings)


def _strategy(g: Graph, topo: Topology, algorithm: str, settings: ExecutionSettings) -> Plan:
    return registry.run("strategy", algorithm, g, topo, seed=0, time_limit=None,
                        cost_model="default", execution=settings.to_dict()).plan


# ------------------------------------------------------------------ cause 1: the batch
def test_spaces_follow_the_batch_the_plan_runs() -> None:
    """``Graph.at_batch_size`` takes every space's batch dimension (and the output
    dimensions built from it) to the new batch; before, a graph captured at 8 samples kept
    spaces of 8, and the cutoff of 4 then allowed at most a 2-way batch split."""
    g = alexnet()  # spaces at batch 128
    small = g.at_batch_size(8)
    for before, after in zip(graph_spaces(g), graph_spaces(small), strict=True):
        b = before.index(before.batch_dim)
        assert after.sizes[b] * 128 == before.sizes[b] * 8
        assert [s for i, s in enumerate(after.sizes) if i != b] == \
            [s for i, s in enumerate(before.sizes) if i != b]
    back = graph_spaces(small.at_batch_size(128))
    assert [s.sizes for s in back] == [s.sizes for s in graph_spaces(g)]


def test_pase_searches_at_the_micro_batch_it_prices() -> None:
    """A graph captured at batch 8, searched for a run of 128 samples on 16 devices: the
    16-way batch split (data parallelism) is among the configurations and the search's
    data-parallel incumbent uses all 16 devices; at the captured batch only 2-way was."""
    g = alexnet().at_batch_size(8)
    topo = _topo(16)
    run = ExecutionSettings(microbatch_size=128, microbatches=1, gradient_sync="end")
    dp = _strategy(g, topo, "data-parallel", run)
    assert dp.meta["devices_used"] == 16
    captured = registry.run("strategy", "data-parallel", g, topo, seed=0, time_limit=None,
                            cost_model="pase").plan
    assert captured.meta["devices_used"] == 2


# ------------------------------------------------------------------ cause 2: one compute model
def test_compute_is_the_simulators_at_the_plans_precision() -> None:
    """The default cost model's compute of a node under a configuration is the shared cost
    model's node seconds (the roofline at the precision's rate) over the devices computing
    it: a mixed-precision run prices a matrix product at the tensor-core rate, an fp32 run
    at the fp32 rate, 10 times slower here; PaSE's default model priced both at the peak."""
    fc = {"kind": "gemm", "dims": [["b", 64], ["n", 256], ["k", 512]],
          "output": [["b"], ["n"]], "output_shape": [64, 256], "m": ["b"], "n": ["n"],
          "k": ["k"], "weight": ["n", "k"], "inputs": {}}
    g = Graph.from_arrays(name="fc", batch_size=64, fwd_flops=[2.0 * 64 * 256 * 512],
                          src=[], dst=[], ops=["linear"], param_bytes=[256 * 512 * 4],
                          output_bytes=[64 * 256 * 4]).replace(spaces=(fc,))
    fast, slow = 1e14, 1e13
    devs = tuple(Device(f"d{i}", 16e9, fast, extra={"fp32_flops": slow}) for i in range(4))
    topo = Topology(name="t", devices=devs, bandwidth=np.full((4, 4), 1e10) - np.eye(4) * 1e10,
                    latency=np.zeros((4, 4)))
    batch_only = np.array([[1, 1, 1], [2, 1, 1], [4, 1, 1]])
    out = {}
    for mixed in (False, True):
        pr = StagePricer(g, topo, range(4),
                         ExecutionSettings(microbatches=1,
                                           precision="bf16" if mixed else "fp32"))
        price = pr.node(0, batch_only)
        nf, nb = pr.cm.node_seconds(0)
        assert price.forward == pytest.approx(nf[0] / np.array([1, 2, 4]), rel=1e-12)
        assert price.backward == pytest.approx(nb[0] / np.array([1, 2, 4]), rel=1e-12)
        out[mixed] = float(price.forward[0])
    assert out[False] == pytest.approx(out[True] * fast / slow, rel=1e-9)
    assert out[True] == pytest.approx(2.0 * 64 * 256 * 512 / fast, rel=1e-9)


# --------------------------------------------- cause 3 and 4: one gradient sync, per iteration
@pytest.mark.parametrize("sync", ["end", "bucketed"])
def test_all_batch_strategy_simulates_as_data_parallelism(sync: str) -> None:
    """Every layer split on the batch over all devices is data parallelism: it simulates
    within 2% of the data-parallel family with the same gradient sync (it was 10 times
    slower: one all-reduce per layer per micro-batch, at the worst link, never overlapped)."""
    g = transformer(num_layers=2)
    topo = build("hierarchical", shape=(2, 4), level_names=("box", "gpu"),
                 bandwidth=(1e9, 2e10), latency=(1e-5, 1e-6))
    s = ExecutionSettings(microbatch_size=g.batch_size, microbatches=2, schedule="gpipe",
                          gradient_sync=sync)
    family = simulate(_dp_plan(g, 8, s), g, topo, timeline=False).iteration_seconds
    dp = _strategy(g, topo, "data-parallel", s)
    assert dp.meta["devices_used"] == 8
    got = simulate(dp.with_settings(s), g, topo, timeline=False).iteration_seconds
    assert got == pytest.approx(family, rel=0.02)
    # and its own cost is what the simulator says (within 10%)
    assert dp.objective.value == pytest.approx(got, rel=0.10)


def test_weight_gradients_are_reduced_once_per_iteration_whatever_the_micro_batches() -> None:
    """The gradient all-reduce of a strategy plan does not grow with the micro-batch count
    (it was charged in every micro-batch, scaled by the micro-batch's share of the batch)."""
    g = transformer(num_layers=1)
    topo = _topo(4, bw=1e9, lat=1e-5)
    rows = {}
    for m in (1, 4):
        s = ExecutionSettings(microbatch_size=g.batch_size // m, microbatches=m,
                              schedule="gpipe", gradient_sync="end")
        plan = _strategy(g, topo, "data-parallel", s).with_settings(s)
        rows[m] = simulate(plan, g, topo, timeline=False).allreduce_seconds
    assert rows[1] == pytest.approx(rows[4])
    assert max(rows[1]) > 0


def test_batch_norm_statistics_are_per_device_under_a_batch_split() -> None:
    """A batch norm split by its batch normalises each device's part (DDP's semantics, what
    the runtime runs): no collective; the paper's formula all-reduced the whole activation
    four times over the split."""
    bn = Space(kind="norm", dims=("d0", "d1", "d2"), sizes=(64, 32, 100),
               output=(("d0",), ("d1",), ("d2",)), output_shape=(64, 32, 100),
               weight=("d1",), attrs={"axis": "d0", "weight_scale": 2})
    ln = Space(kind="norm", dims=("d0", "d1"), sizes=(64, 32), output=(("d0",), ("d1",)),
               output_shape=(64, 32), weight=("d1",), attrs={"axis": "d1"})
    assert local_statistics(bn) and not local_statistics(ln)
    g = Graph.from_arrays(name="bn", batch_size=64, fwd_flops=[1e6], src=[], dst=[],
                          output_bytes=[64 * 32 * 100 * 4], param_bytes=[256])
    g = g.replace(spaces=(bn.to_dict(),))
    pr = StagePricer(g, _topo(4, bw=1e9, lat=1e-5), range(4),
                     ExecutionSettings(microbatches=1))
    whole = pr.node(0, np.array([[1, 1, 1]]))
    split = pr.node(0, np.array([[4, 1, 1]]))
    # the split pays a quarter of the compute and no statistics' collective
    assert split.forward + split.backward < whole.forward + whole.backward
    nf, nb = pr.cm.node_seconds(0)
    ff, fb = pr.cm.unshared_seconds(1.0, range(4))  # what a device pays in full
    assert float(split.forward[0] + split.backward[0]) == pytest.approx(
        (nf[0] + nb[0]) / 4 + (ff[0] + fb[0]) * 3 / 4, rel=1e-9)


# ------------------------------------------------------------------ the search's own cost
def test_strategy_plans_own_cost_is_within_ten_percent_of_the_simulation() -> None:
    """PaSE's plan, searched in the simulator's price, costs what it simulates (10%)."""
    g = transformer(num_layers=2)
    topo = build("hierarchical", shape=(2, 4), level_names=("box", "gpu"),
                 bandwidth=(1e9, 2e10), latency=(1e-5, 1e-6))
    for sync in ("end", "bucketed"):
        s = ExecutionSettings(microbatch_size=g.batch_size, microbatches=2,
                              schedule="gpipe", gradient_sync=sync)
        plan = _strategy(g, topo, "pase", s)
        assert plan.objective.name == "iteration_seconds" and plan.status == "optimal"
        sim = simulate(plan, g, topo, timeline=False).iteration_seconds
        assert plan.objective.value == pytest.approx(sim, rel=0.10)
        # its search space holds data parallelism, priced the same way: never worse
        dp = _strategy(g, topo, "data-parallel", s)
        assert plan.objective.value <= dp.objective.value * (1 + 1e-12)


def test_simulator_cost_model_rules_out_what_does_not_fit_inclusively() -> None:
    """A configuration whose bytes per device equal the limit fits; one byte less does
    not (its cost is infinity, a float)."""
    g = transformer(num_layers=1)
    topo = _topo(2)
    cm = SimulatorCostModel(g, topo, 2)
    v = int(np.argmax(g.param_bytes))
    configs = configurations(cm.pricer.spaces[v], 2, 1)
    need = cm.pricer.memory(v, cm.pricer.node(v, configs), configs)
    i = int(np.argmin(need))
    at = SimulatorCostModel(g, topo, 2, memory_limit=float(need[i])).node_cost(
        cm.pricer.spaces[v], configs, node=v)
    assert at.dtype == np.float64 and np.isfinite(at[i])
    below = SimulatorCostModel(g, topo, 2, memory_limit=float(need[i]) - 1.0).node_cost(
        cm.pricer.spaces[v], configs, node=v)
    assert np.isinf(below[i])


def test_a_search_cut_before_the_shares_agree_prices_the_plan_it_returns(monkeypatch) -> None:
    """Under DDP's overlap PaSE re-solves until the exposed share of the gradients' rings
    is its answer's own; cut before (no re-solve at all, as a time limit does), the
    objective is still the returned plan's price at its own share: the same as a search
    that converged to the same plan (it was the price at the share searched with)."""
    import shardplan.strategy.pase as pase_module

    g = transformer(num_layers=2)
    topo = build("hierarchical", shape=(2, 4), level_names=("box", "gpu"),
                 bandwidth=(1e9, 2e10), latency=(1e-5, 1e-6))
    s = ExecutionSettings(microbatch_size=g.batch_size, microbatches=2, schedule="gpipe",
                          gradient_sync="bucketed")
    full = _strategy(g, topo, "pase", s)
    monkeypatch.setattr(pase_module, "RESOLVES", 0)
    cut = _strategy(g, topo, "pase", s)
    assert cut.strategy == full.strategy  # the same answer on this graph
    assert cut.meta["sync_exposure"] == pytest.approx(full.meta["sync_exposure"], abs=1e-3)
    assert cut.objective.value == pytest.approx(full.objective.value, rel=1e-6)
