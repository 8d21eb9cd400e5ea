"""Public model shapes for published rows that name a model but not its dimensions.

``../shared/gpu-runs/README.md`` leaves ``hidden`` ... ``ffn`` empty where the source gives no
architecture and asks for each model's public configuration, named. Each entry below is that
configuration as the stack that ran the row defines it, with where it comes from; the rows
themselves are never read for a dimension they do not state.

Nemotron's MLP is not gated (squared ReLU: two matrices of ``hidden x ffn``); shardplan's zoo
has the gated (SwiGLU, three matrices) and the GELU (two matrices, no grouped queries) blocks.
A Nemotron is priced as the Llama-style block with grouped queries and a gated MLP of width
``2 ffn / 3``: the same parameters and matrix-product FLOPs per block (its RMSNorm for
Nemotron's LayerNorm1p and SwiGLU's elementwise product for the squared ReLU are what differ),
and the row says so.

The mixtures of experts (``../shared/gpu-runs/moe-megatron.csv``) take the same columns plus
``experts``, ``topk``, ``moe_ffn``, the stack's expert tensor-parallel size (``etp``) where it
sets one, a ``--pipeline-model-parallel-layout`` (``layout``) where the stack's run needs one,
and ``megatron_args``: the rest of the architecture and the stack's MoE settings as
Megatron-LM arguments (:func:`shardplan.importers.megatron.megatron_args_of_row` writes them
as they are). The Hugging Face configurations' vocabularies are kept unpadded, as
Megatron-Bridge and NeMo 2.0 keep them.
"""

from __future__ import annotations

import re

#: model name (lower case, spaces, dashes and underscores removed) ->
#: (columns to fill, source, note or "")
PUBLIC_SHAPES: dict[str, tuple[dict[str, str], str, str]] = {
    "gpt35b": ({"hidden": "4096", "layers": "24", "heads": "32", "ffn": "16384",
                "vocab": "50257"},
               "NeMo `GPTConfig5B` (nemo/collections/llm/gpt/model/base.py); GPT-2 BPE "
               "vocabulary", ""),
    "gpt320b": ({"hidden": "6144", "layers": "44", "heads": "48", "ffn": "24576",
                 "vocab": "50257"},
                "NeMo `GPTConfig20B` (nemo/collections/llm/gpt/model/base.py); GPT-2 BPE "
                "vocabulary", ""),
    "llama27b": ({"hidden": "4096", "layers": "32", "heads": "32", "kv_heads": "32",
                  "ffn": "11008", "vocab": "32000"},
                 "Llama 2 paper (arXiv 2307.09288) / torchtitan's llama2 flavors", ""),
    "llama213b": ({"hidden": "5120", "layers": "40", "heads": "40", "kv_heads": "40",
                   "ffn": "13824", "vocab": "32000"},
                  "Llama 2 paper (arXiv 2307.09288) / torchtitan's llama2 flavors", ""),
    "llama270b": ({"hidden": "8192", "layers": "80", "heads": "64", "kv_heads": "8",
                   "ffn": "28672", "vocab": "32000"},
                  "Llama 2 paper (arXiv 2307.09288) / torchtitan's llama2 flavors", ""),
    "nemotron8b": ({"hidden": "4096", "layers": "32", "heads": "32", "kv_heads": "32",
                    "ffn": "10922", "vocab": "256000", "model": "nemotron-as-llama"},
                   "NeMo `Nemotron3Config8B` (ffn 16,384); Nemotron-4 report's 256k vocabulary",
                   "Nemotron's squared-ReLU MLP (ffn 16,384) priced as a gated one of 10,922"),
    "nemotron22b": ({"hidden": "6144", "layers": "40", "heads": "48", "kv_heads": "48",
                     "ffn": "16384", "vocab": "256000", "model": "nemotron-as-llama"},
                    "NeMo `Nemotron4Config22B` (ffn 24,576); Nemotron-4 report's vocabulary",
                    "Nemotron's squared-ReLU MLP (ffn 24,576) priced as a gated one of 16,384"),
    "nemotron340b": ({"hidden": "18432", "layers": "96", "heads": "96", "kv_heads": "8",
                      "ffn": "49152", "vocab": "256000", "model": "nemotron-as-llama"},
                     "NeMo `Nemotron4Config340B` (ffn 73,728); Nemotron-4 340B report",
                     "Nemotron's squared-ReLU MLP (ffn 73,728) priced as a gated one of "
                     "49,152"),
    "mixtral8x7b": ({"hidden": "4096", "layers": "32", "heads": "32", "kv_heads": "8",
                     "ffn": "14336", "vocab": "32000", "experts": "8", "topk": "2",
                     "moe_ffn": "14336",
                     "megatron_args": "--disable-bias-linear --moe-token-dispatcher-type "
                                      "alltoall --moe-grouped-gemm"},
                    "mistralai/Mixtral-8x7B-v0.1 config.json (arXiv 2401.04088, table 1: no "
                    "biases, softmax over the chosen experts); the all-to-all dispatcher and "
                    "grouped GEMMs of NeMo 2.0's MoE performance recipes (inferred)", ""),
    "deepseekv3": ({"hidden": "7168", "layers": "61", "heads": "128", "kv_heads": "128",
                    "ffn": "18432", "vocab": "129280", "experts": "256", "topk": "8",
                    "moe_ffn": "2048", "etp": "1", "layout": "Et|(tt|)*30mL",
                    "megatron_args": "--disable-bias-linear --multi-latent-attention "
                                     "--q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
                                     "--qk-pos-emb-head-dim 64 --v-head-dim 128 "
                                     "--moe-layer-freq ([0]*3+[1]*58) "
                                     "--moe-shared-expert-intermediate-size 2048 "
                                     "--moe-router-score-function sigmoid "
                                     "--moe-router-num-groups 8 --moe-router-group-topk 4 "
                                     "--moe-router-topk-scaling-factor 2.5 "
                                     "--moe-router-enable-expert-bias --mtp-num-layers 1 "
                                     "--moe-token-dispatcher-type flex --moe-enable-deepep "
                                     "--moe-grouped-gemm --recompute-modules mla_up_proj mlp",
                    "recompute": "selective",
                    "nemo_recipe": "--use-distributed-optimizer --overlap-param-gather",
                    "nemo_tp_recipe": "--sequence-parallel"},
                   "deepseek-ai/DeepSeek-V3 config.json (arXiv 2412.19437, section 4.2); "
                   "Megatron-Bridge's deepseek_v3 recipe (expert TP 1, one MTP layer) and its "
                   "H100 1,024-GPU performance config (layout Et|(tt|)*30mL, DeepEP: "
                   "scripts/performance/configs/deepseek/deepseek_llm_pretrain.py; at v0.1.0rc4, "
                   "the 25.09.01 container, scripts/performance/run_script.py on H100: "
                   "recompute_modules mla_up_proj and mlp, overlap_grad_reduce off; no TP "
                   "communication overlap: the recipe's default CommOverlapConfig("
                   "tp_comm_overlap=False), which run_script does not replace for DeepSeek)", ""),
    "qwen3235ba22b": ({"hidden": "4096", "layers": "94", "heads": "64", "kv_heads": "4",
                       "ffn": "12288", "vocab": "151936", "experts": "128", "topk": "8",
                       "moe_ffn": "1536", "etp": "1",
                       "megatron_args": "--kv-channels 128 --qk-layernorm "
                                        "--disable-bias-linear --moe-token-dispatcher-type "
                                        "alltoall --moe-grouped-gemm",
                       "recompute": "none", "nemo_tp_recipe": "--sequence-parallel"},
                      "Qwen/Qwen3-235B-A22B config.json (arXiv 2505.09388, table 2: heads of "
                      "128, q/k norms, no biases); expert TP 1 as Megatron-Bridge's Qwen3 MoE "
                      "recipes set it (src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py), "
                      "the one EP 32 folds with on TP 2 x DP 16 (the row's notes); no recompute "
                      "as its 25.11 performance config runs it (v0.2.0 "
                      "scripts/performance/configs/qwen3/qwen3_llm_pretrain.py, "
                      "set_qwen3_common_configs: recompute_granularity None; "
                      "qwen3_235b_a22b_h100_config: CommOverlapConfig(tp_comm_overlap=False))",
                      ""),
    "gptoss120b": ({"hidden": "2880", "layers": "36", "heads": "64", "kv_heads": "8",
                    "ffn": "2880", "vocab": "201088", "experts": "128", "topk": "4",
                    "moe_ffn": "2880",
                    "megatron_args": "--kv-channels 64 --quick-geglu "
                                     "--activation-func-clamp-value 7.0 --glu-linear-offset 1.0 "
                                     "--softmax-type learnable --window-size 128,0 "
                                     "--window-attn-skip-freq 2 --moe-token-dispatcher-type "
                                     "alltoall --moe-grouped-gemm "
                                     "--recompute-modules layernorm moe_act",
                    "recompute": "selective", "override_micro_batch": "1"},
                   "openai/gpt-oss-120b config.json and model card (arXiv 2508.10925: heads of "
                   "64, attention sinks, a 128-token window on every other layer, biases, "
                   "SwiGLU clamped at 7); Megatron-Bridge's GPT-OSS bridge (quick-GeGLU with "
                   "offset 1, alltoall, grouped GEMMs); its 25.11 H100 performance config "
                   "(v0.2.0 scripts/performance/configs/gpt_oss/workload_base_configs.py: "
                   "micro-batch 1, recompute_modules layernorm and moe_act)",
                   "micro-batch 1 as the stack's config runs it, where the published table's 4 "
                   "contradicts its own global batch (the row's notes)"),
}


def model_key(name: str) -> str:
    """``LLAMA2-7B`` -> ``llama27b``."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def complete(row: dict[str, str]) -> tuple[dict[str, str], str]:
    """The row with its model's public dimensions filled in where it states none, and a
    note naming their source ("" when the row had them)."""
    if row.get("layers", "").strip():
        return row, ""
    name = row.get("model", "")
    # "DeepSeekV3 (dropless)": the model, not the run's qualifier
    entry = PUBLIC_SHAPES.get(model_key(name)) or \
        PUBLIC_SHAPES.get(model_key(re.sub(r"\([^)]*\)", "", name)))
    if entry is None:
        return row, ""
    cols, source, note = entry
    out = dict(row)
    for key, value in cols.items():
        if key == "model":
            out["model"] = "llama-style " + row["model"]
        elif key.startswith("override_"):  # the stack's config over a contradictory cell
            out[key[len("override_"):]] = value
        elif not out.get(key, "").strip():
            out[key] = value
    return out, f"dimensions from {source}" + (f"; {note}" if note else "")
