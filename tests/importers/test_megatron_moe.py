"""Issue 47: Megatron-LM's mixture-of-experts arguments imported (the experts, the router,
multi-latent attention, the expert grid, the MoE settings, the pipeline layout), and what
Megatron-LM / megatron-core refuse refused in one line."""

from __future__ import annotations

import pytest

from shardplan.errors import ShardplanError
from shardplan.importers._megatron_moe import layout_stages
from shardplan.importers.megatron import parse_megatron
from shardplan.ir import ParallelConfig

_RUN = ("--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 "
        "--normalization RMSNorm --position-embedding-type rope "
        "--untie-embeddings-and-output-weights --swiglu --disable-bias-linear ")
DSV3 = _RUN + (
    "--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --padded-vocab-size 129280 "
    "--ffn-hidden-size 18432 --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
    "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq '([0]*3+[1]*58)' "
    "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
    "--qk-pos-emb-head-dim 64 --v-head-dim 128 --moe-router-score-function sigmoid "
    "--moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5 "
    "--moe-router-enable-expert-bias ")
MIXTRAL = _RUN + (
    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
    "--num-query-groups 8 --ffn-hidden-size 14336 --vocab-size 32000 --num-experts 8 ")
QWEN3 = _RUN + (
    "--num-layers 94 --hidden-size 4096 --num-attention-heads 64 --group-query-attention "
    "--num-query-groups 4 --kv-channels 128 --qk-layernorm --ffn-hidden-size 12288 "
    "--padded-vocab-size 151936 --num-experts 128 --moe-router-topk 8 "
    "--moe-ffn-hidden-size 1536 ")
GPT_OSS = (
    "--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 "
    "--normalization RMSNorm --position-embedding-type rope "
    "--untie-embeddings-and-output-weights --num-layers 36 --hidden-size 2880 "
    "--num-attention-heads 64 --group-query-attention --num-query-groups 8 --kv-channels 64 "
    "--ffn-hidden-size 2880 --padded-vocab-size 201088 --num-experts 128 --moe-router-topk 4 "
    "--moe-ffn-hidden-size 2880 --quick-geglu --activation-func-clamp-value 7.0 "
    "--glu-linear-offset 1.0 --softmax-type learnable --window-size 128,0 "
    "--window-attn-skip-freq 2 ")


def test_deepseek_v3_with_its_layout_and_expert_grid() -> None:
    run = parse_megatron(DSV3 + "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 "
                         "--pipeline-model-parallel-layout 'Et|(tt|)*30mL' --mtp-num-layers 1 "
                         "--expert-model-parallel-size 64 --expert-tensor-parallel-size 1 "
                         "--sequence-parallel --moe-token-dispatcher-type flex "
                         "--moe-enable-deepep --moe-grouped-gemm", num_gpus=1024)
    assert run.model.spec == "deepseek_v3:671B,seq=4096"
    assert run.parallel == ParallelConfig(tp=2, pp=8, dp=64, vp=4, ep=64, etp=1,
                                          stage_layers=(1,) + (2,) * 30 + (0,))
    assert run.parallel.expert_dp == 2
    assert {k: v for k, v in run.execution.items() if k.startswith("moe")} == {
        "moe_dispatcher": "alltoall", "moe_capacity_factor": None, "moe_grouped_gemm": True,
        "moe_force_balance": False, "moe_a2a_overlap": False}
    assert run.notes == (
        "--mtp-num-layers 1: multi-token prediction layers are not modelled",
        "--moe-token-dispatcher-type flex (DeepEP's or HybridEP's kernels) moves each token "
        "to its experts' ranks and back as alltoall does: modelled as alltoall")
    settings, notes = run.settings()
    assert (settings.moe_dispatcher, settings.moe_capacity_factor,
            settings.moe_grouped_gemm) == ("alltoall", None, True)
    assert notes == []


def test_mixtral_by_megatrons_defaults_and_its_settings() -> None:
    """Megatron-LM's defaults: top-2, the experts' width the FFN's, the allgather dispatcher,
    no grouped GEMM; the expert tensor-parallel size equal to TP is the default (unset)."""
    run = parse_megatron(MIXTRAL + "--tensor-model-parallel-size 2 "
                         "--expert-model-parallel-size 4 --expert-tensor-parallel-size 2 "
                         "--sequence-parallel", num_gpus=16)
    assert run.model.spec == "mixtral:8x7B,seq=4096"
    assert run.parallel == ParallelConfig(tp=2, dp=8, ep=4)
    assert run.execution["moe_dispatcher"] == "allgather"
    assert run.execution["moe_grouped_gemm"] is False
    assert run.notes == ()
    dropping = parse_megatron(MIXTRAL + "--moe-expert-capacity-factor 1.25 "
                              "--moe-router-load-balancing-type seq_aux_loss "
                              "--moe-token-dispatcher-type alltoall", num_gpus=8)
    assert dropping.execution["moe_capacity_factor"] == 1.25
    assert dropping.execution["moe_load_balancing"] == "seq_aux_loss"
    assert dropping.notes == (
        "--moe-router-load-balancing-type seq_aux_loss is recorded, not priced: shardplan "
        "prices the published wait for the busiest expert rank (shardplan/cost/_llm_moe.py), "
        "none under --moe-router-force-load-balancing",)
    settings, notes = dropping.settings()
    assert (settings.moe_capacity_factor, settings.moe_dispatcher) == (1.25, "alltoall")
    assert notes == []  # the recorded balancing is no setting of the plan's, and says nothing
    dropless = parse_megatron(MIXTRAL + "--moe-expert-capacity-factor -1", num_gpus=8)
    assert dropless.execution["moe_capacity_factor"] is None


def test_qwen3_and_gpt_oss_are_their_flavors() -> None:
    qwen = parse_megatron(QWEN3 + "--tensor-model-parallel-size 2 --pipeline-model-parallel-size"
                          " 8 --num-virtual-stages-per-pipeline-rank 4 "
                          "--account-for-embedding-in-pipeline-split "
                          "--account-for-loss-in-pipeline-split --expert-model-parallel-size 32 "
                          "--expert-tensor-parallel-size 1 --sequence-parallel", num_gpus=256)
    assert qwen.model.spec == "qwen3_moe:235B-A22B,seq=4096"
    assert (qwen.parallel.ep, qwen.parallel.etp, qwen.parallel.expert_dp) == (32, 1, 1)
    assert qwen.parallel.layers_per_stage(94)[:2] == (2, 3)
    oss = parse_megatron(GPT_OSS + "--pipeline-model-parallel-size 4 "
                         "--expert-model-parallel-size 8", num_gpus=64)
    assert oss.model.spec == "gpt_oss:120B,seq=4096"
    assert (oss.parallel.ep, oss.parallel.etp, oss.parallel.dp) == (8, None, 16)


def test_a_changed_model_is_its_flavor_with_overrides() -> None:
    run = parse_megatron(MIXTRAL.replace("--num-layers 32", "--num-layers 4") +
                         "--moe-router-topk 1 --moe-router-pre-softmax --vocab-size 32001",
                         num_gpus=1)
    # Megatron pads 32,001 to a multiple of 128; pre-softmax routing renormalises nothing
    assert run.model.spec == ("mixtral:8x7B,n_layers=4,vocab_size=32128,top_k=1,"
                              "route_norm=false,seq=4096")


def test_moe_arguments_without_experts_do_nothing_and_say_so() -> None:
    run = parse_megatron("--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                         "--seq-length 32 --vocab-size 100 --micro-batch-size 1 "
                         "--num-experts 0 --moe-router-topk 2 --moe-grouped-gemm", num_gpus=1)
    assert run.model.moe is None and "moe_dispatcher" not in run.execution
    assert run.notes == ("--moe-router-topk without --num-experts does nothing",
                         "--moe-grouped-gemm without --num-experts does nothing")


@pytest.mark.parametrize(("extra", "gpus", "reason"), [
    ("--expert-model-parallel-size 3", 3,
     "--num-experts 8 is not a multiple of --expert-model-parallel-size 3"),
    ("--expert-model-parallel-size 8 --tensor-model-parallel-size 2", 8,
     "etp x ep = 2 x 8 to divide a pipeline rank's 8 devices"),
    ("--moe-layer-freq 2", 1, "dense layers first"),
    ("--moe-shared-expert-intermediate-size 1000", 1, "not a whole number of experts"),
    ("--moe-router-topk 1", 1, "without --moe-router-pre-softmax"),
    ("--moe-router-group-topk 2", 1, "needs --moe-router-num-groups"),
    ("--moe-router-enable-expert-bias", 1, "needs --moe-router-score-function sigmoid"),
    ("--moe-router-score-function relu", 1, "softmax or sigmoid"),
    ("--moe-expert-capacity-factor 0", 1, "drops every token"),
    ("--moe-expert-capacity-factor 1 --moe-router-load-balancing-type sinkhorn", 1,
     "works with aux_loss"),
    ("--moe-router-load-balancing-type most", 1, "is one of aux_loss"),
    ("--moe-token-dispatcher-type ring", 1, "allgather, alltoall or flex"),
    ("--moe-enable-deepep", 1, "needs --moe-token-dispatcher-type flex"),
    ("--moe-router-num-groups 3 --moe-router-group-topk 1", 1,
     "--moe-router-num-groups 3 does not divide --num-experts 8"),
    ("--moe-router-load-balancing-type", 1, "one or more values"),
])
def test_what_megatron_refuses(extra: str, gpus: int, reason: str) -> None:
    with pytest.raises(ShardplanError, match=reason) as exc:
        parse_megatron(MIXTRAL + extra, num_gpus=gpus)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(("args", "reason"), [
    (MIXTRAL.replace("--swiglu ", ""), "have gated experts"),
    (MIXTRAL.replace("--disable-bias-linear ", "") + "--tensor-model-parallel-size 2 "
     "--sequence-parallel", "biases in the experts only with expert tensor parallelism 1"),
    (GPT_OSS.replace("--window-attn-skip-freq 2 ", ""), "every other layer"),
    (GPT_OSS.replace("128,0", "128,4"), "sees no later token"),
    (GPT_OSS.replace("--softmax-type learnable", "--softmax-type fancy"), "vanilla, off-by"),
    ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
     "--vocab-size 100 --micro-batch-size 1 --expert-model-parallel-size 2", "needs a mixture"),
])
def test_models_shardplan_cannot_build_are_refused(args: str, reason: str) -> None:
    with pytest.raises(ShardplanError, match=reason):
        parse_megatron(args, num_gpus=2)


def test_gpt_oss_biases_with_expert_tp_1_and_unmodelled_attention_options() -> None:
    run = parse_megatron(GPT_OSS + "--tensor-model-parallel-size 2 --sequence-parallel "
                         "--expert-tensor-parallel-size 1", num_gpus=2)
    assert run.model.spec == "gpt_oss:120B,seq=4096" and run.parallel.etp == 1
    plain = parse_megatron(GPT_OSS.replace("learnable", "off-by-one"), num_gpus=1)
    assert plain.model.spec == "gpt_oss:120B,attn_sinks=false,seq=4096"
    assert "--softmax-type off-by-one is modelled as the plain softmax" in plain.notes


@pytest.mark.parametrize(("layout", "pp", "layers", "mtp", "want"), [
    ("Et|(tt|)*30mL", 8, 61, 1, (4, (1,) + (2,) * 30 + (0,))),
    ("Et*3|(tt|)*29,m|L", 16, 61, 1, (2, (3,) + (2,) * 29 + (0, 0))),
    ("Ett|ttL", 2, 4, 0, (1, None)),
    ("Et*2|t*2|t*2|t*2L", 2, 8, 0, (2, None)),
])
def test_pipeline_layouts(layout: str, pp: int, layers: int, mtp: int, want: tuple) -> None:
    assert layout_stages(layout, pp, layers, mtp, []) == want


@pytest.mark.parametrize(("layout", "extra", "reason"), [
    ("Ett|ttL", "--num-virtual-stages-per-pipeline-rank 2", "Megatron-LM refuses it with"),
    ("Ett|ttL", "--decoder-first-pipeline-num-layers 2", "exclude each other"),
    ("Ett|tt|L", "", "3 stages, not a multiple of the 2 pipeline ranks"),
    ("tt|EttL", "", "starts with the embedding"),
    ("Ett|Ltt", "", "ends with the loss"),
    ("Ett|tL", "", "places 3 decoder layers"),
    ("Ett|tmtL", "--mtp-num-layers 1", "decoder layers after the MTP layers"),
    ("Ett|ttmL", "", "places 1 MTP layers"),
    ("Ett|tt?L", "", "holds E, t, m, L"),
])
def test_bad_layouts(layout: str, extra: str, reason: str) -> None:
    with pytest.raises(ShardplanError, match=reason):
        parse_megatron("--num-layers 4 --hidden-size 64 --num-attention-heads 4 "
                       "--seq-length 32 --vocab-size 100 --micro-batch-size 1 "
                       f"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                       f"'{layout}' {extra}", num_gpus=2)


def test_a_dense_model_with_a_layout() -> None:
    run = parse_megatron("--num-layers 5 --hidden-size 64 --num-attention-heads 4 "
                         "--seq-length 32 --vocab-size 100 --micro-batch-size 1 "
                         "--global-batch-size 4 --pipeline-model-parallel-size 2 "
                         "--pipeline-model-parallel-layout 'Et|tt|t|tL'", num_gpus=2)
    assert (run.parallel.vp, run.parallel.stage_layers) == (2, (1, 2, 1, 1))
