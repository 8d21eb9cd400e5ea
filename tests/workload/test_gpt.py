"""The Megatron-style GPT given its dimensions (``gpt:...``): GPT-3's published count, the tied
head, torchtitan-style names, training on CPU."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.workload import build_model  # noqa: E402
from shardplan.workload.zoo import parameter_estimate  # noqa: E402

pytestmark = pytest.mark.torch

GPT3 = "gpt:hidden=12288,layers=96,heads=96,vocab=51200,seq=2048"
TINY = "gpt:hidden=32,layers=2,heads=4,vocab=64,seq=8"


def test_gpt3_175b_within_half_a_percent_of_the_published_count() -> None:
    model, (ids,), name = build_model(GPT3, batch_size=1, meta=True)
    count = sum(p.numel() for p in model.parameters())  # the tied head once
    assert name == "gpt" and ids.shape == (1, 2048)
    assert abs(count / 174.6e9 - 1) < 0.005, count
    # Megatron's formula (llm-facts.md), plus the final LayerNorm's 2h
    h, l_, v, s = 12288, 96, 51200, 2048
    assert count == round(12 * l_ * h * h * (1 + 13 / (12 * h)) + v * h + s * h) + 2 * h
    assert parameter_estimate(GPT3) == count


def test_head_is_tied_and_names_are_torchtitan_style() -> None:
    model, _, _ = build_model(TINY, batch_size=1)
    assert model.output.weight is model.tok_embeddings.weight
    names = {n for n, _ in model.named_modules()}
    for want in ("tok_embeddings", "pos_embeddings", "layers.0.attention_norm",
                 "layers.0.attention.wqkv", "layers.0.attention.wo", "layers.1.ffn_norm",
                 "layers.1.feed_forward.w1", "layers.1.feed_forward.w2", "norm", "output"):
        assert want in names, want
    assert model.layers["0"].attention.wqkv.bias is not None  # biases, as Megatron's


def test_ffn_option_and_training_on_cpu() -> None:
    model, (ids,), _ = build_model(TINY + ",ffn=48", batch_size=2)
    assert model.layers["1"].feed_forward.w1.out_features == 48
    logits = model(ids)
    assert logits.shape == (2, 8, 64)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1))
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_seq_defaults_to_the_sequence_length() -> None:
    model, (ids,), _ = build_model("gpt:hidden=32,layers=1,heads=4,vocab=64", batch_size=1,
                                   seq_len=5)
    assert ids.shape == (1, 5) and model.pos_embeddings.num_embeddings == 5


@pytest.mark.parametrize(("spec", "match"), [
    ("gpt:hidden=32,layers=2,vocab=64", "gpt needs heads"),
    ("gpt:hidden=30,layers=2,heads=4,vocab=64", "not divisible by heads=4"),
    ("gpt:hidden=32,layers=2,heads=4,vocab=64,depth=3", "unknown gpt option 'depth'"),
    ("gpt:hidden=32,layers=0,heads=4,vocab=64", "layers must be a positive integer"),
])
def test_bad_specs_are_shardplan_errors(spec: str, match: str) -> None:
    with pytest.raises(ShardplanError, match=match):
        build_model(spec, batch_size=1, meta=True)


def test_small_transformer_still_builds() -> None:
    model, (ids,), name = build_model("transformer,num_layers=1", batch_size=2, seq_len=8)
    assert name == "transformer" and model(ids).shape == (2, 8, 8192)
