"""What issue 44 added to the LLM cost model: the gradient group with context parallelism,
interleaving's simultaneous peak, fp8 where the stacks run it, DeepSpeed's pipeline engine and
buffers, the tied head's copy, and memory as runs report it (shardplan.cost._llm and
shardplan.cost._reserved)."""

import dataclasses

import numpy as np
import pytest

from shardplan.cost import _llm as llm
from shardplan.cost import block_layout, llm_costs, stage_nodes
from shardplan.cost._reserved import (
    ALLOCATOR_ROUND,
    CUDA_CONTEXT_BYTES,
    NCCL_BUFFSIZE,
    NCCL_CHANNELS,
    communicators,
    device_bytes,
    reserved_bytes,
)
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.ir.schedule import make_schedule
from shardplan.topology import build, build_spec
from tests.cost.llm_graph import gpt_graph

H, L, S, V, B = 64, 8, 32, 128, 2


@pytest.fixture(scope="module")
def g():
    return gpt_graph(hidden=H, layers=L, seq=S, vocab=V, batch=B)


@pytest.fixture(scope="module")
def h100():
    return build_spec("dgx-h100,nodes=2")


def settings(**kw):
    kw.setdefault("microbatch_size", B)
    kw.setdefault("microbatches", 4)
    return ExecutionSettings(**kw)


def test_context_parallel_ranks_reduce_and_shard_gradients(g, h100):
    """cp ranks hold the same weights: their gradients are reduced over dp x cp, and the
    distributed optimizer shards over dp x cp (Megatron-Core's with_context_parallel)."""
    alone = llm_costs(g, h100, ParallelConfig(cp=2), settings(microbatch_size=1))
    assert (alone.grad_sync_seconds > 0).all()
    z1 = settings(gradient_sync="zero1", microbatch_size=2)
    with_cp = llm_costs(g, h100, ParallelConfig(dp=2, cp=2), z1).memory
    without = llm_costs(g, h100, ParallelConfig(dp=2), z1).memory
    assert with_cp["optimizer"][0] == pytest.approx(without["optimizer"][0] / 2)
    assert with_cp["master"][0] == pytest.approx(without["master"][0] / 2)
    fsdp = llm_costs(g, h100, ParallelConfig(dp_shard=2, cp=2), z1).memory
    assert fsdp["gradients"][0] == pytest.approx(without["gradients"][0] / 4)


def test_interleaved_memory_is_the_ranks_simultaneous_peak():
    """The held counts come from the one action where the rank's stages together hold the
    most, found against a walk of the schedule done here."""
    pp, vp, m = 3, 2, 6
    par = ParallelConfig(pp=pp, vp=vp)
    st = settings(microbatches=m, schedule="interleaved-1f1b", virtual_stages=vp)
    per_mb = np.arange(1.0, pp * vp + 1.0) * 10
    in_flight = np.asarray(make_schedule("interleaved-1f1b", pp * vp, m,
                                         virtual_stages=vp).in_flight(), dtype=float)
    held = llm._held_at_rank_peak(par, st, per_mb, in_flight)
    sched = make_schedule("interleaved-1f1b", pp * vp, m, virtual_stages=vp)
    for r in range(pp):
        now: dict[int, int] = {}
        best = 0.0
        for a in (leaf for act in sched.ranks[r] for leaf in act.leaves()):
            if a.op == "F":
                now[a.stage] = now.get(a.stage, 0) + 1
            elif a.op in ("B", "W"):
                now[a.stage] -= 1
            best = max(best, sum(per_mb[s] * c for s, c in now.items()))
        mine = [j for j in range(pp * vp) if j % pp == r]
        assert held[mine].sum() == pytest.approx(best)
        assert best < (per_mb[mine] * in_flight[mine]).sum()  # the old sum of peaks
    one = ParallelConfig(pp=pp)
    assert (llm._held_at_rank_peak(one, settings(microbatches=m), per_mb[:pp],
                                   in_flight[:pp]) == per_mb[:pp] * in_flight[:pp]).all()


def test_fp8_runs_the_blocks_linear_layers_only(g):
    lay = block_layout(g)
    sel = llm.fp8_linear_nodes(g)
    names = {g.names[v] for v in np.flatnonzero(sel)}
    assert names == {f"layers.{i}.{n}" for i in range(L) for n in ("qkv", "wo", "w1", "w2")}
    assert not sel[lay.attention_core].any() and not sel[lay.vocab].any()


def test_fp8_casts_move_four_bytes_per_input_gradient_and_weight(g):
    sel = llm.fp8_linear_nodes(g)
    bw = 1e12
    fwd, bwd = llm.fp8_cast_seconds(g, B, sel, bw, microbatches=4)
    assert (fwd[~sel] == 0).all() and (bwd[~sel] == 0).all()
    qkv = g.names.index("layers.0.qkv")
    w2 = g.names.index("layers.0.w2")
    # qkv: inputs b s h, outputs b s 3h, weights 3h^2 + 3h; w2: inputs b s 4h, outputs b s h
    assert fwd[qkv] == pytest.approx(4 * (B * S * H * H / (H + 1) + (3 * H * H + 3 * H) / 4)
                                     / bw, rel=1e-9)
    assert bwd[qkv] == pytest.approx(4 * B * S * 3 * H / bw)
    assert bwd[w2] == pytest.approx(4 * B * S * H / bw)
    assert fwd[w2] > 4 * 4 * B * S * H / bw * 0.99


def test_fp8_with_no_fp8_products_prices_as_bf16(g, h100, monkeypatch):
    """The per-node choice is the only difference: with no node in fp8, an fp8 plan costs
    what bf16 does (no casts, the bf16 rate)."""
    par = ParallelConfig(tp=2)
    bf16 = llm_costs(g, h100, par, settings(precision="bf16"))
    fp8 = llm_costs(g, h100, par, settings(precision="fp8"))
    assert (fp8.forward < bf16.forward).all()
    monkeypatch.setattr(llm, "fp8_linear_nodes", lambda graph: np.zeros(graph.num_nodes, bool))
    none = llm_costs(g, h100, par, settings(precision="fp8"))
    assert none.forward == pytest.approx(bf16.forward)
    assert none.backward == pytest.approx(bf16.backward)


def test_deepspeeds_pipeline_sends_partitions_blocks_and_rebuilds(g, h100):
    """DeepSpeed's pipeline engine partitions the tensors it sends over the TP ranks (as
    Megatron does), blocks the sender, and all-gathers the partitions on receipt."""
    from shardplan.cost._gpu import gpu_model, group_collective_seconds, node_ids

    par = ParallelConfig(tp=2, pp=2)
    mg = llm_costs(g, h100, par, settings(precision="bf16"))
    ds = llm_costs(g, h100, par, settings(precision="bf16", stack="megatron-deepspeed"))
    assert ds.send_bytes.tolist() == mg.send_bytes.tolist()
    rebuild = group_collective_seconds(h100, gpu_model(h100), "allgather", np.arange(2),
                                       float(ds.send_bytes[0] * 2), node_ids(h100))
    assert rebuild > 0
    assert ds.forward[0] == pytest.approx(mg.forward[0] + ds.send_seconds[0])
    assert ds.forward[1] == pytest.approx(mg.forward[1] + rebuild)
    assert ds.backward[1] == pytest.approx(mg.backward[1] + ds.send_seconds[0])
    assert ds.backward[0] == pytest.approx(mg.backward[0] + rebuild)


@pytest.mark.parametrize("precision,extra", [("bf16", 4.0), ("fp16", 4.0 / 4)])
def test_deepspeeds_optimizer_buffers(g, h100, precision, extra):
    par = ParallelConfig(dp=4)
    st = settings(precision=precision, gradient_sync="zero1", microbatch_size=8)
    mg = llm_costs(g, h100, par, st).memory
    ds = llm_costs(g, h100, par, dataclasses.replace(st, stack="megatron-deepspeed")).memory
    params = mg["params"][0] / 2
    assert ds["gradients"][0] - mg["gradients"][0] == pytest.approx(extra * params)
    assert ds["gathered"][0] - mg["gathered"][0] == pytest.approx(
        min(params, llm.DEEPSPEED_BUCKET) * 2)


def test_a_tied_head_is_copied_to_the_last_stage_and_all_reduced(g, h100):
    one = llm_costs(g, h100, ParallelConfig(pp=1), settings(precision="bf16"))
    two = llm_costs(g, h100, ParallelConfig(pp=2), settings(precision="bf16"))
    assert two.memory["params"].sum() - one.memory["params"].sum() == pytest.approx(2 * V * H)
    assert two.grad_sync_seconds[0] > 0 and two.grad_sync_seconds[1] > 0
    assert llm._tied_embedding_params(g, block_layout(g)) == V * H
    lay = block_layout(g)
    stages = stage_nodes(lay, ParallelConfig(pp=2))
    assert not np.isin(np.flatnonzero(lay.vocab & (lay.block < 0)), stages[1]).any()


def test_reserved_and_device_memory(g, h100):
    c = llm_costs(g, h100, ParallelConfig(tp=2, pp=2, dp=2), settings(precision="bf16"))
    m = c.memory
    assert (m["reserved"] >= m["total"]).all()
    nccl = communicators(ParallelConfig(tp=2, pp=2, dp=2)) * NCCL_CHANNELS * 2 * NCCL_BUFFSIZE
    assert m["device"] == pytest.approx(m["reserved"] + CUDA_CONTEXT_BYTES["lazy"] + nccl)
    exp = llm_costs(g, h100, ParallelConfig(tp=2, pp=2, dp=2),
                    settings(precision="bf16", expandable_segments=True)).memory
    assert (exp["reserved"] < m["reserved"]).all()
    assert exp["reserved"] == pytest.approx(np.ceil(m["total"] / ALLOCATOR_ROUND)
                                            * ALLOCATOR_ROUND)
    gpus = build("flat", num_devices=4)
    flat = dataclasses.replace(gpus, devices=tuple(
        dataclasses.replace(d, extra={**d.extra, "type": "cpu"}) for d in gpus.devices))
    cpu = llm_costs(g, flat, ParallelConfig(pp=2), settings()).memory
    assert (cpu["reserved"] == cpu["total"]).all() and (cpu["device"] == cpu["total"]).all()


def test_reserved_bytes_keeps_one_hole_of_the_largest_tensor():
    mib = 2**20
    out = reserved_bytes(np.array([10 * mib + 1, 40 * mib]), np.array([3 * mib, 0]))
    assert out.tolist() == [(6 + 2) * 2 * mib, 40 * mib]
    assert reserved_bytes(np.array([mib]), np.array([50 * mib]),
                          expandable_segments=True).tolist() == [2 * mib]
    assert device_bytes(np.array([0.0]), ParallelConfig(), lazy_loading=False)[0] == \
        CUDA_CONTEXT_BYTES["eager"]


@pytest.mark.parametrize("par,n", [
    (ParallelConfig(), 0), (ParallelConfig(tp=8), 1), (ParallelConfig(tp=8, pp=2), 3),
    (ParallelConfig(tp=2, cp=2, dp=2), 3), (ParallelConfig(cp=2), 1),
    (ParallelConfig(dp=2, dp_shard=4), 2), (ParallelConfig(dp_shard=8), 1)])
def test_communicators_a_layout_creates(par, n):
    assert communicators(par) == n


def test_a_plan_fits_by_what_its_devices_hold(g, h100):
    from shardplan.planner._llm import llm_plan

    _, res = llm_plan(g, h100, ParallelConfig(tp=2, pp=2), settings(precision="bf16"))
    assert res.device_memory_bytes and res.reserved_memory_bytes
    assert all(d > p for d, p in zip(res.device_memory_bytes, res.peak_memory_bytes,
                                     strict=True))
    squeezed = dataclasses.replace(res, memory_capacity_bytes=tuple(
        (d + p) / 2 for d, p in zip(res.device_memory_bytes, res.peak_memory_bytes,
                                    strict=True)))
    assert res.fits_memory and not squeezed.fits_memory
    assert "device_memory_bytes" in res.to_dict()


def test_tensor_parallel_overlap_leaves_the_first_chunk_exposed():
    """Transformer Engine pipelines a region's collective in tp chunks under its product: the
    first chunk waits, the rest hides behind what compute is left."""
    from shardplan.cost._llm_comm import _overlapped

    assert _overlapped(8.0, 100.0, 4) == 2.0
    assert _overlapped(8.0, 0.0, 4) == 8.0
    assert _overlapped(8.0, 3.0, 4) == 2.0 + 3.0
    assert _overlapped(8.0, 100.0, 1) == 8.0


def test_the_loss_backward_allocates_the_logits_gradient_on_the_last_stage(h100):
    """torch's cross_entropy on fp32 logits (torchtitan) writes a new fp32 gradient and its
    half cast (4 + 2 bytes per logit); Megatron's in place leaves the cast (2); fp32 training
    has no cast."""
    g = gpt_graph(hidden=H, layers=L, seq=S, vocab=V, batch=B, loss=False)
    par = ParallelConfig(pp=2, tp=2)
    logits = B * S * V / 2  # one micro-batch, split by the vocabulary over TP 2

    def act(**kw):
        return llm_costs(g, h100, par, settings(**kw)).memory["activations"]

    tt, mg = act(precision="bf16", stack="torchtitan"), act(precision="bf16")
    assert tt[1] - mg[1] == pytest.approx(4 * logits)
    assert tt[0] == mg[0]  # the first stage holds no logits
    assert mg[1] - act(precision="bf16", stack="megatron-core")[1] >= 0
    assert act(precision="fp32", stack="torchtitan")[1] - act(precision="fp32")[1] == \
        pytest.approx(4 * logits)
    assert llm._loss_gradient_bytes(settings(precision="fp32")) == 0.0
    assert llm._loss_gradient_bytes(settings(precision="bf16")) == 2.0


def test_torchtitan_keeps_a_pipelines_fsdp_parameters_gathered(g, h100):
    """Under a pipeline torchtitan turns reshard_after_forward off: each stage gathers once
    per iteration and holds its parameters whole; without a pipeline, or under Megatron,
    every micro-batch gathers."""
    from shardplan.planner._llm import llm_plan

    par = ParallelConfig(pp=2, dp_shard=4)
    st = settings(precision="bf16", microbatch_size=8, microbatches=4)
    tt = llm_costs(g, h100, par, dataclasses.replace(st, stack="torchtitan"))
    mg = llm_costs(g, h100, par, st)
    assert tt.gathers_once and not mg.gathers_once
    assert not llm_costs(g, h100, ParallelConfig(dp_shard=8),
                         dataclasses.replace(st, stack="torchtitan")).gathers_once
    params = tt.grad_bytes / 2  # each stage's parameters per device (bf16 gradients)
    assert tt.memory["gathered"].tolist() == pytest.approx((2 * params).tolist())
    assert (mg.memory["gathered"] < tt.memory["gathered"]).all()  # two blocks, not all
    _, fast = llm_plan(g, h100, par, dataclasses.replace(st, stack="torchtitan"))
    _, slow = llm_plan(g, h100, par, dataclasses.replace(st, stack="megatron-core"))
    assert fast.iteration_seconds < slow.iteration_seconds


def test_deepspeeds_pipe_buffers_keep_each_micro_batchs_output(g, h100):
    par = ParallelConfig(tp=2, pp=2)
    st = settings(precision="bf16", microbatches=4)
    mg = llm_costs(g, h100, par, st)
    ds = llm_costs(g, h100, par, dataclasses.replace(st, stack="megatron-deepspeed"))
    extra = ds.memory["activations"] - mg.memory["activations"]
    assert extra[0] == pytest.approx(ds.send_bytes[0] * ds.in_flight[0])
    assert extra[1] == pytest.approx(0.0)  # the last stage sends nothing on


def test_a_run_of_older_torch_holds_the_eager_cuda_context(g, h100):
    par = ParallelConfig(tp=2)
    lazy = llm_costs(g, h100, par, settings(precision="bf16")).memory
    eager = llm_costs(g, h100, par, settings(precision="bf16", lazy_loading=False)).memory
    assert eager["device"] - lazy["device"] == pytest.approx(
        CUDA_CONTEXT_BYTES["eager"] - CUDA_CONTEXT_BYTES["lazy"])
    assert (eager["reserved"] == lazy["reserved"]).all()
