"""The ``pase`` cost model: the PaSE prototype's layer and edge costs, exactly as restated in
``../shared/pase-cost-model.md`` (paper 004, equation 1, whose formulas the text lost).

Everything is in FLOP-equivalents per device for one training step. Communicating w words costs
r w with r = 8 F / B (a word is 8 bytes; defaults F = 10 TFLOP/s, B = 16 GB/s, r = 5000), an
all-reduce of w words over P devices AR(w, P) = 2 r w (P - 1) / P. Every formula is evaluated
for all configurations of a layer at once: ``F`` is the ``(K, d)`` array of split factors.

The formulas are written once, over a :class:`Units` object, so that the ``default`` model
(:mod:`shardplan.strategy._cost_default`) reuses them with seconds, bytes and topology
bandwidths instead of FLOPs and words. Where the note is literal and odd we kept it literal:
the softmax's ``E d_a`` term, the LSTM re-shard term charged L * S times with the full L and S,
and the edge cost's ``[prod c_tgt <= prod c_src]`` test over the tensor's own dimensions only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardplan.strategy.spaces import Space

__all__ = ["PaseCostModel", "Units", "edge_cost", "layer_cost", "tensor_factors"]

Vec = np.ndarray


@dataclass(frozen=True)
class Units:
    """How costs are counted.

    Attributes
    ----------
    mac : float
        Cost of one unit of the note's compute count (pase: 1 FLOP-equivalent).
    word : callable
        ``word(space)``: cost of moving one element of ``space``'s tensors (pase: r).
    allreduce : callable
        ``allreduce(words, P, space)``: vectorised all-reduce cost (zero where P == 1).
    """

    mac: float
    word: Callable[[Space], float]
    allreduce: Callable[[Vec, Vec, Space], Vec]


def pase_units(flops: float = 1e13, bandwidth: float = 16e9) -> Units:
    """The note's units: r = 8 F / B, AR(w, P) = 2 r w (P - 1) / P."""
    r = 8.0 * flops / bandwidth

    def ar(w: Vec, p: Vec, space: Space) -> Vec:
        p = np.asarray(p, dtype=np.float64)
        return 2.0 * r * np.asarray(w, dtype=np.float64) * (p - 1.0) / p

    return Units(mac=1.0, word=lambda space: r, allreduce=ar)


def _prod(a: np.ndarray, cols: list[int]) -> Vec:
    if not cols:
        return np.ones(a.shape[0], dtype=np.float64)
    return np.prod(a[:, cols].astype(np.float64), axis=1)


def _ind(x: Vec) -> Vec:
    return (np.asarray(x) > 1).astype(np.float64)


def _reshard_words(t: np.ndarray, fs: np.ndarray, ft: np.ndarray) -> Vec:
    """Words a device must receive: max(0, prod Q - [prod ft <= prod fs] prod min(Q, S)).

    ``t`` the tensor shape (n,), ``fs``/``ft`` factor arrays broadcastable to (..., n).
    """
    s = t / fs
    q = t / ft
    overlap = np.prod(np.minimum(q, s), axis=-1)
    cond = np.prod(ft, axis=-1) <= np.prod(fs, axis=-1)
    return np.maximum(0.0, np.prod(q, axis=-1) - cond * overlap)


def layer_cost(space: Space, f: np.ndarray, u: Units, *, weight_grads: bool = True) -> Vec:
    """Cost of every configuration (rows of ``f``) of one layer. O(K d).

    ``weight_grads=False`` leaves out the all-reduce of the layer's weight gradient over the
    devices that split its batch-like dimensions (a GEMM's ``ar(n k, p_m)`` when the space
    has a ``weight``, an LSTM's, a normalisation's ``ar(d_a, others)``, an opaque
    operator's): what the simulator charges once per iteration, with the plan's gradient
    synchronisation, instead of with every micro-batch."""
    wg = 1.0 if weight_grads else 0.0
    f = np.asarray(f, dtype=np.int64)
    k = f.shape[0]
    sizes = np.asarray(space.sizes, dtype=np.float64)
    per = sizes[None, :] / f  # per-device sizes d'
    e = np.prod(per, axis=1)
    a = space.attrs
    kind = space.kind
    ar = u.allreduce

    def pdev(names: list[str]) -> Vec:
        return _prod(per, space.indices(names))

    def fac(names: list[str]) -> Vec:
        return _prod(f, space.indices(names))

    if kind == "gemm":
        beta = pdev(a.get("batch", []))
        m, n, kk = pdev(a["m"]), pdev(a["n"]), pdev(a["k"])
        pm, pn, pk = fac(a["m"]), fac(a["n"]), fac(a["k"])
        pw = float(a.get("pw", 0))
        wk = wg if space.weight else 1.0  # a GEMM of two activations: an input's gradient
        return beta * (u.mac * (3 * m * n * kk + 3 * pw * m * n)
                       + ar(m * n, pk, space) + ar(m * kk, pn, space)
                       + wk * ar(n * kk, pm, space))
    if kind == "lstm":
        lyr, seq, bat, hid, inp = space.dims[:5]
        L, S = float(sizes[0]), float(sizes[1])  # noqa: N806 - the note's names
        beta = pdev([lyr])
        m = pdev([seq, bat])
        n = 4 * pdev([hid])
        kk = 2 * pdev([inp])
        pm, pn, pk = fac([seq, bat]), fac([hid]), fac([inp])
        gemm = beta * (u.mac * (3 * m * n * kk + 3 * 3 * m * n)
                       + ar(m * n, pk, space) + ar(m * kk, pn, space)
                       + wg * ar(n * kk, pm, space))
        t = np.array([sizes[2], sizes[3]])  # the cell output (B, N)
        fs = np.stack([fac([bat]), fac([hid])], axis=1)
        ft = np.stack([fac([bat]), fac([inp])], axis=1)
        words = _reshard_words(t, fs, ft)
        return gemm + L * S * u.word(space) * words
    if kind == "attention":
        # Not in the note (PaSE predates fused attention): softmax(q k^T) v as one operator,
        # 2 b h q k d multiply-adds forward (the two batched products, causal or not, as
        # torch's sdpa_flop_count counts) and 5 backward (flash attention recomputes the
        # scores); b and h split with no communication, the fixed q, k, d never split.
        # A split of k or d (by a hand-written space) would need the partial products
        # all-reduced: charged as the GEMM charges a split k.
        bh = space.attrs.get("batch", ["b", "h"])
        rest = [x for x in space.dims if x not in bh]
        out_words = pdev([*bh, "q", "d"])
        return (u.mac * 7.0 * e + ar(out_words, fac([x for x in rest if x != "q"]), space))
    if kind == "pool":
        b, c, h, w = space.dims[:4]
        rr, ss = (float(x) for x in a.get("window", (1, 1)))
        # The halo is exchanged on the input tensor (the prototype's Pooling prices it on
        # its input image, split like the output); spaces without ``input_hw`` use the
        # output's height and width.
        hin, win = (float(x) for x in a.get("input_hw", (sizes[space.index(h)],
                                                          sizes[space.index(w)])))
        hp, wp = hin / fac([h]), win / fac([w])
        halo = (hp + rr * _ind(fac([h]))) * (wp + ss * _ind(fac([w]))) - hp * wp
        return u.mac * e + u.word(space) * pdev([b, c]) * halo
    if kind == "elementwise":
        return u.mac * (1.0 + float(a.get("pw", 0))) * e
    if kind in ("reshape", "concat", "split", "transpose"):
        return np.zeros(k)
    if kind == "norm":
        ax = a["axis"]
        da, pa = pdev([ax]), fac([ax])
        others = fac([d for d in space.dims if d != ax])
        wk = wg if space.weight else 1.0
        return u.mac * 16 * e + 4 * ar(e / da, pa, space) + wk * 4 * ar(da, others, space)
    if kind == "softmax":
        ax = a["axis"]
        full = float(sizes[space.index(ax)])
        pa = fac([ax])
        e_rest = e / pdev([ax])
        return (u.mac * (4 * e + e * full) + 2 * ar(e_rest, pa, space)
                + ar(e_rest * full, pa, space))
    if kind == "softmax_ce":
        ax = a["axis"]
        b_rest = e / pdev([ax])
        return u.mac * (4 * e + 2 * b_rest) + _ind(fac([ax])) * 2 * u.word(space) * b_rest
    if kind == "reduce_mean":
        return ar(e, fac(list(a["axes"])), space)
    if kind == "opaque":
        # Not in the note: a captured op we cannot describe splits its batch only; its
        # forward + backward FLOPs (2 per multiply-add in the graph, 1 unit here) divide by the
        # split and its weight gradient is all-reduced, as data parallelism would.
        p = fac([space.batch_dim]) if space.batch_dim else np.ones(k)
        return (u.mac * float(a.get("flops", 0.0)) / 2.0 / p
                + wg * ar(np.full(k, float(a.get("param_words", 0.0))), p, space))
    raise AssertionError(kind)


def tensor_factors(space: Space, groups: tuple[tuple[str, ...], ...], f: np.ndarray
                   ) -> np.ndarray:
    """Split factor of each tensor dimension (product over its space dimensions), (K, t)."""
    cols = [_prod(np.asarray(f), space.indices(list(g))) for g in groups]
    return np.stack(cols, axis=1) if cols else np.ones((np.asarray(f).shape[0], 0))


def edge_cost(src: Space, dst: Space, src_id: int, fs: np.ndarray, ft: np.ndarray,
              word: float) -> np.ndarray | None:
    """The note's re-sharding cost of the tensor ``src -> dst``, a ``(K_src, K_dst)`` matrix:
    2 r max(0, prod Q - [prod c_tgt <= prod c_src] prod min(Q, S)), or None when ``dst`` does
    not describe what it reads from ``src`` (the prototype charges only described tensors).
    O(K_src K_dst t)."""
    groups = dst.inputs.get(str(src_id))
    if groups is None or len(groups) != len(src.output):
        return None
    t = np.asarray(src.output_shape, dtype=np.float64)
    a = tensor_factors(src, src.output, fs)
    b = tensor_factors(dst, groups, ft)
    words = _reshard_words(t, a[:, None, :], b[None, :, :])
    return 2.0 * word * words


class PaseCostModel:
    """The note's cost model (name ``pase``; objective ``pase_cost``, FLOP-equivalents).

    Parameters
    ----------
    flops, bandwidth : float
        Peak FLOP/s F and bytes/s B (defaults 10 TFLOP/s and 16 GB/s, r = 5000).
    """

    name = "pase"
    objective = "pase_cost"

    def __init__(self, flops: float = 1e13, bandwidth: float = 16e9) -> None:
        self.units = pase_units(flops, bandwidth)
        self.r = 8.0 * flops / bandwidth

    def node_cost(self, space: Space, configs: np.ndarray, node: int | None = None
                  ) -> np.ndarray:
        return layer_cost(space, configs, self.units)

    def edge_cost(self, src: Space, dst: Space, src_id: int, fs: np.ndarray,
                  ft: np.ndarray, edge_bytes: float, dst_id: int | None = None
                  ) -> np.ndarray | None:
        return edge_cost(src, dst, src_id, fs, ft, self.r)
