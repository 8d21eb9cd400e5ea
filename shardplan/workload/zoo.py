"""The model zoo behind ``shardplan capture MODEL`` and ``shardplan train --model``.

``MODEL`` is one of

- ``mlp``: the multilayer perceptron of paper 000, section 4: three ``Linear`` layers and a
  softmax over 10 classes, on 767 bag-of-words features (767 -> 1024 -> 1024 -> 10, ReLU
  between the layers, which the paper leaves unsaid);
- ``transformer``: a small GPT-style decoder of ours (:class:`~shardplan.workload.gpt.GPTDecoder`);
- ``gnn``: paper 000's graph neural network (its Figure 2): two chains of graph convolutions
  joined by a third convolution, message passing in plain torch
  (:class:`~shardplan.workload.gnn.GNN`);
- ``torchvision:NAME``: any torchvision classification or semantic segmentation model,
  ``weights=None``;
- ``transformers:NAME``: BERT (``BertForMaskedLM``) and GPT-2 (``GPT2LMHeadModel``) built from
  their published configurations, so nothing is downloaded;
- ``gpt:hidden=H,layers=L,heads=A,vocab=V[,seq=S,ffn=F]``: a Megatron-style GPT given its
  dimensions (:class:`~shardplan.workload.gpt.MegatronGPT`);
- ``llama3:FLAVOR``, ``llama2:FLAVOR``: Llama 3 (``8B``, ``70B``, ``405B``, ``debug``) and
  Llama 2 (``7B``, ``13B``, ``70B``, ``debug``) as torchtitan defines them
  (:mod:`~shardplan.workload.llama`), with :class:`~shardplan.workload.llama.LlamaConfig`
  overrides and ``seq`` after commas (``llama3:8B,seq=4096,n_layers=2``);
- ``mixtral:FLAVOR`` (``8x7B``, ``8x22B``), ``deepseek_v3:FLAVOR`` (``671B``),
  ``qwen3_moe:FLAVOR`` (``30B-A3B``, ``235B-A22B``), ``gpt_oss:FLAVOR`` (``120B``), each with
  a ``debug`` flavor: mixtures of experts after torchtitan's (:mod:`~shardplan.workload.moe`),
  with :class:`~shardplan.workload.moe.MoEConfig` overrides and ``seq`` after commas
  (``deepseek_v3:671B,seq=4096,n_layers=5``);
- ``FILE.py:FUNCTION``: ``FUNCTION()`` in that file returns ``(model, example_inputs)``.

Models can be built on the meta device (parameters, buffers and inputs without storage):
``build_model(..., meta=True)``, or ``meta=None`` to decide by size: the LLM families are
built on meta, with a :class:`~shardplan.errors.ShardplanWarning`, when their float32
parameters would take over half of this machine's memory (:func:`needs_meta`).

``transformer``, ``gnn`` and ``transformers:NAME`` take configuration overrides after commas,
such as ``transformer,num_layers=2``, ``gnn,hidden=64`` or ``transformers:gpt2,n_layer=2``.

One module per model family: :mod:`~shardplan.workload.mlp`, :mod:`~shardplan.workload.gpt`,
:mod:`~shardplan.workload.gnn`, :mod:`~shardplan.workload.vision` (torchvision),
:mod:`~shardplan.workload.hf` (transformers), and :mod:`~shardplan.workload.llama`; this module
names them.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardplan.errors import ShardplanError, ShardplanWarning
from shardplan.workload._common import failure
from shardplan.workload._common import parse_overrides as _parse_overrides
from shardplan.workload._user import load_user_function as _load_user_function
from shardplan.workload.gnn import build_gnn as _build_gnn
from shardplan.workload.gpt import build_gpt as _build_gpt
from shardplan.workload.gpt import build_transformer as _build_transformer
from shardplan.workload.gpt import gpt_config as _gpt_config
from shardplan.workload.gpt import gpt_parameter_count as _gpt_parameter_count
from shardplan.workload.gpt import gpt_transformer_meta as _gpt_meta
from shardplan.workload.hf import HF_CONFIGS
from shardplan.workload.hf import build_hf as _build_hf
from shardplan.workload.llama import FLAVORS as _LLAMA_FLAVORS
from shardplan.workload.llama import TRAINING_SEQ as _LLAMA_TRAINING_SEQ
from shardplan.workload.llama import build_llama as _build_llama
from shardplan.workload.llama import config_of as _llama_config
from shardplan.workload.llama import parameter_count as _llama_parameter_count
from shardplan.workload.llama import transformer_meta as _llama_meta
from shardplan.workload.mlp import MLP
from shardplan.workload.moe import FLAVORS as _MOE_FLAVORS
from shardplan.workload.moe import TRAINING_SEQ as _MOE_TRAINING_SEQ
from shardplan.workload.moe import build_moe as _build_moe
from shardplan.workload.moe import config_of as _moe_config
from shardplan.workload.moe import parameter_count as _moe_parameter_count
from shardplan.workload.moe import transformer_meta as _moe_meta
from shardplan.workload.vision import build_torchvision as _build_torchvision
from shardplan.workload.vision import torchvision_names as _torchvision_names

__all__ = ["BlockSpec", "block_spec", "build_model", "check_spec_sizes", "list_models",
           "needs_meta", "parameter_estimate", "resolve_meta", "spec_seq", "training_seq"]

#: Build on the meta device when float32 parameters take more than this share of the memory.
MEMORY_SHARE = 0.5


def list_models() -> list[str]:
    """Every ``MODEL`` name the zoo knows (``FILE.py:FUNCTION`` aside).

    Lists torchvision's classification and segmentation models when torchvision imports.
    """
    names = ["mlp", "transformer", "gnn", *(f"transformers:{n}" for n in HF_CONFIGS),
             "gpt:hidden=H,layers=L,heads=A,vocab=V,seq=S", *_LLAMA_FLAVORS, *_MOE_FLAVORS]
    try:
        cls, seg = _torchvision_names()
    except ImportError:  # pragma: no cover
        return names
    return names + [f"torchvision:{n}" for n in cls + seg]


#: The size kind (:data:`shardplan._limits.LIMITS`) of each dimension key of a gpt:,
#: llama*:, MoE (mixtral:, deepseek_v3:, ...) or transformer spec.
_SPEC_SIZES = {"layers": "layers", "n_layers": "layers", "num_layers": "layers",
               "hidden": "width", "dim": "width", "ffn": "width", "ffn_dim": "width",
               "d_model": "width", "heads": "heads", "n_heads": "heads", "n_kv_heads": "heads",
               "num_heads": "heads", "vocab": "vocab", "vocab_size": "vocab",
               "seq": "sequence", "n_layer": "layers", "n_embd": "width", "n_head": "heads",
               "head_dim": "width", "moe_dim": "width", "dense_ffn_dim": "width",
               "q_lora_rank": "width", "kv_lora_rank": "width",
               # the experts' counts, as import megatron bounds --num-experts and the router's
               "num_experts": "width", "top_k": "width", "num_shared_experts": "width",
               "n_groups": "width", "topk_groups": "width", "first_k_dense": "layers"}

#: The mixture-of-experts families (:mod:`shardplan.workload.moe`).
_MOE_KINDS = frozenset(k.partition(":")[0] for k in _MOE_FLAVORS)


def spec_seq(spec: str) -> int | None:
    """The ``seq=`` of a model spec (``llama3:8B,seq=4096``), or None."""
    import re

    m = re.search(r"(?:^|[,:])seq=(\d+)(?:,|$)", spec.strip())
    return int(m.group(1)) if m else None


def training_seq(spec: str) -> tuple[int, str] | None:
    """The sequence a published flavor was trained at and what it is (``(8192, "llama3's
    training length")`` for ``llama3:8B``; :data:`~shardplan.workload.llama.TRAINING_SEQ`),
    or None: a spec of dimensions (``gpt:``), a ``debug`` flavor, any other model. A spec's
    own ``seq=`` is :func:`spec_seq`'s, and wins."""
    head = spec.strip().partition(",")[0]
    seq = _LLAMA_TRAINING_SEQ.get(head) or _MOE_TRAINING_SEQ.get(head)
    if seq is None:
        return None
    return seq, f"{head.partition(':')[0]}'s training length"


def check_spec_sizes(spec: str, *, batch_size: int | None = None,
                     seq_len: int | None = None) -> None:
    """Every size a model spec gives (``layers=``, ``hidden=``, ``seq=``, ...; a flavor's
    own sizes count too) and the batch and sequence flags, within
    :data:`shardplan._limits.LIMITS`, before anything is built; one line naming the key
    otherwise."""
    from shardplan._limits import check_size

    head, _, opts = spec.strip().partition(",")
    kind, _, name = head.partition(":")
    if kind in ("gpt", "llama2", "llama3", "transformer", "transformers") or \
            kind in _MOE_KINDS:
        # the spec's own keys first: a sequence the flag took from seq= is named as seq=
        text = (name + "," + opts) if kind == "gpt" else opts
        for item in text.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if eq and key in _SPEC_SIZES:
                try:
                    v = float(value)
                except ValueError:
                    continue  # the model's own parser says what is wrong with it
                check_size(f"{key}=", v, _SPEC_SIZES[key])
    if batch_size is not None:
        check_size("--batch-size", batch_size, "batch")
    if seq_len is not None:
        check_size("--seq-len", seq_len, "sequence")


def parameter_estimate(spec: str, *, seq_len: int = 128) -> int | None:
    """Parameters of a ``gpt:``, ``llama*:`` or MoE spec from its dimensions (no model built);
    None for the other families. Raises :class:`ShardplanError` on a bad spec."""
    head, _, opts = spec.strip().partition(",")
    kind, _, name = head.partition(":")
    if kind == "gpt":
        return _gpt_parameter_count(_gpt_config(_parse_overrides(name + "," + opts, spec),
                                                seq_len))
    if kind in ("llama2", "llama3"):
        return _llama_parameter_count(_llama_config(head, _parse_overrides(opts, spec))[0])
    if kind in _MOE_KINDS:
        return _moe_parameter_count(_moe_config(head, _parse_overrides(opts, spec))[0])
    return None


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """How a model of identical blocks is captured from two of them.

    Attributes
    ----------
    two_blocks : str
        The spec of the same model with two blocks.
    num_blocks : int
        The model's blocks.
    container : str
        The module path holding the blocks (``layers.N``).
    transformer : dict
        The full model's dimensions (a graph's ``meta["transformer"]``).
    """

    two_blocks: str
    num_blocks: int
    container: str
    transformer: dict[str, Any]


def block_spec(spec: str, *, seq_len: int = 128) -> BlockSpec | None:
    """For ``gpt:``, ``llama*:`` and MoE specs (without dense first layers), the two-block
    spec capture stamps the full depth from (:mod:`shardplan.capture._stamp`); None for the
    other families and for MoE models with dense first layers (captured whole)."""
    head, _, opts = spec.strip().partition(",")
    kind, _, name = head.partition(":")
    if kind == "gpt":
        cfg = _gpt_config(_parse_overrides(name + "," + opts, spec), seq_len)
        return BlockSpec(f"{spec},layers=2", cfg.layers, "layers", _gpt_meta(cfg))
    if kind in ("llama2", "llama3"):
        lcfg, seq = _llama_config(head, _parse_overrides(opts, spec))
        return BlockSpec(f"{spec},n_layers=2", lcfg.n_layers, "layers",
                         _llama_meta(lcfg, seq or seq_len))
    if kind in _MOE_KINDS:
        # dense first layers differ from the MoE ones: such a model is captured whole
        mcfg, seq = _moe_config(head, _parse_overrides(opts, spec))
        if mcfg.first_k_dense:
            return None
        return BlockSpec(f"{spec},n_layers=2", mcfg.n_layers, "layers",
                         _moe_meta(mcfg, seq or seq_len, kind))
    return None


def resolve_meta(spec: str, meta: bool | None, *, seq_len: int = 128) -> bool:
    """``meta`` as given, or (None) whether :func:`needs_meta`; a
    :class:`~shardplan.errors.ShardplanWarning` says when a model goes to meta by size."""
    if meta is not None:
        return bool(meta)
    if not needs_meta(spec, seq_len=seq_len):
        return False
    count = parameter_estimate(spec, seq_len=seq_len) or 0
    warnings.warn(f"{spec}: {count / 1e9:.1f} B parameters would not fit in this machine's "
                  f"memory; built on the meta device (no storage)", ShardplanWarning,
                  stacklevel=3)
    return True


def _memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 34


def needs_meta(spec: str, *, seq_len: int = 128, memory_bytes: int | None = None) -> bool:
    """Whether ``spec``'s float32 parameters would take over :data:`MEMORY_SHARE` of
    ``memory_bytes`` (default: this machine's physical memory). Known only for the
    ``gpt:`` and ``llama*:`` families (False for the others)."""
    count = parameter_estimate(spec, seq_len=seq_len)
    memory = _memory_bytes() if memory_bytes is None else memory_bytes
    return count is not None and 4 * count > MEMORY_SHARE * memory


def build_model(spec: str, *, batch_size: int = 8, seq_len: int = 128,
                image_size: int | None = None, meta: bool | None = False
                ) -> tuple[nn.Module, tuple[Any, ...], str]:
    """Build a model of the zoo and example inputs for it, deterministically.

    Parameters
    ----------
    spec : str
        ``mlp``, ``transformer[,key=value...]``, ``gnn[,key=value...]``,
        ``gpt:hidden=H,layers=L,heads=A,vocab=V[,seq=S,ffn=F]``,
        ``llama3:FLAVOR[,key=value...]``, ``llama2:FLAVOR[,key=value...]``,
        ``torchvision:NAME``, ``transformers:NAME[,key=value...]`` or ``FILE.py:FUNCTION``.
    batch_size : int
        Leading dimension of the example inputs (ignored for ``FILE.py:FUNCTION``).
    seq_len : int
        Tokens per sequence for language models (a ``gpt:`` or ``llama*:`` spec's ``seq``
        takes precedence).
    image_size : int, optional
        Height and width of image inputs (default 224; inception_v3 299).
    meta : bool or None
        True: build on the meta device (no storage; what capture needs to count FLOPs and
        bytes). None: on meta when :func:`needs_meta` says the parameters would not fit,
        with a :class:`~shardplan.errors.ShardplanWarning` saying so. False: real memory.

    Returns
    -------
    (model, example_inputs, name)
        ``example_inputs`` is a tuple of positional arguments; ``name`` a short model name.

    Raises
    ------
    ShardplanError
        Unknown model, bad option, or a user file that cannot provide a model.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ShardplanError("the model must be a non-empty name")
    spec = spec.strip()
    check_spec_sizes(spec, batch_size=batch_size, seq_len=seq_len)
    for what, v in (("batch size", batch_size), ("sequence length", seq_len)):
        if not isinstance(v, int) or v < 1:
            raise ShardplanError(f"{what} must be a positive integer, got {v!r}")
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise ShardplanError(f"image size must be a positive integer, got {image_size!r}")
    torch.manual_seed(0)
    head, _, opts = spec.partition(",")
    if ":" in spec and spec.rsplit(":", 1)[0].endswith(".py"):
        if meta:
            with torch.device("meta"):
                return _load_user_function(spec)
        return _load_user_function(spec)
    if resolve_meta(spec, meta, seq_len=seq_len):
        try:
            with torch.device("meta"):
                return _build(spec, head, opts, batch_size, seq_len, image_size, "meta")
        except (NotImplementedError, RuntimeError) as exc:  # a build that reads values
            raise ShardplanError(f"{spec!r} cannot be built on the meta device (its "
                                 f"construction reads tensor values): {failure(exc)}") from None
    return _build(spec, head, opts, batch_size, seq_len, image_size, "cpu")


def _build(spec: str, head: str, opts: str, batch_size: int, seq_len: int,
           image_size: int | None, device: str) -> tuple[nn.Module, tuple[Any, ...], str]:
    if head == "mlp":
        if opts:
            raise ShardplanError("mlp takes no options")
        return MLP(), (torch.randn(batch_size, 767),), "mlp"
    if head == "transformer":
        model, inputs = _build_transformer(_parse_overrides(opts, spec), batch_size, seq_len)
        return model, inputs, "transformer"
    if head == "gnn":
        model, inputs = _build_gnn(_parse_overrides(opts, spec), batch_size)
        return model, inputs, "gnn"
    kind, _, name = head.partition(":")
    if kind == "gpt":
        model, inputs, _ = _build_gpt(_parse_overrides(name + "," + opts, spec), batch_size,
                                      seq_len, device=device)
        return model, inputs, "gpt"
    if kind in ("llama2", "llama3"):
        model, inputs, _, _ = _build_llama(head, _parse_overrides(opts, spec), batch_size,
                                           seq_len, device=device)
        return model, inputs, head.replace(":", "-")
    if kind in _MOE_KINDS:
        model, inputs, _, _ = _build_moe(head, _parse_overrides(opts, spec), batch_size,
                                         seq_len, device=device)
        return model, inputs, head.replace(":", "-")
    if kind == "torchvision" and name:
        if opts:
            raise ShardplanError("torchvision models take no options")
        model, inputs = _build_torchvision(name, batch_size, image_size)
        return model, inputs, name
    if kind == "transformers" and name:
        model, inputs = _build_hf(name, _parse_overrides(opts, spec), batch_size, seq_len)
        return model, inputs, name
    raise ShardplanError(f"unknown model {spec!r} (expected mlp, transformer, gnn, "
                         f"gpt:hidden=...,layers=..., llama3:FLAVOR, llama2:FLAVOR, "
                         f"mixtral:FLAVOR, deepseek_v3:FLAVOR, qwen3_moe:FLAVOR, "
                         f"gpt_oss:FLAVOR, torchvision:NAME, transformers:NAME or "
                         f"FILE.py:FUNCTION)")
