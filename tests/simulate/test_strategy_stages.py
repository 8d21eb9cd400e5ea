"""Strategy stages (PaSE / DTensor plans): what the runtime's program pays beyond its
layers' own costs."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.ir import Device, ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.simulate import simulate


def _graph() -> Graph:
    g = Graph.from_arrays(name="g", batch_size=4, fwd_flops=[1e9, 2e9, 3e9], src=[0, 1],
                          dst=[1, 2], output_bytes=[1000, 1000, 4000])
    last = {"kind": "elementwise", "dims": [["b", 4], ["n", 250]], "output": [["b"], ["n"]],
            "output_shape": [4, 250], "inputs": {"1": [["b"], []]}}
    return g.replace(spaces=(None, None, last))


def _topo(gather_seconds: float | None) -> Topology:
    devs = tuple(Device(f"d{i}", 1e9, 1e12) for i in range(2))
    bw = np.array([[0.0, 1e9], [1e9, 0.0]])
    meta = {}
    if gather_seconds is not None:
        meta = {"collectives": {"allgather": {"2": [[1.0, gather_seconds],
                                                     [1e9, gather_seconds]]}}}
    return Topology(name="t", devices=devs, bandwidth=bw, latency=np.zeros((2, 2)), meta=meta)


def _seconds(last: list[int], gather: float | None) -> float:
    settings = ExecutionSettings(microbatches=3, optimizer="sgd", efficiency=1.0)
    plan = Plan("g", "t", "pase", (Stage((0, 1, 2), (0, 1)),), Objective("x", 0.0),
                strategy={"0": [2], "1": [2], "2": last})
    return simulate(plan.with_settings(settings), _graph(), _topo(gather)).iteration_seconds


def test_a_split_model_output_is_gathered_whole_every_microbatch() -> None:
    """The program returns whole outputs unless they are split by their batch alone (each
    device then computes the loss of its part, as data parallelism does): a model output
    split over the stage's 2 devices on another dimension costs one all-gather per
    micro-batch, by the measured curve; split by its batch, or not split, nothing."""
    slow, fast = _seconds([1, 2], 0.010), _seconds([1, 2], 0.004)
    assert slow - fast == pytest.approx(3 * 0.006)
    for last in ([2, 1], [1, 1]):  # the batch alone, and not split
        assert _seconds(last, 0.010) == pytest.approx(_seconds(last, 0.004))




def _chain(n: int = 4, rows: int = 4, cols: int = 250) -> Graph:
    """``n`` elementwise nodes in a chain, each output ``rows x cols`` float32."""
    g = Graph.from_arrays(name="chain", batch_size=rows, fwd_flops=[1e6] * n,
                          src=list(range(n - 1)), dst=list(range(1, n)),
                          output_bytes=[4 * rows * cols] * n)
    spaces = []
    for v in range(n):
        sp = {"kind": "elementwise", "dims": [["b", rows], ["n", cols]],
              "output": [["b"], ["n"]], "output_shape": [rows, cols], "inputs": {}}
        if v:
            sp["inputs"] = {str(v - 1): [["b"], ["n"]]}
        spaces.append(sp)
    return g.replace(spaces=tuple(spaces))


def _four(between: float) -> Topology:
    """Devices 0, 1 and 2, 3 joined at 1e12 B/s; ``between`` B/s from one pair to the other."""
    devs = tuple(Device(f"d{i}", 1e12, 1e12) for i in range(4))
    bw = np.full((4, 4), between)
    for a, b in ((0, 1), (2, 3)):
        bw[a, b] = bw[b, a] = 1e12
    np.fill_diagonal(bw, 0.0)
    return Topology(name="four", devices=devs, bandwidth=bw, latency=np.zeros((4, 4)))


def _two_stages(first: list[int], second: list[int]) -> Plan:
    stages = (Stage((0, 1), (0, 1)), Stage((2, 3), (2, 3)))
    strategy = {"0": first, "1": first, "2": second, "3": second}
    settings = ExecutionSettings(microbatches=1, optimizer="sgd", efficiency=1.0,
                                 schedule="gpipe")
    return Plan("chain", "four", "hybrid", stages, Objective("x", 0.0),
                strategy=strategy).with_settings(settings)


def test_a_batch_split_boundary_is_sent_as_shards_device_to_device() -> None:
    """Two stages of two devices, every layer split by the batch two ways: the tensor
    crossing the boundary travels as R = 2 batch shards, device i of the first stage to
    device i of the second (half the bytes each, as a replicated pipeline's replicas send),
    not gathered and sent whole. Measured by the inter-stage link: slowing it costs the
    forward shard and its gradient, once each per micro-batch. A layout split on another
    dimension leaves whole (gathered, and every device sends all of it)."""
    from shardplan.simulate._strategy_stages import _strategy_engine_inputs, per_device_traffic

    g = _chain()
    nbytes = float(g.output_bytes[1])
    split = _two_stages([2, 1], [2, 1])
    ins = _strategy_engine_inputs(split, g, _four(1e12), split.settings.resolve(g))
    # node 1 crosses in 2 shards; node 3, the model's output, stays in 2 for the loss
    assert ins["shards"].tolist() == [1, 2, 1, 2]
    reps = np.array([2, 2])
    per_pair = per_device_traffic(g, np.array([0, 0, 1, 1]), 2, reps, ins["shards"]) / reps
    assert per_pair[0, 1] == pytest.approx(nbytes / 2)

    def slowdown(plan: Plan) -> float:
        fast = simulate(plan, g, _four(1e12)).iteration_seconds
        return simulate(plan, g, _four(1e6)).iteration_seconds - fast

    link = 1e-6 - 1e-12  # seconds per byte the slow link adds
    assert slowdown(split) == pytest.approx(2 * (nbytes / 2) * link, rel=1e-3)
    whole = _two_stages([1, 2], [1, 2])  # split on its features: leaves whole
    ins = _strategy_engine_inputs(whole, g, _four(1e12), whole.settings.resolve(g))
    assert ins["shards"].tolist() == [1, 1, 1, 1]  # and so does the model's output
    assert slowdown(whole) == pytest.approx(2 * nbytes * link, rel=1e-3)


def test_a_batch_shard_is_re_sharded_where_the_next_stage_wants_another_layout() -> None:
    """The shards arrive in the producer's layout: a consumer that splits the features
    instead pays the re-shard in its stage (PaSE's edge price), and none where the layouts
    agree; the producing stage gathers nothing either way, and the last gathers the model's
    output only where it is not split by the batch alone."""
    from shardplan.strategy._price import StagePricer, stage_prices

    g = _chain()
    same, other = _two_stages([2, 1], [2, 1]), _two_stages([2, 1], [1, 2])
    topo = _four(1e9)
    s = same.settings.resolve(g)
    p_same, p_other = stage_prices(same, g, topo, s), stage_prices(other, g, topo, s)
    assert p_same[0]["forward"] == pytest.approx(p_other[0]["forward"])  # no gather
    pr = StagePricer(g, topo, (2, 3), s)
    reshard = float(np.asarray(pr.edge(1, 2, np.array([[2, 1]]), np.array([[1, 2]]),
                                       float(pr.graph.edge_bytes[1]))).reshape(-1)[0])
    assert reshard > 0
    own = sum(float(pr.node(v, np.array([c])).forward[0] + pr.node(v, np.array([c]))
                    .backward[0]) for v in (2, 3) for c in ([1, 2],)) \
        - sum(float(pr.node(v, np.array([c])).forward[0] + pr.node(v, np.array([c]))
                    .backward[0]) for v in (2, 3) for c in ([2, 1],))
    got = (p_other[1]["forward"] + p_other[1]["backward"]) \
        - (p_same[1]["forward"] + p_same[1]["backward"])
    # the model's output (node 3): split by the batch, each device's loss reads its shard;
    # split on its features, it is gathered whole for the loss
    gather = float(pr.gather_seconds(3, np.array([[1, 2]]))[0])
    assert gather > 0
    assert got == pytest.approx(own + reshard + gather, rel=1e-9)


def test_an_all_batch_hybrid_simulates_like_the_same_stages_replicated() -> None:
    """Every layer of every stage split by the batch over the stage's R devices is the
    replicated pipeline: its boundaries travel as the replicas' batch shards, device to
    device, so it simulates within 2% of the same stages run as R replicas (issue 33: the
    hybrid at S x R no slower than the same stages replicated)."""
    from shardplan.generate import generate
    from shardplan.runtime import contiguous_plan
    from shardplan.strategy import hybrid_plan
    from shardplan.topology import build

    g = generate("transformer")  # whole boundaries made this 11% slower
    topo = build("flat", num_devices=4)
    settings = ExecutionSettings(microbatches=4, schedule="1f1b")
    pipe = contiguous_plan(g, 2, 2).with_settings(settings)
    every = hybrid_plan(pipe, g, topo, algorithm="data-parallel",
                        options={"cost_model": "default", "cutoff": 1,
                                 "execution": settings.to_dict()})
    replicated = simulate(pipe, g, topo).iteration_seconds
    assert simulate(every, g, topo).iteration_seconds == pytest.approx(replicated, rel=0.02)
