"""Llama 2 / 3: published parameter counts (on meta), torchtitan's names and dimensions, and the
tiny flavors training for real on CPU."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.workload import build_model  # noqa: E402
from shardplan.workload.llama import (  # noqa: E402
    FLAVORS,
    apply_rotary,
    ffn_hidden_dim,
    parameter_count,
)
from shardplan.workload.zoo import list_models, needs_meta  # noqa: E402

pytestmark = pytest.mark.torch

# Published parameter counts (llm-facts.md: Meta's model cards and torchtitan's flavors).
PUBLISHED = {"llama3:8B": 8.03e9, "llama3:70B": 70.55e9, "llama3:405B": 405.85e9,
             "llama2:7B": 6.74e9, "llama2:13B": 13.02e9, "llama2:70B": 68.98e9}
# Published FFN widths (llm-facts.md).
FFN = {"llama3:8B": 14336, "llama3:70B": 28672, "llama3:405B": 53248, "llama2:7B": 11008,
       "llama2:13B": 13824, "llama2:70B": 28672}


@pytest.mark.parametrize("flavor", sorted(PUBLISHED))
def test_parameter_counts_within_half_a_percent_of_the_published(flavor: str) -> None:
    model, (tokens,), _ = build_model(flavor, batch_size=1, seq_len=8, meta=True)
    count = sum(p.numel() for p in model.parameters())
    assert all(p.is_meta for p in model.parameters()) and tokens.is_meta
    assert abs(count / PUBLISHED[flavor] - 1) < 0.005, count
    assert parameter_count(FLAVORS[flavor]) == count  # the formula is the model's


@pytest.mark.parametrize("flavor", sorted(FFN))
def test_ffn_widths_are_the_published_ones(flavor: str) -> None:
    assert ffn_hidden_dim(FLAVORS[flavor]) == FFN[flavor]


def test_405b_has_the_published_shape() -> None:
    model, _, name = build_model("llama3:405B", batch_size=1, seq_len=8, meta=True)
    assert name == "llama3-405B" and len(model.layers) == 126
    att = model.layers["125"].attention
    assert (att.wq.in_features, att.wq.out_features) == (16384, 16384)
    assert att.wk.out_features == 8 * 128  # 8 KV heads of 128
    assert model.output.weight is not model.tok_embeddings.weight  # untied


def test_module_names_are_torchtitans() -> None:
    model, _, _ = build_model("llama3:debug", batch_size=1, seq_len=8)
    names = {n for n, _ in model.named_modules()}
    for want in ("tok_embeddings", "layers.0.attention_norm", "layers.0.attention.wq",
                 "layers.0.attention.wk", "layers.0.attention.wv", "layers.0.attention.wo",
                 "layers.1.ffn_norm", "layers.1.feed_forward.w1", "layers.1.feed_forward.w2",
                 "layers.1.feed_forward.w3", "norm", "output"):
        assert want in names, want


@pytest.mark.parametrize("flavor", ["llama3:debug", "llama2:debug"])
def test_tiny_flavors_train_on_cpu(flavor: str) -> None:
    model, (tokens,), _ = build_model(flavor, batch_size=2, seq_len=12)
    logits = model(tokens)
    assert logits.shape == (2, 12, FLAVORS[flavor].vocab_size)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tokens.reshape(-1))
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
               for p in model.parameters())


def test_causal_grouped_query_attention_matches_a_reference() -> None:
    """The one SDPA call with repeated KV heads equals attention written out head by head:
    query head j reads KV head j // (heads / kv_heads), position t sees positions <= t."""
    model, (tokens,), _ = build_model("llama3:debug", batch_size=2, seq_len=6)
    cfg = model.cfg
    att = model.layers["0"].attention
    x = torch.randn(2, 6, cfg.dim)
    cos, sin = model.rope_cos, model.rope_sin
    got = att(x, cos, sin)
    hd, rep = cfg.head_dim, cfg.n_heads // cfg.kv_heads
    q = apply_rotary(att.wq(x).view(2, 6, cfg.n_heads, hd), cos, sin)
    k = apply_rotary(att.wk(x).view(2, 6, cfg.kv_heads, hd), cos, sin)
    v = att.wv(x).view(2, 6, cfg.kv_heads, hd)
    mask = torch.ones(6, 6).tril().bool()
    heads = []
    for j in range(cfg.n_heads):
        scores = q[:, :, j] @ k[:, :, j // rep].transpose(1, 2) / math.sqrt(hd)
        scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(scores.softmax(-1) @ v[:, :, j // rep])
    want = att.wo(torch.stack(heads, dim=2).reshape(2, 6, cfg.dim))
    assert torch.allclose(got, want, atol=1e-5)


def test_rotary_is_torchtitans_complex_rotation() -> None:
    """Adjacent feature pairs as complex numbers times e^{i t theta^(-2j/d)}."""
    model, _, _ = build_model("llama3:debug", batch_size=1, seq_len=5)
    d = model.cfg.head_dim
    x = torch.randn(1, 5, 2, d)
    freqs = 1.0 / (model.cfg.rope_theta ** (torch.arange(0, d, 2).float() / d))
    cis = torch.polar(torch.ones(5, d // 2), torch.outer(torch.arange(5).float(), freqs))
    want = torch.view_as_real(torch.view_as_complex(x.reshape(1, 5, 2, d // 2, 2))
                              * cis.view(1, 5, 1, d // 2)).reshape(1, 5, 2, d)
    assert torch.allclose(apply_rotary(x, model.rope_cos, model.rope_sin), want, atol=1e-5)


def test_overrides_after_commas() -> None:
    model, (tokens,), _ = build_model("llama3:8B,seq=4096,n_layers=2", batch_size=1,
                                      meta=True)
    assert len(model.layers) == 2 and tokens.shape == (1, 4096)
    assert model.rope_cos.shape[0] >= 4096


@pytest.mark.parametrize(("spec", "match"), [
    ("llama3:7B", "unknown flavor 'llama3:7B'"),
    ("llama3:8B,n_experts=2", "unknown llama option 'n_experts'"),
    ("llama3:8B,n_kv_heads=5", "not a multiple of n_kv_heads=5"),
    ("llama3:8B,seq=0", "seq must be a positive integer"),
    ("llama2:7B,dim=-1", "dim must be a positive integer"),
])
def test_bad_specs_are_shardplan_errors(spec: str, match: str) -> None:
    with pytest.raises(ShardplanError, match=match):
        build_model(spec, batch_size=1, meta=True)


def test_flavors_are_listed() -> None:
    names = list_models()
    assert {"llama3:8B", "llama3:70B", "llama3:405B", "llama2:7B", "llama2:13B",
            "llama2:70B"} <= set(names)


def test_needs_meta_by_size() -> None:
    assert needs_meta("llama3:405B")  # 1.6 TB of float32 parameters fit no host here
    assert not needs_meta("llama3:debug")
    assert needs_meta("llama3:debug", memory_bytes=1000)
    assert not needs_meta("mlp", memory_bytes=1000)  # only the LLM families are sized


def test_automatic_meta_says_so(monkeypatch) -> None:
    from shardplan.errors import ShardplanWarning
    from shardplan.workload import zoo

    model, _, _ = build_model("llama3:debug", batch_size=1, seq_len=8, meta=None)
    assert not next(model.parameters()).is_meta  # fits: real memory
    monkeypatch.setattr(zoo, "_memory_bytes", lambda: 1000)  # a machine with 1 kB
    with pytest.warns(ShardplanWarning, match="built on the meta device"):
        model, _, _ = build_model("llama3:debug", batch_size=1, seq_len=8, meta=None)
    assert next(model.parameters()).is_meta


def test_flavors_have_their_training_sequence() -> None:
    from shardplan.workload.zoo import training_seq

    assert training_seq("llama3:8B") == (8192, "llama3's training length")
    assert training_seq("llama3:405B,n_layers=2") == (8192, "llama3's training length")
    assert training_seq("llama2:7B") == (4096, "llama2's training length")
    assert training_seq("llama3:debug") is None
    assert training_seq("gpt:hidden=64,layers=2,heads=4,vocab=64") is None
