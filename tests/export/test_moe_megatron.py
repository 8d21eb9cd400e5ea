"""Issue 47: the Megatron-LM export of a mixture-of-experts plan carries the experts, the
expert grid (EP, ETP) and the MoE settings; megatron-core's own ``TransformerConfig`` (its
MoE, MLA and pipeline-layout checks) and ``RankGenerator`` (the expert groups it folds into
each pipeline rank) accept them, and the importer reads the same plan back."""

from __future__ import annotations

import json
import shlex
from typing import Any

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.export import export
from shardplan.importers._moe import flavor_model, layer_pattern
from shardplan.importers._run import ModelDims, RunConfig, execution_of
from shardplan.importers.megatron import parse_megatron
from shardplan.ir import Graph, ParallelConfig
from shardplan.ir.parallel import balanced_stage_layers
from shardplan.topology import build
from tests.helpers import plan_of_run

#: the models' own arguments (what the export leaves to the user, as for a dense model)
_DSV3 = ("--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --seq-length 4096 "
         "--padded-vocab-size 129280 --ffn-hidden-size 18432 --swiglu --disable-bias-linear "
         "--normalization RMSNorm --position-embedding-type rope "
         "--untie-embeddings-and-output-weights --multi-latent-attention --q-lora-rank 1536 "
         "--kv-lora-rank 512 --moe-router-score-function sigmoid --moe-router-num-groups 8 "
         "--moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5 ")
_MIXTRAL = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
            "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 "
            "--padded-vocab-size 32000 --swiglu --disable-bias-linear --normalization RMSNorm "
            "--position-embedding-type rope --untie-embeddings-and-output-weights ")
_QWEN3 = ("--num-layers 94 --hidden-size 4096 --num-attention-heads 64 --seq-length 4096 "
          "--group-query-attention --num-query-groups 4 --kv-channels 128 --qk-layernorm "
          "--padded-vocab-size 151936 --swiglu --disable-bias-linear --normalization RMSNorm "
          "--position-embedding-type rope --untie-embeddings-and-output-weights ")
_GPT_OSS = ("--num-layers 36 --hidden-size 2880 --num-attention-heads 64 --seq-length 4096 "
            "--group-query-attention --num-query-groups 8 --kv-channels 64 "
            "--padded-vocab-size 201088 --quick-geglu --activation-func-clamp-value 7.0 "
            "--softmax-type learnable --window-size 128,0 --window-attn-skip-freq 2 "
            "--normalization RMSNorm --position-embedding-type rope "
            "--untie-embeddings-and-output-weights ")

#: name -> (model, its arguments, degrees, micro-batch, global batch, settings)
PLANS: dict[str, tuple[ModelDims, str, dict[str, Any], int, int, dict[str, Any]]] = {
    # the published DeepSeek-V3 layout: Et|(tt|)*30|L on PP 8 x VP 4, EP 64, ETP 1
    "dsv3": (flavor_model("deepseek_v3:671B", 4096), _DSV3,
             {"tp": 2, "pp": 8, "vp": 4, "dp": 64, "ep": 64, "etp": 1,
              "stage_layers": (1,) + (2,) * 30 + (0,)}, 1, 8192,
             {"precision": "bf16", "grad_reduce": "fp32", "sequence_parallel": True,
              "recompute": "selective", "gradient_sync": "zero1",
              "moe": {"moe_dispatcher": "alltoall", "moe_capacity_factor": None,
                      "moe_grouped_gemm": True}}),
    "mixtral-dropping": (flavor_model("mixtral:8x7B", 4096), _MIXTRAL,
                         {"tp": 2, "dp": 8, "ep": 4}, 1, 64,
                         {"precision": "bf16", "grad_reduce": "fp32", "sequence_parallel": True,
                          "moe": {"moe_dispatcher": "allgather", "moe_capacity_factor": 1.25,
                                  "moe_grouped_gemm": False,
                                  "moe_load_balancing": "seq_aux_loss"}}),
    # EP 32 over TP 2 x DP 16: the experts take the TP ranks (ETP 1)
    "qwen3": (flavor_model("qwen3_moe:235B-A22B", 4096), _QWEN3,
              {"tp": 2, "pp": 8, "vp": 4, "dp": 16, "ep": 32, "etp": 1,
               "stage_layers": balanced_stage_layers(94, 32, embedding=True, loss=True)},
              1, 2048, {"precision": "bf16", "grad_reduce": "fp32", "sequence_parallel": True,
                        "gradient_sync": "zero1",
                        "moe": {"moe_dispatcher": "alltoall", "moe_capacity_factor": None,
                                "moe_grouped_gemm": True}}),
    "gpt-oss": (flavor_model("gpt_oss:120B", 4096), _GPT_OSS,
                {"pp": 4, "dp": 16, "ep": 8}, 4, 512,
                {"precision": "bf16", "grad_reduce": "fp32", "recompute": "full",
                 "moe": {"moe_dispatcher": "alltoall", "moe_capacity_factor": None,
                         "moe_grouped_gemm": True}}),
}


def graph_of(model: ModelDims) -> Graph:
    """A chain graph of the model (embedding, blocks, norm, head) carrying the mixture of
    experts as a captured zoo model records it."""
    assert model.moe is not None
    modules = ["tok_embeddings"] + [f"layers.{i}" for i in range(model.num_layers)] + \
        ["norm", "output"]
    n = len(modules)
    moe = model.moe
    meta = {"input_shapes": [[1, model.seq_len]], "input_dtypes": ["int64"],
            "transformer": {"layers": model.num_layers, "experts": moe.num_experts,
                            "top_k": moe.top_k, "moe_ffn": moe.moe_ffn,
                            "shared_experts": moe.shared_experts,
                            "first_k_dense": moe.first_k_dense}}
    return Graph.from_arrays(name="moe", fwd_flops=np.full(n, 1e9), src=np.arange(n - 1),
                             dst=np.arange(1, n), names=[f"n{i}" for i in range(n)],
                             ops=["linear"] * n, modules=modules, batch_size=1,
                             param_bytes=np.full(n, 1024), output_bytes=np.full(n, 4096),
                             meta=meta)


def layout(name: str, stack: str = "megatron-core") -> tuple[RunConfig, Any, Graph]:
    model, _, degrees, micro, glob, settings = PLANS[name]
    par = ParallelConfig(**degrees)
    run = RunConfig(model=model, num_gpus=par.world_size, parallel=par, micro_batch_size=micro,
                    global_batch=glob, source="test",
                    execution=execution_of(par, micro_batch_size=micro, global_batch=glob,
                                           stack=stack, **settings))
    graph = graph_of(model)
    return run, plan_of_run(run, graph.num_nodes), graph


def _export(name: str) -> tuple[RunConfig, dict[str, Any], Any]:
    run, plan, graph = layout(name)
    out = export(plan, graph, build("flat", num_devices=run.parallel.world_size), "megatron")
    return run, json.loads(out.text), out


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_export_round_trips(name: str) -> None:
    """The model's own arguments and the export's: the same model, grid and settings."""
    run, data, out = _export(name)
    again = parse_megatron(PLANS[name][1] + data["args_text"], num_gpus=run.parallel.world_size)
    assert again.model.spec == run.model.spec
    assert again.parallel == run.parallel
    assert (again.micro_batch_size, again.global_batch) == (run.micro_batch_size,
                                                            run.global_batch)
    settings, _ = run.settings()
    back, _ = again.settings()
    assert back == settings
    for key in ("moe_dispatcher", "moe_capacity_factor", "moe_grouped_gemm",
                "moe_load_balancing"):
        assert again.execution.get(key) == run.execution.get(key), key
    par = run.parallel
    assert (data["expert_model_parallel_size"], data["expert_tensor_parallel_size"],
            data["num_experts"]) == (par.ep, par.expert_tp, run.model.moe.num_experts)
    assert out.notes == ()


def test_megatron_export_of_the_moe_arguments() -> None:
    _, data, _ = _export("dsv3")
    args = data["args"]
    tail = args[args.index("--num-experts"):]
    assert tail == ["--num-experts", "256", "--moe-router-topk", "8", "--moe-ffn-hidden-size",
                    "2048", "--moe-shared-expert-intermediate-size", "2048",
                    "--moe-layer-freq", "([0]*3+[1]*58)", "--expert-model-parallel-size", "64",
                    "--expert-tensor-parallel-size", "1", "--moe-token-dispatcher-type",
                    "alltoall", "--moe-grouped-gemm"]
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et|(tt|)*30L"
    assert "--num-virtual-stages-per-pipeline-rank" not in args
    _, data, _ = _export("mixtral-dropping")
    args = data["args"]
    assert args[args.index("--expert-model-parallel-size"):] == [
        "--expert-model-parallel-size", "4", "--moe-token-dispatcher-type", "allgather",
        "--moe-expert-capacity-factor", "1.25", "--moe-router-load-balancing-type",
        "seq_aux_loss"]


_CORE = {"--tensor-model-parallel-size": "tensor_model_parallel_size",
         "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
         "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
         "--context-parallel-size": "context_parallel_size",
         "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
         "--num-experts": "num_moe_experts", "--moe-router-topk": "moe_router_topk",
         "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
         "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
         "--expert-model-parallel-size": "expert_model_parallel_size",
         "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
         "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
         "--moe-expert-capacity-factor": "moe_expert_capacity_factor",
         "--moe-router-load-balancing-type": "moe_router_load_balancing_type"}
_INTS = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
         "virtual_pipeline_model_parallel_size", "num_moe_experts", "moe_router_topk",
         "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
         "expert_model_parallel_size", "expert_tensor_parallel_size"}


def _core_kwargs(args: list[str], run: RunConfig) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for i, a in enumerate(args):
        if a in _CORE:
            name = _CORE[a]
            value: Any = args[i + 1]
            kw[name] = int(value) if name in _INTS else float(value) \
                if name == "moe_expert_capacity_factor" else value
        elif a == "--moe-layer-freq":
            kw["moe_layer_freq"] = list(layer_pattern(args[i + 1], run.model.num_layers))
    kw["moe_grouped_gemm"] = "--moe-grouped-gemm" in args
    kw["sequence_parallel"] = "--sequence-parallel" in args
    return kw


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_core_accepts_the_moe_export(name: str) -> None:
    """megatron-core's TransformerConfig (MLATransformerConfig for DeepSeek-V3) with the
    exported arguments runs its MoE, MLA, pipeline-layout and parallel checks."""
    core = pytest.importorskip("megatron.core.transformer.transformer_config")
    torch = pytest.importorskip("torch")
    run, data, _ = _export(name)
    m = run.model
    kw = _core_kwargs(data["args"], run)
    cls = core.TransformerConfig
    model_kw: dict[str, Any] = {"num_query_groups": m.num_kv_heads, "ffn_hidden_size": m.ffn,
                                "gated_linear_unit": True, "add_bias_linear": name == "gpt-oss"}
    if name == "dsv3":
        cls = core.MLATransformerConfig
        model_kw = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128,
                    "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "ffn_hidden_size": m.ffn,
                    "gated_linear_unit": True, "add_bias_linear": False}
    elif name in ("qwen3", "gpt-oss"):
        model_kw["kv_channels"] = 128 if name == "qwen3" else 64
    conf = cls(num_layers=m.num_layers, hidden_size=m.hidden, num_attention_heads=m.num_heads,
               pipeline_dtype=torch.bfloat16, bf16=True, params_dtype=torch.bfloat16,
               **model_kw, **kw)
    par = run.parallel
    assert (conf.expert_model_parallel_size, conf.expert_tensor_parallel_size) == (
        par.ep, par.expert_tp)
    assert conf.num_moe_experts == m.moe.num_experts
    assert (conf.virtual_pipeline_model_parallel_size or 1) == par.vp
    if conf.pipeline_model_parallel_layout is not None:
        lay = conf.pipeline_model_parallel_layout
        per_stage = [sum(1 for t in lay.layout[j % par.pp][j // par.pp]
                         if t.name == "decoder") for j in range(par.num_stages)]
        assert tuple(per_stage) == par.layers_per_stage(m.num_layers)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_folds_the_experts_as_the_plan_does(name: str) -> None:
    """megatron-core's RankGenerator (the expert grid of initialize_model_parallel, default
    order tp-cp-ep-dp-pp) makes the plan's expert-parallel, expert-TP and expert-DP groups
    (ParallelConfig.expert_coordinates), and the same pipeline groups as the dense grid."""
    ps = pytest.importorskip("megatron.core.parallel_state")
    run, data, _ = _export(name)
    par = run.parallel
    world = par.world_size
    etp, ep = data["expert_tensor_parallel_size"], data["expert_model_parallel_size"]
    order = "tp-cp-ep-dp-pp"
    experts = ps.RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * par.pp), pp=par.pp,
                               cp=1, order=order)
    dense = ps.RankGenerator(tp=par.tp, ep=1, dp=par.data_parallel, pp=par.pp, cp=par.cp,
                             order=order)
    assert experts.get_ranks("pp") == dense.get_ranks("pp")

    def ours(axis: str) -> list[list[int]]:
        groups: dict[tuple, list[int]] = {}
        for r in range(world):
            c = par.expert_coordinates(r)
            groups.setdefault(tuple(v for k, v in c.items() if k != axis), []).append(r)
        return sorted(groups.values())

    for axis, token in (("ep", "ep"), ("etp", "tp"), ("edp", "dp")):
        assert sorted(sorted(g) for g in experts.get_ranks(token)) == ours(axis), axis


def test_moe_plans_megatron_cannot_take_are_refused() -> None:
    from dataclasses import replace

    run, plan, graph = layout("mixtral-dropping")
    dense = Graph.from_arrays(name="moe", fwd_flops=np.ones(graph.num_nodes),
                              src=np.arange(graph.num_nodes - 1),
                              dst=np.arange(1, graph.num_nodes), modules=graph.modules,
                              ops=["linear"] * graph.num_nodes,
                              names=[f"n{i}" for i in range(graph.num_nodes)], batch_size=1)
    with pytest.raises(ShardplanError, match=r"^the plan splits experts \(TP 2 x DP 8 x EP 4\) "
                                             r"and graph 'llm' has no mixture of experts"):
        export(plan, dense, build("flat", num_devices=16), "megatron")
    with pytest.raises(ShardplanError, match=r"^deepspeed's config has no expert parallelism"):
        export(plan, graph, build("flat", num_devices=16), "deepspeed")
    torch = json.loads(export(plan, graph, build("flat", num_devices=16), "torch").text)
    assert (torch["expert_parallel"], torch["expert_tensor_parallel"],
            torch["expert_data_parallel"], torch["num_experts"]) == (4, 2, 2, 8)
    # a dense plan of a mixture of experts: no expert grid, the experts' own arguments
    flat = replace(plan, parallel=ParallelConfig(tp=2, dp=8))
    args = json.loads(export(flat, graph, build("flat", num_devices=16), "megatron").text)[
        "args"]
    assert args[args.index("--num-experts"):args.index("--num-experts") + 2] == [
        "--num-experts", "8"]
    assert shlex.join(args).count("--expert-model-parallel-size 1") == 1


def test_layouts_unroll_as_megatron_core_unrolls_them() -> None:
    """The importer's reading of --pipeline-model-parallel-layout is megatron-core's
    (PipelineParallelLayerLayout.parse_str_to_list), on the layouts the export writes and
    on Megatron's own examples."""
    core = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    from shardplan.export._moe import megatron_layout
    from shardplan.importers._megatron_moe import _layout_stages_text

    names = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    written = [megatron_layout(ParallelConfig(pp=2, vp=2, stage_layers=c))
               for c in ((1, 2, 2, 0), (3, 2, 2, 3), (0, 4, 4, 1))]
    for text in ("Et|(tt|)*30mL", "Et*3|(tt|)*29,m|L", "(Et|)*1(t*2|)*3L", "E|t|t|L",
                 *written):
        theirs = core.PipelineParallelLayerLayout.parse_str_to_list(text)
        assert _layout_stages_text(text) == ["".join(names[x.name] for x in s) for s in theirs]
