"""Iteration spaces of layers (PaSE, paper 004 section II) and their configurations.

A layer's iteration space ("domain") is an ordered tuple of named dimensions with sizes; a
*configuration* gives every dimension a split factor. The space also says how the tensors the
layer produces and reads map onto its dimensions, which is what the re-sharding cost of an edge
needs: ``output`` lists, per dimension of the output tensor, the space dimensions it is made of
(a reshape's merged dimension lists several), ``inputs`` does the same per producer node id.

JSON form (a graph node's ``space``)::

    {"kind": "gemm", "dims": [["b", 128], ["n", 4096], ["k", 9216]], "fixed": [],
     "m": ["b"], "n": ["n"], "k": ["k"], "pw": 1,
     "output": [["b"], ["n"]], "output_shape": [128, 4096],
     "inputs": {"17": [["b"], ["k"]]}, "weight": ["n", "k"]}

Kinds and the attributes their cost formula reads (``../shared/pase-cost-model.md``):

========================  ===================================================================
``gemm``                  ``m``, ``n``, ``k``, ``batch`` (lists of dims), ``pw`` (fused
                          pointwise ops); fully connected, convolution, einsum, embedding
``lstm``                  dims ``(L, S, B, N, K)``; the whole multi-layer LSTM
``pool``                  ``window`` ``[R, S]``, ``input_hw`` (input height, width); dims
                          ``(b, c, h, w)``
``attention``             dims ``(b, h, q, k, d)``: scaled dot-product attention as one
                          operator (``softmax(q k^T) v`` over batch, heads, query, key and
                          head dimension), ``batch`` (the dims splitting without
                          communication, ``b`` and ``h``), ``causal``; ``q``, ``k``, ``d``
                          fixed by capture; flash attention (no s x s tensor is kept)
``elementwise``           ``pw``
``norm``, ``softmax``     ``axis``
``softmax_ce``            ``axis`` (the class axis)
``reduce_mean``           ``axes``
``reshape``, ``concat``,  no cost (data movement only, charged on edges)
``split``, ``transpose``
``opaque``                a captured op we do not model: ``flops`` (forward + backward),
                          ``param_words``; only its batch dimension may split
========================  ===================================================================

Configuration enumeration follows the note: for a dimension of size d the allowed factors are
the divisors e of d with d / e >= cutoff (only 1 if none qualifies, and only 1 for the
dimensions in ``fixed``), and a configuration is any combination whose product is at most p.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardplan.errors import InvalidFileError
from shardplan.ir import Graph

__all__ = ["KINDS", "Space", "allowed_factors", "batch_only", "configurations", "graph_spaces"]

KINDS = ("gemm", "lstm", "attention", "pool", "elementwise", "norm", "softmax", "softmax_ce",
         "reduce_mean", "reshape", "concat", "split", "transpose", "opaque")

_MAX_SIZE = 2**53  # sizes are multiplied as float64: beyond this they are not exact

_STRUCT_KEYS = {"kind", "dims", "fixed", "output", "output_shape", "inputs", "weight",
                "dtype_bytes"}


@dataclass(frozen=True)
class Space:
    """A layer's iteration space.

    Attributes
    ----------
    kind : str
        One of :data:`KINDS`: which cost formula applies.
    dims : tuple of str
        Dimension names, in the order configurations list their factors.
    sizes : tuple of int
    fixed : tuple of str
        Dimensions that never split (a convolution's output height and width, the LSTM's
        sequence, a concat's axis, a reshape's non-leading merged dimensions).
    output : tuple of tuple of str
        Per dimension of the output tensor, the space dimensions it spans.
    output_shape : tuple of int
    inputs : mapping of str to tuple of tuple of str
        Per producer node id (as a string), the space dimensions of each dimension of the
        tensor read from it (an empty tuple: a tensor dimension the layer does not split).
    weight : tuple of str
        Dimensions of the layer's parameters (memory of the ``default`` cost model).
    dtype_bytes : int
    attrs : mapping
        Kind-specific attributes (see the module docstring).
    """

    kind: str
    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    fixed: tuple[str, ...] = ()
    output: tuple[tuple[str, ...], ...] = ()
    output_shape: tuple[int, ...] = ()
    inputs: Mapping[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    weight: tuple[str, ...] = ()
    dtype_bytes: int = 4
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidFileError(f"unknown space kind {self.kind!r} (known: "
                                   f"{', '.join(KINDS)})")
        if len(self.dims) != len(self.sizes) or len(set(self.dims)) != len(self.dims):
            raise InvalidFileError(f"space dims {self.dims!r} must be distinct, one size each")
        if any(int(s) < 1 for s in self.sizes):
            raise InvalidFileError(f"space sizes must be positive, got {self.sizes!r}")
        if any(int(s) > _MAX_SIZE for s in self.sizes):
            raise InvalidFileError(f"space sizes must be below 2^53, got {max(self.sizes)}")
        known = set(self.dims)
        groups = [*self.output, *(g for t in self.inputs.values() for g in t)]
        for names in (self.fixed, self.weight, *groups):
            for nm in names:
                if nm not in known:
                    raise InvalidFileError(f"space of kind {self.kind!r} names dimension "
                                           f"{nm!r} that is not one of {list(self.dims)}")
        if len(self.output) != len(self.output_shape):
            raise InvalidFileError("space 'output' and 'output_shape' differ in length")
        if self.kind == "attention":
            if self.dims != ("b", "h", "q", "k", "d"):
                raise InvalidFileError(f"an attention space has dims (b, h, q, k, d), got "
                                       f"{self.dims!r}")
            batch = self.attrs.get("batch", ["b", "h"])
            if not isinstance(batch, (list, tuple)) or any(x not in known for x in batch):
                raise InvalidFileError(f"attention 'batch' must list dimensions of "
                                       f"{list(self.dims)}, got {batch!r}")

    # ------------------------------------------------------------------ queries
    def index(self, name: str) -> int:
        return self.dims.index(name)

    def indices(self, names: Sequence[str]) -> list[int]:
        return [self.dims.index(nm) for nm in names]

    def output_parts(self, configs: Any) -> np.ndarray:
        """Per configuration (a row of split factors, one per dimension), the parts the
        output is split into: the product of the factors of the dimensions its output's
        dimensions are made of. O(K d)."""
        f = np.asarray(configs, dtype=np.float64).reshape(-1, len(self.dims))
        parts = np.ones(f.shape[0])
        for g in self.output:
            if g:
                parts = parts * np.prod(f[:, self.indices(list(g))], axis=1)
        return parts

    @property
    def batch_dim(self) -> str | None:
        """The dimension the batch-only fallback splits (attribute ``batch_dim``, else the
        first dimension)."""
        return self.attrs.get("batch_dim", self.dims[0] if self.dims else None)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        dims = [[n, int(s)] for n, s in zip(self.dims, self.sizes, strict=True)]
        d: dict[str, Any] = {"kind": self.kind, "dims": dims}
        if self.fixed:
            d["fixed"] = list(self.fixed)
        d["output"] = [list(g) for g in self.output]
        d["output_shape"] = [int(s) for s in self.output_shape]
        d["inputs"] = {k: [list(g) for g in v] for k, v in self.inputs.items()}
        if self.weight:
            d["weight"] = list(self.weight)
        if self.dtype_bytes != 4:
            d["dtype_bytes"] = self.dtype_bytes
        d.update(self.attrs)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Space:
        try:
            dims = [(str(n), int(s)) for n, s in data["dims"]]
            return cls(
                kind=str(data["kind"]), dims=tuple(n for n, _ in dims),
                sizes=tuple(s for _, s in dims),
                fixed=tuple(str(x) for x in data.get("fixed", ())),
                output=tuple(tuple(str(x) for x in g) for g in data.get("output", ())),
                output_shape=tuple(int(x) for x in data.get("output_shape", ())),
                inputs={str(k): tuple(tuple(str(x) for x in g) for g in v)
                        for k, v in (data.get("inputs") or {}).items()},
                weight=tuple(str(x) for x in data.get("weight", ())),
                dtype_bytes=int(data.get("dtype_bytes", 4)),
                attrs={k: v for k, v in data.items() if k not in _STRUCT_KEYS},
            )
        except InvalidFileError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidFileError(f"malformed space: {type(exc).__name__}: {exc}") from None


def batch_only(batch_size: int, *, flops: float = 0.0, param_words: float = 0.0,
               output_words: float = 0.0) -> Space:
    """The space of a node nobody described: one ``batch`` dimension (kind ``opaque``).

    Its output is taken as a ``(batch, rest)`` tensor, so that edges between two such nodes
    cost nothing when both split the batch alike.
    """
    rest = max(1, round(output_words / max(batch_size, 1)))
    return Space(kind="opaque", dims=("batch",), sizes=(int(batch_size),),
                 output=(("batch",), ()), output_shape=(int(batch_size), int(rest)),
                 attrs={"flops": float(flops), "param_words": float(param_words)})


def allowed_factors(size: int, devices: int, cutoff: int) -> list[int]:
    """Divisors e of ``size`` with ``size / e >= cutoff`` and ``e <= devices`` (at least 1).

    O(min(devices, size / cutoff)): only factors up to ``devices`` can be used, so a huge
    dimension costs no more than a small one.
    """
    size, cutoff = int(size), max(1, int(cutoff))
    top = min(int(devices), size // cutoff)
    if top < 1:
        return [1]
    e = np.arange(1, top + 1, dtype=np.int64)
    good = e[size % e == 0].tolist()
    return good if good else [1]


def configurations(space: Space, devices: int, cutoff: int = 4) -> np.ndarray:
    """Every configuration of ``space`` on ``devices`` devices, as a ``(K, len(dims))`` int64
    array in lexicographic order of the dimensions' factors.

    Built one dimension at a time, dropping partial products above ``devices``, so the work is
    proportional to the output (at most a few hundred rows for p <= 64).
    """
    rows = np.ones((1, 0), dtype=np.int64)
    prods = np.ones(1, dtype=np.int64)
    fixed = set(space.fixed)
    for name, size in zip(space.dims, space.sizes, strict=True):
        fac = [1] if name in fixed else allowed_factors(int(size), devices, cutoff)
        f = np.asarray(fac, dtype=np.int64)
        new_prod = (prods[:, None] * f[None, :]).reshape(-1)
        keep = new_prod <= devices
        rows = np.concatenate([np.repeat(rows, len(f), axis=0),
                               np.tile(f, len(prods))[:, None]], axis=1)[keep]
        prods = new_prod[keep]
    return rows


def graph_spaces(graph: Graph) -> list[Space]:
    """Every node's space; nodes without one get :func:`batch_only`."""
    out = []
    for i in range(graph.num_nodes):
        raw = None if graph.spaces is None else graph.spaces[i]
        if raw is None:
            out.append(batch_only(graph.batch_size,
                                  flops=float(graph.fwd_flops[i] + graph.bwd_flops[i]),
                                  param_words=float(graph.param_bytes[i]) / 4.0,
                                  output_words=float(graph.output_bytes[i]) / 4.0))
        else:
            try:
                out.append(raw if isinstance(raw, Space) else Space.from_dict(raw))
            except InvalidFileError as exc:
                raise InvalidFileError(f"node {i} ({graph.names[i]!r}): {exc}") from None
    return out
