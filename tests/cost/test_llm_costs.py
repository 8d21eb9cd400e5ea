"""The LLM plan kind's costs (shardplan.cost._llm) on a GPT written as capture makes it."""

import numpy as np
import pytest

from shardplan.cost import block_layout, llm_costs, precision_bytes, stage_nodes
from shardplan.cost._gpu import gpu_model, group_collective_seconds, node_ids
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, ParallelConfig
from shardplan.topology import build
from tests.cost.llm_graph import gpt_graph, gpt_parameters

H, L, S, V, B = 64, 4, 32, 128, 2


@pytest.fixture(scope="module")
def g():
    return gpt_graph(hidden=H, layers=L, seq=S, vocab=V, batch=B)


@pytest.fixture(scope="module")
def topo():
    return build("dgx1")


def allreduce(topo, group, nbytes):
    return group_collective_seconds(topo, gpu_model(topo), "allreduce", group, nbytes,
                                    node_ids(topo))


def settings(**kw):
    kw.setdefault("microbatch_size", B)
    kw.setdefault("microbatches", 4)
    return ExecutionSettings(**kw)


def test_fixture_has_megatrons_parameter_count(g):
    assert g.param_bytes.sum() / 4 == gpt_parameters(hidden=H, layers=L, vocab=V, seq=S)


def test_block_layout_roles(g):
    lay = block_layout(g)
    assert lay.num_blocks == L
    assert np.unique(lay.region[lay.region >= 0]).size == 2 * L  # attention and MLP per block
    names = [g.names[v] for v in np.flatnonzero(lay.vocab)]
    assert names == ["tok", "output", "loss"]
    assert lay.block[g.names.index("tok")] == -1
    assert lay.block[g.names.index("norm")] == L
    assert [g.names[v] for v in np.flatnonzero(lay.attention_core)] == \
        [f"layers.{i}.sdpa" for i in range(L)]
    # norms and residual additions are replicated, not split
    assert not lay.split[g.names.index("layers.0.ln1")]
    assert not lay.split[g.names.index("layers.0.add1")]
    with pytest.raises(ShardplanError, match="no transformer blocks"):
        block_layout(Graph.from_arrays(name="x", fwd_flops=[1.0], src=[], dst=[]))


def test_stage_nodes_whole_blocks_embedding_first_head_last(g):
    lay = block_layout(g)
    st = stage_nodes(lay, ParallelConfig(pp=2, stage_layers=(1, 3)))
    assert sorted(np.concatenate(st).tolist()) == list(range(g.num_nodes))
    first = {g.names[v] for v in st[0]}
    assert {"tok", "pos", "embed_add", "layers.0.wo"} <= first
    assert not any(n.startswith("layers.1") for n in first)
    assert {"norm", "output", "loss", "layers.3.w2"} <= {g.names[v] for v in st[1]}


def test_tensor_parallel_megatrons_two_allreduces_per_block_and_pass(g, topo):
    tp_group = [0, 1]
    act = B * S * H * 2  # bf16 hidden state of one micro-batch
    one = allreduce(topo, tp_group, act)
    c = llm_costs(g, topo, ParallelConfig(tp=2), settings(precision="bf16"))
    # 2 per block, and the vocabulary-parallel embedding's (forward) / head's (backward)
    assert c.tp_comm_forward.sum() == pytest.approx((2 * L + 1) * one)
    assert c.tp_comm_backward.sum() == pytest.approx((2 * L + 1) * one)
    full = llm_costs(g, topo, ParallelConfig(tp=2), settings(recompute=_full()))
    none = llm_costs(g, topo, ParallelConfig(tp=2), settings())
    # full recompute repeats the blocks' forward all-reduces in the backward
    extra = full.tp_comm_backward.sum() - none.tp_comm_backward.sum()
    assert extra == pytest.approx(2 * L * allreduce(topo, tp_group, B * S * H * 4))
    assert llm_costs(g, topo, ParallelConfig(), settings()).tp_comm_forward.sum() == 0


def _full():
    return "full"


def test_split_nodes_take_a_tp_share_of_compute(g, topo):
    one = llm_costs(g, topo, ParallelConfig(), settings())
    two = llm_costs(g, topo, ParallelConfig(tp=2), settings())
    # compute without communication: the split share halves, the replicated stays
    comp1 = one.forward.sum()
    comp2 = two.forward.sum() - two.tp_comm_forward.sum()
    assert comp1 / 2 < comp2 < comp1


def test_memory_bytes_per_parameter_and_their_division(g, topo):
    p = gpt_parameters(hidden=H, layers=L, vocab=V, seq=S)
    mixed = settings(precision="bf16")
    c = llm_costs(g, topo, ParallelConfig(), mixed)
    m = c.memory
    assert m["params"][0] == pytest.approx(2 * p)
    assert m["gradients"][0] == pytest.approx(2 * p)
    assert m["master"][0] == pytest.approx(4 * p)
    assert m["optimizer"][0] == pytest.approx(8 * p)  # Adam: ZeRO's 16 bytes in all
    assert precision_bytes("fp32") == (4, 4, 0)
    # tensor parallelism divides what is split (all but norms, biases of rows, positions)
    t = llm_costs(g, topo, ParallelConfig(tp=2), mixed).memory
    replicated = (S * H + (2 * 2 * L + 2) * H + 2 * L * H)
    assert t["params"][0] == pytest.approx(2 * ((p - replicated) / 2 + replicated), rel=0.02)
    # FSDP shards all of it over 8, ZeRO-1 the master weights and moments over the replicas
    f = llm_costs(g, topo, ParallelConfig(dp_shard=8), settings(microbatch_size=8)).memory
    d = llm_costs(g, topo, ParallelConfig(dp=8), settings(microbatch_size=8)).memory
    assert f["params"][0] == pytest.approx(d["params"][0] / 8)
    assert f["optimizer"][0] == pytest.approx(d["optimizer"][0] / 8)


def test_activation_memory_close_to_megatrons_formula(g, topo):
    """arXiv 2205.05198: s b h (34 + 5 a s / h) bytes per layer at 2 bytes, no parallelism;
    the graph keeps no s x s matrix (flash attention), so 34 s b h against what autograd
    keeps of our blocks (the fixture has no dropout masks: their 2 s b h are missing)."""
    import numpy as np

    from shardplan.cost import saved_bytes

    st = settings(precision="bf16", microbatches=1)
    c = llm_costs(g, topo, ParallelConfig(), st)
    lay = block_layout(g)
    blocks = (lay.block >= 0) & (lay.block < L)
    kept = saved_bytes(g, np.zeros(g.num_nodes, dtype=bool), 4.0)
    per_layer = kept[blocks].sum() / 2 / L  # fp32 captured -> 2 bytes
    assert per_layer == pytest.approx(34 * S * B * H, rel=0.1)
    assert per_layer == 32 * S * B * H  # input, norm, qkv (3), attention, add, norm, 4 + 4
    assert c.memory["activations"][0] >= per_layer * L


def test_recompute_and_pipeline_in_flight_change_activations(g, topo):
    base = llm_costs(g, topo, ParallelConfig(pp=2), settings(microbatches=8))
    assert base.in_flight.tolist() == [2, 1]
    full = llm_costs(g, topo, ParallelConfig(pp=2), settings(microbatches=8,
                                                                recompute=_full()))
    assert (full.memory["activations"] < base.memory["activations"]).all()
    assert (full.backward > base.backward).all()


def test_bad_layouts_are_refused(g, topo):
    with pytest.raises(ShardplanError, match="needs 16 devices"):
        llm_costs(g, topo, ParallelConfig(tp=2, dp=8), settings(microbatch_size=8))
    with pytest.raises(ShardplanError, match="does not divide"):
        llm_costs(g, topo, ParallelConfig(dp=4), settings(microbatch_size=2))
    with pytest.raises(ShardplanError, match="cannot fill"):
        llm_costs(g, topo, ParallelConfig(pp=8), settings())


def test_check_layout_refuses_exactly_at_each_boundary(g, topo):
    """Every refusal of the one layout check, its message, and the layout just inside it."""
    from shardplan.cost._llm import check_layout

    def refused(par, st, graph=g):
        with pytest.raises(ShardplanError) as e:
            check_layout(graph, topo, par, st)
        return str(e.value)

    check_layout(g, topo, ParallelConfig(tp=2, dp=4), settings(microbatch_size=4))  # 8 of 8
    assert refused(ParallelConfig(tp=3, dp=3), settings(microbatch_size=3)) == \
        "TP 3 x DP 3 needs 9 devices, the topology has 8"
    assert refused(ParallelConfig(tp=3), settings()) == \
        "tensor parallelism 3 does not divide the model's 4 heads"
    dims = dict(g.meta["transformer"], kv_heads=2)
    gqa = g.replace(meta=dict(g.meta, transformer=dims))
    check_layout(gqa, topo, ParallelConfig(tp=2), settings())
    assert refused(ParallelConfig(tp=4), settings(), gqa) == \
        "tensor parallelism 4 does not divide the model's 2 kv heads"
    unsized = g.replace(meta=dict(g.meta, transformer=dict(dims, heads="4", kv_heads=None)))
    check_layout(unsized, topo, ParallelConfig(tp=8), settings())  # no integer to divide
    check_layout(g, topo, ParallelConfig(pp=4), settings())  # 4 blocks fill 4 stages
    assert refused(ParallelConfig(pp=4, vp=2), settings()) == \
        "4 layers cannot fill pp x vp = 8 stages"
    check_layout(g, topo, ParallelConfig(dp=2), settings(microbatch_size=2))
    assert refused(ParallelConfig(dp=2), settings(microbatch_size=3)) == \
        "a micro-batch of 3 sequences does not divide over 2 data-parallel replicas"
    # no micro-batch size: the graph's batch (2) is the micro-batch
    assert refused(ParallelConfig(dp=4), ExecutionSettings(microbatches=4)) == \
        "a micro-batch of 2 sequences does not divide over 4 data-parallel replicas"
    # interleaved 1F1B: M a multiple of max(1, M // pp)
    two = ParallelConfig(pp=2, vp=2)
    for m in (1, 2, 3, 4, 6):
        check_layout(g, topo, two, settings(microbatches=m))
    assert refused(two, settings(microbatches=5)) == (
        "interleaved 1F1B needs the micro-batches (5) to be a multiple of "
        "max(1, M // pp) = 2")
    check_layout(g, topo, ParallelConfig(pp=2), settings(microbatches=5))  # not interleaved


def test_materialized_attention_keeps_and_moves_the_scores(g, topo):
    """Korthikanti et al. 2022: 5 a s^2 b bytes per layer kept for the backward (2-byte
    activations); the flash kernel keeps none."""
    import dataclasses

    base = settings(microbatches=1, precision="bf16")
    flash = llm_costs(g, topo, ParallelConfig(), base)
    mat = llm_costs(g, topo, ParallelConfig(), dataclasses.replace(base,
                                                                  attention="materialized"))
    heads = g.meta["transformer"]["heads"]
    kept = 5 * heads * S * S * B * L
    assert mat.memory["activations"][0] - flash.memory["activations"][0] == \
        pytest.approx(kept)
    assert (mat.forward > flash.forward).all() and (mat.backward > flash.backward).all()
    with pytest.raises(ShardplanError, match="attention kernel"):
        dataclasses.replace(base, attention="x")


def test_deepspeed_module_unit_holds_a_module_and_buckets_not_two_blocks(g, topo):
    """FSDP's gathered memory: two whole blocks (FSDP2, Megatron FSDP), or under
    ``shard_unit`` ``module`` DeepSpeed ZeRO-3's running module with its prefetch bucket
    (capped by the live-parameter limit) and one gradient bucket."""
    from shardplan.cost._llm import (
        ZERO3_MAX_LIVE_PARAMS,
        ZERO3_PREFETCH_PARAMS,
        ZERO3_REDUCE_BUCKET,
    )

    par = ParallelConfig(dp_shard=8)
    block = llm_costs(g, topo, par, settings(microbatch_size=8, precision="bf16"))
    module = llm_costs(g, topo, par, settings(microbatch_size=8, precision="bf16",
                                              shard_unit="module"))
    one_block = 12 * H * H + 13 * H  # the fixture's GPT block: weights, biases, 2 norms
    assert block.memory["gathered"][0] == pytest.approx(2 * 2 * one_block, rel=0.01)
    largest = 4 * H * H + 4 * H  # the MLP's first product, the largest module here
    live = max(largest, min(largest + ZERO3_PREFETCH_PARAMS, ZERO3_MAX_LIVE_PARAMS))
    assert module.memory["gathered"][0] == pytest.approx(2 * live + 2 * ZERO3_REDUCE_BUCKET)
    # DeepSpeed keeps a half-precision parameter shard and half-precision gradients; FSDP2
    # steps its fp32 shards (no half copy kept) and holds fp32 gradients: the same bytes
    p = g.param_bytes.sum() / 4 / 8
    assert (module.memory["params"][0], block.memory["params"][0]) == (2 * p, 0)
    assert (module.memory["gradients"][0], block.memory["gradients"][0]) == (2 * p, 4 * p)
    for key in ("master", "optimizer", "activations"):
        assert module.memory[key][0] == pytest.approx(block.memory[key][0])
    # one gather per parameterized module, each with its latency: more units, more seconds
    n_param_nodes = int(np.count_nonzero(g.param_bytes > 0))
    assert module.gather_units.tolist() == [n_param_nodes]
    assert block.gather_units.tolist() == [L]
    assert module.param_gather_seconds[0] > block.param_gather_seconds[0]
    # the unit only matters when parameters are sharded
    dp = llm_costs(g, topo, ParallelConfig(dp=8), settings(microbatch_size=8,
                                                           shard_unit="module"))
    assert dp.memory["gathered"][0] == 0 and dp.param_gather_seconds[0] == 0


def test_op_recompute_keeps_what_torchtitans_policy_saves(g, topo):
    """``recompute`` ``op`` (torchtitan's per-op checkpointing): each block keeps fused
    attention's output and every other matrix product's (the 1st and 3rd of QKV, out, MLP
    up, MLP down), recomputing the rest; it costs more than selective and less than full."""
    from shardplan.cost._llm import _op_saved

    saved = {g.names[v] for v in np.flatnonzero(_op_saved(g))}
    assert saved == {f"layers.{i}.{n}" for i in range(L) for n in ("qkv", "sdpa", "w1")}
    by = {rc: llm_costs(g, topo, ParallelConfig(), settings(microbatches=1, recompute=rc))
          for rc in ("none", "selective", "op", "full")}
    extra = {rc: by[rc].backward[0] - by["none"].backward[0] for rc in by}
    assert 0 < extra["selective"] < extra["op"] < extra["full"]
    # memory: full's (block inputs and one block) plus the saved outputs of every block
    names = {n: i for i, n in enumerate(g.names)}
    outs = sum(float(g.output_bytes[names[n]]) for n in saved)
    act = {rc: by[rc].memory["activations"][0] for rc in by}
    assert act["op"] - act["full"] == pytest.approx(outs)
    assert act["full"] < act["op"] < act["none"]


def test_full_recompute_of_every_kth_block(g, topo):
    """``recompute_every`` k (torchtitan's selective_ac_option k): only the k-th, 2k-th, ...
    blocks are checkpointed; the others keep their activations and re-run nothing."""
    def costs(rc="full", every=1):
        return llm_costs(g, topo, ParallelConfig(),
                         settings(microbatches=1, recompute=rc, recompute_every=every))

    none, k1, k2, k4, k5 = (costs("none"), costs(), costs(every=2), costs(every=4),
                            costs(every=5))
    extra = {k: c.backward[0] - none.backward[0] for k, c in ((1, k1), (2, k2), (4, k4))}
    assert extra[2] == pytest.approx(extra[1] / 2)  # 2 of the 4 identical blocks
    assert extra[4] == pytest.approx(extra[1] / 4)
    act = {k: c.memory["activations"][0] for k, c in ((1, k1), (2, k2), (4, k4), (5, k5))}
    # each block not checkpointed keeps its activations instead of its input
    assert (act[2] - act[1]) / 2 == pytest.approx((act[4] - act[1]) / 3)
    assert act[1] < act[2] < act[4]
    # a period longer than the model checkpoints nothing
    assert act[5] == pytest.approx(none.memory["activations"][0])
    assert k5.backward[0] == pytest.approx(none.backward[0])


def test_gather_units_count_modules_or_blocks_and_at_least_one(g):
    """FSDP's gathers per pass: the parameterized nodes (any parameter at all) under
    DeepSpeed's module unit, else the blocks; a stage with neither still makes one."""
    from shardplan.cost._llm import _gather_units

    layout = block_layout(g)
    n_params = np.zeros(g.num_nodes)
    one_block = np.flatnonzero(layout.block == 0)
    assert _gather_units(layout, one_block, n_params, True) == 1  # nothing to gather
    assert _gather_units(layout, one_block, n_params, False) == 1  # one block
    n_params[one_block[:3]] = 1.0  # three modules of one parameter each
    assert _gather_units(layout, one_block, n_params, True) == 3
    outside = np.flatnonzero(layout.block < 0)
    assert _gather_units(layout, outside, n_params, False) == 1  # no block at all


def test_loss_over_the_logits_moves_its_counted_bytes(topo, monkeypatch):
    """A graph that ends at the logits is charged the loss's memory-bound passes on the
    stage holding the head: (32 + 6) bytes per logit element forward and (8 + 6) backward
    under half precision (the casts), 32 and 8 in fp32, split by the vocabulary over TP."""
    import shardplan.cost._llm as llm

    g = gpt_graph(hidden=H, layers=L, seq=S, vocab=V, batch=B, loss=False)
    bw = topo.devices[0].extra["memory_bandwidth"] * gpu_model(topo).memory_efficiency
    logits = B * S * V
    for prec, cast in (("bf16", 6.0), ("fp32", 0.0)):
        for par in (ParallelConfig(pp=2), ParallelConfig(pp=2, tp=2)):
            with_loss = llm_costs(g, topo, par, settings(precision=prec))
            monkeypatch.setattr(llm, "LOSS_BYTES_FORWARD", 0.0)
            monkeypatch.setattr(llm, "LOSS_BYTES_BACKWARD", 0.0)
            monkeypatch.setattr(llm, "LOSS_CAST_BYTES", 0.0)
            without = llm_costs(g, topo, par, settings(precision=prec))
            monkeypatch.undo()
            share = logits / par.tp / bw
            assert with_loss.forward[0] == without.forward[0]  # the head is on the last
            assert with_loss.forward[1] - without.forward[1] == \
                pytest.approx((32.0 + cast) * share)
            assert with_loss.backward[1] - without.backward[1] == \
                pytest.approx((8.0 + cast) * share)


def test_a_graph_with_its_own_loss_is_not_charged_twice(g):
    """A captured loss node (a model that returns its loss) is priced as any node: no
    logits node is charged on top; a graph ending at the logits charges its head."""
    from shardplan.cost._llm import _logits_node

    assert _logits_node(g, block_layout(g)) == -1
    bare = gpt_graph(hidden=H, layers=L, seq=S, vocab=V, batch=B, loss=False)
    layout = block_layout(bare)
    assert bare.ops[-1] == "linear"
    assert _logits_node(bare, layout) == bare.num_nodes - 1 == \
        int(np.flatnonzero(layout.vocab)[-1])


def test_the_logits_are_the_last_vocabulary_node_after_the_blocks():
    """A logit bias in the head's module moves the loss to it; a soft cap outside the
    vocabulary modules (tanh on the logits) does not; a model without a vocabulary head
    charges no loss."""
    from shardplan.cost._llm import _logits_node

    def logits(**kw):
        graph = gpt_graph(hidden=H, layers=L, seq=S, vocab=V, batch=B, loss=False, **kw)
        node = _logits_node(graph, block_layout(graph))
        return node if node < 0 else graph.names[node]

    assert logits() == "output"
    assert logits(after_head=(("add", "output"),)) == "output.add"
    assert logits(after_head=(("tanh", ""),)) == "output"
    assert logits(after_head=(("add", "output"), ("tanh", ""))) == "output.add"
    assert logits(head="classifier") == -1


def test_mixed_precision_step_moves_counted_bytes(g, topo):
    """The optimizer step: Adam's 28 bytes per parameter, plus Megatron's mixed-precision
    passes (16 bytes in bf16, 24 in fp16 with loss-scale unscaling), at the memory rate."""
    bw = topo.devices[0].extra["memory_bandwidth"] * gpu_model(topo).memory_efficiency
    n = g.param_bytes.sum() / 4
    for prec, extra in (("fp32", 0.0), ("bf16", 16.0), ("fp16", 24.0)):
        c = llm_costs(g, topo, ParallelConfig(), settings(precision=prec))
        assert c.optimizer_seconds[0] == pytest.approx(n * (28.0 + extra) / bw)
    sharded = llm_costs(g, topo, ParallelConfig(dp=2), settings(precision="bf16",
                                                                 gradient_sync="zero1"))
    assert sharded.optimizer_seconds[0] == pytest.approx(n * 44.0 / bw / 2)


def test_fsdp2_copies_its_blocks_out_and_its_gradients_in(g, topo):
    """torch FSDP2 (``shard_unit`` ``block``): every forward and backward copies the stage's
    gathered parameters out of the flat buffer (2 x their bytes), and each backward adds its
    share of the gradients' copy-in (parameter + gradient bytes) over the micro-batches;
    DeepSpeed's module unit and plain data parallelism copy nothing."""
    import dataclasses

    from shardplan.cost._llm import FSDP_COPY_OUT, _tied_embedding_params

    bw = topo.devices[0].extra["memory_bandwidth"] * gpu_model(topo).memory_efficiency
    w, gb, _ = precision_bytes("bf16")
    st = settings(precision="bf16", microbatch_size=4)
    par = ParallelConfig(pp=2, dp_shard=2)
    block = llm_costs(g, topo, par, st)
    module = llm_costs(g, topo, par, dataclasses.replace(st, shard_unit="module"))
    plain = llm_costs(g, topo, ParallelConfig(pp=2, dp=2), st)
    assert module.forward.tolist() == pytest.approx(plain.forward.tolist())
    layout = block_layout(g)
    p = np.array([g.param_bytes[nodes].sum() / 4 for nodes in stage_nodes(layout, par)])
    p[-1] += _tied_embedding_params(g, layout)  # the last stage's copy of the tied head
    out = FSDP_COPY_OUT * w * p / bw
    assert (block.forward - module.forward).tolist() == pytest.approx(out.tolist())
    assert (block.backward - module.backward).tolist() == \
        pytest.approx((out + (w + gb) * p / bw / st.microbatches).tolist())


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fp32_gradient_reduction(g, topo, precision):
    """``grad_reduce`` ``fp32`` (Megatron's fp32 gradient accumulation, FSDP2's fp32
    reduce_dtype): 4-byte gradients reduced and held (FSDP2 holds them so anyway), FSDP2's
    gradient copy-in writes 4 bytes, and the step skips the half-to-fp32 copy (6 bytes per
    parameter); nothing else moves. fp32 training is the same either way."""
    import dataclasses

    from shardplan.cost._formulas import GRAD_CAST_BYTES

    bw = topo.devices[0].extra["memory_bandwidth"] * gpu_model(topo).memory_efficiency
    n = g.param_bytes.sum() / 4
    for par in (ParallelConfig(dp=4), ParallelConfig(dp_shard=4), ParallelConfig(dp_shard=2),
                ParallelConfig(dp=2)):
        st = settings(precision=precision, microbatch_size=8)
        half = llm_costs(g, topo, par, st)
        full = llm_costs(g, topo, par, dataclasses.replace(st, grad_reduce="fp32"))
        assert full.grad_bytes.tolist() == pytest.approx((2 * half.grad_bytes).tolist())
        # FSDP2's sharded gradients are fp32 either way (those of its fp32 shards)
        assert full.memory["gradients"].tolist() == pytest.approx(
            (half.memory["gradients"] * (1 if par.dp_shard > 1 else 2)).tolist())
        assert full.grad_sync_seconds[0] > half.grad_sync_seconds[0]
        for k in ("params", "master", "optimizer", "activations", "gathered", "buffers"):
            assert full.memory[k].tolist() == half.memory[k].tolist()
        assert full.forward.tolist() == pytest.approx(half.forward.tolist())
        # each rank copies its whole (unsharded) gradients in, 2 bytes more per parameter
        copy_in = 2 * n / bw / st.microbatches if par.dp_shard > 1 else 0.0
        assert (full.backward - half.backward)[0] == pytest.approx(copy_in)
        share = par.data_parallel if par.dp_shard > 1 else 1
        assert (half.optimizer_seconds - full.optimizer_seconds)[0] == \
            pytest.approx(n / share * GRAD_CAST_BYTES / bw)
    # FSDP2's fp32 gradient shards beside its fp32 parameter shards, on every rank of an
    # interleaved pipeline (each rank's two virtual stages)
    par = ParallelConfig(pp=2, vp=2, dp_shard=2)
    inter = llm_costs(g, topo, par, settings(precision="bf16", microbatch_size=8,
                                             schedule="interleaved-1f1b"))
    assert inter.memory["gradients"].tolist() == inter.memory["master"].tolist()
    assert inter.memory["params"].tolist() == [0.0, 0.0]
    st = settings(precision="fp32", microbatch_size=8)
    a = llm_costs(g, topo, ParallelConfig(dp=4), st)
    b = llm_costs(g, topo, ParallelConfig(dp=4), dataclasses.replace(st, grad_reduce="fp32"))
    assert a.grad_bytes.tolist() == b.grad_bytes.tolist()
    assert a.optimizer_seconds.tolist() == b.optimizer_seconds.tolist()


def test_memory_total_buffers_and_the_graphs_dtype(g, topo):
    """Every rank's total is the sum of its categories; the model's buffers (as the graph
    records them, on every rank) are among them; a graph captured in bf16 (meta
    ``dtype_bytes`` 2) holds twice the parameters its bytes would hold in fp32."""
    par = ParallelConfig(pp=2, dp_shard=2)
    st = settings(precision="bf16", microbatch_size=4)
    plain = llm_costs(g, topo, par, st).memory
    assert plain["buffers"].tolist() == [0.0, 0.0]
    buffered = g.replace(meta={**g.meta, "buffer_bytes": 1000})
    m = llm_costs(buffered, topo, par, st).memory
    assert m["buffers"].tolist() == [1000.0, 1000.0]
    parts = ("params", "gradients", "master", "optimizer", "activations", "gathered",
             "buffers")
    assert m["total"].tolist() == pytest.approx([sum(m[k][r] for k in parts)
                                                 for r in range(2)])
    assert (m["total"] - plain["total"]).tolist() == pytest.approx([1000.0, 1000.0])
    halves = llm_costs(g.replace(meta={**g.meta, "dtype_bytes": 2}), topo, par, st).memory
    for k in ("master", "gradients", "optimizer"):
        assert halves[k].tolist() == pytest.approx((2 * plain[k]).tolist())


def test_gradient_sync_by_layout(g, topo):
    """The replicas' gradients: DDP all-reduces them, FSDP (sharded parameters or
    ``gradient_sync`` ``sharded``) and ZeRO-1 reduce-scatter them, by NCCL's rule over the
    data-parallel group; one replica syncs nothing. What is sharded divides the memory: FSDP
    all of it, ZeRO-1 the master weights and moments; every virtual stage of a rank counts."""
    from shardplan.cost._gpu import nccl_terms

    hw, nodes = gpu_model(topo), node_ids(topo)
    st = settings(precision="bf16", microbatch_size=8)
    for par, gs, kind in ((ParallelConfig(dp=4), "end", "allreduce"),
                          (ParallelConfig(dp_shard=4), "end", "reducescatter"),
                          (ParallelConfig(dp=4), "sharded", "reducescatter"),
                          (ParallelConfig(dp=4), "zero1", "reducescatter")):
        import dataclasses

        c = llm_costs(g, topo, par, dataclasses.replace(st, gradient_sync=gs))
        lat, per_byte = nccl_terms(topo, hw, kind, [0, 1, 2, 3], nodes)
        assert c.grad_sync_seconds[0] == pytest.approx(lat + c.grad_bytes[0] * per_byte)
    assert llm_costs(g, topo, ParallelConfig(), st).grad_sync_seconds.tolist() == [0.0]
    import dataclasses

    plain = llm_costs(g, topo, ParallelConfig(dp=4), st).memory
    sharded = llm_costs(g, topo, ParallelConfig(dp=4),
                        dataclasses.replace(st, gradient_sync="sharded")).memory
    zero1 = llm_costs(g, topo, ParallelConfig(dp=4),
                      dataclasses.replace(st, gradient_sync="zero1")).memory
    for k in ("master", "optimizer"):
        assert sharded[k][0] == pytest.approx(plain[k][0] / 4)
        assert zero1[k][0] == pytest.approx(plain[k][0] / 4)
    assert zero1["params"][0] == plain["params"][0]
    assert zero1["gradients"][0] == plain["gradients"][0]
    inter = llm_costs(g, topo, ParallelConfig(pp=2, vp=2, dp=2),
                      settings(precision="bf16", microbatch_size=8,
                               schedule="interleaved-1f1b", gradient_sync="zero1")).memory
    assert inter["optimizer"].tolist() == pytest.approx((2 * inter["master"]).tolist())


def test_collectives_off_gpus_use_the_topologys_ring():
    """On a topology of no GPU model (CPU processes), the data-parallel sync is the
    topology's collective of the group (shardplan.cost.collective_seconds)."""
    from shardplan.cost._collectives import collective_seconds

    g = gpt_graph(hidden=H, layers=L, seq=S, vocab=V, batch=8)
    import dataclasses

    gpus = build("flat", num_devices=4)
    flat = dataclasses.replace(gpus, devices=tuple(
        dataclasses.replace(d, extra={**d.extra, "type": "cpu"}) for d in gpus.devices))
    assert gpu_model(flat) is None
    for par, kind in ((ParallelConfig(dp=4), "allreduce"),
                      (ParallelConfig(dp_shard=4), "reducescatter")):
        c = llm_costs(g, flat, par, settings(microbatch_size=8))
        want = collective_seconds(flat, kind, np.arange(4), float(c.grad_bytes[0]))
        assert c.grad_sync_seconds[0] == pytest.approx(want)
        assert c.grad_sync_seconds[0] > 0


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_tensor_parallel_overlap_hides_at_most_the_regions_compute(g, topo, recompute):
    """Megatron's --tp-comm-overlap: each region's all-reduces hide behind its own compute,
    so the exposed communication lies strictly between none and all of it (on this small
    model both happen), and the compute itself is unchanged."""
    import dataclasses

    st = settings(microbatch_size=B, recompute=recompute)
    plain = llm_costs(g, topo, ParallelConfig(tp=4), st)
    hidden = llm_costs(g, topo, ParallelConfig(tp=4), dataclasses.replace(st, tp_comm_overlap=True))
    assert hidden.tp_comm_forward.tolist() == plain.tp_comm_forward.tolist()
    assert hidden.tp_comm_backward.tolist() == plain.tp_comm_backward.tolist()
    for a, b, comm in ((hidden.forward, plain.forward, plain.tp_comm_forward),
                       (hidden.backward, plain.backward, plain.tp_comm_backward)):
        assert comm[0] > 0
        assert b[0] - comm[0] < a[0] < b[0]


def test_sequence_parallelism_needs_tensor_parallelism(g, topo):
    """Sequence parallelism splits the norms' activations over the tensor-parallel ranks
    (less memory at TP 2); without tensor parallelism it changes nothing."""
    import dataclasses

    st = settings(microbatch_size=B)
    sp = dataclasses.replace(st, sequence_parallel=True)
    for tp in (1, 2):
        a = llm_costs(g, topo, ParallelConfig(tp=tp), st)
        b = llm_costs(g, topo, ParallelConfig(tp=tp), sp)
        if tp == 1:
            assert b.memory["activations"].tolist() == a.memory["activations"].tolist()
            assert (b.forward.tolist(), b.backward.tolist()) == \
                (a.forward.tolist(), a.backward.tolist())
        else:
            assert b.memory["activations"][0] < a.memory["activations"][0]
