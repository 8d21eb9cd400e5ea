"""Measured fixed costs (``shardplan.cost._overheads``): absent fields change nothing, and
each measured overhead is charged where the run pays it, by hand-computed amounts."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from shardplan.cost import CostModel
from shardplan.cost._overheads import (
    busy_slowdown,
    charge_run_overheads,
    dtensor_op_overhead,
    dtensor_op_seconds_per_byte,
    fsdp_gather_overhead,
    fsdp_unit_chunks,
    fsdp_unit_keys,
    op_overhead,
    pipeline_action_overhead,
)
from shardplan.ir import Device, ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.simulate import simulate


def _topo(num: int, **extra) -> Topology:
    bw = np.full((num, num), 1e9)
    np.fill_diagonal(bw, 0)
    lat = np.full((num, num), 1e-5)
    np.fill_diagonal(lat, 0)
    return Topology(name="t", devices=tuple(Device(f"d{i}", 1e12, 1e12, dict(extra))
                                            for i in range(num)), bandwidth=bw, latency=lat)


def _graph(measured: bool, params: int = 0) -> Graph:
    n = 4
    kw = {"fwd_seconds": np.full(n, 1.0), "bwd_seconds": np.full(n, 2.0)} if measured else {}
    return Graph.from_arrays(name="g", fwd_flops=np.full(n, 1e12), src=np.arange(n - 1),
                             dst=np.arange(1, n), param_bytes=np.full(n, params), **kw)


def _plan(stages, devices) -> Plan:
    return Plan("g", "t", "hand", tuple(Stage(tuple(s), tuple(d))
                                        for s, d in zip(stages, devices, strict=True)),
                Objective("max_stage_seconds", 0.0))


ZERO = {"op_overhead_seconds": [0.0, 0.0], "dtensor_op_overhead_seconds": [0.0, 0.0],
        "dtensor_op_seconds_per_byte": [0.0, 0.0],
        "fsdp_gather_overhead_seconds": 0.0, "gradient_seconds_per_byte": [0.0, 0.0],
        "fsdp_reduce_overhead_seconds": 0.0, "fsdp_reduce_seconds_per_byte": 0.0,
        "pipeline_action_overhead_seconds": 0.0,
        "busy_slowdown": {"1": 1.0, "2": 1.0}}


def test_readers_default_to_nothing() -> None:
    t = _topo(2)
    assert op_overhead(t) == (0.0, 0.0) and dtensor_op_overhead(t) == (0.0, 0.0)
    assert dtensor_op_seconds_per_byte(t) == (0.0, 0.0)
    # the median over the devices asked, with the measurement's busy slowdown divided out
    per = _topo(3, dtensor_op_seconds_per_byte=[2e-9, 4e-9], busy_slowdown={"3": 2.0})
    per = dataclasses.replace(per, devices=(*per.devices[:2], Device(
        "d2", 1e12, 1e12, {"dtensor_op_seconds_per_byte": [8e-9, 8e-9],
                           "busy_slowdown": {"3": 2.0}})))
    assert dtensor_op_seconds_per_byte(per, [0, 1]) == pytest.approx((1e-9, 2e-9))
    assert dtensor_op_seconds_per_byte(per, [2]) == pytest.approx((4e-9, 4e-9))
    assert dtensor_op_seconds_per_byte(per) == pytest.approx((1e-9, 2e-9))
    assert fsdp_gather_overhead(t, [0, 1]) == 0.0 and busy_slowdown(t, [0, 1]) == 1.0
    assert op_overhead(None) == (0.0, 0.0)
    # a measured ratio below 1 is noise, and one device is never slowed by others
    slow = _topo(2, busy_slowdown={"1": 1.0, "2": 0.9})
    assert busy_slowdown(slow, [0, 1]) == 1.0
    assert busy_slowdown(_topo(2, busy_slowdown={"2": 1.7}), [1]) == 1.0


@pytest.mark.parametrize("sync", ["end", "bucketed", "sharded"])
@pytest.mark.parametrize("measured", [True, False])
def test_topology_without_the_fields_simulates_as_with_zero_overheads(sync, measured) -> None:
    """Old topology files (no fields) and measured zeros give identical results, and the
    run-overhead hook returns the stage times untouched (the same object)."""
    g = _graph(measured, params=4_000_000)
    plan = _plan([[0, 1, 2, 3]], [[0, 1]])
    settings = ExecutionSettings(microbatches=2, schedule="gpipe", optimizer="sgd",
                                 gradient_sync=sync)
    old = simulate(plan.with_settings(settings), g, _topo(2), timeline=False)
    new = simulate(plan.with_settings(settings), g, _topo(2, **ZERO), timeline=False)
    assert new.iteration_seconds == old.iteration_seconds
    assert new.peak_memory_bytes == old.peak_memory_bytes
    cm = CostModel(g, _topo(2))
    for a, b in zip(cm._work, CostModel(g, _topo(2, **ZERO))._work, strict=True):
        assert np.array_equal(a, b)
    from shardplan.cost import stage_times

    st = stage_times(cm, np.zeros(4, dtype=np.int64), [[0, 1]], num_stages=1)
    assert charge_run_overheads(st, _topo(2), sync, [0, 1], None) is st


def test_op_overhead_is_charged_to_unmeasured_nodes_only() -> None:
    t = _topo(1, op_overhead_seconds=[1e-3, 3e-3])
    g = Graph.from_arrays(name="g", fwd_flops=[1e12, 1e12], src=[0], dst=[1],
                          fwd_seconds=[0.5, float("nan")], bwd_seconds=[0.7, float("nan")])
    fwd, bwd = CostModel(g, t).node_seconds(0)
    # node 0 measured (its time has its dispatch); node 1: 1e12 FLOPs at 1e12/s + overhead
    assert fwd.tolist() == pytest.approx([0.5, 1.0 + 1e-3])
    assert bwd.tolist() == pytest.approx([0.7, 2.0 + 3e-3])
    bare, _ = CostModel(g, _topo(1)).node_seconds(0)
    assert bare.tolist() == pytest.approx([0.5, 1.0])


def test_busy_slowdown_scales_every_compute_of_a_plan_on_that_many_devices() -> None:
    g = _graph(True)  # no parameters: no all-reduce, the iteration is compute alone
    settings = ExecutionSettings(microbatches=3, schedule="gpipe", optimizer="sgd")
    dp = _plan([[0, 1, 2, 3]], [[0, 1]]).with_settings(settings)
    one = _plan([[0, 1, 2, 3]], [[0]]).with_settings(settings)
    base = _topo(2)
    busy = _topo(2, busy_slowdown={"1": 1.0, "2": 1.5})
    # each replica: 4 nodes x (1 + 2) s / 2 per micro-batch, 3 micro-batches, then x 1.5
    assert simulate(dp, g, base).iteration_seconds == pytest.approx(18.0)
    assert simulate(dp, g, busy).iteration_seconds == pytest.approx(27.0)
    # one device alone computes at its own pace
    assert simulate(one, g, busy).iteration_seconds == pytest.approx(
        simulate(one, g, base).iteration_seconds)
    # the optimizer step is computed too: slowed alike
    held = _plan([[0, 1, 2, 3]], [[0, 1]]).with_settings(settings)
    p = _graph(True, params=4_000_000)
    slow, fast = simulate(held, p, busy), simulate(held, p, base)
    assert fast.optimizer_seconds > 0
    assert slow.optimizer_seconds == pytest.approx(1.5 * fast.optimizer_seconds)


def test_fsdp_units_follow_the_runtime_wrapping() -> None:
    mods = ["tok_emb", "blocks.0.ln", "blocks.0.fc", "add", "blocks.1.fc", "ln_f", "head"]
    g = Graph.from_arrays(name="g", fwd_flops=np.ones(7), src=np.arange(6),
                          dst=np.arange(1, 7), param_bytes=[10, 1, 4, 0, 4, 1, 10],
                          modules=mods)
    keys = fsdp_unit_keys(g)
    assert keys == ["", "blocks.0", "blocks.0", "", "blocks.1", "", ""]
    mlp = Graph.from_arrays(name="m", fwd_flops=np.ones(4), src=[0, 1, 2], dst=[1, 2, 3],
                            param_bytes=[8, 0, 8, 8], modules=["fc1", "relu", "fc2", "fc3"])
    assert fsdp_unit_keys(mlp) == ["fc1", "relu", "fc2", "fc3"]
    # several indexed families (ResNet's Sequential layers): the top-level children
    res = Graph.from_arrays(name="r", fwd_flops=np.ones(6), src=np.arange(5),
                            dst=np.arange(1, 6), param_bytes=np.full(6, 8),
                            modules=["conv1", "layer1.0.conv1", "layer1.1.conv1",
                                     "layer2.0.conv1", "layer2.1.conv1", "fc"])
    assert fsdp_unit_keys(res) == ["conv1", "layer1", "layer1", "layer2", "layer2", "fc"]
    # one unit only (or no module names): None, units are cut by size
    assert fsdp_unit_keys(_graph(True, params=4)) is None
    # segments: root (21 bytes) first, ending before blocks.0 starts (1 of 7 s of forward);
    # blocks.0 ends at node 2 (3/7), blocks.1 closes the forward; backward: blocks.1 ends
    # at its node (reverse order: 3 nodes of 7), blocks.0 closes it; the root is kept
    order = np.arange(7)
    f, b = fsdp_unit_chunks(keys, order, np.ones(7), np.ones(7), g.param_bytes)
    assert f == [(21.0, pytest.approx(1 / 7)), (5.0, pytest.approx(3 / 7)), (4.0, 1.0)]
    assert b == [(4.0, pytest.approx(3 / 7)), (5.0, 1.0)]


def _fsdp_extra_seconds(unit_bytes: int, field: str, value: Any,
                        root_bytes: int = 0, base: dict | None = None) -> float:
    """Simulated seconds a measured FSDP field adds to one replicated stage of three FSDP
    units of ``unit_bytes`` parameter bytes each, and a root holding ``root_bytes`` (the
    head's) (GPipe, 2 micro-batches, free links; both devices also noting ``base``)."""
    mods = ["blocks.0.fc", "blocks.1.fc", "blocks.2.fc", "head"]
    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(4), src=[0, 1, 2], dst=[1, 2, 3],
                          fwd_seconds=np.full(4, 1.0), bwd_seconds=np.full(4, 2.0),
                          param_bytes=[unit_bytes] * 3 + [root_bytes], modules=mods)
    settings = ExecutionSettings(microbatches=2, schedule="gpipe", optimizer="sgd",
                                 gradient_sync="sharded")
    plan = _plan([[0, 1, 2, 3]], [[0, 1]]).with_settings(settings)
    free = _topo(2)
    free = dataclasses.replace(free, bandwidth=np.where(free.bandwidth > 0, 1e30, 0.0),
                               latency=np.zeros((2, 2)), devices=tuple(
                                   Device(d.name, d.memory_bytes, d.flops, dict(base or {}))
                                   for d in free.devices))
    costly = Topology(name="t", devices=tuple(
        Device(d.name, d.memory_bytes, d.flops, {**(base or {}), field: value})
        for d in free.devices), bandwidth=free.bandwidth, latency=free.latency)
    return simulate(plan, g, costly).iteration_seconds - simulate(plan, g, free).iteration_seconds


def test_fsdp_gather_overhead_is_charged_per_unit_and_micro_batch() -> None:
    # 3 units: 3 gathers in each forward and 3 in each backward, 2 micro-batches
    assert _fsdp_extra_seconds(4, "fsdp_gather_overhead_seconds", 0.25) == pytest.approx(
        2 * (3 + 3) * 0.25)


def _alexnet_hybrid() -> tuple[Graph, Plan, Plan]:
    """AlexNet in two halves on two devices each, and PaSE's hybrid of that split (on a
    topology without measured fixed costs): ``(graph, pipeline, hybrid)``."""
    from shardplan.generate import generate
    from shardplan.strategy import hybrid_plan

    g = generate("alexnet")
    order = [int(v) for v in g.topological_order]
    half = len(order) // 2
    pipe = Plan(g.name, "", "contiguous", (Stage(tuple(sorted(order[:half])), (0, 1)),
                                            Stage(tuple(sorted(order[half:])), (2, 3))),
                Objective("max_stage_seconds", 1.0))
    return g, pipe, hybrid_plan(pipe, g, _topo(4))


def test_dtensor_overhead_is_charged_per_node_of_strategy_plans_only() -> None:
    from shardplan.simulate._strategy_stages import strategy_stage_seconds

    g, pipe, plan = _alexnet_hybrid()
    base = _topo(4)
    over = _topo(4, dtensor_op_overhead_seconds=[1e-3, 2e-3])
    s = plan.settings.resolve(g)
    f0, b0 = strategy_stage_seconds(plan, g, base, s)
    f1, b1 = strategy_stage_seconds(plan, g, over, s)
    sizes = np.array([len(st.nodes) for st in plan.stages])
    assert (f1 - f0).tolist() == pytest.approx((sizes * 1e-3).tolist())
    assert (b1 - b0).tolist() == pytest.approx((sizes * 2e-3).tolist())
    # a plain pipeline on the same topology pays none of it
    p = dataclasses.replace(pipe, stages=tuple(Stage(st.nodes, st.devices[:1])
                                               for st in pipe.stages))
    assert simulate(p, g, over).iteration_seconds == simulate(p, g, base).iteration_seconds


def test_dtensor_overhead_per_byte_is_charged_on_the_output_part_each_device_holds() -> None:
    """Replicated, every device holds every node's whole output; data-parallel, a quarter
    of every output whose node has a batch dimension (others would stay whole)."""
    from shardplan.simulate._strategy_stages import strategy_stage_seconds
    from shardplan.strategy.data_parallel import data_parallel_split
    from shardplan.strategy.tables import graph_spaces

    g, _, _ = _alexnet_hybrid()
    spaces = graph_spaces(g)
    every = tuple(range(g.num_nodes))

    def one_stage(split) -> Plan:
        strategy = {str(v): tuple(int(x) for x in split(spaces[v])) for v in every}
        return Plan(g.name, "", "test", (Stage(every, (0, 1, 2, 3)),),
                    Objective("max_stage_seconds", 1.0), strategy=strategy)

    rate = [2e-9, 5e-9]
    batch = np.array([spaces[v].batch_dim is not None for v in every])
    for split, parts in ((lambda sp: np.ones(len(sp.dims)), 1),
                         (lambda sp: data_parallel_split(sp, 4), 4)):
        plan = one_stage(split)
        s = plan.settings.resolve(g)
        # the micro-batch's outputs (the graph rescaled to the settings' micro-batch size)
        out = CostModel.from_settings(g, _topo(4), s).graph.output_bytes.astype(float)
        held = out[batch].sum() / parts + out[~batch].sum()
        f0, b0 = strategy_stage_seconds(plan, g, _topo(4), s)
        f1, b1 = strategy_stage_seconds(plan, g, _topo(4, dtensor_op_seconds_per_byte=rate), s)
        # the stage's communication is shared between its passes by their compute: the
        # two passes together grow by the charge
        assert (f1 + b1 - f0 - b0)[0] == pytest.approx(held * sum(rate)), parts
        if parts == 1:  # nothing communicates: each pass grows by its own
            assert (f1 - f0)[0] == pytest.approx(held * rate[0])
            assert (b1 - b0)[0] == pytest.approx(held * rate[1])
    assert batch.any()


def test_strategy_stage_communication_is_every_layer_and_reshard_cost_shared_by_passes() -> None:
    """A strategy stage's forward and backward together grow, from an instant network to a
    real one, by PaSE's layer collectives without the weight gradients' (those are the
    iteration's gradient sync) and re-shards between layers, at the micro-batch's own
    sizes (no scaling), plus its output gathers; the backward takes the share of that
    communication its compute has."""
    from shardplan.simulate._strategy_stages import strategy_stage_seconds
    from shardplan.strategy._cost_pase import Units, layer_cost
    from shardplan.strategy._price import StagePricer
    from shardplan.strategy.data_parallel import data_parallel_split

    g, _, _ = _alexnet_hybrid()
    every = tuple(range(g.num_nodes))
    plan = Plan(g.name, "", "test", (Stage(every, (0, 1, 2, 3)),),
                Objective("max_stage_seconds", 1.0), strategy={})
    s = plan.settings.resolve(g)
    slow = _topo(4)
    pricer = StagePricer(g, slow, range(4), s)
    spaces = pricer.spaces  # at the micro-batch size
    # batch-split and replicated layers in turn: every edge between them re-shards
    strategy = {str(v): tuple(int(x) for x in (data_parallel_split(spaces[v], 4) if v % 2
                                              else np.ones(len(spaces[v].dims))))
                for v in every}
    plan = dataclasses.replace(plan, strategy=strategy)
    fast = dataclasses.replace(slow, bandwidth=np.where(slow.bandwidth > 0, 1e30, 0.0),
                               latency=np.zeros((4, 4)))
    (f0,), (b0,) = strategy_stage_seconds(plan, g, fast, s)
    (f1,), (b1,) = strategy_stage_seconds(plan, g, slow, s)
    units = Units(mac=0.0, word=pricer.comm.units.word, allreduce=pricer.comm.units.allreduce)
    config = {v: np.asarray([strategy[str(v)]]) for v in every}
    layers = sum(float(layer_cost(spaces[v], config[v], units, weight_grads=False)[0])
                 for v in every)
    mb = pricer.graph
    reshards = sum(float(np.asarray(pricer.comm.edge_cost(
        spaces[u], spaces[v], u, config[u], config[v], float(b))).reshape(-1)[0])
        for u, v, b in zip(mb.src.tolist(), mb.dst.tolist(), mb.edge_bytes.tolist(),
                           strict=True))
    comm = layers + reshards
    has_out = np.zeros(g.num_nodes, dtype=bool)
    has_out[g.src] = True
    gathers = sum(float(pricer.gather_seconds(v, config[v], loss=True)[0])
                  for v in every if not has_out[v])
    assert reshards > 0 and comm > 0
    assert f1 + b1 - f0 - b0 == pytest.approx(comm + gathers, rel=1e-6)
    assert b1 - b0 == pytest.approx(comm * b0 / (f0 + b0), rel=1e-6)


def test_dtensor_collective_overhead_is_charged_per_output_gather() -> None:
    """Every all-gather of a strategy stage's split outputs pays the measured per-collective
    overhead once: the forward grows by a whole number of overheads, the same number for
    any overhead, and the stages of AlexNet's hybrid gather something."""
    from shardplan.strategy._price import StagePricer

    g, _, plan = _alexnet_hybrid()
    s = plan.settings.resolve(g)
    stage_of = plan.assignment(g.num_nodes)
    counts = []
    for k, st in enumerate(plan.stages):
        config = {int(v): np.asarray([plan.strategy[str(v)]]) for v in st.nodes}
        leaves = {int(u) for u, v in zip(g.src.tolist(), g.dst.tolist(), strict=True)
                  if stage_of[u] == k and stage_of[v] != k}

        def gathers(topo: Topology, devices: tuple = st.devices, config: dict = config,
                    leaves: set = leaves) -> float:
            pr = StagePricer(g, topo, devices, s)
            return sum(float(pr.gather_seconds(v, config[v])[0]) for v in leaves)

        base = gathers(_topo(4))
        per = [(gathers(_topo(4, dtensor_collective_overhead_seconds=o)) - base) / o
               for o in (1e-3, 2.5e-3)]
        assert per[0] == pytest.approx(round(per[0])) and per[1] == pytest.approx(per[0])
        counts.append(round(per[0]))
    assert max(counts) >= 1


def test_strategy_devices_read_and_accumulate_the_weight_they_hold() -> None:
    """On a strategy stage each device reads, in every forward and backward, the part of a
    node's weight its configuration leaves it (the weight spread over the product of the
    factors of the space's weight dimensions), whatever share of the batch it computes, and
    accumulates that part's gradients over the later micro-batches."""
    from shardplan.simulate._strategy_stages import strategy_stage_seconds
    from shardplan.strategy.tables import graph_spaces

    g, _, plan = _alexnet_hybrid()
    base = _topo(4)
    bw = 1e15  # fast enough that no node's read reaches its time (no cap)
    s = plan.settings.resolve(g)
    f0, b0 = strategy_stage_seconds(plan, g, base, s)
    f1, b1 = strategy_stage_seconds(plan, g, _topo(4, memory_bandwidth=bw), s)
    spaces = graph_spaces(g)
    m = s.microbatches
    want_f, want_b = np.zeros(2), np.zeros(2)
    for i, st in enumerate(plan.stages):
        for v in st.nodes:
            c = list(plan.strategy[str(v)])
            sp = spaces[v]
            held = g.param_bytes[v] / np.prod([c[sp.dims.index(d)] for d in sp.weight])
            rest = 1 - 1 / np.prod(c)
            want_f[i] += held / bw * rest
            want_b[i] += 2 * held / bw * rest + 3 * held * (m - 1) / m / bw
    assert want_b.min() > 0
    # (the stage's communication is split between its forward and backward in proportion
    # to their compute: compare the sums)
    assert ((f1 + b1) - (f0 + b0)).tolist() == pytest.approx((want_f + want_b).tolist(),
                                                             rel=1e-6)


@pytest.mark.parametrize("sync, devices, per_byte", [
    ("end", [0, 1], 3e-9), ("bucketed", [0, 1], 3e-9), ("end", [0], 1e-9),
    ("sharded", [0, 1], 0.0)])
def test_gradient_handling_is_charged_once_per_iteration(sync, devices, per_byte) -> None:
    """The step waits for the gradients' handling: the replicated figure with replicas
    (flattened for the all-reduce or DDP's buckets), the one-replica figure alone; FSDP's
    own buffers are not charged."""
    g = _graph(True, params=1_000_000)  # 4 MB of parameters
    settings = ExecutionSettings(microbatches=2, schedule="gpipe", optimizer="sgd",
                                 gradient_sync=sync)
    plan = _plan([[0, 1, 2, 3]], [devices]).with_settings(settings)
    base = simulate(plan, g, _topo(2)).iteration_seconds
    handled = simulate(plan, g, _topo(2, gradient_seconds_per_byte=[1e-9, 3e-9]))
    assert handled.iteration_seconds - base == pytest.approx(per_byte * 4_000_000)


@pytest.mark.parametrize("sync, devices, charged", [
    ("end", [0], True), ("end", [0, 1], True), ("bucketed", [0, 1], False),
    ("sharded", [0, 1], False)])
def test_pipeline_actions_pay_the_schedule_overhead(sync, devices, charged) -> None:
    """Plans the pipeline runtime runs pay its per-action overhead on every forward and
    backward; DDP and FSDP runs (one stage, replicas) do not."""
    g = _graph(True)
    settings = ExecutionSettings(microbatches=3, schedule="gpipe", optimizer="sgd",
                                 gradient_sync=sync)
    plan = _plan([[0, 1, 2, 3]], [devices]).with_settings(settings)
    base = simulate(plan, g, _topo(2)).iteration_seconds
    slow = simulate(plan, g, _topo(2, pipeline_action_overhead_seconds=0.1)).iteration_seconds
    assert slow - base == pytest.approx(3 * 2 * 0.1 if charged else 0.0)
    two = _plan([[0, 1], [2, 3]], [[0], [1]]).with_settings(settings)
    # a 2-stage GPipe of 3 micro-batches: (3 + 1) forwards and (3 + 1) backwards in a row
    d = simulate(two, g, _topo(2, pipeline_action_overhead_seconds=0.1)).iteration_seconds \
        - simulate(two, g, _topo(2)).iteration_seconds
    assert d == pytest.approx(8 * 0.1)


def test_dispatch_does_not_shrink_when_replicas_split_the_micro_batch() -> None:
    """Two replicas each run half the samples through every operator: the measured part of
    a node's time up to the per-operator overhead is paid in full by both."""
    from shardplan.cost import stage_times

    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(3), src=[0, 1], dst=[1, 2],
                          fwd_seconds=[1.0, 0.05, 1.0], bwd_seconds=[2.0, 0.05, 2.0])
    t = _topo(2, op_overhead_seconds=[0.1, 0.2])
    st = stage_times(CostModel(g, t), np.zeros(3, dtype=np.int64), [[0, 1]], num_stages=1)
    # forward: 2.05 / 2 + (0.1 + 0.05 + 0.1) / 2; backward: 4.05 / 2 + (0.2 + 0.05 + 0.2) / 2
    assert st.forward[0].tolist() == pytest.approx([1.025 + 0.125] * 2)
    assert st.backward[0].tolist() == pytest.approx([2.025 + 0.225] * 2)
    one = stage_times(CostModel(g, t), np.zeros(3, dtype=np.int64), [[0]], num_stages=1)
    assert one.forward[0, 0] == pytest.approx(2.05) and one.backward[0, 0] == pytest.approx(4.05)


@pytest.mark.parametrize("recompute", [False, True])
def test_weight_reads_do_not_shrink_when_replicas_split_the_micro_batch(recompute) -> None:
    """A replica's share of the batch still reads every weight: per node, its parameter
    bytes at the memory bandwidth in the forward and twice that in the backward, with the
    per-operator overhead, at most the node's time, are paid in full by every replica."""
    from shardplan.cost import stage_times

    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(3), src=[0, 1], dst=[1, 2],
                          fwd_seconds=[1.0, 0.05, 1.0], bwd_seconds=[2.0, 0.05, 2.0],
                          param_bytes=[300, 0, 5000])
    t = _topo(2, op_overhead_seconds=[0.1, 0.2], memory_bandwidth=1000.0)
    cm = CostModel(g, t, recompute=recompute)
    ff, fb = cm.replica_fixed
    # node 0: 0.1 + 0.3 forward, 0.2 + 0.6 backward; node 1 capped at its 0.05; node 2:
    # 5 s of reads capped at its 1 and 2 s
    assert ff.tolist() == pytest.approx([0.4, 0.05, 1.0])
    assert fb.tolist() == pytest.approx([0.8, 0.05, 2.0])
    assert cm.replica_fixed_total().tolist() == pytest.approx(
        (ff * (2 if recompute else 1) + fb).tolist())
    st = stage_times(cm, np.zeros(3, dtype=np.int64), [[0, 1]], num_stages=1)
    fwd = 2.05 / 2 + 1.45 / 2
    # and each replica accumulates all its gradients: 7 of the default 8 micro-batches'
    # backwards read two copies of 5,300 bytes and write one
    accumulate = 3 * 5300 * 7 / 8 / 1000.0
    assert cm.accumulation_seconds.sum() == pytest.approx(accumulate)
    bwd = 4.05 / 2 + 2.85 / 2 + accumulate + (fwd if recompute else 0.0)
    assert st.forward[0].tolist() == pytest.approx([fwd] * 2)
    assert st.backward[0].tolist() == pytest.approx([bwd] * 2)
    # without a bandwidth, the overhead alone; with neither, nothing is fixed
    none = CostModel(g, _topo(2, op_overhead_seconds=[0.1, 0.2]), recompute=recompute)
    assert none.replica_fixed[0].tolist() == pytest.approx([0.1, 0.05, 0.1])
    assert not CostModel(g, _topo(2)).replica_fixed[1].any()


@pytest.mark.parametrize("micro", [1, 4])
def test_gradient_accumulation_is_charged_to_every_backward_and_replica(micro) -> None:
    """Every backward of an iteration but the first adds its gradients into the earlier
    ones (3 P bytes at the memory bandwidth); replicas each accumulate all of theirs, and
    the simulated iteration pays it once per later micro-batch."""
    from shardplan.cost import stage_times

    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(2), src=[0], dst=[1],
                          fwd_seconds=[1.0, 1.0], bwd_seconds=[2.0, 2.0],
                          param_bytes=[400, 200])
    t = _topo(2, memory_bandwidth=1000.0)
    settings = ExecutionSettings(microbatches=micro, optimizer="sgd")
    cm = CostModel.from_settings(g, t, settings)
    per_mb = 3 * 600 * (micro - 1) / micro / 1000.0
    assert cm.accumulation_seconds.sum() == pytest.approx(per_mb)
    one = stage_times(cm, np.zeros(2, dtype=np.int64), [[0]], num_stages=1)
    assert one.backward[0, 0] == pytest.approx(4.0 + per_mb)
    two = stage_times(cm, np.zeros(2, dtype=np.int64), [[0, 1]], num_stages=1)
    read = 2 * 600 / 1000.0  # the backward's weight reads, not shrinking either
    assert two.backward[0].tolist() == pytest.approx([2.0 + read / 2 + per_mb] * 2)
    sim = simulate(_plan([[0, 1]], [[0]]), g, t, schedule="gpipe", num_microbatches=micro,
                   optimizer="sgd")
    free = simulate(_plan([[0, 1]], [[0]]), g, _topo(2), schedule="gpipe",
                    num_microbatches=micro, optimizer="sgd")
    assert sim.iteration_seconds - free.iteration_seconds == pytest.approx(
        micro * per_mb + sim.optimizer_seconds - free.optimizer_seconds)


def test_unshared_seconds_on_a_subset_of_devices() -> None:
    """Given the devices that run the nodes, the rule reads their per-operator overhead and
    slowest memory, and the nodes' time on the first of them; without, every device's and
    the fastest device's time. A weight split over q devices is read q times faster."""
    g = Graph.from_arrays(name="g", fwd_flops=np.array([4e9, 4e9]), src=[0], dst=[1],
                          param_bytes=[600, 0])
    slow = Device("s", 1e12, 1e12, {"op_overhead_seconds": [3e-4, 4e-4],
                                    "memory_bandwidth": 2e6})
    fast = Device("f", 1e12, 4e12, {"op_overhead_seconds": [1e-4, 2e-4],
                                    "memory_bandwidth": 1e6})
    slow2 = Device("s2", 1e12, 1e12, {"op_overhead_seconds": [5e-4, 6e-4],
                                      "memory_bandwidth": 2e6})
    bw = np.full((3, 3), 1e9)
    np.fill_diagonal(bw, 0)
    t = Topology(name="t", devices=(slow, fast, slow2), bandwidth=bw,
                 latency=np.zeros((3, 3)))
    cm = CostModel(g, t)
    # every device: median overhead 3e-4 / 4e-4, slowest memory 1e6 (600 bytes: 6e-4 s)
    f, b = cm.unshared_seconds()
    assert f.tolist() == pytest.approx([3e-4 + 6e-4, 3e-4])
    assert b.tolist() == pytest.approx([4e-4 + 12e-4, 4e-4])
    # the slow devices alone: their median overhead 4e-4 / 5e-4, their memory (3e-4 s)
    f, b = cm.unshared_seconds(devices=[0, 2])
    assert f.tolist() == pytest.approx([4e-4 + 3e-4, 4e-4])
    assert b.tolist() == pytest.approx([5e-4 + 6e-4, 5e-4])
    f, _ = cm.unshared_seconds(weight_split=np.array([3.0, 1.0]), devices=[0])
    assert f.tolist() == pytest.approx([3e-4 + 1e-4, 3e-4])
    # 6 ms of reads are capped by the node's time: on the fastest device by default, else on
    # the first given one (1 ms or 4 ms of FLOPs, with the 0.3 ms dispatch a FLOP-priced
    # node carries)
    big = CostModel(g.replace(param_bytes=np.array([6e3, 0])), t)
    assert big.unshared_seconds()[0][0] == pytest.approx(1.3e-3)
    assert big.unshared_seconds(devices=[1, 0])[0][0] == pytest.approx(1.3e-3)
    assert big.unshared_seconds(devices=[0, 1])[0][0] == pytest.approx(4.3e-3)


def test_measured_optimizer_step_replaces_the_roofline() -> None:
    """A device's measured seconds per parameter byte of the settings' optimizer price its
    step (the measurement's busy slowdown divided out); another optimizer, or a device
    without the field, keeps the roofline."""
    from shardplan.cost import stage_times
    from shardplan.cost._formulas import optimizer_seconds

    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(2), src=[0], dst=[1],
                          fwd_seconds=[1.0, 1.0], bwd_seconds=[2.0, 2.0],
                          param_bytes=[4000, 2000])
    a = np.array([0, 1])
    measured = {"optimizer_seconds_per_byte": {"adam": 1e-6, "sgd": 2e-7},
                "busy_slowdown": {"1": 1.0, "2": 2.0}}
    t = _topo(2, memory_bandwidth=1e6, **measured)
    adam = stage_times(CostModel(g, t, optimizer="adam"), a, [[0], [1]], num_stages=2)
    assert adam.optimizer[:, 0].tolist() == pytest.approx([4000 * 1e-6 / 2, 2000 * 1e-6 / 2])
    sgd = stage_times(CostModel(g, t, optimizer="sgd"), a, [[0], [1]], num_stages=2)
    assert sgd.optimizer[:, 0].tolist() == pytest.approx([4000 * 2e-7 / 2, 2000 * 2e-7 / 2])
    roof = stage_times(CostModel(g, t, optimizer="adamw"), a, [[0], [1]], num_stages=2)
    want = optimizer_seconds(np.array([4000.0, 2000.0]), "adamw", 1e12, 1e6)
    assert roof.optimizer[:, 0].tolist() == pytest.approx(want.tolist())
    # a device without the measurement keeps the roofline; FSDP steps each replica's shard
    half = dataclasses.replace(t, devices=(t.devices[0], dataclasses.replace(
        t.devices[1], extra={"memory_bandwidth": 1e6})))
    mixed = stage_times(CostModel(g, half, optimizer="adam"), a, [[0], [1]], num_stages=2)
    assert mixed.optimizer[:, 0].tolist() == pytest.approx(
        [4000 * 1e-6 / 2, float(optimizer_seconds(2000.0, "adam", 1e12, 1e6))])
    # an unreadable entry is not a measurement: the roofline
    bad = _topo(2, memory_bandwidth=1e6, optimizer_seconds_per_byte={"adam": "fast"})
    kept = stage_times(CostModel(g, bad, optimizer="adam"), a, [[0], [1]], num_stages=2)
    assert kept.optimizer[:, 0].tolist() == pytest.approx(
        optimizer_seconds(np.array([4000.0, 2000.0]), "adam", 1e12, 1e6).tolist())
    sharded = CostModel.from_settings(g, t, ExecutionSettings(gradient_sync="sharded",
                                                              optimizer="adam"))
    both = stage_times(sharded, np.zeros(2, dtype=np.int64), [[0, 1]], num_stages=1)
    assert both.optimizer[0].tolist() == pytest.approx([6000 / 2 * 1e-6 / 2] * 2)


def test_measured_optimizer_step_charges_every_tensor() -> None:
    """Beside the bytes, every parameter tensor of a stage costs the measured seconds per
    tensor (busy slowdown divided out), each replica stepping all of its stage's tensors
    (FSDP: a shard of each); nodes without a captured count hold one tensor if they hold
    parameters; without a byte rate, the roofline alone (the tensor rate is not charged)."""
    from shardplan.cost import stage_times
    from shardplan.cost._formulas import optimizer_seconds

    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(3), src=[0, 1], dst=[1, 2],
                          fwd_seconds=[1.0] * 3, bwd_seconds=[2.0] * 3,
                          param_bytes=[4000, 2000, 1000])
    g = g.replace(param_tensors=np.array([2.0, 5.0, np.nan]))
    a = np.array([0, 0, 1])
    measured = {"optimizer_seconds_per_byte": {"adam": 1e-6},
                "optimizer_seconds_per_tensor": {"adam": 1e-3, "sgd": 7.0},
                "busy_slowdown": {"1": 1.0, "2": 2.0}}
    t = _topo(2, memory_bandwidth=1e6, **measured)
    st = stage_times(CostModel(g, t, optimizer="adam"), a, [[0], [1]], num_stages=2)
    assert st.optimizer[:, 0].tolist() == pytest.approx(
        [(6000 * 1e-6 + 7 * 1e-3) / 2, (1000 * 1e-6 + 1 * 1e-3) / 2])
    sharded = CostModel.from_settings(g, t, ExecutionSettings(gradient_sync="sharded",
                                                              optimizer="adam"))
    both = stage_times(sharded, np.zeros(3, dtype=np.int64), [[0, 1]], num_stages=1)
    assert both.optimizer[0].tolist() == pytest.approx([(7000 / 2 * 1e-6 + 8e-3) / 2] * 2)
    sgd = stage_times(CostModel(g, t, optimizer="sgd"), a, [[0], [1]], num_stages=2)
    assert sgd.optimizer[:, 0].tolist() == pytest.approx(
        optimizer_seconds(np.array([6000.0, 1000.0]), "sgd", 1e12, 1e6).tolist())
    bad = _topo(2, memory_bandwidth=1e6, optimizer_seconds_per_byte={"adam": 1e-6},
                optimizer_seconds_per_tensor={"adam": [1]})
    kept = stage_times(CostModel(g, bad, optimizer="adam"), a, [[0], [1]], num_stages=2)
    assert kept.optimizer[:, 0].tolist() == pytest.approx([6000 * 1e-6, 1000 * 1e-6])
    from shardplan.cost._overheads import optimizer_seconds_per_tensor

    assert optimizer_seconds_per_tensor(None, "adam").shape == (0,)


def test_comm_cpu_share_reads_each_device() -> None:
    """Per device, absent, negative or unreadable entries read as 0; no busy slowdown is
    divided out (a ratio of two times under one load)."""
    from shardplan.cost._overheads import comm_cpu_share

    t = _topo(4, busy_slowdown={"1": 1.0, "4": 3.0})
    shares = [0.7, -1.0, "x", None]
    t = dataclasses.replace(t, devices=tuple(
        dataclasses.replace(d, extra={**d.extra, "comm_cpu_share": v})
        for d, v in zip(t.devices, shares, strict=True)))
    assert comm_cpu_share(t).tolist() == [0.7, 0.0, 0.0, 0.0]
    assert comm_cpu_share(_topo(2)).tolist() == [0.0, 0.0]
    assert comm_cpu_share(None).size == 0


def test_slowest_memory_reads_the_weights() -> None:
    """Devices of different memory bandwidths: the slowest one's reads are charged."""
    g = Graph.from_arrays(name="g", fwd_flops=np.zeros(2), src=[0], dst=[1],
                          fwd_seconds=[1.0, 1.0], bwd_seconds=[2.0, 2.0],
                          param_bytes=[100, 0])
    t = _topo(2, memory_bandwidth=1000.0)
    t = dataclasses.replace(t, devices=(t.devices[0], dataclasses.replace(
        t.devices[1], extra={"memory_bandwidth": 500.0})))
    assert CostModel(g, t).replica_fixed[0].tolist() == pytest.approx([0.2, 0.0])


def test_dtensor_step_overhead_is_charged_per_layer_where_parameters_are_dtensors() -> None:
    """Strategies, hybrids and FSDP keep their parameters as DTensors: their optimizer step
    pays the measured per-layer overhead for every node holding parameters; DDP, plain
    pipelines and topologies without the field pay nothing (as before)."""
    g = _graph(True, params=4)  # 4 nodes holding parameters
    layers = int(np.count_nonzero(g.param_bytes))
    free, costly = _topo(2), _topo(2, dtensor_step_overhead_seconds=0.5)

    def diff(plan: Plan, sync: str) -> float:
        s = ExecutionSettings(microbatches=2, optimizer="sgd", gradient_sync=sync)
        return (simulate(plan.with_settings(s), g, costly).iteration_seconds
                - simulate(plan.with_settings(s), g, free).iteration_seconds)

    dp = _plan([[0, 1, 2, 3]], [[0, 1]])
    assert diff(dp, "sharded") == pytest.approx(0.5 * layers)  # FSDP
    assert diff(dp, "bucketed") == 0.0 and diff(dp, "end") == 0.0  # DDP, flat all-reduce
    pipe = _plan([[0, 1], [2, 3]], [[0], [1]])
    assert diff(pipe, "end") == 0.0
    pase = Plan("g", "t", "pase", (Stage((0, 1, 2, 3), (0, 1)),), Objective("x", 0.0),
                strategy={str(v): [2] for v in range(4)})
    assert diff(pase, "end") == pytest.approx(0.5 * layers)  # a strategy: DTensors


def test_fixed_costs_measured_under_load_are_not_slowed_twice() -> None:
    """``topology measure`` times the fixed costs with all its ranks busy, so they already
    hold that busy slowdown; the simulator multiplies a plan's compute by the slowdown of
    its devices, so the readers divide the measured one out: a plan on all the measured
    ranks is charged each overhead as measured (the old readers charged it 2x here)."""
    g = _graph(True)
    slow = {"busy_slowdown": {"1": 1.0, "2": 2.0}}
    plain, costly = _topo(2, **slow), _topo(2, pipeline_action_overhead_seconds=0.1, **slow)
    assert pipeline_action_overhead(costly, [0, 1]) == pytest.approx(0.05)  # alone
    s = ExecutionSettings(microbatches=2, optimizer="sgd", gradient_sync="end")
    dp = _plan([[0, 1, 2, 3]], [[0, 1]]).with_settings(s)  # run by the pipeline runtime
    diff = simulate(dp, g, costly).iteration_seconds - simulate(dp, g, plain).iteration_seconds
    assert diff == pytest.approx(2 * 2 * 0.1)  # 2 micro-batches x (F + B), as measured
    assert op_overhead(_topo(2, op_overhead_seconds=[4e-6, 8e-6], **slow)) == \
        pytest.approx((2e-6, 4e-6))


def test_host_collectives_reads_cpu_devices() -> None:
    """A device noted as a CPU (``device``, as ``topology measure`` writes it, or ``type``;
    any case) runs its collectives on the cores that compute; a GPU's name or type, a
    device without either, and no topology do not."""
    from shardplan.cost._overheads import host_collectives

    extras = [{"device": "cpu"}, {"type": "CPU"}, {"device": "CPU", "type": "v100"},
              {"device": "NVIDIA A100"}, {"type": "a100"}, {}]
    devs = tuple(Device(f"d{i}", 1e9, 1e12, x) for i, x in enumerate(extras))
    n = len(devs)
    topo = Topology(name="t", devices=devs, bandwidth=np.ones((n, n)) - np.eye(n),
                    latency=np.zeros((n, n)))
    got = host_collectives(topo)
    assert got.dtype == bool and got.tolist() == [True, True, True, False, False, False]
    assert host_collectives(None).shape == (0,) and host_collectives(None).dtype == bool


def test_fsdp_reduce_overhead_is_charged_once_per_unit_and_iteration() -> None:
    """The runtime reduces gradients in the last micro-batch only: 3 units, once each,
    fixed and per byte of the unit (40 bytes), whatever the micro-batch count."""
    assert _fsdp_extra_seconds(40, "fsdp_reduce_overhead_seconds", 0.25) == pytest.approx(
        3 * 0.25)
    assert _fsdp_extra_seconds(40, "fsdp_reduce_seconds_per_byte", 0.01) == pytest.approx(
        3 * 40 * 0.01)
    # a root holding parameters (30 bytes): gathered in the forward only (FSDP2 keeps it
    # for the backward), its gradients reduced once too, when the backward ends
    assert _fsdp_extra_seconds(40, "fsdp_reduce_overhead_seconds", 0.25, 30) == \
        pytest.approx(4 * 0.25)
    assert _fsdp_extra_seconds(40, "fsdp_reduce_seconds_per_byte", 0.01, 30) == \
        pytest.approx((3 * 40 + 30) * 0.01)
    assert _fsdp_extra_seconds(40, "fsdp_gather_overhead_seconds", 0.25, 30) == \
        pytest.approx(2 * (4 + 3) * 0.25)


def test_fsdp_gather_per_byte_cost_is_charged_per_unit_bytes() -> None:
    """The copies around an FSDP unit's all-gather grow with its parameters: the measured
    per-byte cost is charged per unit gathered, by the unit's bytes."""
    # 3 units of 40 bytes, gathered in each forward and each backward, 2 micro-batches
    assert _fsdp_extra_seconds(40, "fsdp_gather_seconds_per_byte", 0.01) == pytest.approx(
        2 * 2 * 3 * 40 * 0.01)


def test_host_sync_wait_interpolates_the_slowest_devices_points() -> None:
    """Linear from (0, 0) through the measured points (in any order; a negative extra read
    as 0), flat beyond the last; the slowest of the devices; divided by the busy slowdown
    the points were measured under; 0 without points or a topology."""
    from shardplan.cost._overheads import host_sync_wait

    pts = {"host_sync_seconds": [[3.0, 1.0], [1.0, 0.5]]}
    topo = _topo(2, **pts)
    assert host_sync_wait(topo, [0], [0.0, 0.5, 2.0, 9.0]).tolist() == \
        pytest.approx([0.0, 0.25, 0.75, 1.0])
    mixed = dataclasses.replace(topo, devices=(
        topo.devices[0], Device("d1", 1e12, 1e12, {"host_sync_seconds": [[1.0, 2.0]]})))
    assert host_sync_wait(mixed, [0, 1], [0.5, 4.0]).tolist() == pytest.approx([1.0, 2.0])
    assert host_sync_wait(mixed, [0], [4.0]).tolist() == pytest.approx([1.0])
    unmeasured_first = dataclasses.replace(topo, devices=(_topo(1).devices[0],
                                                          topo.devices[1]))
    assert host_sync_wait(unmeasured_first, [0, 1], [9.0]).tolist() == pytest.approx([1.0])
    clipped = _topo(1, host_sync_seconds=[[1.0, -0.5]])
    assert host_sync_wait(clipped, [0], [2.0]).tolist() == [0.0]
    slow = _topo(2, busy_slowdown={"1": 1.0, "2": 2.0}, **pts)
    assert host_sync_wait(slow, [0], [9.0]).tolist() == pytest.approx([0.5])
    assert host_sync_wait(_topo(2), [0, 1], [1.0]).tolist() == [0.0]
    assert host_sync_wait(None, [0], [1.0]).tolist() == [0.0]


def test_fsdp_on_cpu_ranks_pays_the_host_sync_wait_by_each_units_length() -> None:
    """Each FSDP unit's computing on a CPU ends in a collective waited for: it pays
    ``host_sync_seconds`` at its own length. Each replica computes half the micro-batch:
    three units of 0.5 s forward (the last with the head's: 1 s) and 1 s backward (the
    first with the head's: 2 s). Points (1 s, 0.5 s) and (3 s, 1 s): per micro-batch
    0.25 + 0.25 + 0.5 forward and 0.75 + 0.5 + 0.5 backward, 2 micro-batches. Under a
    busy slowdown of 2 (the one measured, the plan's own) the lengths double and the
    extras are as measured."""
    pts = [[1.0, 0.5], [3.0, 1.0]]
    cpu = {"device": "cpu"}
    assert _fsdp_extra_seconds(4, "host_sync_seconds", pts, base=cpu) == pytest.approx(
        2 * (1.0 + 1.75))
    busy = {**cpu, "busy_slowdown": {"1": 1.0, "2": 2.0}}
    assert _fsdp_extra_seconds(4, "host_sync_seconds", pts, base=busy) == pytest.approx(
        2 * ((0.5 + 0.5 + 0.75) + (1.0 + 0.75 + 0.75)))
    assert _fsdp_extra_seconds(4, "host_sync_seconds", pts) == 0.0  # not a CPU
