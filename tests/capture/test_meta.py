"""Capture on the meta device: the same graph as in real memory, blocks stamped out to full
depth equal to a full capture, the model's dimensions in the graph's meta, and the attention
operator (one node, its FLOPs, no s x s activation)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardplan.capture import capture, capture_spec  # noqa: E402
from shardplan.capture._stamp import block_of, stamp_blocks  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir import Graph  # noqa: E402
from shardplan.workload import build_model  # noqa: E402

pytestmark = pytest.mark.torch

LLAMA = "llama3:debug,dim=32,n_heads=4,n_kv_heads=2,vocab_size=64"
# dropout 0: torch counts an attention with dropout 8 b h s^2 d backward, not flash's 10
GPT = "gpt:hidden=32,layers=3,heads=4,vocab=64,seq=8,dropout=0"


def _real(spec: str, batch: int = 2, seq: int = 8) -> Graph:
    model, inputs, name = build_model(spec, batch_size=batch, seq_len=seq)
    assert not next(model.parameters()).is_meta
    return capture(model, inputs, name=name)


def assert_same_graph(a: Graph, b: Graph) -> None:
    assert a.names == b.names
    assert a.ops == b.ops
    assert a.modules == b.modules
    for col in ("fwd_flops", "bwd_flops", "param_bytes", "output_bytes", "weight", "src",
                "dst", "edge_bytes", "param_tensors"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert a.spaces == b.spaces
    assert a.node_extra == b.node_extra


@pytest.fixture(scope="module")
def llama_meta() -> Graph:
    return capture_spec(LLAMA, batch_size=2, seq_len=8, meta=True)  # two blocks: no stamp


@pytest.fixture(scope="module")
def gpt_stamped() -> Graph:
    return capture_spec(GPT, batch_size=2, seq_len=8, meta=True)


def test_meta_capture_equals_the_real_memory_capture(llama_meta: Graph) -> None:
    meta = llama_meta
    real = _real(LLAMA)
    assert "stamped" not in meta.meta and meta.meta["device"] == "meta"
    assert "device" not in real.meta
    assert_same_graph(meta, real)
    assert meta.meta["parameters"] == real.meta["parameters"]
    assert meta.meta["transformer"] == real.meta["transformer"]


def test_stamped_blocks_equal_a_full_capture(gpt_stamped: Graph) -> None:
    """capture_spec on meta stamps the third block; a full capture in real memory agrees on
    every node, edge, space and the model's dimensions."""
    stamped = gpt_stamped
    assert stamped.meta["stamped"] == {"template_blocks": 2, "blocks": 3,
                                       "container": "layers"}
    full = _real(GPT)
    assert_same_graph(stamped, full)
    for key in ("parameters", "transformer", "input_shapes", "buffer_bytes"):
        assert stamped.meta[key] == full.meta[key], key


def test_stamped_llama_equals_a_full_capture(llama_meta: Graph) -> None:
    """Grouped-query attention, rotary tables read by every block, fx names numbered on."""
    stamped = stamp_blocks(llama_meta, 3)
    assert stamped is not None
    assert_same_graph(stamped, _real(LLAMA + ",n_layers=3"))


def test_stamping_refuses_blocks_that_differ(llama_meta: Graph) -> None:
    g = llama_meta
    assert stamp_blocks(g, 5) is not None
    flops = g.fwd_flops.copy()
    flops[[i for i, m in enumerate(g.modules) if block_of(m) == 1][0]] += 1.0
    assert stamp_blocks(g.replace(fwd_flops=flops), 5) is None


def test_graph_meta_records_the_models_dimensions() -> None:
    g = capture_spec("llama3:8B,seq=64", batch_size=1, meta=True)
    t = g.meta["transformer"]
    assert t == {"family": "llama", "hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8,
                 "ffn": 14336, "vocab": 128256, "seq": 64, "tied": False,
                 "parameters": 8030261248}
    assert g.meta["parameters"] == t["parameters"]
    assert int(g.param_bytes.sum()) == 4 * t["parameters"]  # every parameter read once
    # every node's module is a full path: the embedding, a block's module, or the head
    blocks = {block_of(m) for m in g.modules}
    assert blocks == {None, *range(32)}
    assert {m for m in g.modules if block_of(m) is None} == {"tok_embeddings", "norm",
                                                             "output"}
    assert "layers.31.attention.wq" in g.modules and "layers.0.feed_forward.w3" in g.modules


def test_gpt_meta_counts_the_tied_head_once(gpt_stamped: Graph) -> None:
    g = gpt_stamped
    t = g.meta["transformer"]
    h, v, s, layers = 32, 64, 8, 3
    assert t["family"] == "gpt" and t["tied"] is True and t["kv_heads"] == 4
    assert t["parameters"] == 12 * layers * h * h + 13 * layers * h + v * h + s * h + 2 * h
    assert g.meta["parameters"] == t["parameters"]
    assert int(g.weight.sum()) == t["parameters"]


def test_attention_is_one_operator_with_attention_flops(gpt_stamped: Graph) -> None:
    b, s = 2, 8
    g = gpt_stamped
    sdpa = [i for i, op in enumerate(g.ops) if op == "scaled_dot_product_attention"]
    assert [g.modules[i] for i in sdpa] == [f"layers.{j}.attention" for j in range(3)]
    h, d = 4, 8
    for i in sdpa:
        # torch counts the full s x s product, causal or not: 4 b h s^2 d forward (two
        # batched matrix products), 10 b h s^2 d backward (flash recomputes the scores)
        assert g.fwd_flops[i] == 4 * b * h * s * s * d
        assert g.bwd_flops[i] == 10 * b * h * s * s * d
        # what it keeps is its (b, h, s, d) output: no s x s matrix
        assert g.output_bytes[i] == 4 * b * h * s * d
        assert g.memory_bytes is None or g.memory_bytes[i] == 0
        assert g.spaces[i]["kind"] == "attention" and g.spaces[i]["causal"] is True
        assert g.spaces[i]["dims"] == [["b", b], ["h", h], ["q", s], ["k", s], ["d", d]]


def test_flash_attention_memory_has_no_s_squared_term() -> None:
    """Doubling the sequence doubles every attention node's activation bytes (4x would be
    an s x s matrix)."""
    short = capture_spec(GPT, batch_size=2, seq_len=8, meta=True)
    long = capture_spec(GPT.replace("seq=8", "seq=16"), batch_size=2, meta=True)
    i = short.ops.index("scaled_dot_product_attention")
    assert long.output_bytes[i] == 2 * short.output_bytes[i]
    assert long.fwd_flops[i] == 4 * short.fwd_flops[i]


def test_profile_needs_real_memory() -> None:
    with pytest.raises(ShardplanError, match="cannot run on a model built on the meta"):
        capture_spec(GPT, batch_size=1, meta=True, profile=True)
