"""The GPU hardware model (shardplan.cost._gpu): NCCL by scope, kernels at their fractions."""

import pytest

from shardplan.cost import llm_costs
from shardplan.cost._collectives import collective_seconds
from shardplan.cost._gpu import (
    GPU_MODELS,
    gpu_model,
    group_collective_seconds,
    node_ids,
    wave_efficiency,
)
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.topology import build, build_spec
from tests.cost.llm_graph import gpt_graph

NVL, NIC = 300e9, 25e9


def a100(nodes):
    return build("hierarchical", shape=(nodes, 8), bandwidth=(NIC, NVL), latency=(5e-6, 2e-6),
                 device="a100")


def test_known_gpu_types_and_unknown_devices():
    assert gpu_model(a100(1)) is GPU_MODELS["a100"]
    assert gpu_model(build("flat", num_devices=2, device="a100")) is GPU_MODELS["a100"]
    cpu = build("flat", num_devices=2)
    cpu = cpu.replace(devices=tuple(d.__class__(d.name, d.memory_bytes, d.flops, {})
                                    for d in cpu.devices))
    assert gpu_model(cpu) is None
    m = GPU_MODELS["a100"]
    assert m.matmul_efficiency == pytest.approx(267.9 / 312)
    assert 0.8 < m.nccl_efficiency < 0.82


def test_inside_a_node_a_ring_over_nvlink():
    t = a100(1)
    m = GPU_MODELS["a100"]
    s = 64e6
    got = group_collective_seconds(t, m, "allreduce", range(8), s, node_ids(t))
    want = m.nccl_base_latency + 14 * m.nccl_nvlink_step + 2 * 7 / 8 * s / (
        m.nccl_efficiency * NVL)
    assert got == pytest.approx(want)
    half = group_collective_seconds(t, m, "allgather", range(8), s, node_ids(t))
    assert half == pytest.approx(m.nccl_base_latency + 7 * m.nccl_nvlink_step +
                                 7 / 8 * s / (m.nccl_efficiency * NVL))


def test_across_nodes_each_gpu_uses_its_own_nic():
    t = a100(4)
    m = GPU_MODELS["a100"]
    s = 1e9
    ids = node_ids(t)
    # all 32 GPUs: 8 per node share the inter-node traffic (1/8 each over its NIC)
    full = group_collective_seconds(t, m, "allreduce", range(32), s, ids)
    out = 2 * 3 / 4 * (s / 8) / (m.nccl_efficiency * NIC)
    inside = 2 * 7 / 8 * s / (m.nccl_efficiency * NVL)
    # NCCL's ring latency: 2 x 31 steps, 2 x 3 of them between nodes (tuning.cc)
    assert full == pytest.approx(m.nccl_base_latency + (62 - 6) * m.nccl_nvlink_step +
                                 6 * m.nccl_net_step + max(out, inside))
    gather = group_collective_seconds(t, m, "allgather", range(32), 1.0, ids)
    assert gather == pytest.approx(m.nccl_base_latency + 28 * m.nccl_nvlink_step +
                                   3 * m.nccl_net_step, rel=1e-6)
    # one GPU per node (a data-parallel group under TP 8): the whole tensor over one NIC
    rail = group_collective_seconds(t, m, "allreduce", [0, 8, 16, 24], s, ids)
    assert rail == pytest.approx(m.nccl_base_latency + 6 * m.nccl_net_step +
                                 2 * 3 / 4 * s / (m.nccl_efficiency * NIC))
    assert rail > 5 * full
    # the topology's own ring (no GPU model) prices the whole ring at its slowest link
    assert collective_seconds(t, "allreduce", list(range(32)), s) > full


def test_llm_costs_use_the_fractions_on_gpus():
    g = gpt_graph(hidden=2048, layers=2, seq=512, batch=4)
    st = ExecutionSettings(microbatch_size=4, microbatches=1, precision="bf16")
    gpu = llm_costs(g, a100(1), ParallelConfig(), st)
    peak = llm_costs(g, a100(1), ParallelConfig(), st.__class__(
        microbatch_size=4, microbatches=1, precision="bf16", efficiency=1.0))
    # every node slower than at the datasheet's peak: by the smaller fraction, and matrix
    # products by their waves too (this graph's products fill 8 / 108 to 8 / 9 of theirs)
    m = GPU_MODELS["a100"]
    ratio = gpu.forward.sum() / peak.forward.sum()
    worst_wave = float(wave_efficiency(4 * 512, 128, m.sms))  # the 128-word head
    assert 1 / min(m.matmul_efficiency, m.memory_efficiency) < ratio
    assert ratio <= 1 / (min(m.matmul_efficiency, m.memory_efficiency) * worst_wave)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_waves_of_column_and_row_parallel_products(tp):
    """Each product's GEMM as the device runs it: the column-parallel QKV and first MLP
    product write M x N/tp, the row-parallel output and second MLP product M x N with K/tp;
    the backward's input- and weight-gradient products write M x K and K x N; each may split
    its reduction dimension where its outputs leave SMs idle."""
    from shardplan.cost._llm import _wave_factors

    h, s, b = 1216, 512, 4
    g = gpt_graph(hidden=h, layers=1, seq=s, batch=b)
    wf, wb = _wave_factors(g, b, tp, 1, 108)
    by_name = {n: i for i, n in enumerate(g.names)}
    m_rows = b * s

    def w(r, c, depth):
        return float(wave_efficiency(r, c, 108, depth))

    def back(r, k, c):
        return 2 / (1 / w(r, k, c) + 1 / w(k, c, r))

    qkv, wo = by_name["layers.0.qkv"], by_name["layers.0.wo"]
    w1, w2 = by_name["layers.0.w1"], by_name["layers.0.w2"]
    assert wf[qkv] == pytest.approx(w(m_rows, 3 * h / tp, h))
    assert wb[qkv] == pytest.approx(back(m_rows, h, 3 * h / tp))
    assert wf[w1] == pytest.approx(w(m_rows, 4 * h / tp, h))
    assert wf[wo] == pytest.approx(w(m_rows, h, h / tp))
    assert wb[wo] == pytest.approx(back(m_rows, h / tp, h))
    assert wf[w2] == pytest.approx(w(m_rows, h, 4 * h / tp))
    assert wb[w2] == pytest.approx(back(m_rows, 4 * h / tp, h))
    # the tied head holds no parameters of its own (its shape is not read: whole waves), nor
    # do nodes that are no products
    assert wf[by_name["output"]] == 1.0
    assert wf[by_name["layers.0.gelu"]] == 1.0 and wb[by_name["layers.0.ln1"]] == 1.0
    # 2048 x 3648 outputs: 8 x 29 = 232 tiles, 3 waves of 108 where 2.15 would do
    if tp == 1:
        assert wf[qkv] == pytest.approx(232 / 324)
    # at TP 4 the QKV product writes 8 x 8 = 64 tiles, under one wave: K = 1216 splits once
    if tp == 4:
        assert wf[qkv] == pytest.approx(128 / 216)


@pytest.mark.parametrize("tp", [2, 4])
def test_overlapped_tensor_parallel_products_run_in_chunks(tp):
    """Under Transformer Engine's userbuffers (--tp-comm-overlap, its defaults): the
    column-parallel forward and the row-parallel input gradient in tp chunks of M / tp
    tokens, the row-parallel forward in 4 chunks on the SMs the reduce-scatter leaves; the
    other products whole (each chunk fills its own waves: it may fill them better or worse
    than the whole)."""
    from shardplan.cost._llm import UB_PIPELINE_SMS, UB_PIPELINE_SPLITS, _wave_factors

    h, s, b = 2048, 1024, 2
    g = gpt_graph(hidden=h, layers=1, seq=s, batch=b)
    plain_f, plain_b = _wave_factors(g, b, tp, 1, 132)
    wf, wb = _wave_factors(g, b, tp, 1, 132, True)
    by_name = {n: i for i, n in enumerate(g.names)}
    m = b * s

    def w(r, c, depth, sms=132):
        return float(wave_efficiency(r, c, sms, depth))

    qkv, wo = by_name["layers.0.qkv"], by_name["layers.0.wo"]
    assert wf[qkv] == pytest.approx(w(m / tp, 3 * h / tp, h))
    assert wb[qkv] == pytest.approx(plain_b[qkv])  # bulk: whole
    small = 132 - UB_PIPELINE_SMS
    assert wf[wo] == pytest.approx(w(m / UB_PIPELINE_SPLITS, h, h / tp, small) * small / 132)
    assert wb[wo] == pytest.approx(2 / (1 / w(m / tp, h / tp, h) + 1 / w(h / tp, h, m)))
    assert wf[wo] < plain_f[wo]  # 32 tiles split 3 ways on 116 SMs against 128 tiles
    assert wf[by_name["output"]] == plain_f[by_name["output"]]  # the head is not overlapped


def test_split_k_fills_only_what_a_wave_leaves_idle():
    assert float(wave_efficiency(256, 128, 132)) == pytest.approx(1 / 132)  # no depth given
    assert float(wave_efficiency(256, 128, 132, 1 << 20)) == pytest.approx(1.0)  # 132 ways
    assert float(wave_efficiency(256, 128, 132, 256)) == pytest.approx(2 / 132)  # 128 deep
    assert float(wave_efficiency(256 * 10, 128 * 14, 132, 1 << 20)) == pytest.approx(
        140 / 264)  # 140 tiles fill more than a wave: not split
    assert float(wave_efficiency(256, 128 * 50, 132, 1 << 20)) == pytest.approx(100 / 132)


def test_fp8_products_reach_their_own_fraction():
    from shardplan.cost._llm import pricing

    h100 = GPU_MODELS["h100"]
    assert h100.matmul_fraction("fp8") == pytest.approx(1402.6 / 1979)
    assert h100.matmul_fraction("bf16") == h100.matmul_efficiency
    assert GPU_MODELS["a100"].matmul_fraction("fp8") == GPU_MODELS["a100"].matmul_efficiency
    g = gpt_graph(hidden=256, layers=1, seq=64, batch=1)
    topo = build_spec("dgx-h100,nodes=1")
    st = ExecutionSettings(microbatch_size=1, microbatches=1, precision="fp8")
    pr = pricing(g, topo, ParallelConfig(), st)
    assert pr.flops == pytest.approx(1979e12 * 1402.6 / 1979, rel=1e-3)


def test_cluster_presets_price_every_plan_kinds_collectives_by_nccl():
    """On a GPU cluster preset the collectives of the plan kinds that price groups by size
    (data parallelism, a stage's replicas) follow the NCCL rule of LLM plans, the group
    packed onto whole nodes; a hand-built topology of the same GPUs keeps the ring."""
    import numpy as np

    from shardplan.cost._collectives import measured_seconds, ring_collectives
    from shardplan.cost._formulas import ring_allreduce_seconds
    from shardplan.cost._links import inverse_bandwidth
    from shardplan.topology import build_spec

    t = build_spec("dgx-a100,nodes=2")
    m, ids, s = GPU_MODELS["a100"], node_ids(t), 1e9
    for kind in ("allreduce", "allgather", "reducescatter"):
        for r in (2, 8, 12, 16):
            want = group_collective_seconds(t, m, kind, range(r), s, ids)
            assert collective_seconds(t, kind, list(range(r)), s) == pytest.approx(want)
            assert measured_seconds(t, kind, r, s) == pytest.approx(want)
    packed = group_collective_seconds(t, m, "allreduce", [0, 1], s, ids)
    assert collective_seconds(t, "allreduce", [0, 8], s) == pytest.approx(packed)
    rows = ring_collectives(t, "allreduce", np.arange(16).reshape(2, 8),
                            np.array([s, 2 * s]), inverse_bandwidth(t))
    one = group_collective_seconds(t, m, "allreduce", range(8), s, ids)
    two = group_collective_seconds(t, m, "allreduce", range(8), 2 * s, ids)
    assert rows.tolist() == pytest.approx([one, two])
    assert measured_seconds(t, "allreduce", 16, np.array([0.0, s])).tolist() == \
        pytest.approx([0.0, collective_seconds(t, "allreduce", list(range(16)), s)])
    assert measured_seconds(t, "allreduce", 1, s) == 0.0
    # one ring over the node boundary is ~10x the NCCL rule, and a hand-built topology of
    # the same A100s (not a preset) keeps it
    ring = float(ring_allreduce_seconds(16, s, 5e-6, 1 / NIC))
    assert collective_seconds(t, "allreduce", list(range(16)), s) * 9 < ring
    assert collective_seconds(a100(2), "allreduce", list(range(16)), s) == pytest.approx(ring)
    assert measured_seconds(a100(2), "allreduce", 16, s) is None


def test_nccl_terms_by_scope_exactly():
    """``(latency, seconds per byte)`` of NCCL's rule: nothing for one device; inside a
    node the NVLink ring; one GPU on each of two nodes the NIC alone; device ids of any
    shape or number type."""
    import numpy as np

    from shardplan.cost._gpu import nccl_terms

    t = a100(2)
    m, ids = GPU_MODELS["a100"], node_ids(t)
    eta = m.nccl_efficiency
    assert nccl_terms(t, m, "allreduce", [3], ids) == (0.0, 0.0)
    pair = nccl_terms(t, m, "allgather", np.array([[0.0], [1.0]]), ids)
    assert pair == pytest.approx((m.nccl_base_latency + m.nccl_nvlink_step,
                                  1 / 2 / (eta * NVL)))
    rail = nccl_terms(t, m, "allreduce", [0, 8], ids)
    assert rail == pytest.approx((m.nccl_base_latency + 2 * m.nccl_net_step,
                                  2 * 1 / 2 / (eta * NIC)))
    mixed = nccl_terms(t, m, "reducescatter", [0, 8, 1, 9], ids)
    assert mixed == pytest.approx((m.nccl_base_latency + 2 * m.nccl_nvlink_step +
                                   m.nccl_net_step,
                                   max(1 / 2 / (eta * NVL), 1 / 2 / 2 / (eta * NIC))))
    assert group_collective_seconds(t, m, "allreduce", [0, 8], 0.0, ids) == 0.0
    assert group_collective_seconds(t, m, "allreduce", [0, 8], 1e6, ids) == \
        pytest.approx(rail[0] + 1e6 * rail[1])


def test_cluster_collectives_only_for_groups_the_cluster_holds():
    """The preset's NCCL rule prices groups of 2..D GPUs, fractional byte counts too; a
    group larger than the cluster, or a topology that is not a preset, gets None."""
    import numpy as np

    from shardplan.cost._gpu import cluster_collective_seconds
    from shardplan.topology import build_spec

    t = build_spec("dgx-a100,nodes=2")
    m, ids = GPU_MODELS["a100"], node_ids(t)
    lat, k = m.nccl_base_latency + 2 * 15 * m.nccl_nvlink_step - 2 * m.nccl_nvlink_step + \
        2 * m.nccl_net_step, None
    got = cluster_collective_seconds(t, "allreduce", 16, np.array([0.0, 0.5, 2.0]))
    one = group_collective_seconds(t, m, "allreduce", range(16), 1.0, ids)
    k = one - lat
    assert got.tolist() == pytest.approx([0.0, lat + 0.5 * k, lat + 2.0 * k])
    assert cluster_collective_seconds(t, "allreduce", 1, 1e6) == 0.0
    assert cluster_collective_seconds(t, "allreduce", 17, 1e6) is None
    assert cluster_collective_seconds(t, "allreduce", 0, 1e6) is None
    assert cluster_collective_seconds(a100(2), "allreduce", 16, 1e6) is None
