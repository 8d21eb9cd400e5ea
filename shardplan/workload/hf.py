"""Hugging Face ``transformers`` models of the zoo (``transformers:NAME[,key=value...]``).

BERT (``BertForMaskedLM``) and GPT-2 (``GPT2LMHeadModel``) built from their published
configurations (:data:`HF_CONFIGS`), so nothing is downloaded; ``transformers`` is imported
only when one is built.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardplan.errors import ShardplanError

__all__ = ["HF_CONFIGS", "build_hf"]


#: Published configurations (the values of the Hugging Face hub's config.json files).
HF_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-tiny": ("bert", {"num_hidden_layers": 2, "hidden_size": 128,
                           "num_attention_heads": 2, "intermediate_size": 512}),
    "bert-mini": ("bert", {"num_hidden_layers": 4, "hidden_size": 256,
                           "num_attention_heads": 4, "intermediate_size": 1024}),
    "bert-small": ("bert", {"num_hidden_layers": 4, "hidden_size": 512,
                            "num_attention_heads": 8, "intermediate_size": 2048}),
    "bert-medium": ("bert", {"num_hidden_layers": 8, "hidden_size": 512,
                             "num_attention_heads": 8, "intermediate_size": 2048}),
    "bert-base": ("bert", {"num_hidden_layers": 12, "hidden_size": 768,
                           "num_attention_heads": 12, "intermediate_size": 3072}),
    "bert-large": ("bert", {"num_hidden_layers": 24, "hidden_size": 1024,
                            "num_attention_heads": 16, "intermediate_size": 4096}),
    "gpt2": ("gpt2", {"n_layer": 12, "n_embd": 768, "n_head": 12}),
    "gpt2-medium": ("gpt2", {"n_layer": 24, "n_embd": 1024, "n_head": 16}),
    "gpt2-large": ("gpt2", {"n_layer": 36, "n_embd": 1280, "n_head": 20}),
    "gpt2-xl": ("gpt2", {"n_layer": 48, "n_embd": 1600, "n_head": 25}),
}
_BERT_COMMON = {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2,
                "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                "attention_probs_dropout_prob": 0.1, "layer_norm_eps": 1e-12}
_GPT2_COMMON = {"vocab_size": 50257, "n_positions": 1024, "n_ctx": 1024,
                "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
                "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "use_cache": False}

_hf_classes: dict[str, type[nn.Module]] = {}


def _hf_class(family: str) -> type[nn.Module]:
    """``BertForMaskedLM`` / ``GPT2LMHeadModel`` subclasses whose forward returns the logits.

    Subclassing (rather than wrapping) keeps the module paths the published ones.
    """
    if family not in _hf_classes:
        if family == "bert":
            from transformers import BertForMaskedLM

            class BertMLMLogits(BertForMaskedLM):
                def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
                    return super().forward(input_ids=input_ids).logits

            _hf_classes[family] = BertMLMLogits
        else:
            from transformers import GPT2LMHeadModel

            class GPT2LMLogits(GPT2LMHeadModel):
                def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
                    return super().forward(input_ids=input_ids, use_cache=False).logits

            _hf_classes[family] = GPT2LMLogits
    return _hf_classes[family]


def build_hf(name: str, overrides: dict[str, Any], batch_size: int, seq_len: int
              ) -> tuple[nn.Module, tuple[Any, ...]]:
    if name not in HF_CONFIGS:
        raise ShardplanError(f"unknown transformers model {name!r} (choose from "
                             f"{', '.join(HF_CONFIGS)})")
    family, sizes = HF_CONFIGS[name]
    try:
        if family == "bert":
            from transformers import BertConfig as Config
            values = {**_BERT_COMMON, **sizes}
        else:
            from transformers import GPT2Config as Config
            values = {**_GPT2_COMMON, **sizes}
    except ImportError as exc:  # pragma: no cover - transformers is a declared extra
        raise ShardplanError(f"transformers:{name} needs the 'transformers' package "
                             f"({exc})") from None
    default = Config()
    for key in overrides:
        if not hasattr(default, key):
            raise ShardplanError(f"unknown {Config.__name__} option {key!r} in "
                                 f"transformers:{name}")
    values.update(overrides)
    if family == "gpt2":  # GPT-2's special token ids (50256) are used only in generation:
        for key in ("bos_token_id", "eos_token_id"):  # a smaller vocabulary drops them
            if key not in overrides and values.get("vocab_size", 50257) <= 50256:
                values[key] = None
    cfg = Config(**values, attn_implementation="sdpa")
    max_pos = cfg.max_position_embeddings if family == "bert" else cfg.n_positions
    if seq_len > max_pos:
        raise ShardplanError(f"--seq-len {seq_len} exceeds {name}'s {max_pos} positions")
    model = _hf_class(family)(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch_size, seq_len))
    return model, (ids,)
