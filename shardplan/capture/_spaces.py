"""PaSE iteration spaces of captured aten operators (paper 004 section II).

:func:`op_spaces` gives every captured op a ``space`` dict (see
:mod:`shardplan.strategy.spaces`). Recognised ops get the space their cost formula needs:

* ``linear``, ``addmm``, ``mm``, ``matmul``, ``bmm``: a GEMM over the output's leading
  dimensions (m, or batch for ``bmm``), its last (n) and the reduced one (k);
* ``conv2d`` / ``convolution`` (2-d): the note's convolution domain
  ``(b, c, h, w, r, s, o)`` with output height and width never split;
* ``max_pool2d``, ``avg_pool2d``: pooling with the kernel as window;
* ``batch_norm`` variants (axis: batch), ``layer_norm`` (axis: last), ``softmax`` /
  ``log_softmax`` (axis: the op's dim), ``mean`` (``reduce_mean`` over its dims);
* ``embedding``: a GEMM (one-hot times table); ``cat``: concat, its axis fixed;
* ``scaled_dot_product_attention`` (and the fused kernels it dispatches to): one
  ``attention`` operator over ``(b, h, q, k, d)`` (batch, heads, query, key, head dimension):
  batch and heads split freely; query, key and head dimension are fixed (splitting them is
  context parallelism or a split reduction, not a layout of this one operator), so query,
  key and value map their batch and heads only; ``causal`` records ``is_causal``;
* ``view``, ``reshape``, ``flatten``, ``transpose``, ``permute``: zero-cost data movement whose
  dimensions are the output's; shape-preserving ops (``relu``, ``add``, ``gelu``, dropout,
  ...): elementwise.

Anything else gets a batch-only space. Tensor dimensions of an input map onto the op's
dimensions of the same position when the ranks agree and the sizes match; otherwise only the
leading (batch) dimension maps, when it is the same size, which keeps every edge costable; a
reshape that merges or splits leading dimensions maps the outer one (a batch split of
``(b, s, h)`` is the same split of its ``(b s, h)`` view). This is a conservative reading: a
re-layout the mapping does not capture is charged as a re-shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ATTENTION_OPS", "graph_spaces_of", "op_spaces", "shapes_of"]

#: Operator names captured as one attention operator with a (b, h, q, k, d) space.
ATTENTION_OPS = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention")

_ELEMENTWISE = {"relu", "relu_", "gelu", "silu", "tanh", "sigmoid", "add", "add_", "sub",
                "mul", "div", "dropout", "native_dropout", "hardtanh", "hardtanh_", "clone",
                "contiguous", "alias", "detach", "neg", "exp", "pow", "sqrt", "rsqrt",
                "where", "masked_fill", "_to_copy", "to", "type_as"}
_MOVE = {"view": "reshape", "_unsafe_view": "reshape", "reshape": "reshape",
         "flatten": "reshape", "transpose": "transpose", "t": "transpose",
         "permute": "transpose", "expand": "transpose", "unsqueeze": "reshape",
         "squeeze": "reshape", "slice": "split", "split": "split", "chunk": "split",
         "select": "split"}


def _shape(val: Any) -> tuple[int, ...] | None:
    shape = getattr(val, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None


def _names(r: int) -> list[str]:
    return [f"d{i}" for i in range(r)]


def op_spaces(ops: Sequence[str], out_shapes: Sequence[tuple[int, ...] | None],
              in_shapes: Sequence[Sequence[tuple[int, ...] | None]],
              uses: Sequence[tuple[int, int, tuple[int, ...] | None]],
              args: Sequence[Sequence[Any]], batch_size: int) -> list[dict[str, Any] | None]:
    """One space per op (None: let the planner use a batch-only space).

    Parameters
    ----------
    ops : op names (``conv2d``)
    out_shapes : per op, the shape of its (first) output tensor
    in_shapes : per op, the shapes of its tensor arguments in order
    uses : ``(producer, consumer, shape)`` of every tensor flowing between ops
    args : per op, its positional arguments (ints and lists are read: dims, strides)
    batch_size : int
    """
    spaces: list[dict[str, Any] | None] = []
    for i, op in enumerate(ops):
        try:
            spaces.append(_one(op, out_shapes[i], in_shapes[i], args[i]))
        except (IndexError, TypeError, ValueError, ZeroDivisionError):
            spaces.append(None)
    # Input mappings, now that every producer's output is known.
    for prod, cons, shape in uses:
        sp = spaces[cons]
        src = spaces[prod]
        if sp is None or src is None:
            continue
        rank = len(src["output"])
        groups: list[list[str]] = [[] for _ in range(rank)]
        dims = dict((n, s) for n, s in sp["dims"])
        mine = sp.get("_in_dims")
        if mine is not None and shape is not None and len(shape) == rank:
            for j, (n, s) in enumerate(zip(mine, shape, strict=False)):
                if n is not None and dims.get(n) == s and n not in sp.get("fixed", ()):
                    groups[j] = [n]
        elif rank and shape and sp["dims"] and sp["dims"][0][1] == shape[0]:
            groups[0] = [sp["dims"][0][0]]
        if sp["kind"] == "reshape" and rank and shape and sp["dims"] and not any(groups):
            # a reshape that merges or splits the leading dimensions ((b, s, h) to
            # (b s, h) and back): a split of the outer dimension is the same contiguous
            # split on both sides, so the batch maps (DTensor views it without moving data)
            first, size = sp["dims"][0]
            if first not in sp.get("fixed", ()) and (size % shape[0] == 0
                                                      or shape[0] % size == 0):
                groups[0] = [first]
        sp["inputs"][str(prod)] = groups
    for sp in spaces:
        if sp is not None:
            sp.pop("_in_dims", None)
    return spaces


def _space(kind: str, dims: list[tuple[str, int]], out: Sequence[str], **kw: Any
           ) -> dict[str, Any]:
    sizes = dict(dims)
    return {"kind": kind, "dims": [[n, int(s)] for n, s in dims],
            "output": [[n] for n in out], "output_shape": [int(sizes[n]) for n in out],
            "inputs": {}, **kw}


def _one(op: str, out: tuple[int, ...] | None, ins: Sequence[tuple[int, ...] | None],
         args: Sequence[Any]) -> dict[str, Any] | None:
    if out is None or len(out) == 0:
        return None
    r = len(out)
    names = _names(r)
    first = ins[0] if ins else None
    if op in ("linear", "addmm", "mm", "matmul") and first is not None and r >= 2:
        k = first[-1]
        dims = [*zip(names[:-1], out[:-1], strict=True), ("n", out[-1]), ("k", k)]
        return _space("gemm", dims, [*names[:-1], "n"], m=names[:-1], n=["n"], k=["k"],
                      weight=["n", "k"] if op in ("linear", "addmm") else [],
                      _in_dims=[*names[:-1], "k"])
    if op == "bmm" and first is not None and r == 3:
        dims = [("d0", out[0]), ("m", out[1]), ("n", out[2]), ("k", first[-1])]
        return _space("gemm", dims, ["d0", "m", "n"], batch=["d0"], m=["m"], n=["n"],
                      k=["k"], _in_dims=["d0", "m", "k"])
    if op in ("conv2d", "convolution") and first is not None and r == 4 and len(ins) > 1:
        w = ins[1]
        if w is None or len(w) != 4:
            return None
        dims = [("b", out[0]), ("c", first[1]), ("h", out[2]), ("w", out[3]), ("r", w[2]),
                ("s", w[3]), ("o", out[1])]
        return _space("gemm", dims, ["b", "o", "h", "w"], fixed=["h", "w"],
                      m=["b", "h", "w"], n=["o"], k=["c", "r", "s"],
                      weight=["c", "r", "s", "o"], _in_dims=["b", "c", None, None])
    if op in ("max_pool2d", "avg_pool2d", "max_pool2d_with_indices") and r == 4:
        k = args[1] if len(args) > 1 else 1
        k = list(k) if isinstance(k, (list, tuple)) else [k, k]
        if len(k) == 1:
            k = k * 2
        dims = list(zip(["b", "c", "h", "w"], out, strict=True))
        return _space("pool", dims, ["b", "c", "h", "w"], window=[int(k[0]), int(k[1])],
                      _in_dims=["b", "c", None, None])
    if "batch_norm" in op and r >= 2:
        dims = list(zip(names, out, strict=True))
        return _space("norm", dims, names, axis="d0", weight=["d1"], weight_scale=2,
                      _in_dims=names)
    if op == "layer_norm":
        dims = list(zip(names, out, strict=True))
        return _space("norm", dims, names, axis=names[-1], weight=[names[-1]],
                      weight_scale=2, _in_dims=names)
    if op in ("softmax", "_softmax", "log_softmax", "_log_softmax"):
        dim = int(args[1]) % r if len(args) > 1 else r - 1
        dims = list(zip(names, out, strict=True))
        return _space("softmax", dims, names, axis=names[dim], _in_dims=names)
    if op == "mean" and first is not None:
        red = args[1] if len(args) > 1 else list(range(len(first)))
        red = [int(x) % len(first) for x in (red if isinstance(red, (list, tuple)) else [red])]
        in_names = _names(len(first))
        keep = [n for j, n in enumerate(in_names) if j not in red]
        dims = list(zip(in_names, first, strict=True))
        if len(keep) != r:
            return None
        return _space("reduce_mean", dims, keep, axes=[in_names[j] for j in red],
                      _in_dims=in_names)
    if op == "embedding" and len(ins) > 1 and ins[0] is not None:
        table = ins[0]
        dims = [*zip(names[:-1], out[:-1], strict=True), ("n", out[-1]), ("v", table[0])]
        return _space("gemm", dims, [*names[:-1], "n"], m=names[:-1], n=["n"], k=["v"],
                      weight=["v", "n"], _in_dims=names[:-1])
    if op in ATTENTION_OPS and first is not None and r == 4 and len(ins) >= 3 \
            and ins[1] is not None and len(first) == 4 and len(ins[1]) == 4:
        b, h, q, d = first
        kk = ins[1][2]
        if out[:3] != (b, h, q):
            return None
        dims = [("b", b), ("h", h), ("q", q), ("k", kk), ("d", d)]
        # query, key and value all read (b, h, sequence, d); only b and h ever split
        return _space("attention", dims, ["b", "h", "q", "d"], fixed=["q", "k", "d"],
                      batch=["b", "h"], _in_dims=["b", "h", None, None])
    if op == "cat":
        axis = int(args[1]) % r if len(args) > 1 else 0
        dims = list(zip(names, out, strict=True))
        return _space("concat", dims, names, fixed=[names[axis]], _in_dims=names)
    if op in _MOVE:
        dims = list(zip(names, out, strict=True))
        return _space(_MOVE[op], dims, names, _in_dims=names)
    if op in _ELEMENTWISE:
        dims = list(zip(names, out, strict=True))
        return _space("elementwise", dims, names, _in_dims=names)
    return None


def shapes_of(fx_node: Any) -> tuple[tuple[int, ...] | None, list[tuple[int, ...] | None],
                                     list[Any]]:
    """(output shape, argument tensor shapes, positional args) of an exported fx node."""
    val = fx_node.meta.get("val")
    if isinstance(val, (list, tuple)):
        val = val[0] if val else None
    out = _shape(val)
    ins: list[tuple[int, ...] | None] = []
    plain: list[Any] = []
    for a in fx_node.args:
        if hasattr(a, "meta"):
            ins.append(_shape(a.meta.get("val")))
            plain.append(None)
        elif isinstance(a, (list, tuple)) and a and all(hasattr(x, "meta") for x in a):
            ins.extend(_shape(x.meta.get("val")) for x in a)
            plain.append(None)
        else:
            plain.append(a)
    return out, ins, plain


def graph_spaces_of(fx_nodes: Sequence[Any], ops: Sequence[str],
                    pairs: Sequence[tuple[int, int]], batch_size: int
                    ) -> list[dict[str, Any] | None]:
    """Spaces of captured ops from their exported fx nodes; ``pairs`` are the graph's edges
    (the tensor on an edge is taken to have its producer's output shape)."""
    info = [shapes_of(n) for n in fx_nodes]
    uses = [(u, v, info[u][0]) for u, v in pairs]
    spaces = op_spaces(ops, [x[0] for x in info], [x[1] for x in info], uses,
                       [x[2] for x in info], batch_size)
    for node, sp in zip(fx_nodes, spaces, strict=True):
        if sp is not None and sp["kind"] == "attention":
            causal = node.kwargs.get("is_causal", False)
            if not causal and len(node.args) > 5:  # positional is_causal
                causal = node.args[5]
            sp["causal"] = bool(causal)
    return spaces


