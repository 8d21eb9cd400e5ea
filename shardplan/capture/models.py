"""The model zoo behind ``shardplan capture MODEL``.

``MODEL`` is one of

- ``mlp``: the multilayer perceptron of paper 000, section 4: three ``Linear`` layers and a
  softmax over 10 classes, on 767 bag-of-words features (767 -> 1024 -> 1024 -> 10, ReLU
  between the layers, which the paper leaves unsaid);
- ``transformer``: a small GPT-style decoder of ours (:class:`GPTDecoder`);
- ``gnn``: paper 000's graph neural network (its Figure 2): two chains of graph convolutions
  joined by a third convolution, message passing in plain torch (:class:`GNN`);
- ``torchvision:NAME``: any torchvision classification or semantic segmentation model,
  ``weights=None``;
- ``transformers:NAME``: BERT (``BertForMaskedLM``) and GPT-2 (``GPT2LMHeadModel``) built from
  their published configurations, so nothing is downloaded;
- ``FILE.py:FUNCTION``: ``FUNCTION()`` in that file returns ``(model, example_inputs)``.

``transformer``, ``gnn`` and ``transformers:NAME`` take configuration overrides after commas,
such as ``transformer,num_layers=2``, ``gnn,hidden=64`` or ``transformers:gpt2,n_layer=2``.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardplan.errors import ShardplanError

__all__ = ["GNN", "GNNConfig", "GPTDecoder", "GPTDecoderConfig", "GraphConv", "HF_CONFIGS",
           "MLP", "OutputSelector", "build_model", "list_models"]


# ---------------------------------------------------------------------------------------- mlp
class MLP(nn.Module):
    """Paper 000's benchmark model: three ``Linear`` layers followed by a softmax."""

    def __init__(self, in_features: int = 767, hidden: int = 1024, num_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(hidden, num_classes)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x))))))


# -------------------------------------------------------------------------------- transformer
@dataclass(kw_only=True, slots=True)
class GPTDecoderConfig:
    """Sizes of :class:`GPTDecoder`."""

    vocab_size: int = 8192
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4
    max_seq_len: int = 1024
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for f in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_ratio",
                  "max_seq_len"):
            if getattr(self, f) < 1:
                raise ShardplanError(f"transformer option {f} must be positive")
        if self.d_model % self.num_heads:
            raise ShardplanError(f"transformer d_model={self.d_model} is not divisible by "
                                 f"num_heads={self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ShardplanError("transformer dropout must be in [0, 1)")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``."""

    def __init__(self, cfg: GPTDecoderConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        shape = (b, s, self.num_heads, d // self.num_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Module):
    """The position-wise MLP of a transformer block (GELU)."""

    def __init__(self, cfg: GPTDecoderConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class DecoderBlock(nn.Module):
    """A pre-LayerNorm decoder block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: GPTDecoderConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTDecoder(nn.Module):
    """A small GPT-style language model: embeddings, pre-LN decoder blocks, LM head.

    Input: token ids of shape ``(batch, seq)``; output: logits ``(batch, seq, vocab)``.
    """

    def __init__(self, cfg: GPTDecoderConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GPTDecoderConfig()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok_emb(ids) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# ---------------------------------------------------------------------------------------- gnn
@dataclass(kw_only=True, slots=True)
class GNNConfig:
    """Sizes of :class:`GNN`: a fixed graph of ``num_nodes`` nodes (a ring with
    ``chords`` extra seeded edges per node, both directions), ``in_features`` per node,
    ``hidden`` features in the convolutions, ``chain_length`` convolutions per chain."""

    num_nodes: int = 32
    in_features: int = 16
    hidden: int = 32
    num_classes: int = 4
    chain_length: int = 2
    chords: int = 2
    graph_seed: int = 0

    def __post_init__(self) -> None:
        for f in ("num_nodes", "in_features", "hidden", "num_classes", "chain_length"):
            if getattr(self, f) < 1:
                raise ShardplanError(f"gnn option {f} must be positive")
        if self.num_nodes < 3:
            raise ShardplanError("gnn option num_nodes must be at least 3 (a ring)")
        if self.chords < 0:
            raise ShardplanError("gnn option chords must be >= 0")


def gnn_edges(cfg: GNNConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` of the GNN's fixed graph: a ring and ``chords`` seeded random edges
    per node, each in both directions, without self loops or repeats."""
    n = cfg.num_nodes
    gen = torch.Generator().manual_seed(int(cfg.graph_seed))
    pairs = {(i, (i + 1) % n) for i in range(n)}
    for i in range(n):
        for j in torch.randint(0, n, (cfg.chords,), generator=gen).tolist():
            if j != i:
                pairs.add((min(i, j), max(i, j)))
    both = sorted(pairs | {(b, a) for a, b in pairs})
    src = torch.tensor([a for a, _ in both], dtype=torch.int64)
    dst = torch.tensor([b for _, b in both], dtype=torch.int64)
    return src, dst


class GraphConv(nn.Module):
    """One graph convolution over a fixed graph: ``h_v' = relu(W_self h_v + W_nbr mean_{u ->
    v} h_u)``, messages gathered with ``index_select`` and summed per receiving node with
    ``index_add`` (plain torch, no graph library). Input and output ``(batch, nodes,
    features)``; the graph is the same for every sample (buffers, not inputs)."""

    def __init__(self, in_features: int, out_features: int, src: torch.Tensor,
                 dst: torch.Tensor, num_nodes: int) -> None:
        super().__init__()
        self.self_lin = nn.Linear(in_features, out_features)
        self.nbr_lin = nn.Linear(in_features, out_features, bias=False)
        deg = torch.zeros(num_nodes).index_add(0, dst, torch.ones(dst.numel()))
        self.register_buffer("src", src.clone(), persistent=False)
        self.register_buffer("dst", dst.clone(), persistent=False)
        self.register_buffer("inv_deg", (1.0 / deg.clamp_min(1.0)).unsqueeze(-1),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        messages = x.index_select(1, self.src)
        summed = torch.zeros_like(x).index_add(1, self.dst, messages)
        return torch.relu(self.self_lin(x) + self.nbr_lin(summed * self.inv_deg))


class GNN(nn.Module):
    """Paper 000's graph neural network (its Figure 2): two chains of graph convolutions
    over the same input, joined by a third convolution on their concatenated features, then
    a mean over the nodes and a linear classifier (graph classification).

    Input: node features ``(batch, nodes, in_features)``; output: logits ``(batch,
    classes)``. Captured at module level with ``--atomic GraphConv``, every convolution is
    one vertex (the readout and classifier fold into the joining one).
    """

    def __init__(self, cfg: GNNConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GNNConfig()
        src, dst = gnn_edges(cfg)

        def chain() -> nn.ModuleList:
            sizes = [cfg.in_features] + [cfg.hidden] * cfg.chain_length
            return nn.ModuleList(GraphConv(a, b, src, dst, cfg.num_nodes)
                                 for a, b in zip(sizes, sizes[1:], strict=False))

        self.chain_a = chain()
        self.chain_b = chain()
        self.combine = GraphConv(2 * cfg.hidden, cfg.hidden, src, dst, cfg.num_nodes)
        self.head = nn.Linear(cfg.hidden, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x
        for conv in self.chain_a:
            a = conv(a)
        b = x
        for conv in self.chain_b:
            b = conv(b)
        h = self.combine(torch.cat([a, b], dim=-1))
        return self.head(h.mean(dim=1))


def _build_gnn(overrides: dict[str, Any], batch_size: int) -> tuple[nn.Module, tuple[Any, ...]]:
    known = {f.name for f in fields(GNNConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ShardplanError(f"unknown gnn option {bad[0]!r} (choose from "
                             f"{', '.join(sorted(known))})")
    for k, v in overrides.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise ShardplanError(f"gnn option {k} must be an integer, got {v!r}")
    cfg = GNNConfig(**overrides)
    model = GNN(cfg)
    return model, (torch.randn(batch_size, cfg.num_nodes, cfg.in_features),)


# --------------------------------------------------------------------------------- wrappers
class OutputSelector(nn.Module):
    """Wraps a model whose output is a dict or tuple so that ``forward`` returns one tensor.

    Capture strips the ``model.`` prefix this wrapper adds to module paths.
    """

    prefix = "model."

    def __init__(self, model: nn.Module, key: Any) -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, *args: Any) -> torch.Tensor:
        return self.model(*args)[self.key]


# ------------------------------------------------------------------------------ huggingface
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


def _build_hf(name: str, overrides: dict[str, Any], batch_size: int, seq_len: int
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


# -------------------------------------------------------------------------------- torchvision
_TV_INPUT = {"inception_v3": 299}
_TV_KWARGS = {"inception_v3": {"aux_logits": False, "init_weights": False},
              "googlenet": {"aux_logits": False, "init_weights": False}}


def _torchvision_names() -> tuple[list[str], list[str]]:
    import torchvision

    cls = torchvision.models.list_models(module=torchvision.models)
    seg = torchvision.models.list_models(module=torchvision.models.segmentation)
    return sorted(cls), sorted(seg)


def _build_torchvision(name: str, batch_size: int, image_size: int | None
                       ) -> tuple[nn.Module, tuple[Any, ...]]:
    try:
        import torchvision
    except ImportError as exc:  # pragma: no cover
        raise ShardplanError(f"torchvision:{name} needs torchvision ({exc})") from None
    cls, seg = _torchvision_names()
    if name not in cls and name not in seg:
        close = difflib.get_close_matches(name.lower(), cls + seg, n=5, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else \
            " (see torchvision.models.list_models())"
        raise ShardplanError(f"unknown torchvision classification or segmentation model "
                             f"{name!r}{hint}")
    kwargs = dict(_TV_KWARGS.get(name, {}))
    if name in seg:
        kwargs["weights_backbone"] = None  # its default would download ImageNet weights
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    if name in seg:
        model = OutputSelector(model, "out")
    size = image_size or _TV_INPUT.get(name, 224)
    return model, (torch.randn(batch_size, 3, size, size),)


# -------------------------------------------------------------------------------- user file
def _failure(exc: BaseException) -> str:
    """One line saying how the user's code failed: its exception's first line, or the
    ``sys.exit`` it called (whose status must not become the command's)."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:200]}"


def _load_user_function(spec: str) -> tuple[nn.Module, tuple[Any, ...], str]:
    path, func_name = spec.rsplit(":", 1)
    if not os.path.isfile(path):
        raise ShardplanError(f"model file {path!r} does not exist")
    mod_name = f"_shardplan_user_{abs(hash(os.path.abspath(path)))}"
    loader = importlib.util.spec_from_file_location(mod_name, path)
    if loader is None or loader.loader is None:
        raise ShardplanError(f"cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(loader)
    sys.modules[mod_name] = module
    try:
        loader.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's file may fail any way
        sys.modules.pop(mod_name, None)
        raise ShardplanError(f"importing {path!r} failed: {_failure(exc)}") from None
    fn = getattr(module, func_name, None)
    if fn is None or not callable(fn):
        raise ShardplanError(f"{path!r} has no function {func_name!r}")
    try:
        result = fn()
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        raise ShardplanError(f"{func_name}() in {path!r} failed: {_failure(exc)}") from None
    if not (isinstance(result, (tuple, list)) and len(result) == 2
            and isinstance(result[0], nn.Module)):
        raise ShardplanError(f"{func_name}() in {path!r} must return (model, example_inputs) "
                             f"with model a torch.nn.Module, got {type(result).__name__}")
    model, inputs = result
    return model, normalize_inputs(inputs, what=f"{func_name}() in {path!r}"), func_name


def normalize_inputs(inputs: Any, *, what: str = "example_inputs") -> tuple[Any, ...]:
    """A single tensor or a sequence of arguments as a tuple of positional arguments."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    raise ShardplanError(f"{what}: example inputs must be a tensor or a tuple of arguments, "
                         f"got {type(inputs).__name__}")


# ---------------------------------------------------------------------------------- registry
def _parse_overrides(text: str, spec: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in (p for p in text.split(",") if p.strip()):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip():
            raise ShardplanError(f"bad option {part!r} in model {spec!r}: expected key=value")
        raw = raw.strip()
        value: Any
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[key.strip()] = value
    return out


def _build_transformer(overrides: dict[str, Any], batch_size: int, seq_len: int
                       ) -> tuple[nn.Module, tuple[Any, ...]]:
    known = {f.name for f in fields(GPTDecoderConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ShardplanError(f"unknown transformer option {bad[0]!r} (choose from "
                             f"{', '.join(sorted(known))})")
    values = {**overrides}
    values.setdefault("max_seq_len", max(1024, seq_len))
    cfg = GPTDecoderConfig(**values)
    if seq_len > cfg.max_seq_len:
        raise ShardplanError(f"--seq-len {seq_len} exceeds max_seq_len {cfg.max_seq_len}")
    model = GPTDecoder(cfg)
    return model, (torch.randint(0, cfg.vocab_size, (batch_size, seq_len)),)


def list_models() -> list[str]:
    """Every ``MODEL`` name the zoo knows (``FILE.py:FUNCTION`` aside).

    Lists torchvision's classification and segmentation models when torchvision imports.
    """
    names = ["mlp", "transformer", "gnn", *(f"transformers:{n}" for n in HF_CONFIGS)]
    try:
        cls, seg = _torchvision_names()
    except ImportError:  # pragma: no cover
        return names
    return names + [f"torchvision:{n}" for n in cls + seg]


def build_model(spec: str, *, batch_size: int = 8, seq_len: int = 128,
                image_size: int | None = None) -> tuple[nn.Module, tuple[Any, ...], str]:
    """Build a model of the zoo and example inputs for it, deterministically.

    Parameters
    ----------
    spec : str
        ``mlp``, ``transformer[,key=value...]``, ``gnn[,key=value...]``, ``torchvision:NAME``,
        ``transformers:NAME[,key=value...]`` or ``FILE.py:FUNCTION``.
    batch_size : int
        Leading dimension of the example inputs (ignored for ``FILE.py:FUNCTION``).
    seq_len : int
        Tokens per sequence for language models.
    image_size : int, optional
        Height and width of image inputs (default 224; inception_v3 299).

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
    for what, v in (("batch size", batch_size), ("sequence length", seq_len)):
        if not isinstance(v, int) or v < 1:
            raise ShardplanError(f"{what} must be a positive integer, got {v!r}")
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise ShardplanError(f"image size must be a positive integer, got {image_size!r}")
    torch.manual_seed(0)
    head, _, opts = spec.partition(",")
    if ":" in spec and spec.rsplit(":", 1)[0].endswith(".py"):
        return _load_user_function(spec)
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
    if kind == "torchvision" and name:
        if opts:
            raise ShardplanError("torchvision models take no options")
        model, inputs = _build_torchvision(name, batch_size, image_size)
        return model, inputs, name
    if kind == "transformers" and name:
        model, inputs = _build_hf(name, _parse_overrides(opts, spec), batch_size, seq_len)
        return model, inputs, name
    raise ShardplanError(f"unknown model {spec!r} (expected mlp, transformer, gnn, "
                         f"torchvision:NAME, transformers:NAME or FILE.py:FUNCTION)")

