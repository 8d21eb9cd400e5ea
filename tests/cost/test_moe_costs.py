"""A mixture of experts' price (shardplan.cost._llm_moe): expert weights over EP x ETP,
their gradients over the expert replicas, the dispatch's all-to-all on the topology, the
grouped GEMMs' shapes, the straggler; and the search's expert grids against the price."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from shardplan.cost import llm_costs
from shardplan.cost._gpu import gpu_model, nccl_terms, node_ids
from shardplan.cost._llm import block_layout, pricing
from shardplan.cost._llm_moe import (
    MOE_STRAGGLER,
    expert_comm_seconds,
    grouped_gemm_efficiency,
    straggler_factor,
)
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.topology import build_spec

capture = pytest.importorskip("shardplan.capture")


@pytest.fixture(scope="module")
def moe():
    return capture.capture_spec("mixtral:debug", batch_size=1, meta=True)


@pytest.fixture(scope="module")
def dense():
    return capture.capture_spec("llama3:debug", batch_size=1, meta=True)


TOPO = build_spec("dgx-h100,nodes=2")


def _settings(par: ParallelConfig, **kw) -> ExecutionSettings:
    return ExecutionSettings(precision="bf16", microbatch_size=2 * par.data_parallel,
                             microbatches=4, **kw)


def _expert_params(graph) -> float:
    lay = block_layout(graph)
    return float(graph.param_bytes[lay.expert].sum()) / float(graph.meta.get("dtype_bytes", 4))


def test_roles_of_a_mixture(moe, dense):
    lay = block_layout(moe)
    assert lay.has_experts and not block_layout(dense).has_experts
    mods = [moe.modules[v] for v in np.flatnonzero(lay.expert)]
    assert mods and all(".moe.experts" in m for m in mods)
    # router, dispatch, combine are token-wise MoE nodes; the experts are among them
    assert (lay.expert <= lay.moe).all() and (lay.moe & ~lay.expert).any()
    assert not (lay.moe & (lay.region >= 0)).any()


def test_expert_weights_divide_by_ep_and_etp_and_dense_ones_do_not(moe):
    base = ParallelConfig(dp=8)
    e = _expert_params(moe)
    one = llm_costs(moe, TOPO, base, _settings(base)).memory["params"][0]
    for par in (ParallelConfig(dp=8, ep=2), ParallelConfig(dp=8, ep=4),
                ParallelConfig(tp=2, dp=4, ep=2, etp=1), ParallelConfig(tp=2, dp=4, ep=2)):
        got = llm_costs(moe, TOPO, par, _settings(par, sequence_parallel=par.tp > 1))
        # bf16 weights: the experts' over ep x etp, the rest as the dense layers split
        want_experts = e / (par.ep * par.expert_tp) * 2
        assert got.memory["params"][0] == pytest.approx(
            want_experts + (one - 2 * e) * _dense_split(moe, par), rel=1e-9), par


def _dense_split(graph, par: ParallelConfig) -> float:
    """Bytes fraction of the non-expert parameters one device holds under ``par``."""
    lay = block_layout(graph)
    p = graph.param_bytes.astype(float)
    dense = ~lay.expert
    split = lay.split & dense
    return float((p[split].sum() / par.tp + p[dense & ~split].sum()) / p[dense].sum())


def test_optimizer_state_of_experts_shards_over_expert_replicas(moe):
    """ZeRO-1: the dense state over the 8 data-parallel ranks, the experts' over the
    8 / ep expert replicas."""
    e = _expert_params(moe)
    for ep in (1, 2, 4):
        par = ParallelConfig(dp=8, ep=ep)
        mem = llm_costs(moe, TOPO, par, _settings(par, gradient_sync="zero1")).memory
        total = float(moe.param_bytes.sum()) / 4
        want = ((total - e) / 8 + (e / ep) / (8 // ep)) * 4  # fp32 master weights
        assert mem["master"][0] == pytest.approx(want, rel=1e-9)


def test_dispatch_is_free_without_expert_parallelism_and_costs_across_nodes(moe):
    par1 = ParallelConfig(dp=16)
    f, b = expert_comm_seconds(pricing(moe, TOPO, par1, _settings(par1)))
    assert not f.any() and not b.any()
    inside = ParallelConfig(dp=16, ep=4)  # 4 consecutive GPUs of one node
    fi, bi = expert_comm_seconds(pricing(moe, TOPO, inside, _settings(inside)))
    assert (fi > 0).all() and np.array_equal(fi, bi)
    full = _settings(inside, recompute="full")
    _, bf = expert_comm_seconds(pricing(moe, TOPO, inside, full))
    assert bf == pytest.approx(2 * bi)  # the forward's all-to-alls again
    # the same all-to-all over 16 GPUs of two nodes crosses the NICs: slower per byte
    hw = gpu_model(TOPO)
    lat8, k8 = nccl_terms(TOPO, hw, "alltoall", np.arange(8), node_ids(TOPO))
    lat16, k16 = nccl_terms(TOPO, hw, "alltoall", np.arange(16), node_ids(TOPO))
    assert k16 > 2 * k8 and lat16 > lat8
    # NVLink inside a node: S (g - 1) / n bytes at the link's bus bandwidth
    b_in = float(TOPO.bandwidth[0, 1])
    assert k8 == pytest.approx(7 / 8 / (hw.nccl_efficiency * b_in))


def test_grouped_gemm_shapes_and_the_straggler(moe):
    assert grouped_gemm_efficiency(512, 256, 4, 132) == pytest.approx(
        4 * 512 * 256 / (np.ceil(4 * 2 * 2 / 132) * 132 * 256 * 128))
    # per-expert kernels take a wave each; a grouped one shares them
    assert grouped_gemm_efficiency(256, 128, 8, 132, grouped=False) == pytest.approx(1 / 132)
    assert grouped_gemm_efficiency(256, 128, 8, 132) == pytest.approx(8 / 132)
    par = ParallelConfig(dp=8, ep=4)
    assert straggler_factor(pricing(moe, TOPO, par, _settings(par))) == MOE_STRAGGLER
    capped = _settings(par, moe_capacity_factor=1.1)
    assert straggler_factor(pricing(moe, TOPO, par, capped)) == 1.1
    one = ParallelConfig(dp=8)
    assert straggler_factor(pricing(moe, TOPO, one, _settings(one))) == 1.0


def test_expert_grid_refusals(moe, dense):
    with pytest.raises(ShardplanError, match="does not divide the model's 4 experts"):
        par = ParallelConfig(dp=8, ep=8)
        llm_costs(moe, TOPO, par, _settings(par))
    with pytest.raises(ShardplanError, match="needs a mixture of experts"):
        par = ParallelConfig(dp=8, ep=2)
        llm_costs(dense, TOPO, par, _settings(par))


def test_the_search_offers_expert_grids_and_its_bound_holds(moe):
    """Every (EP, ETP) grid the search offers prices; the static bound the search prunes
    with never exceeds what the priced layout holds of the same kinds."""
    from shardplan.planner._llm import _static_bytes, candidates

    st = ExecutionSettings(precision="bf16")
    offered = list(candidates(moe, TOPO, st, global_batch=16, max_microbatch=2))
    grids = {(p.ep, p.etp) for p, _ in offered}
    assert {(1, None), (2, None), (4, None)} <= grids and (2, 1) in grids
    total = float(moe.param_bytes.sum()) / 4
    e = _expert_params(moe)
    for par, s in offered[::7]:
        mem = llm_costs(moe, TOPO, par, s).memory
        held = sum(float(mem[k].max()) for k in ("params", "gradients", "master", "optimizer"))
        assert _static_bytes(total, par, s, e) <= held * (1 + 1e-9), (par, s.gradient_sync)


def test_an_expert_layout_plans_and_simulates(moe):
    from shardplan.planner._llm import llm_plan

    par = ParallelConfig(pp=2, dp=8, ep=4)
    plan, res = llm_plan(moe, TOPO, par, replace(_settings(par), microbatches=4))
    assert res.iteration_seconds > 0 and plan.parallel == par


def _two_streams(attn_f, attn_b, mlp_f, mlp_b, a2a_f, a2a_b) -> float:
    """Brute force of Megatron-Core's overlapped layer pair: every operation as a task on
    its stream, started when its stream is free and its inputs are ready, in the order
    ``TransformerLayerSchedulePlan.run`` issues them."""
    tasks = [  # (name, stream, seconds, inputs)
        ("combine_bwd", "comm", a2a_b, ()), ("attn_fwd", "comp", attn_f, ()),
        ("mlp_bwd", "comp", mlp_b, ("combine_bwd",)),
        ("dispatch_fwd", "comm", a2a_f, ("attn_fwd",)),
        ("dispatch_bwd", "comm", a2a_b, ("mlp_bwd",)),
        ("mlp_fwd", "comp", mlp_f, ("dispatch_fwd",)),
        ("combine_fwd", "comm", a2a_f, ("mlp_fwd",)),
        ("attn_bwd", "comp", attn_b, ("dispatch_bwd",)),
    ]
    free = {"comm": 0.0, "comp": 0.0}
    end: dict[str, float] = {}
    for name, stream, sec, inputs in tasks:
        start = max([free[stream]] + [end[i] for i in inputs])
        end[name] = free[stream] = start + sec
    return max(end.values())


def test_overlapped_layer_pair_is_the_two_streams_schedule() -> None:
    """Against the brute force, and its bounds: never below either stream's work, never
    above all of it in series, the computation alone without communication."""
    from shardplan.cost._llm_moe import overlapped_layer_pair

    rng = np.random.default_rng(7)
    x = rng.exponential(1.0, size=(6, 500)) * (rng.random((6, 500)) < 0.8)
    got = overlapped_layer_pair(*x)
    want = np.array([_two_streams(*col) for col in x.T])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    comp, comm = x[:4].sum(axis=0), 2.0 * (x[4] + x[5])
    assert (got >= np.maximum(comp, comm) - 1e-12).all() and (got <= comp + comm + 1e-12).all()
    no_comm = overlapped_layer_pair(*x[:4], np.zeros(500), np.zeros(500))
    np.testing.assert_allclose(no_comm, comp)
    # k layers alike take k times one: a stage's pair is the pair of its totals
    np.testing.assert_allclose(overlapped_layer_pair(*(3.0 * x)), 3.0 * got)
    # equal work on both streams hides all of it; experts that wait for their own dispatch,
    # and an attention backward that waits for its, do not: 4 of computation, 4 of
    # communication, 6 in all
    assert overlapped_layer_pair(*np.ones((6, 1))) == 4.0
    assert overlapped_layer_pair(*np.array([[0.0], [2.0], [2.0], [0.0], [1.0], [1.0]])) == 6.0


def test_a2a_overlap_exposes_what_the_overlapped_pair_adds(moe):
    from shardplan.cost._llm_moe import exposed_expert_comm, moe_layers, overlapped_layer_pair

    par = ParallelConfig(dp=8, ep=4)
    on = pricing(moe, TOPO, par, _settings(par, moe_a2a_overlap=True))
    off = pricing(moe, TOPO, par, _settings(par))
    layers = moe_layers(on)
    cf, cb = np.array([3.0]) * layers, np.array([3.0]) * layers
    comp_f, comp_b = np.array([1.0]) * layers, np.array([2.0]) * layers
    ex_f, ex_b = np.array([0.5]) * layers, np.array([1.0]) * layers
    f, b = exposed_expert_comm(on, cf, cb, comp_f, comp_b, ex_f, ex_b)
    pair = overlapped_layer_pair(np.array([0.5]), np.array([1.0]), np.array([0.5]),
                                 np.array([1.0]), np.array([1.5]), np.array([1.5]))
    exposed = layers * pair - (comp_f + comp_b)
    np.testing.assert_allclose(f + b, exposed)
    np.testing.assert_allclose(f, b)  # shared as the communication is
    # communication far shorter than the computation beside it: hidden
    f, b = exposed_expert_comm(on, cf / 100, cb / 100, comp_f * 10, comp_b * 10,
                               ex_f * 10, ex_b * 10)
    assert (f == 0).all() and (b == 0).all()
    f, b = exposed_expert_comm(off, cf, cb, comp_f, comp_b, ex_f, ex_b)
    assert f is cf and b is cb
    # a stage without expert communication (dense layers only) exposes none, beside one
    # that has some
    two = [np.array([0.0, 3.0]), np.array([0.0, 3.0]), np.array([1.0, 1.0]),
           np.array([2.0, 2.0]), np.array([0.5, 0.5]), np.array([1.0, 1.0])]
    f, b = exposed_expert_comm(on, *two)
    assert f[0] == 0.0 and b[0] == 0.0 and f[1] > 0.0 and np.isfinite(f).all()
    full = llm_costs(moe, TOPO, par, _settings(par))
    hid = llm_costs(moe, TOPO, par, _settings(par, moe_a2a_overlap=True))
    assert (hid.forward <= full.forward).all() and (hid.backward < full.backward).all()
    assert full.alone_forward is None and full.alone_backward is None
    # a pass without a partner pays its whole dispatch and combine
    np.testing.assert_allclose(hid.forward + hid.alone_forward, full.forward)
    np.testing.assert_allclose(hid.backward + hid.alone_backward, full.backward)


def test_balanced_gating_has_no_straggler(moe):
    par = ParallelConfig(dp=8, ep=4)
    assert straggler_factor(pricing(moe, TOPO, par, _settings(par, moe_force_balance=True))) \
        == 1.0


def test_recompute_modules_pick_their_nodes(moe):
    from shardplan.cost._llm_layout import recompute_mask

    lay = block_layout(moe)
    act = recompute_mask(moe, ("moe_act",))
    assert act.any() and (act <= lay.expert).all()
    assert all(moe.ops[v] in ("silu", "mul") for v in np.flatnonzero(act))
    norms = recompute_mask(moe, ("layernorm",))
    assert {moe.modules[v].split(".")[-1] for v in np.flatnonzero(norms)} == {
        "attention_norm", "ffn_norm"}
    assert (recompute_mask(moe, ("core_attn",)) == lay.attention_core).all()
    assert (recompute_mask(moe, ("moe",)) == lay.moe).all()
    both = recompute_mask(moe, ("layernorm", "moe_act"))
    assert (both == (act | norms)).all()
    mla = capture.capture_spec("deepseek_v3:debug", batch_size=1, meta=True)
    up = recompute_mask(mla, ("mla_up_proj",))
    assert {m.rsplit(".", 1)[-1] for m in np.array(mla.modules)[up]} == {"wq_b", "wkv_b"}
    # recomputing the activations adds their forward to the backward and keeps less
    par = ParallelConfig(dp=8, ep=4)
    none = llm_costs(moe, TOPO, par, _settings(par))
    sel = llm_costs(moe, TOPO, par, _settings(par, recompute="selective",
                                               recompute_modules=("moe_act", "layernorm")))
    assert (sel.backward > none.backward).all()
    assert (sel.memory["activations"] < none.memory["activations"]).all()
    with pytest.raises(ShardplanError, match="recompute_modules"):
        _settings(par, recompute_modules=("attn",))


def test_a_device_reads_only_its_experts_weights():
    """Mixtral's experts on 128 tokens are memory-bound: a device reads its experts'
    weights, 1/ep of them, so their products take 1/ep of the time of every expert local."""
    from shardplan.cost._llm import node_seconds

    g = capture.capture_spec("mixtral:8x7B,n_layers=1,seq=128", batch_size=1, meta=True)
    lay = block_layout(g)
    mm = lay.expert & (g.param_bytes > 0)
    one, four = ParallelConfig(dp=8), ParallelConfig(dp=8, ep=4)
    pr = pricing(g, TOPO, one, _settings(one))
    t1 = node_seconds(pr).fwd[mm]
    t4 = node_seconds(pricing(g, TOPO, four, _settings(four, moe_force_balance=True))).fwd[mm]
    weights = g.param_bytes[mm] / 4 * 2 / pr.bw  # captured in fp32, read in bf16
    assert (t1 >= weights).all()  # every expert's weights read
    # a quarter of them, and the products no faster than their grouped GEMMs allow
    assert (t4 < t1 / 2).all() and (t4 >= weights / 4).all()


def test_sliding_window_layers_attend_to_fewer_keys():
    from shardplan.cost._llm import _SDPA, _window_factors

    g = capture.capture_spec("gpt_oss:debug", batch_size=1, meta=True)
    dims = g.meta["transformer"]
    w, s = dims["sliding_window"], dims["seq"]
    f = _window_factors(g)
    lay = block_layout(g)
    sdpa = [v for v, op in enumerate(g.ops) if _SDPA.search(op.lower()) and lay.block[v] >= 0]
    want = (w * s - w * (w - 1) / 2) / (s * (s + 1) / 2)
    assert [f[v] for v in sdpa] == [pytest.approx(want) if lay.block[v] % 2 == 0 else 1.0
                                    for v in sdpa]
    assert (np.delete(f, sdpa) == 1.0).all()
