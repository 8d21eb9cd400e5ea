"""An independent statement of the PaSE benchmarks and the prototype's cost model, for tests.

Written apart from ``shardplan.generate._pase`` and ``shardplan.strategy._cost_pase``: layers
are described the way the prototype's ``graph.py`` calls its ops (shapes flow from layer to
layer), costs are the formulas of ``../shared/pase-cost-model.md`` evaluated one configuration
at a time with plain Python arithmetic, configurations are enumerated with ``itertools``.
The result is a :class:`shardplan.strategy.Tables`, so the exact DP (tested against
exhaustive enumeration elsewhere) gives its optimum; the tests compare that optimum, and the
data-parallel total, with what the generators and the ``pase`` cost model give.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from shardplan.strategy import Tables

R = 8 * 10e12 / 16e9  # words -> FLOP-equivalents: 8 F / B with F = 10 TFLOP/s, B = 16 GB/s


def allreduce(words: float, procs: float) -> float:
    return 2.0 * R * words * (procs - 1) / procs


@dataclass
class Node:
    name: str
    dims: list[tuple[str, int]]
    cost: Callable[[dict[str, int]], float]
    out_shape: list[int]
    out_groups: list[list[str]]  # per output tensor dim, the dims that split it
    inputs: list[tuple[int, list[list[str]]]] = field(default_factory=list)
    fixed: set[str] = field(default_factory=set)


@dataclass
class T:
    """A tensor: its producer (node index) and shape."""

    node: int
    shape: list[int]


class Net:
    def __init__(self, batch: int, cutoff: int) -> None:
        self.batch, self.cutoff = batch, cutoff
        self.nodes: list[Node] = []

    def add(self, node: Node) -> T:
        self.nodes.append(node)
        return T(len(self.nodes) - 1, node.out_shape)

    # ------------------------------------------------------------------ cost helpers
    @staticmethod
    def per(dims: list[tuple[str, int]], f: dict[str, int], names: list[str]) -> float:
        size = dict(dims)
        return math.prod(size[n] / f[n] for n in names)

    @staticmethod
    def fac(f: dict[str, int], names: list[str]) -> int:
        return math.prod(f[n] for n in names)

    def gemm(self, dims, batch, m, n, k, pw):  # noqa: ANN001, ANN201 - local helper
        def cost(f: dict[str, int]) -> float:
            beta = self.per(dims, f, batch)
            mm, nn, kk = (self.per(dims, f, x) for x in (m, n, k))
            pm, pn, pk = (self.fac(f, x) for x in (m, n, k))
            return beta * (3 * mm * nn * kk + 3 * pw * mm * nn + allreduce(mm * nn, pk)
                           + allreduce(mm * kk, pn) + allreduce(nn * kk, pm))
        return cost

    # ------------------------------------------------------------------ layers
    def conv(self, x: T | None, cin: int, hin: int, cout: int, r: int, s: int,
             stride: int = 1, pad: tuple[int, int] = (0, 0), pw: int = 0,
             name: str = "conv") -> T:
        ho = (hin + 2 * pad[0] - r) // stride + 1
        wo = (hin + 2 * pad[1] - s) // stride + 1
        dims = [("b", self.batch), ("c", cin), ("h", ho), ("w", wo), ("r", r), ("s", s),
                ("o", cout)]
        ins = [] if x is None else [(x.node, [["b"], ["c"], [], []])]
        return self.add(Node(name, dims, self.gemm(dims, [], ["b", "h", "w"], ["o"],
                                                   ["c", "r", "s"], pw),
                             [self.batch, cout, ho, wo], [["b"], ["o"], ["h"], ["w"]], ins,
                             {"h", "w"}))

    def pool(self, x: T, k: int, stride: int, pad: int = 0, name: str = "pool") -> T:
        b, c, hin, win = x.shape
        ho = (hin + 2 * pad - k) // stride + 1
        dims = [("b", b), ("c", c), ("h", ho), ("w", ho)]

        def cost(f: dict[str, int]) -> float:
            e = self.per(dims, f, ["b", "c", "h", "w"])
            hp, wp = hin / f["h"], win / f["w"]  # the halo is on the input image
            halo = (hp + (k if f["h"] > 1 else 0)) * (wp + (k if f["w"] > 1 else 0)) - hp * wp
            return e + R * (b / f["b"]) * (c / f["c"]) * halo
        g = [["b"], ["c"], ["h"], ["w"]]
        return self.add(Node(name, dims, cost, [b, c, ho, ho], g, [(x.node, g)]))

    def norm(self, x: T, names: list[str], axis: str, name: str = "norm") -> T:
        dims = list(zip(names, x.shape, strict=True))

        def cost(f: dict[str, int]) -> float:
            e = self.per(dims, f, names)
            da = self.per(dims, f, [axis])
            others = self.fac(f, [n for n in names if n != axis])
            return 16 * e + 4 * allreduce(e / da, f[axis]) + 4 * allreduce(da, others)
        g = [[n] for n in names]
        return self.add(Node(name, dims, cost, list(x.shape), g, [(x.node, g)]))

    def elementwise(self, xs: list[T], names: list[str], pw: int = 0,
                    name: str = "add") -> T:
        dims = list(zip(names, xs[0].shape, strict=True))
        g = [[n] for n in names]
        return self.add(Node(name, dims, lambda f: (1 + pw) * self.per(dims, f, names),
                             list(xs[0].shape), g, [(x.node, g) for x in xs]))

    def concat(self, xs: list[tuple[T, int]], name: str = "cat") -> T:
        b, _, h, w = xs[0][0].shape
        c = sum(ch for _, ch in xs)
        dims = [("b", b), ("c", c), ("h", h), ("w", w)]
        g = [["b"], ["c"], ["h"], ["w"]]
        return self.add(Node(name, dims, lambda f: 0.0, [b, c, h, w], g,
                             [(x.node, g) for x, _ in xs], {"c"}))

    def flatten(self, x: T, name: str = "flatten") -> T:
        """A reshape (b, c, h, w) -> (b, c h w) that keeps the flattened data contiguous:
        only the batch splits (the leading axis, which the cutoff keeps from splitting
        fully)."""
        b, c, h, w = x.shape
        dims = [("b", b), ("c", c), ("h", h), ("w", w)]
        return self.add(Node(name, dims, lambda f: 0.0, [b, c * h * w],
                             [["b"], ["c", "h", "w"]],
                             [(x.node, [["b"], ["c"], ["h"], ["w"]])], {"c", "h", "w"}))

    def mean_hw(self, x: T, name: str = "avgpool") -> T:
        b, c, h, w = x.shape
        dims = [("b", b), ("c", c), ("h", h), ("w", w)]
        return self.add(Node(name, dims, lambda f: allreduce(
            self.per(dims, f, ["b", "c", "h", "w"]), f["h"] * f["w"]), [b, c],
            [["b"], ["c"]], [(x.node, [["b"], ["c"], ["h"], ["w"]])]))

    def fc(self, x: T, n: int, pw: int = 0, name: str = "fc") -> T:
        b, k = x.shape
        dims = [("b", b), ("n", n), ("k", k)]
        return self.add(Node(name, dims, self.gemm(dims, [], ["b"], ["n"], ["k"], pw), [b, n],
                             [["b"], ["n"]], [(x.node, [["b"], ["k"]])]))

    def softmax_ce(self, x: T, names: list[str], name: str = "loss") -> T:
        dims = list(zip(names, x.shape, strict=True))
        cls = names[-1]

        def cost(f: dict[str, int]) -> float:
            e = self.per(dims, f, names)
            rows = self.per(dims, f, names[:-1])
            return 4 * e + 2 * rows + (2 * R * rows if f[cls] > 1 else 0.0)
        return self.add(Node(name, dims, cost, [], [], [(x.node, [[n] for n in names])]))

    def einsum(self, dims: list[tuple[str, int]], batch: list[str], m: list[str],
               n: list[str], k: list[str], out: list[str],
               ins: list[tuple[T, list[list[str]]]], pw: int = 0, name: str = "einsum") -> T:
        size = dict(dims)
        return self.add(Node(name, dims, self.gemm(dims, batch, m, n, k, pw),
                             [size[d] for d in out], [[d] for d in out],
                             [(x.node, g) for x, g in ins]))

    # ------------------------------------------------------------------ tables
    def configurations(self, node: Node, procs: int) -> list[tuple[int, ...]]:
        options = []
        for nm, d in node.dims:
            if nm in node.fixed:
                options.append([1])
                continue
            ok = [e for e in range(1, d + 1) if d % e == 0 and d // e >= self.cutoff
                  and e <= procs]
            options.append(ok or [1])
        return [c for c in itertools.product(*options) if math.prod(c) <= procs]

    def tables(self, procs: int) -> Tables:
        configs = [np.array(self.configurations(nd, procs), dtype=np.int64)
                   for nd in self.nodes]
        costs = []
        for nd, cf in zip(self.nodes, configs, strict=True):
            names = [n for n, _ in nd.dims]
            costs.append(np.array([nd.cost(dict(zip(names, row.tolist(), strict=True)))
                                   for row in cf]))
        edges = []
        for v, nd in enumerate(self.nodes):
            for u, groups in nd.inputs:
                src = self.nodes[u]
                t = np.array(src.out_shape, dtype=np.float64)

                def tensor_factors(node: Node, cf: np.ndarray, grp: list[list[str]]
                                   ) -> np.ndarray:
                    idx = {n: i for i, (n, _) in enumerate(node.dims)}
                    cols = [np.prod(cf[:, [idx[n] for n in g]], axis=1) if g else
                            np.ones(cf.shape[0]) for g in grp]
                    return np.stack(cols, axis=1).astype(np.float64)

                fs = tensor_factors(src, configs[u], src.out_groups)[:, None, :]
                ft = tensor_factors(nd, configs[v], groups)[None, :, :]
                held, need = t / fs, t / ft
                keep = np.where(np.prod(ft, axis=2) <= np.prod(fs, axis=2),
                                np.prod(np.minimum(held, need), axis=2), 0.0)
                edges.append((u, v, 2 * R * np.maximum(0.0, np.prod(need, axis=2) - keep)))
        merged: dict[tuple[int, int], np.ndarray] = {}
        for u, v, m in edges:
            merged[(u, v)] = merged[(u, v)] + m if (u, v) in merged else m
        return Tables(graph="reference", devices=procs, cost_model="reference",
                      objective="pase_cost", names=tuple(nd.name for nd in self.nodes),
                      dims=tuple(tuple(n for n, _ in nd.dims) for nd in self.nodes),
                      configs=tuple(configs), node_cost=tuple(costs),
                      edges=tuple((u, v, m) for (u, v), m in sorted(merged.items())))

    def data_parallel(self, tables: Tables) -> np.ndarray:
        """Per node, the configuration splitting the batch the most and nothing else."""
        out = []
        for v, nd in enumerate(self.nodes):
            bdim = [i for i, (n, _) in enumerate(nd.dims) if n == "b"]
            cf = tables.configs[v]
            other = np.delete(cf, bdim, axis=1)
            ok = np.all(other == 1, axis=1)
            score = np.where(ok, cf[:, bdim[0]] if bdim else 1, -1)
            out.append(int(np.argmax(score)))
        return np.array(out, dtype=np.int64)


# ---------------------------------------------------------------------- the benchmarks
def alexnet(batch: int = 128) -> Net:
    net = Net(batch, cutoff=4)
    x = net.conv(None, 3, 227, 96, 11, 11, stride=4, pw=1)
    x = net.pool(x, 3, 2)
    x = net.conv(x, 96, x.shape[2], 256, 5, 5, pad=(2, 2), pw=1)
    x = net.pool(x, 3, 2)
    x = net.conv(x, 256, x.shape[2], 384, 3, 3, pad=(1, 1), pw=1)
    x = net.conv(x, 384, x.shape[2], 384, 3, 3, pad=(1, 1), pw=1)
    x = net.conv(x, 384, x.shape[2], 256, 3, 3, pad=(1, 1), pw=1)
    x = net.pool(x, 3, 2)
    x = net.flatten(x)
    x = net.fc(x, 4096, pw=1)
    x = net.fc(x, 4096, pw=1)
    x = net.fc(x, 1024)
    net.softmax_ce(x, ["b", "c"])
    return net


def inception_v3(batch: int = 128) -> Net:
    net = Net(batch, cutoff=4)

    def basic(x: T | None, cin: int, cout: int, r: int, s: int, stride: int = 1,
              pad: tuple[int, int] = (0, 0), hin: int | None = None) -> T:
        h = hin if x is None else x.shape[2]
        y = net.conv(x, cin, h, cout, r, s, stride, pad)  # no ReLU fused (AddBasicConv)
        return net.norm(y, ["b", "c", "h", "w"], "b")

    x = basic(None, 3, 32, 3, 3, 2, hin=299)
    x = basic(x, 32, 32, 3, 3)
    x = basic(x, 32, 64, 3, 3, pad=(1, 1))
    x = net.pool(x, 3, 2)
    x = basic(x, 64, 80, 1, 1)
    x = basic(x, 80, 192, 3, 3)
    x = net.pool(x, 3, 2)
    c = 192
    for pf in (32, 64, 64):  # InceptionA
        b1 = basic(x, c, 64, 1, 1)
        b5 = basic(basic(x, c, 48, 1, 1), 48, 64, 5, 5, pad=(2, 2))
        b3 = basic(basic(basic(x, c, 64, 1, 1), 64, 96, 3, 3, pad=(1, 1)), 96, 96, 3, 3,
                   pad=(1, 1))
        bp = basic(net.pool(x, 3, 1, 1), c, pf, 1, 1)
        x = net.concat([(b1, 64), (b5, 64), (b3, 96), (bp, pf)])
        c = 224 + pf
    b3 = basic(x, c, 384, 3, 3, 2)  # InceptionB
    bd = basic(basic(basic(x, c, 64, 1, 1), 64, 96, 3, 3, pad=(1, 1)), 96, 96, 3, 3, 2)
    bp = net.pool(x, 3, 2)
    x = net.concat([(b3, 384), (bd, 96), (bp, c)])
    c = 384 + 96 + c
    for c7 in (128, 160, 160, 192):  # InceptionC
        b1 = basic(x, c, 192, 1, 1)
        t = basic(basic(x, c, c7, 1, 1), c7, c7, 1, 7, pad=(0, 3))
        b7 = basic(t, c7, 192, 7, 1, pad=(3, 0))
        t = basic(basic(x, c, c7, 1, 1), c7, c7, 7, 1, pad=(3, 0))
        t = basic(basic(t, c7, c7, 1, 7, pad=(0, 3)), c7, c7, 7, 1, pad=(3, 0))
        bd = basic(t, c7, 192, 1, 7, pad=(0, 3))
        bp = basic(net.pool(x, 3, 1, 1), c, 192, 1, 1)
        x = net.concat([(b1, 192), (b7, 192), (bd, 192), (bp, 192)])
        c = 768
    b3 = basic(basic(x, c, 192, 1, 1), 192, 320, 3, 3, 2)  # InceptionD
    t = basic(basic(x, c, 192, 1, 1), 192, 192, 1, 7, pad=(0, 3))
    b7 = basic(basic(t, 192, 192, 7, 1, pad=(3, 0)), 192, 192, 3, 3, 2)
    bp = net.pool(x, 3, 2)
    x = net.concat([(b3, 320), (b7, 192), (bp, c)])
    c = 320 + 192 + c
    for _ in range(2):  # InceptionE
        b1 = basic(x, c, 320, 1, 1)
        t = basic(x, c, 384, 1, 1)
        a1 = basic(t, 384, 384, 1, 3, pad=(0, 1))
        a2 = basic(t, 384, 384, 3, 1, pad=(1, 0))
        t = basic(basic(x, c, 448, 1, 1), 448, 384, 3, 3, pad=(1, 1))
        d1 = basic(t, 384, 384, 1, 3, pad=(0, 1))
        d2 = basic(t, 384, 384, 3, 1, pad=(1, 0))
        bp = basic(net.pool(x, 3, 1, 1), c, 192, 1, 1)
        x = net.concat([(b1, 320), (a1, 384), (a2, 384), (d1, 384), (d2, 384), (bp, 192)])
        c = 2048
    x = net.mean_hw(x)
    x = net.fc(x, 1000)
    net.softmax_ce(x, ["b", "c"])
    return net


def rnnlm(batch: int = 64) -> Net:
    net = Net(batch, cutoff=1)
    seq, hid, voc, layers = 256, 2048, 100_000, 2
    emb = net.einsum([("b", batch), ("s", seq), ("d", hid), ("v", voc)], [], ["b", "s"],
                     ["d"], ["v"], ["b", "s", "d"], [], name="embedding")
    dims = [("l", layers), ("s", seq), ("b", batch), ("n", hid), ("k", hid)]

    def lstm_cost(f: dict[str, int]) -> float:
        beta = layers / f["l"]
        m, n, k = seq * batch / (f["s"] * f["b"]), 4 * hid / f["n"], 2 * hid / f["k"]
        gemm = beta * (3 * m * n * k + 9 * m * n + allreduce(m * n, f["k"])
                       + allreduce(m * k, f["n"]) + allreduce(n * k, f["s"] * f["b"]))
        held = (batch / f["b"], hid / f["n"])  # cell output (B, N), re-read as (B, K)
        need = (batch / f["b"], hid / f["k"])
        keep = held[0] * min(held[1], need[1]) if f["b"] * f["k"] <= f["b"] * f["n"] else 0
        return gemm + layers * seq * R * max(0.0, need[0] * need[1] - keep)
    lstm = net.add(Node("lstm", dims, lstm_cost, [batch, seq, hid], [["b"], ["s"], ["n"]],
                        [(emb.node, [["b"], ["s"], ["k"]])], {"s"}))
    out = net.einsum([("b", batch), ("s", seq), ("v", voc), ("k", hid)], [], ["b", "s"], ["v"],
                     ["k"], ["b", "s", "v"], [(lstm, [["b"], ["s"], ["k"]])], name="fc")
    net.softmax_ce(out, ["b", "s", "v"])
    return net


def transformer(batch: int = 64, layers: int = 6) -> Net:
    net = Net(batch, cutoff=1)
    seq, voc, dm, nh, hd, ff = 256, 50_000, 512, 8, 64, 2048
    bsd = ["b", "s", "d"]
    ident = [["b"], ["s"], ["d"]]

    def embed() -> T:
        e = net.einsum([("b", batch), ("s", seq), ("d", dm), ("v", voc)], [], ["b", "s"],
                       ["d"], ["v"], bsd, [], name="embedding")
        return net.elementwise([e], bsd, name="positional")  # + the positional encoding

    def proj(x: T, width: int) -> T:
        return net.einsum([("b", batch), ("s", seq), ("h", nh), ("f", width), ("d", dm)], [],
                          ["b", "s"], ["h", "f"], ["d"], ["b", "s", "h", "f"], [(x, ident)])

    def attention(q: T, kv: T) -> T:
        qdims = [("b", batch), ("h", nh), ("q", seq), ("t", seq), ("e", hd)]
        ins = [(q, [["b"], ["q"], ["h"], []])]
        if kv.node != q.node:
            ins.append((kv, [["b"], ["t"], ["h"], []]))
        qk = net.einsum(qdims, ["b", "h"], ["q"], ["t"], ["e"], ["b", "h", "q", "t"], ins)
        sdims = [("b", batch), ("h", nh), ("q", seq), ("t", seq)]

        def softmax(f: dict[str, int]) -> float:
            e = net.per(sdims, f, ["b", "h", "q", "t"])
            rest = e / (seq / f["t"])
            return (4 * e + e * seq + 2 * allreduce(rest, f["t"])
                    + allreduce(rest * seq, f["t"]))
        g4 = [["b"], ["h"], ["q"], ["t"]]
        sm = net.add(Node("softmax", sdims, softmax, [batch, nh, seq, seq], g4, [(qk.node, g4)]))
        av = net.einsum([("b", batch), ("h", nh), ("q", seq), ("e", hd), ("t", seq)],
                        ["b", "h"], ["q"], ["e"], ["t"], ["b", "h", "q", "e"],
                        [(sm, g4), (kv, [["b"], ["t"], ["h"], []])])
        return net.einsum([("b", batch), ("s", seq), ("d", dm), ("h", nh), ("e", hd)], [],
                          ["b", "s"], ["d"], ["h", "e"], bsd,
                          [(av, [["b"], ["h"], ["s"], ["e"]])])

    def add_norm(a: T, res: T) -> T:
        return net.norm(net.elementwise([a, res], bsd), bsd, "d")

    def ffn(x: T) -> T:
        h1 = net.einsum([("b", batch), ("s", seq), ("f", ff), ("d", dm)], [], ["b", "s"],
                        ["f"], ["d"], ["b", "s", "f"], [(x, ident)], pw=2)
        return net.einsum([("b", batch), ("s", seq), ("d", dm), ("f", ff)], [], ["b", "s"],
                          ["d"], ["f"], bsd, [(h1, [["b"], ["s"], ["f"]])])

    x = embed()
    for _ in range(layers):
        qkv = proj(x, 3 * hd)
        x = add_norm(attention(qkv, qkv), x)
        x = add_norm(ffn(x), x)
    memory = x
    y = embed()
    for _ in range(layers):
        qkv = proj(y, 3 * hd)
        y = add_norm(attention(qkv, qkv), y)
        q, kv = proj(y, hd), proj(memory, 2 * hd)
        y = add_norm(attention(q, kv), y)
        y = add_norm(ffn(y), y)
    out = net.einsum([("b", batch), ("s", seq), ("v", voc), ("d", dm)], [], ["b", "s"], ["v"],
                     ["d"], ["b", "s", "v"], [(y, ident)])
    net.softmax_ce(out, ["b", "s", "v"])
    return net


BENCHMARKS = {"alexnet": alexnet, "inception-v3": inception_v3, "rnnlm": rnnlm,
              "transformer": transformer}
