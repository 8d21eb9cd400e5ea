"""The cost model on tiny graphs whose numbers are worked out by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardplan.cost import (
    CostModel,
    allreduce_seconds,
    in_flight_microbatches,
    lower_bound_seconds,
    node_seconds,
    partition_compute_seconds,
    partition_memory_breakdown,
    partition_memory_bytes,
    plan_arrays,
    stage_compute_seconds,
    stage_memory_bytes,
    stage_traffic,
    stage_transfer_seconds,
    transfer_seconds,
    transfer_seconds_matrix,
    transfer_seconds_pairs,
)
from shardplan.errors import ShardplanError
from shardplan.ir import Device, Graph, Objective, Plan, Stage, Topology

INF = math.inf


@pytest.fixture
def topo() -> Topology:
    """3 devices of 1, 2, 4 FLOP/s; asymmetric links; 0 -> 2 has no route."""
    bw = [[0, 10, 0], [5, 0, 20], [1, 40, 0]]
    lat = [[0, 0.5, 0.5], [0.5, 0, 0.25], [0.5, 0.5, 0]]
    devs = tuple(Device(f"d{i}", mem, fl) for i, (mem, fl) in enumerate(
        [(200.0, 1.0), (150.0, 2.0), (1000.0, 4.0)]))
    return Topology(name="t3", devices=devs, bandwidth=bw, latency=lat)


def test_node_seconds_flops_and_measured(diamond: Graph) -> None:
    fwd, bwd = node_seconds(diamond, 2.0, 0.5)  # effective 1 FLOP/s
    assert fwd.tolist() == [1, 2, 3, 4] and bwd.tolist() == [2, 4, 6, 8]
    _, bwd_rc = node_seconds(diamond, 2.0, 0.5, recompute=True)
    assert bwd_rc.tolist() == [3, 6, 9, 12]
    g = diamond.replace(fwd_seconds=np.array([np.nan, 0.1, np.nan, np.nan]),
                        bwd_seconds=np.array([np.nan, 0.3, 0.7, np.nan]))
    fwd, bwd = node_seconds(g, 1.0)
    assert fwd.tolist() == [1, 0.1, 3, 4] and bwd.tolist() == [2, 0.3, 0.7, 8]
    fwd, _ = node_seconds(g, 1.0, speed=2.0)  # measured seconds only are rescaled
    assert fwd.tolist() == [1, 0.05, 3, 4]
    with pytest.raises(ShardplanError, match="efficiency"):
        node_seconds(diamond, 1.0, 1.5)
    with pytest.raises(ShardplanError, match="flops_per_second"):
        node_seconds(diamond, 0.0)


def test_stage_and_partition_compute(diamond: Graph) -> None:
    assert stage_compute_seconds(diamond, [1, 2, 2], 1.0) == (5.0, 10.0)
    # assignment [0,1,1,2] on devices of 1, 2, 4 FLOP/s at efficiency 0.5: stage FLOPs
    # forward 1, 5, 4 at 0.5, 1, 2 FLOP/s
    fwd, bwd = partition_compute_seconds(diamond, [0, 1, 1, 2], [1.0, 2.0, 4.0], 0.5)
    assert fwd.tolist() == [2, 5, 2] and bwd.tolist() == [4, 10, 4]
    fwd, bwd = partition_compute_seconds(diamond, [0, 0, 0, 0], 1.0, num_stages=3,
                                         recompute=True)
    assert fwd.tolist() == [10, 0, 0] and bwd.tolist() == [30, 0, 0]
    with pytest.raises(ShardplanError, match="one stage id per node"):
        partition_compute_seconds(diamond, [0, 1], 1.0)
    with pytest.raises(ShardplanError, match=r"\[0, 2\)"):
        partition_compute_seconds(diamond, [0, 1, 2, 0], 1.0, num_stages=2)
    with pytest.raises(ShardplanError, match="one number per stage"):
        partition_compute_seconds(diamond, [0, 1, 1, 0], [1.0, 2.0, 3.0])


def test_transfer_seconds(topo: Topology) -> None:
    assert transfer_seconds(topo, 0, 1, 100) == pytest.approx(0.5 + 100 / 10)
    assert transfer_seconds(topo, 0, 2, 100) == INF
    assert transfer_seconds(topo, 1, 1, 100) == 0.0
    assert transfer_seconds(topo, 0, 1, 0) == 0.0
    m = transfer_seconds_matrix(topo, 100)
    assert m.tolist() == [[0, 10.5, INF], [20.5, 0, 5.25], [100.5, 3.0, 0]]
    assert transfer_seconds_pairs(topo, [0, 1, 2, 2], [1, 1, 0, 1], [100, 9, 100, 0]).tolist() \
        == [10.5, 0.0, 100.5, 0.0]
    with pytest.raises(ShardplanError, match="destination device"):
        transfer_seconds(topo, 0, 3, 1)


def test_stage_traffic_counts_a_tensor_once_per_consuming_stage(diamond: Graph) -> None:
    # 0 -> {1, 2} (10, 20 bytes), 1 -> 3 (30), 2 -> 3 (40)
    b, t = stage_traffic(diamond, [0, 1, 1, 2])
    assert b.tolist() == [[0, 20, 0], [0, 0, 70], [0, 0, 0]]  # node 0's output once, max bytes
    assert t.tolist() == [[0, 1, 0], [0, 0, 2], [0, 0, 0]]
    b, t = stage_traffic(diamond, [0, 1, 1, 2], dedupe=False)
    assert b[0, 1] == 30 and t[0, 1] == 2
    assert np.array_equal(stage_traffic(diamond, [0, 0, 1, 1])[0],
                          diamond.stage_graph([0, 0, 1, 1]))


def test_stage_transfer_seconds(diamond: Graph, topo: Topology) -> None:
    b, t = stage_traffic(diamond, [0, 1, 1, 2])
    # stage 0 -> 1: one tensor of 20 B over 0 -> 1 (0.5 + 2) and its gradient 1 -> 0 (0.5 + 4)
    # stage 1 -> 2: two tensors, 70 B over 1 -> 2 (2 * 0.25 + 3.5), back 2 -> 1 (2 * 0.5 + 1.75)
    c = stage_transfer_seconds(topo, b, t, [0, 1, 2])
    assert c.tolist() == [7.0, 13.75, 6.75]
    c = stage_transfer_seconds(topo, b, t, [0, 1, 2], gradients=False)
    assert c.tolist() == [2.5, 6.5, 4.0]
    c = stage_transfer_seconds(topo, b, t, [0, 2, 1])  # stage 0 -> 1 is device 0 -> 2: no route
    assert c[0] == INF and c[1] == INF and math.isfinite(c[2])
    with pytest.raises(ShardplanError, match="shape"):
        stage_transfer_seconds(topo, b, t, [0, 1])


def test_allreduce(topo: Topology) -> None:
    # r = 2: 2 steps of 50 B; ring links 0 -> 1 (0.5 + 5) and 1 -> 0 (0.5 + 10): 2 * 10.5
    assert allreduce_seconds(topo, [0, 1], 100) == 21.0
    assert allreduce_seconds(topo, [1], 100) == 0.0
    assert allreduce_seconds(topo, [0, 2, 1], 100) == INF


def test_memory_terms(diamond: Graph) -> None:
    # params [4, 8, 0, 16], outputs [10, 30, 40, 5]; assignment [0, 0, 1, 1]:
    # stage 0: P = 12, outputs 40, receives nothing
    # stage 1: P = 16, outputs 45, receives node 0's (20 B on 0 -> 2) and node 1's (30 B)
    a = [0, 0, 1, 1]
    m = partition_memory_breakdown(diamond, a, in_flight=[2, 1])
    assert m["params"].tolist() == [12, 16] and m["gradients"].tolist() == [12, 16]
    assert m["optimizer"].tolist() == [24, 32] and m["master"].tolist() == [0, 0]
    assert m["activations"].tolist() == [2 * 40, 1 * (45 + 50)]
    assert m["total"].tolist() == [128, 159]
    # recompute: stash inputs per micro-batch (graph input node 0: 10 B; received 50 B),
    # rebuild one micro-batch's other outputs: stage 0 2 * 10 + 30, stage 1 1 * 50 + 45
    rc = partition_memory_breakdown(diamond, a, in_flight=[2, 1], recompute=True)
    assert rc["activations"].tolist() == [50, 95]
    assert partition_memory_bytes(diamond, a, optimizer="sgd-momentum", in_flight=2)[0] == \
        12 + 12 + 12 + 80
    assert partition_memory_bytes(diamond, a, optimizer="sgd", in_flight=2)[0] == 12 + 12 + 80
    # mixed precision, 2-byte params: fp32 master 24, Adam's two fp32 moments 48
    mp = partition_memory_breakdown(diamond, a, in_flight=2, mixed_precision=True)
    assert mp["master"][0] == 24 and mp["optimizer"][0] == 48 and mp["total"][0] == 176
    assert partition_memory_bytes(diamond, a, in_flight=2, replicas=2)[0] == 12 + 12 + 24 + 40
    g = diamond.replace(memory_bytes=np.array([1.0, np.nan, 2.0, np.nan]))
    assert partition_memory_breakdown(g, a)["extra"].tolist() == [1, 2]
    assert stage_memory_bytes(diamond, [2, 3], in_flight=1) == 159
    assert stage_memory_bytes(diamond, [0, 1], in_flight=2) == 128
    with pytest.raises(ShardplanError, match="unknown optimizer"):
        partition_memory_bytes(diamond, a, optimizer="lamb")
    with pytest.raises(ShardplanError, match="in_flight"):
        partition_memory_bytes(diamond, a, in_flight=[1, 2, 3])


def test_in_flight() -> None:
    assert in_flight_microbatches(4, 8).tolist() == [4, 3, 2, 1]
    assert in_flight_microbatches(4, 3).tolist() == [3, 3, 2, 1]
    assert in_flight_microbatches(2, 3, "gpipe").tolist() == [3, 3]
    with pytest.raises(ShardplanError, match="schedule"):
        in_flight_microbatches(2, 2, "zb")


def test_cost_model_stage_seconds(diamond: Graph, topo: Topology) -> None:
    cm = CostModel(diamond, topo, efficiency=0.5)
    # compute (fwd + bwd) [6, 15, 6] as above, communication [7, 13.75, 6.75]
    assert cm.stage_seconds([0, 1, 1, 2], [0, 1, 2]).tolist() == [13.0, 28.75, 12.75]
    assert cm.compute_matrix([0, 1, 1, 2]).tolist() == [[6, 3, 1.5], [30, 15, 7.5],
                                                         [24, 12, 6]]
    assert cm.stage_compute_seconds([1, 2], 1) == (5.0, 10.0)
    fwd, bwd = cm.partition_compute_seconds([0, 1, 1, 2], [0, 1, 2])
    assert fwd.tolist() == [2, 5, 2] and bwd.tolist() == [4, 10, 4]
    fwd, _ = cm.node_seconds(2)
    assert fwd.tolist() == [0.5, 1, 1.5, 2]
    assert cm.stage_transfer_seconds([0, 1, 1, 2], [0, 1, 2]).tolist() == [7.0, 13.75, 6.75]
    # memory 128, 159 against devices of 200, 150, 1000 bytes
    assert cm.fits_memory([0, 0, 1, 1], [0, 1], in_flight=[2, 1]).tolist() == [True, False]
    assert cm.fits_memory([0, 0, 1, 1], [0, 2], in_flight=[2, 1]).tolist() == [True, True]
    assert cm.stage_memory_bytes([0, 1], in_flight=2) == 128
    # gradients 12 and 16 B, halves of 6 and 8 B per ring step
    assert cm.allreduce_seconds([0, 0, 1, 1], [[0, 1], [2, 1]]).tolist() == pytest.approx([
        2 * max(0.5 + 6 / 10, 0.5 + 6 / 5), 2 * max(0.5 + 8 / 40, 0.25 + 8 / 20)])


def test_cost_model_measured_seconds_scale_with_profile_flops(diamond: Graph,
                                                               topo: Topology) -> None:
    g = diamond.replace(fwd_seconds=np.array([np.nan, 0.1, np.nan, np.nan]))
    plain = CostModel(g, topo)
    assert plain.node_seconds(1)[0].tolist() == [0.5, 0.1, 1.5, 2]  # as measured
    scaled = CostModel(g, topo, profile_flops=1.0)  # device 1 is twice the profiler
    assert scaled.node_seconds(1)[0].tolist() == [0.5, 0.05, 1.5, 2]


def test_replicas_share_the_microbatch() -> None:
    g = Graph.from_arrays(name="c", fwd_flops=[4.0, 8.0], src=[0], dst=[1],
                          output_bytes=[100, 0])
    n = 4
    topo = Topology(name="u", devices=tuple(Device(f"d{i}", 1e9, 1.0) for i in range(n)),
                    bandwidth=np.full((n, n), 10.0), latency=np.full((n, n), 1.0))
    cm = CostModel(g, topo)
    # compute 12 and 24 s split over 2 replicas; each replica sends 50 B: 1 + 5 s each way
    assert cm.stage_seconds([0, 1], [[0, 1], [2, 3]]).tolist() == [6 + 12, 12 + 12]
    assert cm.partition_memory_bytes([0, 1], replicas=2).tolist() == [50, 50]


def test_lower_bound(diamond: Graph, topo: Topology) -> None:
    # fwd + bwd FLOPs 3, 6, 9, 12 at the fastest device's 4 FLOP/s: 0.75, 1.5, 2.25, 3
    assert lower_bound_seconds(diamond, topo) == 3.0  # max(7.5 / 3, 3)
    assert lower_bound_seconds(diamond, topo, 2) == 3.75
    assert lower_bound_seconds(diamond, topo, 1, efficiency=0.5) == 15.0
    assert lower_bound_seconds(diamond, topo, 1, recompute=True) == 7.5 + 2.5
    with pytest.raises(ShardplanError, match="num_devices"):
        lower_bound_seconds(diamond, topo, 0)


def test_plan_arrays(diamond: Graph) -> None:
    plan = Plan(graph="diamond", topology="t", algorithm="x",
                stages=(Stage((0, 1), (2, 0)), Stage((2, 3), (1, 3))),
                objective=Objective("x", 1.0))
    a, dev = plan_arrays(plan, diamond)
    assert a.tolist() == [0, 0, 1, 1] and dev.tolist() == [[2, 0], [1, 3]]
    ragged = Plan(graph="d", topology="t", algorithm="x",
                  stages=(Stage((0, 1), (0,)), Stage((2, 3), (1, 2))),
                  objective=Objective("x", 1.0))
    with pytest.raises(ShardplanError, match="same number of replicas"):
        plan_arrays(ragged, diamond)


def test_cost_model_validates_options(diamond: Graph, topo: Topology) -> None:
    with pytest.raises(ShardplanError, match="optimizer"):
        CostModel(diamond, topo, optimizer="rmsprop")
    with pytest.raises(ShardplanError, match="efficiency"):
        CostModel(diamond, topo, efficiency=0)
    with pytest.raises(ShardplanError, match="needs a topology"):
        CostModel(diamond).node_seconds(0)
    with pytest.raises(ShardplanError, match="device must be"):
        CostModel(diamond, topo).node_seconds(3)
    assert CostModel(diamond).partition_memory_bytes([0, 0, 1, 1], in_flight=[2, 1]).tolist() \
        == [128, 159]


def test_optimizer_step_temporaries_by_hand() -> None:
    """Adam's step holds two copies of the largest parameter tensor after the backward freed
    the activations: the peak is the larger of the two phases (measured with MemTracker,
    benchmarks/memory_calibration.py); SGD steps in place."""
    from shardplan.cost import partition_memory_breakdown
    from shardplan.ir import Graph

    g = Graph.from_arrays(name="g", fwd_flops=[0, 0, 0], src=[0, 1], dst=[1, 2],
                          param_bytes=[100, 400, 10], output_bytes=[8, 4, 2])
    br = partition_memory_breakdown(g, [0, 0, 1], 2, optimizer="adam", in_flight=[3, 1])
    assert br["step_temporary"].tolist() == [800.0, 20.0]
    assert br["activations"].tolist() == [36.0, 6.0]  # 3 x (8 + 4); 2 + 4 received
    # stage 0: 500 params + 500 grads + 1000 Adam state + max(36, 800)
    assert br["total"].tolist() == [2800.0, 10 + 10 + 20 + 20.0]
    sgd = partition_memory_breakdown(g, [0, 0, 1], 2, optimizer="sgd", in_flight=[3, 1])
    assert sgd["step_temporary"].tolist() == [0.0, 0.0]
    assert sgd["total"].tolist() == [1036.0, 26.0]


def test_optimizer_step_is_a_roofline_by_hand() -> None:
    """1e6 four-byte parameters under Adam: 12 FLOPs and 28 bytes each. At 1e11 FLOP/s and
    10 GB/s the step is memory bound (2.8 ms, not 0.12 ms); without a known bandwidth,
    FLOPs alone; SGD moves 12 bytes a parameter."""
    from shardplan.cost._formulas import optimizer_seconds

    assert optimizer_seconds(4e6, "adam", 1e11, 1e10) == pytest.approx(2.8e-3)
    assert optimizer_seconds(4e6, "adam", 1e11) == pytest.approx(1.2e-4)
    assert optimizer_seconds(4e6, "sgd", 1e11, 1e10) == pytest.approx(1.2e-3)
    assert optimizer_seconds(4e6, "adam", 1e9, 1e12) == pytest.approx(1.2e-2)  # FLOP bound
    # mixed precision adds Megatron's step passes (bf16 16 bytes, fp16 24), less the
    # half-to-fp32 gradient copy (6) when the gradients are already fp32; fp32 has none
    assert optimizer_seconds(4e6, "adam", 1e11, 1e10, "bf16") == pytest.approx(4.4e-3)
    assert optimizer_seconds(4e6, "adam", 1e11, 1e10, "fp16") == pytest.approx(5.2e-3)
    assert optimizer_seconds(4e6, "adam", 1e11, 1e10, "bf16", True) == pytest.approx(3.8e-3)
    assert optimizer_seconds(4e6, "adam", 1e11, 1e10, "fp32", True) == pytest.approx(2.8e-3)
