"""Llama 2 / Llama 3 models (to come: issue 36). Empty on purpose: this is their room.

What goes here, so that it lands in one place:

- ``LlamaConfig``: a ``@dataclass(kw_only=True, slots=True)`` of torchtitan's model arguments
  (``dim``, ``n_layers``, ``n_heads``, ``n_kv_heads``, ``vocab_size``, ``ffn_dim_multiplier``,
  ``multiple_of``, ``norm_eps``, ``rope_theta``, ``max_seq_len``), validated in
  ``__post_init__``, and ``FLAVORS``: the published flavors by name (``llama3:8B``,
  ``llama3:70B``, ``llama3:405B``, ``llama2:7B|13B|70B``), dimensions as torchtitan defines them.
- The model: RMSNorm, rotary embeddings, grouped-query attention as one
  ``F.scaled_dot_product_attention`` call (one operator with an iteration space, so that heads
  can be split), a SwiGLU feed-forward and an untied output head; module names as torchtitan's
  (``tok_embeddings``, ``layers.N.attention.wq``, ``feed_forward.w1``, ``norm``, ``output``),
  which the tensor-parallel plans and the exporters key on. The model never knows how it is
  split.
- A ``build_llama(flavor, overrides, batch_size, seq_len, meta=...)`` that builds on the meta
  device when asked or when the model would not fit, and a line in
  :func:`shardplan.workload.zoo.build_model` and :func:`~shardplan.workload.zoo.list_models`.

The Megatron-style GPT given its dimensions (``gpt:hidden=...,layers=...``) belongs in
:mod:`shardplan.workload.gpt`, beside the small GPT decoder. Like every zoo module, this one may
import torch and :mod:`shardplan.errors`, nothing of capture, runtime or the planners.
"""

from __future__ import annotations

__all__: list[str] = []
