"""The PaSE paper's four benchmark graphs (paper 004 section IV), with iteration spaces.

Sizes follow ``../shared/pase-cost-model.md``: batch 128 for the CNNs and 64 for the others;
AlexNet on 227x227x3; InceptionV3 on 299x299x3 in torchvision's layout (every convolution
followed by its own batch-norm node, no auxiliary head); RNNLM with vocabulary 100000, 2048
units, 2 LSTM layers, sequence 256 (one LSTM node); the small Transformer (sequence 256,
vocabulary 50000, d_model 512, 8 heads of 64, FFN 2048, 6 + 6 layers) with attention as
einsums. Every node carries its ``space`` (see :mod:`shardplan.strategy.spaces`); the graph's
``pase_cutoff`` meta field is 4 for the CNNs and 1 for the others, as the note says.

As the prototype's ``graph.py`` builds them (baidu-research/PaSE): AlexNet's convolutions and
hidden FC layers fuse their ReLU (``pw = 1``); InceptionV3's convolutions do not (its
``AddBasicConv`` is a plain convolution and a batch norm); the Transformer adds the positional
encoding to each embedding in an elementwise node of its own, and its first FFN layer fuses
two pointwise ops (ReLU and dropout, ``pw = 2``); a pooling's halo exchange is priced on its
input tensor (``input_hw``), as the prototype's ``Pooling`` does.

Decisions the note leaves open: the
InceptionE module's inner concatenations feed its final concat directly (same data); the
fused QKV projection's output is read by the
Q K^T einsum with the sequence as its query axis (the key's use of it is not a separate
tensor), and by the attention-times-V einsum with the sequence as its key axis; the decoder's
cross-attention has a Q projection of its own input and a fused KV projection of the encoder
output. FLOPs count 2 per multiply-add; backward FLOPs are twice the forward for GEMMs and equal
to it for the rest; bytes assume float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Node

__all__ = ["alexnet", "inception_v3", "rnnlm", "transformer"]

Groups = Sequence[Sequence[str]]


class _Builder:
    """Accumulates nodes with spaces and the edges their inputs name."""

    def __init__(self, name: str, batch: int, meta: dict[str, Any]) -> None:
        self.name = name
        self.batch = batch
        self.meta = meta
        self.nodes: list[Node] = []
        self.edges: list[tuple[int, int, int]] = []

    def add(self, name: str, op: str, kind: str, dims: Sequence[tuple[str, int]], *,
            output: Groups, inputs: Sequence[tuple[int, Groups]] = (), fixed: Sequence[str] = (),
            weight: Sequence[str] = (), expert: dict[str, str] | None = None,
            module: str = "", output_shape: Sequence[int] | None = None, **attrs: Any) -> int:
        sizes = dict(dims)
        shape = list(output_shape) if output_shape is not None else \
            [math.prod(sizes[d] for d in g) for g in output]
        space: dict[str, Any] = {
            "kind": kind, "dims": [[d, int(s)] for d, s in dims],
            "output": [list(g) for g in output], "output_shape": shape,
            "inputs": {str(src): [list(g) for g in groups] for src, groups in inputs},
        }
        if fixed:
            space["fixed"] = list(fixed)
        if weight:
            space["weight"] = list(weight)
        if expert:
            space["expert"] = dict(expert)
        space.update(attrs)
        elems = math.prod(s for _, s in dims)
        if kind == "gemm":
            fwd = 2.0 * elems + attrs.get("pw", 0) * math.prod(shape)
            bwd = 2.0 * fwd
        elif kind == "lstm":
            lyr, seq, bat, hid, inp = (s for _, s in dims)
            fwd = 2.0 * lyr * seq * bat * 4 * hid * 2 * inp
            bwd = 2.0 * fwd
        elif kind in ("reshape", "concat", "split", "transpose"):
            fwd = bwd = 0.0
        else:
            fwd = bwd = float(elems) * (1 + attrs.get("pw", 0))
        params = math.prod(sizes[d] for d in weight) * attrs.get("weight_scale", 1) \
            if weight else 0
        nid = len(self.nodes)
        out_bytes = 4 * math.prod(shape)
        self.nodes.append(Node(id=nid, name=name, op=op, module=module or name,
                               fwd_flops=fwd, bwd_flops=bwd, param_bytes=4 * params,
                               output_bytes=out_bytes, weight=float(params), space=space))
        for src, _ in inputs:
            self.edges.append((src, nid, int(self.nodes[src].output_bytes)))
        return nid

    def graph(self) -> Graph:
        return Graph.from_nodes(name=self.name, batch_size=self.batch, nodes=self.nodes,
                                edges=self.edges, meta=self.meta)


_IMG = (("b",), ("c",), ("h",), ("w",))
_DATA = {"b": "all"}


def _check_batch(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ShardplanError(f"batch_size must be a positive integer, got {batch_size!r}")
    return batch_size


class _CNN:
    """Convolution / pooling / batch-norm helpers over NCHW tensors."""

    def __init__(self, b: _Builder) -> None:
        self.b = b

    def conv(self, name: str, src: int | None, cin: int, hin: int, cout: int,
             k: tuple[int, int], stride: int = 1, pad: tuple[int, int] = (0, 0),
             pw: int = 1) -> tuple[int, int, int]:
        """Returns (node, out height, out width)."""
        b = self.b
        ho = (hin + 2 * pad[0] - k[0]) // stride + 1
        wo = (hin + 2 * pad[1] - k[1]) // stride + 1
        inputs = [] if src is None else [(src, (("b",), ("c",), (), ()))]
        nid = b.add(name, "conv2d", "gemm",
                    [("b", b.batch), ("c", cin), ("h", ho), ("w", wo), ("r", k[0]),
                     ("s", k[1]), ("o", cout)],
                    output=(("b",), ("o",), ("h",), ("w",)), inputs=inputs,
                    fixed=("h", "w"), weight=("c", "r", "s", "o"), expert=_DATA,
                    m=["b", "h", "w"], n=["o"], k=["c", "r", "s"], pw=pw)
        return nid, ho, wo

    def pool(self, name: str, src: int, c: int, hin: int, k: int, stride: int,
             pad: int = 0, op: str = "max_pool2d") -> tuple[int, int]:
        b = self.b
        ho = (hin + 2 * pad - k) // stride + 1
        nid = b.add(name, op, "pool", [("b", b.batch), ("c", c), ("h", ho), ("w", ho)],
                    output=_IMG, inputs=[(src, _IMG)], expert=_DATA, window=[k, k],
                    input_hw=[hin, hin])
        return nid, ho

    def conv_bn(self, name: str, src: int | None, cin: int, h: int, w: int, cout: int,
                k: tuple[int, int], stride: int = 1,
                pad: tuple[int, int] = (0, 0)) -> tuple[int, int, int, int]:
        """A convolution followed by its batch norm, the prototype's ``AddBasicConv`` (no
        pointwise op fused into the convolution): (bn node, cout, h, w)."""
        b = self.b
        ho = (h + 2 * pad[0] - k[0]) // stride + 1
        wo = (w + 2 * pad[1] - k[1]) // stride + 1
        cid = b.add(f"{name}.conv", "conv2d", "gemm",
                    [("b", b.batch), ("c", cin), ("h", ho), ("w", wo), ("r", k[0]),
                     ("s", k[1]), ("o", cout)],
                    output=(("b",), ("o",), ("h",), ("w",)),
                    inputs=[] if src is None else [(src, (("b",), ("c",), (), ()))],
                    fixed=("h", "w"), weight=("c", "r", "s", "o"), expert=_DATA,
                    m=["b", "h", "w"], n=["o"], k=["c", "r", "s"], pw=0, module=name)
        nid = b.add(f"{name}.bn", "batch_norm", "norm",
                    [("b", b.batch), ("c", cout), ("h", ho), ("w", wo)], output=_IMG,
                    inputs=[(cid, _IMG)], weight=("c",), weight_scale=2, expert=_DATA,
                    axis="b", module=name)
        return nid, cout, ho, wo

    def concat(self, name: str, parts: Sequence[tuple[int, int]], h: int, w: int) -> int:
        """``parts``: (node, channels) in order."""
        b = self.b
        c = sum(ch for _, ch in parts)
        return b.add(name, "cat", "concat", [("b", b.batch), ("c", c), ("h", h), ("w", w)],
                     output=_IMG, inputs=[(p, _IMG) for p, _ in parts], fixed=("c",),
                     expert=_DATA)

    def head(self, src: int, c: int, h: int, classes: int, hidden: Sequence[int] = (),
             flatten: bool = False) -> None:
        """Flatten (reshape) or global mean, FC layers, softmax + cross-entropy."""
        b = self.b
        if flatten:
            # Only splits that keep the flattened data contiguous (the note): the batch,
            # the leading axis, which the cutoff keeps from splitting fully.
            src = b.add("flatten", "view", "reshape",
                        [("b", b.batch), ("c", c), ("h", h), ("w", h)],
                        output=(("b",), ("c", "h", "w")), inputs=[(src, _IMG)],
                        fixed=("c", "h", "w"), expert=_DATA)
            feat = c * h * h
        else:
            src = b.add("avgpool", "mean", "reduce_mean",
                        [("b", b.batch), ("c", c), ("h", h), ("w", h)],
                        output=(("b",), ("c",)), inputs=[(src, _IMG)], expert=_DATA,
                        axes=["h", "w"])
            feat = c
        widths = [*hidden, classes]
        for i, width in enumerate(widths):
            last = i == len(widths) - 1
            src = b.add(f"fc{i + 1}", "linear", "gemm",
                        [("b", b.batch), ("n", width), ("k", feat)],
                        output=(("b",), ("n",)), inputs=[(src, (("b",), ("k",)))],
                        weight=("n", "k"), expert={"n": "all"}, m=["b"], n=["n"], k=["k"],
                        pw=0 if last else 1)
            feat = width
        b.add("loss", "cross_entropy", "softmax_ce", [("b", b.batch), ("c", feat)],
              output=(), output_shape=(), inputs=[(src, (("b",), ("c",)))], expert=_DATA,
              axis="c")


def alexnet(*, batch_size: int = 128, name: str = "alexnet") -> Graph:
    """AlexNet as the PaSE benchmark: a path of 5 convolutions, 3 max-pools, a reshape, 3 fully
    connected layers (4096, 4096, 1024) and softmax + cross-entropy (13 nodes).

    Examples
    --------
    >>> alexnet().num_nodes
    13
    """
    b = _Builder(name, _check_batch(batch_size), {"pase_cutoff": 4, "model": "pase:alexnet"})
    cnn = _CNN(b)
    x, h, _ = cnn.conv("conv1", None, 3, 227, 96, (11, 11), stride=4)
    x, h = cnn.pool("pool1", x, 96, h, 3, 2)
    x, h, _ = cnn.conv("conv2", x, 96, h, 256, (5, 5), pad=(2, 2))
    x, h = cnn.pool("pool2", x, 256, h, 3, 2)
    x, h, _ = cnn.conv("conv3", x, 256, h, 384, (3, 3), pad=(1, 1))
    x, h, _ = cnn.conv("conv4", x, 384, h, 384, (3, 3), pad=(1, 1))
    x, h, _ = cnn.conv("conv5", x, 384, h, 256, (3, 3), pad=(1, 1))
    x, h = cnn.pool("pool3", x, 256, h, 3, 2)
    cnn.head(x, 256, h, 1024, hidden=(4096, 4096), flatten=True)
    return b.graph()


def inception_v3(*, batch_size: int = 128, name: str = "inception-v3") -> Graph:
    """InceptionV3 in torchvision's layout (modules A x3, B, C x4 with 128/160/160/192
    channels, D, E x2), every convolution followed by its batch norm, global mean, FC 1000,
    softmax + cross-entropy."""
    b = _Builder(name, _check_batch(batch_size), {"pase_cutoff": 4,
                                                  "model": "pase:inception-v3"})
    cnn = _CNN(b)
    x, c, h, w = cnn.conv_bn("Conv2d_1a_3x3", None, 3, 299, 299, 32, (3, 3), 2)
    x, c, h, w = cnn.conv_bn("Conv2d_2a_3x3", x, c, h, w, 32, (3, 3))
    x, c, h, w = cnn.conv_bn("Conv2d_2b_3x3", x, c, h, w, 64, (3, 3), pad=(1, 1))
    x, h = cnn.pool("maxpool1", x, c, h, 3, 2)
    w = h
    x, c, h, w = cnn.conv_bn("Conv2d_3b_1x1", x, c, h, w, 80, (1, 1))
    x, c, h, w = cnn.conv_bn("Conv2d_4a_3x3", x, c, h, w, 192, (3, 3))
    x, h = cnn.pool("maxpool2", x, c, h, 3, 2)
    w = h

    def cb(nm: str, src: int, cin: int, cout: int, k: tuple[int, int], stride: int = 1,
           pad: tuple[int, int] = (0, 0), hh: int = 0, ww: int = 0) -> tuple[int, int, int]:
        nid, co, ho, wo = cnn.conv_bn(nm, src, cin, hh or h, ww or w, cout, k, stride, pad)
        return nid, ho, wo

    for mod, pf in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        b1, _, _ = cb(f"{mod}.branch1x1", x, c, 64, (1, 1))
        t, _, _ = cb(f"{mod}.branch5x5_1", x, c, 48, (1, 1))
        b5, _, _ = cb(f"{mod}.branch5x5_2", t, 48, 64, (5, 5), pad=(2, 2))
        t, _, _ = cb(f"{mod}.branch3x3dbl_1", x, c, 64, (1, 1))
        t, _, _ = cb(f"{mod}.branch3x3dbl_2", t, 64, 96, (3, 3), pad=(1, 1))
        b3, _, _ = cb(f"{mod}.branch3x3dbl_3", t, 96, 96, (3, 3), pad=(1, 1))
        p, _ = cnn.pool(f"{mod}.avgpool", x, c, h, 3, 1, 1, op="avg_pool2d")
        bp, _, _ = cb(f"{mod}.branch_pool", p, c, pf, (1, 1))
        x = cnn.concat(f"{mod}.cat", [(b1, 64), (b5, 64), (b3, 96), (bp, pf)], h, w)
        c = 64 + 64 + 96 + pf
    # Mixed_6a (InceptionB): 35 -> 17
    b3, h2, w2 = cb("Mixed_6a.branch3x3", x, c, 384, (3, 3), 2)
    t, _, _ = cb("Mixed_6a.branch3x3dbl_1", x, c, 64, (1, 1))
    t, _, _ = cb("Mixed_6a.branch3x3dbl_2", t, 64, 96, (3, 3), pad=(1, 1))
    bd, _, _ = cb("Mixed_6a.branch3x3dbl_3", t, 96, 96, (3, 3), 2)
    p, _ = cnn.pool("Mixed_6a.maxpool", x, c, h, 3, 2)
    x = cnn.concat("Mixed_6a.cat", [(b3, 384), (bd, 96), (p, c)], h2, w2)
    c, h, w = 384 + 96 + c, h2, w2
    for mod, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160),
                    ("Mixed_6e", 192)):
        b1, _, _ = cb(f"{mod}.branch1x1", x, c, 192, (1, 1))
        t, _, _ = cb(f"{mod}.branch7x7_1", x, c, c7, (1, 1))
        t, _, _ = cb(f"{mod}.branch7x7_2", t, c7, c7, (1, 7), pad=(0, 3))
        b7, _, _ = cb(f"{mod}.branch7x7_3", t, c7, 192, (7, 1), pad=(3, 0))
        t, _, _ = cb(f"{mod}.branch7x7dbl_1", x, c, c7, (1, 1))
        t, _, _ = cb(f"{mod}.branch7x7dbl_2", t, c7, c7, (7, 1), pad=(3, 0))
        t, _, _ = cb(f"{mod}.branch7x7dbl_3", t, c7, c7, (1, 7), pad=(0, 3))
        t, _, _ = cb(f"{mod}.branch7x7dbl_4", t, c7, c7, (7, 1), pad=(3, 0))
        bd, _, _ = cb(f"{mod}.branch7x7dbl_5", t, c7, 192, (1, 7), pad=(0, 3))
        p, _ = cnn.pool(f"{mod}.avgpool", x, c, h, 3, 1, 1, op="avg_pool2d")
        bp, _, _ = cb(f"{mod}.branch_pool", p, c, 192, (1, 1))
        x = cnn.concat(f"{mod}.cat", [(b1, 192), (b7, 192), (bd, 192), (bp, 192)], h, w)
        c = 768
    # Mixed_7a (InceptionD): 17 -> 8
    t, _, _ = cb("Mixed_7a.branch3x3_1", x, c, 192, (1, 1))
    b3, h2, w2 = cb("Mixed_7a.branch3x3_2", t, 192, 320, (3, 3), 2)
    t, _, _ = cb("Mixed_7a.branch7x7x3_1", x, c, 192, (1, 1))
    t, _, _ = cb("Mixed_7a.branch7x7x3_2", t, 192, 192, (1, 7), pad=(0, 3))
    t, _, _ = cb("Mixed_7a.branch7x7x3_3", t, 192, 192, (7, 1), pad=(3, 0))
    b7, _, _ = cb("Mixed_7a.branch7x7x3_4", t, 192, 192, (3, 3), 2)
    p, _ = cnn.pool("Mixed_7a.maxpool", x, c, h, 3, 2)
    x = cnn.concat("Mixed_7a.cat", [(b3, 320), (b7, 192), (p, c)], h2, w2)
    c, h, w = 320 + 192 + c, h2, w2
    for mod in ("Mixed_7b", "Mixed_7c"):
        b1, _, _ = cb(f"{mod}.branch1x1", x, c, 320, (1, 1))
        t, _, _ = cb(f"{mod}.branch3x3_1", x, c, 384, (1, 1))
        a1, _, _ = cb(f"{mod}.branch3x3_2a", t, 384, 384, (1, 3), pad=(0, 1))
        a2, _, _ = cb(f"{mod}.branch3x3_2b", t, 384, 384, (3, 1), pad=(1, 0))
        t, _, _ = cb(f"{mod}.branch3x3dbl_1", x, c, 448, (1, 1))
        t, _, _ = cb(f"{mod}.branch3x3dbl_2", t, 448, 384, (3, 3), pad=(1, 1))
        d1, _, _ = cb(f"{mod}.branch3x3dbl_3a", t, 384, 384, (1, 3), pad=(0, 1))
        d2, _, _ = cb(f"{mod}.branch3x3dbl_3b", t, 384, 384, (3, 1), pad=(1, 0))
        p, _ = cnn.pool(f"{mod}.avgpool", x, c, h, 3, 1, 1, op="avg_pool2d")
        bp, _, _ = cb(f"{mod}.branch_pool", p, c, 192, (1, 1))
        x = cnn.concat(f"{mod}.cat", [(b1, 320), (a1, 384), (a2, 384), (d1, 384),
                                      (d2, 384), (bp, 192)], h, w)
        c = 2048
    cnn.head(x, c, h, 1000)
    return b.graph()


_SEQ3 = (("b",), ("s",), ("d",))


def rnnlm(*, batch_size: int = 64, name: str = "rnnlm") -> Graph:
    """RNNLM: embedding (vocabulary 100000, 2048), one node for the 2-layer LSTM (2048 units,
    sequence 256), FC to the vocabulary, softmax + cross-entropy (4 nodes, a path)."""
    b = _Builder(name, _check_batch(batch_size), {"pase_cutoff": 1, "model": "pase:rnnlm",
                                                  "expert_model_parallel": 2})
    bs, seq, hid, voc = b.batch, 256, 2048, 100_000
    vocab = {"b": "data", "v": "model"}
    emb = b.add("embedding", "embedding", "gemm",
                [("b", bs), ("s", seq), ("d", hid), ("v", voc)], output=_SEQ3,
                weight=("v", "d"), expert=vocab, m=["b", "s"], n=["d"], k=["v"])
    lstm = b.add("lstm", "lstm", "lstm",
                 [("l", 2), ("s", seq), ("b", bs), ("n", hid), ("k", hid)],
                 output=(("b",), ("s",), ("n",)), inputs=[(emb, (("b",), ("s",), ("k",)))],
                 fixed=("s",), weight=("l", "n", "k"), weight_scale=8,
                 expert={"l": "model", "b": "data"}, batch_dim="b")
    fc = b.add("fc", "linear", "gemm", [("b", bs), ("s", seq), ("v", voc), ("k", hid)],
               output=(("b",), ("s",), ("v",)), inputs=[(lstm, (("b",), ("s",), ("k",)))],
               weight=("v", "k"), expert=vocab, m=["b", "s"], n=["v"], k=["k"])
    b.add("loss", "cross_entropy", "softmax_ce", [("b", bs), ("s", seq), ("v", voc)],
          output=(), output_shape=(), inputs=[(fc, (("b",), ("s",), ("v",)))], expert=vocab,
          axis="v")
    return b.graph()


def transformer(*, batch_size: int = 64, name: str = "transformer", num_layers: int = 6
                ) -> Graph:
    """The small Transformer: 6 encoder and 6 decoder layers (``num_layers`` each), attention
    as einsums (fused QKV projection, Q K^T, softmax, attention x V, output projection),
    residual adds and layer norms as nodes, shared-size embeddings, FC to the vocabulary,
    softmax + cross-entropy."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ShardplanError(f"num_layers must be a positive integer, got {num_layers!r}")
    b = _Builder(name, _check_batch(batch_size), {"pase_cutoff": 1,
                                                  "model": "pase:transformer",
                                                  "expert_model_parallel": 8})
    bs, seq, voc, dm, nh, hd, ff = b.batch, 256, 50_000, 512, 8, 64, 2048
    data = {"b": "data"}
    heads = {"b": "data", "h": "model"}

    def embedding(nm: str) -> int:
        """The embedding and, as the prototype, the positional encoding added to it (an
        elementwise node; the encoding itself is an input, so no edge)."""
        e = b.add(nm, "embedding", "gemm", [("b", bs), ("s", seq), ("d", dm), ("v", voc)],
                  output=_SEQ3, weight=("v", "d"), expert={"b": "data", "v": "model"},
                  m=["b", "s"], n=["d"], k=["v"])
        return b.add(f"{nm.rsplit('.', 1)[0]}.positional", "add", "elementwise",
                     [("b", bs), ("s", seq), ("d", dm)], output=_SEQ3, inputs=[(e, _SEQ3)],
                     expert=data)

    def proj(nm: str, src: int, width: int) -> int:
        """(b, s, d) -> (b, s, h, width) projection (fused Q/K/V parts)."""
        return b.add(nm, "linear", "gemm",
                     [("b", bs), ("s", seq), ("h", nh), ("f", width), ("d", dm)],
                     output=(("b",), ("s",), ("h",), ("f",)), inputs=[(src, _SEQ3)],
                     weight=("h", "f", "d"), expert=heads, m=["b", "s"], n=["h", "f"],
                     k=["d"], module=nm.rsplit(".", 1)[0])

    def attention(pre: str, q_src: int, kv_src: int) -> int:
        """Q K^T, softmax, x V and the output projection; returns the projection."""
        qk = b.add(f"{pre}.qk", "einsum", "gemm",
                   [("b", bs), ("h", nh), ("q", seq), ("t", seq), ("e", hd)],
                   output=(("b",), ("h",), ("q",), ("t",)),
                   inputs=[(q_src, (("b",), ("q",), ("h",), ()))]
                   + ([] if kv_src == q_src else [(kv_src, (("b",), ("t",), ("h",), ()))]),
                   expert=heads, batch=["b", "h"], m=["q"], n=["t"], k=["e"], module=pre)
        sm = b.add(f"{pre}.softmax", "softmax", "softmax",
                   [("b", bs), ("h", nh), ("q", seq), ("t", seq)],
                   output=(("b",), ("h",), ("q",), ("t",)),
                   inputs=[(qk, (("b",), ("h",), ("q",), ("t",)))], expert=heads, axis="t",
                   module=pre)
        av = b.add(f"{pre}.av", "einsum", "gemm",
                   [("b", bs), ("h", nh), ("q", seq), ("e", hd), ("t", seq)],
                   output=(("b",), ("h",), ("q",), ("e",)),
                   inputs=[(sm, (("b",), ("h",), ("q",), ("t",))),
                           (kv_src, (("b",), ("t",), ("h",), ()))],
                   expert=heads, batch=["b", "h"], m=["q"], n=["e"], k=["t"], module=pre)
        return b.add(f"{pre}.out", "linear", "gemm",
                     [("b", bs), ("s", seq), ("d", dm), ("h", nh), ("e", hd)],
                     output=_SEQ3, inputs=[(av, (("b",), ("h",), ("s",), ("e",)))],
                     weight=("d", "h", "e"), expert=heads, m=["b", "s"], n=["d"],
                     k=["h", "e"], module=pre)

    def add_norm(pre: str, a: int, res: int) -> int:
        s = b.add(f"{pre}.add", "add", "elementwise", [("b", bs), ("s", seq), ("d", dm)],
                  output=_SEQ3, inputs=[(a, _SEQ3), (res, _SEQ3)], expert=data, module=pre)
        return b.add(f"{pre}.norm", "layer_norm", "norm", [("b", bs), ("s", seq), ("d", dm)],
                     output=_SEQ3, inputs=[(s, _SEQ3)], weight=("d",), weight_scale=2,
                     expert=data, axis="d", module=pre)

    def ffn(pre: str, x: int) -> int:
        # ReLU and dropout fused into the first layer: two pointwise ops, as the prototype.
        h1 = b.add(f"{pre}.ffn1", "linear", "gemm",
                   [("b", bs), ("s", seq), ("f", ff), ("d", dm)],
                   output=(("b",), ("s",), ("f",)), inputs=[(x, _SEQ3)], weight=("f", "d"),
                   expert={"b": "data", "f": "model"}, m=["b", "s"], n=["f"], k=["d"], pw=2,
                   module=pre)
        return b.add(f"{pre}.ffn2", "linear", "gemm",
                     [("b", bs), ("s", seq), ("d", dm), ("f", ff)], output=_SEQ3,
                     inputs=[(h1, (("b",), ("s",), ("f",)))], weight=("d", "f"),
                     expert={"b": "data", "f": "model"}, m=["b", "s"], n=["d"], k=["f"],
                     module=pre)

    x = embedding("encoder.embedding")
    for i in range(num_layers):
        pre = f"encoder.{i}"
        qkv = proj(f"{pre}.attn.qkv", x, 3 * hd)
        a = attention(f"{pre}.attn", qkv, qkv)
        x = add_norm(f"{pre}.attn", a, x)
        x = add_norm(f"{pre}.ffn", ffn(pre, x), x)
    memory = x
    y = embedding("decoder.embedding")
    for i in range(num_layers):
        pre = f"decoder.{i}"
        qkv = proj(f"{pre}.self.qkv", y, 3 * hd)
        a = attention(f"{pre}.self", qkv, qkv)
        y = add_norm(f"{pre}.self", a, y)
        q = proj(f"{pre}.cross.q", y, hd)
        kv = proj(f"{pre}.cross.kv", memory, 2 * hd)
        a = attention(f"{pre}.cross", q, kv)
        y = add_norm(f"{pre}.cross", a, y)
        y = add_norm(f"{pre}.ffn", ffn(pre, y), y)
    fc = b.add("fc", "linear", "gemm", [("b", bs), ("s", seq), ("v", voc), ("d", dm)],
               output=(("b",), ("s",), ("v",)), inputs=[(y, _SEQ3)], weight=("v", "d"),
               expert={"b": "data", "v": "model"}, m=["b", "s"], n=["v"], k=["d"])
    b.add("loss", "cross_entropy", "softmax_ce", [("b", bs), ("s", seq), ("v", voc)],
          output=(), output_shape=(), inputs=[(fc, (("b",), ("s",), ("v",)))],
          expert={"b": "data", "v": "model"}, axis="v")
    return b.graph()
