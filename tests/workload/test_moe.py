"""Mixture-of-experts flavors: published parameter counts (on meta), torchtitan's names, the
debug flavors training on CPU, and the router / dispatch / experts / combine nodes of a
captured graph."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir import Graph  # noqa: E402
from shardplan.workload import build_model  # noqa: E402
from shardplan.workload.moe import (  # noqa: E402
    FLAVORS,
    PUBLISHED,
    active_parameter_count,
    parameter_count,
)
from shardplan.workload.zoo import (  # noqa: E402
    block_spec,
    list_models,
    parameter_estimate,
    training_seq,
)

pytestmark = pytest.mark.torch

DEBUG = sorted(k for k in FLAVORS if k.endswith(":debug"))


@pytest.mark.parametrize("flavor", sorted(PUBLISHED))
def test_parameter_counts_within_half_a_percent_of_the_published(flavor: str) -> None:
    model, (tokens,), _ = build_model(flavor, batch_size=1, seq_len=8, meta=True)
    count = sum(p.numel() for p in model.parameters())
    assert all(p.is_meta for p in model.parameters()) and tokens.is_meta
    total, _, _ = PUBLISHED[flavor]
    assert abs(count / total - 1) < 0.005, count
    assert parameter_count(FLAVORS[flavor]) == count == parameter_estimate(flavor)


@pytest.mark.parametrize("flavor", sorted(PUBLISHED))
def test_active_parameters_match_the_published_figure(flavor: str) -> None:
    # published as 2-3 significant figures ("37B", "3.3B"): within 2% (GPT-OSS's card gives
    # 5.13 B, within 0.5%)
    _, active, what = PUBLISHED[flavor]
    count = active_parameter_count(FLAVORS[flavor], embedding=what == "all")
    tol = 0.005 if flavor.startswith("gpt_oss") else 0.02
    assert abs(count / active - 1) < tol, count


def test_deepseek_v3_has_the_published_shape() -> None:
    model, _, name = build_model("deepseek_v3:671B", batch_size=1, seq_len=8, meta=True)
    assert name == "deepseek_v3-671B" and len(model.layers) == 61
    att = model.layers["0"].attention
    assert (att.wq_a.out_features, att.wq_b.out_features) == (1536, 128 * 192)
    assert (att.wkv_a.out_features, att.wkv_b.out_features) == (512 + 64, 128 * 256)
    assert att.wo.in_features == 128 * 128
    for i in range(3):
        assert model.layers[str(i)].feed_forward.w1.out_features == 18432
        assert not hasattr(model.layers[str(i)], "moe")
    moe = model.layers["3"].moe
    assert tuple(moe.experts.w1.shape) == (256, 7168, 2048) and moe.router.top_k == 8
    assert moe.shared_experts.w1.out_features == 2048
    assert model.tok_embeddings.num_embeddings == 129280
    assert model.output.weight is not model.tok_embeddings.weight


def test_module_names_are_torchtitans() -> None:
    model, _, _ = build_model("deepseek_v3:debug", batch_size=1, seq_len=8)
    names = {n for n, _ in model.named_modules()}
    for want in ("tok_embeddings", "layers.0.attention.wq_a", "layers.0.attention.wkv_b",
                 "layers.0.feed_forward.w1", "layers.1.moe.router.gate",
                 "layers.1.moe.dispatch", "layers.1.moe.experts", "layers.1.moe.combine",
                 "layers.1.moe.shared_experts.w2", "norm", "output"):
        assert want in names, want


@pytest.mark.parametrize("flavor", DEBUG)
def test_debug_flavors_train_on_cpu(flavor: str) -> None:
    model, (tokens,), name = build_model(flavor, batch_size=2, seq_len=16)
    assert name == flavor.replace(":", "-")
    logits = model(tokens)
    assert logits.shape == (2, 16, FLAVORS[flavor].vocab_size)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    assert math.isfinite(loss.item())
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    assert model.layers["1"].moe.experts.w1.grad.abs().sum() > 0


def test_dropless_routing_equals_a_per_token_loop() -> None:
    model, (tokens,), _ = build_model("mixtral:debug,capacity_factor=none", batch_size=1,
                                      seq_len=8)
    moe = model.layers["0"].moe
    x = torch.randn(1, 8, 64)
    got = moe(x)
    weights, experts = moe.router(x[0])
    want = torch.zeros(8, 64)
    e = moe.experts
    for t in range(8):
        for j in range(2):
            i = int(experts[t, j])
            h = torch.nn.functional.silu(x[0, t] @ e.w1[i]) * (x[0, t] @ e.w3[i])
            want[t] += weights[t, j] * (h @ e.w2[i])
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-6)


def test_capacity_drops_tokens_beyond_it() -> None:
    model, _, _ = build_model("mixtral:debug,capacity_factor=0.25", batch_size=1, seq_len=8)
    slots, slot = model.layers["0"].moe.dispatch(torch.randn(8, 64),
                                                 torch.zeros(8, 2, dtype=torch.int64))
    # 8 tokens x 2 choices, 4 experts: capacity ceil(0.25 * 16 / 4) = 1 per expert
    assert slots.shape == (4, 1, 64) and int((slot < 4).sum()) == 1


def test_spec_options_and_errors() -> None:
    model, (tokens,), _ = build_model("qwen3_moe:30B-A3B,n_layers=2,seq=64", batch_size=1,
                                      meta=True)
    assert len(model.layers) == 2 and tokens.shape == (1, 64)
    with pytest.raises(ShardplanError, match="unknown flavor"):
        build_model("mixtral:8x9B", meta=True)
    with pytest.raises(ShardplanError, match="unknown moe option"):
        build_model("mixtral:debug,bogus=1")
    with pytest.raises(ShardplanError, match="top_k"):
        build_model("mixtral:debug,top_k=9")
    assert {"deepseek_v3:671B", "gpt_oss:120B", "mixtral:8x22B"} <= set(list_models())
    assert training_seq("deepseek_v3:671B") == (4096, "deepseek_v3's training length")
    assert training_seq("gpt_oss:120B") is None
    assert block_spec("deepseek_v3:671B") is None  # dense first layers: captured whole
    blocks = block_spec("mixtral:8x7B,seq=256")
    assert blocks is not None and blocks.num_blocks == 32
    assert blocks.transformer["experts"] == 8 and blocks.transformer["seq"] == 256


def _ops_under(graph: Graph, prefix: str) -> list[str]:
    return [op for op, m in zip(graph.ops, graph.modules, strict=True)
            if m == prefix or m.startswith(prefix + ".")]


@pytest.mark.parametrize("flavor", DEBUG)
def test_capture_has_router_dispatch_experts_and_combine_nodes(flavor: str) -> None:
    graph = capture_spec(flavor, batch_size=1, seq_len=32)
    cfg = FLAVORS[flavor]
    layer = f"layers.{cfg.n_layers - 1}.moe"
    assert "linear" in _ops_under(graph, f"{layer}.router.gate")
    assert "topk" in _ops_under(graph, f"{layer}.router")
    assert "index_add" in _ops_under(graph, f"{layer}.dispatch")
    assert _ops_under(graph, f"{layer}.experts").count("bmm") == 3
    assert "index" in _ops_under(graph, f"{layer}.combine")
    has_shared = bool(_ops_under(graph, f"{layer}.shared_experts"))
    assert has_shared == bool(cfg.num_shared_experts)
    # the experts' grouped GEMMs count the routed tokens' FLOPs (capacity factor 1)
    flops = sum(f for f, op, m in zip(graph.fwd_flops, graph.ops, graph.modules, strict=True)
                if op == "bmm" and m.startswith(f"{layer}.experts"))
    assert flops == 2 * 32 * cfg.top_k * 3 * cfg.dim * cfg.moe_dim
    assert round(float(graph.weight.sum())) == parameter_count(cfg)


def test_dense_first_layers_stay_under_feed_forward() -> None:
    graph = capture_spec("deepseek_v3:debug", batch_size=1, seq_len=16)
    assert _ops_under(graph, "layers.0.feed_forward").count("linear") == 3
    assert not _ops_under(graph, "layers.0.moe")


def test_a_big_flavor_captures_on_meta_by_stamping() -> None:
    graph = capture_spec("mixtral:8x7B,seq=256", batch_size=1, meta=True)
    assert graph.meta["device"] == "meta" and graph.meta["stamped"]["blocks"] == 32
    assert graph.meta["transformer"]["experts"] == 8
    assert round(float(graph.weight.sum())) == parameter_count(FLAVORS["mixtral:8x7B"])
    assert _ops_under(graph, "layers.31.moe.experts").count("bmm") == 3


def test_deepseek_v3_captures_on_meta_with_its_dense_layers() -> None:
    graph = capture_spec("deepseek_v3:671B,seq=128,n_layers=4", batch_size=1, meta=True)
    assert graph.meta["device"] == "meta"
    assert _ops_under(graph, "layers.2.feed_forward").count("linear") == 3
    assert _ops_under(graph, "layers.3.moe.experts").count("bmm") == 3
    assert _ops_under(graph, "layers.3.moe.shared_experts").count("linear") == 3


@pytest.mark.slow
def test_deepseek_v3_full_depth_captures_on_meta() -> None:
    graph = capture_spec("deepseek_v3:671B,seq=4096", batch_size=1, meta=True)
    assert round(float(graph.weight.sum())) == parameter_count(FLAVORS["deepseek_v3:671B"])
    assert _ops_under(graph, "layers.60.moe.experts").count("bmm") == 3
