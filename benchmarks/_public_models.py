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
"""

from __future__ import annotations

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
}


def model_key(name: str) -> str:
    """``LLAMA2-7B`` -> ``llama27b``."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def complete(row: dict[str, str]) -> tuple[dict[str, str], str]:
    """The row with its model's public dimensions filled in where it states none, and a
    note naming their source ("" when the row had them)."""
    if row.get("layers", "").strip():
        return row, ""
    entry = PUBLIC_SHAPES.get(model_key(row.get("model", "")))
    if entry is None:
        return row, ""
    cols, source, note = entry
    out = dict(row)
    for key, value in cols.items():
        if key == "model":
            out["model"] = "llama-style " + row["model"]
        elif not out.get(key, "").strip():
            out[key] = value
    return out, f"dimensions from {source}" + (f"; {note}" if note else "")
