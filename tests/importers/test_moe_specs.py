"""The importers' mixtures of experts (``shardplan/importers/_moe.py``): the torch-free flavor
table against the zoo's own, the flavor a set of fields is named by, Megatron-LM's layer
patterns read without ``eval``."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from shardplan.errors import ShardplanError
from shardplan.importers._moe import (
    MOE_DEFAULTS,
    MOE_FLAVORS,
    check_moe,
    flavor_model,
    layer_pattern,
    moe_model,
)
from shardplan.importers._run import ModelDims, MoEDims


def _zoo() -> Any:
    pytest.importorskip("torch")
    from shardplan.workload import moe

    return moe


def test_the_table_is_the_zoos() -> None:
    """Every flavor of the zoo is in the table with the same fields, and the defaults are
    ``MoEConfig``'s: the importers name the models the zoo builds."""
    zoo = _zoo()
    assert set(MOE_FLAVORS) == set(zoo.FLAVORS)
    assert {k: v for k, v in asdict(zoo.MoEConfig()).items() if k in MOE_DEFAULTS} == \
        MOE_DEFAULTS
    for name, cfg in zoo.FLAVORS.items():
        got = {k: v for k, v in asdict(cfg).items() if k in MOE_DEFAULTS}
        assert got == {**MOE_DEFAULTS, **MOE_FLAVORS[name]}, name


@pytest.mark.parametrize("flavor", sorted(MOE_FLAVORS))
def test_a_flavor_is_named_by_itself(flavor: str) -> None:
    dims = moe_model(MOE_FLAVORS[flavor], 4096)
    assert dims.spec == f"{flavor},seq=4096"
    assert dims.moe is not None and dims.moe.overrides == ()


def test_the_closest_flavor_and_its_overrides_build_the_same_model() -> None:
    """A changed Qwen3 (its vocabulary padded by Megatron) is the 235B flavor with one
    override; the zoo builds exactly the fields asked for."""
    zoo = _zoo()
    values = {**MOE_FLAVORS["qwen3_moe:235B-A22B"], "vocab_size": 152064, "n_layers": 4}
    dims = moe_model(values, 128)
    assert dims.spec == "qwen3_moe:235B-A22B,n_layers=4,vocab_size=152064,seq=128"
    assert (dims.family, dims.flavor, dims.num_layers, dims.num_kv_heads, dims.ffn) == (
        "qwen3_moe", "235B-A22B", 4, 4, 1536)
    cfg, seq = zoo.config_of(dims.moe.flavor, dict(dims.moe.overrides))
    assert seq is None
    assert {k: v for k, v in asdict(cfg).items() if k in MOE_DEFAULTS} == check_moe(values)


@pytest.mark.parametrize(("changes", "family"), [
    ({"attention": "mla"}, "deepseek_v3"),
    ({"attn_sinks": True}, "gpt_oss"),
    ({"swiglu_limit": 7.0}, "gpt_oss"),
    ({"qk_norm": True}, "qwen3_moe"),
    ({}, "mixtral"),
])
def test_the_family_is_the_feature_only_it_has(changes: dict, family: str) -> None:
    values = {**MOE_FLAVORS["mixtral:8x7B"], **changes}
    assert moe_model(values, 64).family == family


def test_the_default_kv_heads_and_head_width_are_resolved_before_comparing() -> None:
    """Mixtral's 8 query groups given as 8, and a head width equal to dim / heads: no
    override; MLA's flavors ignore the grouped-query fields."""
    values = {**MOE_FLAVORS["mixtral:8x7B"], "head_dim": 128}
    assert moe_model(values, 64).spec == "mixtral:8x7B,seq=64"
    ds = {**MOE_FLAVORS["deepseek_v3:671B"], "n_kv_heads": 3, "qk_norm": True}
    assert moe_model(ds, 64).spec == "deepseek_v3:671B,seq=64"
    full = moe_model({**MOE_FLAVORS["mixtral:8x7B"], "n_kv_heads": None}, 64)
    assert full.spec == "mixtral:8x7B,n_kv_heads=32,seq=64" and full.num_kv_heads == 32


def test_model_dims_of_a_mixture_of_experts() -> None:
    d = flavor_model("deepseek_v3:671B", 4096)
    assert (d.hidden, d.num_layers, d.num_heads, d.num_kv_heads, d.ffn, d.vocab) == (
        7168, 61, 128, 128, 18432, 129280)
    assert d.moe == MoEDims(flavor="deepseek_v3:671B", num_experts=256, top_k=8, moe_ffn=2048,
                            shared_experts=1, first_k_dense=3, attention="mla")
    oss = flavor_model("gpt_oss:120B", 8192, n_layers=24, num_experts=32)
    assert oss.spec == "gpt_oss:120B,n_layers=24,num_experts=32,seq=8192"
    assert flavor_model("deepseek_v3:671B", 64, route_norm=False, route_scale=1.0,
                        swiglu_limit=None).spec == \
        "deepseek_v3:671B,route_norm=false,route_scale=1.0,seq=64"
    with pytest.raises(ShardplanError, match="is not its mixture of experts' flavor"):
        ModelDims(family="mixtral", flavor="8x22B", hidden=8, num_layers=1, num_heads=1,
                  num_kv_heads=1, ffn=8, vocab=8, seq_len=8, moe=d.moe)
    with pytest.raises(ShardplanError, match="unknown mixture-of-experts flavor"):
        flavor_model("mixtral:8x9B", 64)
    with pytest.raises(ShardplanError, match="unknown mixture-of-experts field 'ffn'"):
        flavor_model("mixtral:8x7B", 64, ffn=3)


@pytest.mark.parametrize(("changes", "reason"), [
    ({"top_k": 9}, "9 experts per token exceed the 8 experts"),
    ({"n_groups": 3}, "group-limited routing does not fit"),
    ({"first_k_dense": 40}, "40 dense layers exceed the 32 layers"),
    ({"first_k_dense": 1}, "need an FFN width"),
    ({"n_kv_heads": 5}, "32 attention heads do not divide into 5 query groups"),
    ({"dim": 4000, "head_dim": None, "n_heads": 30, "n_kv_heads": 10},
     "hidden size 4000 is not a multiple of the 30 attention heads"),
    ({"num_experts": 0}, "num_experts must be an integer >= 1"),
])
def test_models_that_do_not_fit_are_refused(changes: dict, reason: str) -> None:
    with pytest.raises(ShardplanError, match=reason):
        moe_model({**MOE_FLAVORS["mixtral:8x7B"], **changes}, 64)


@pytest.mark.parametrize(("text", "layers", "want"), [
    ("1", 3, (1, 1, 1)),
    ("3", 6, (1, 0, 0, 1, 0, 0)),
    ("([0]*3+[1]*2)", 5, (0, 0, 0, 1, 1)),
    ("([1]*3+[0]*1)*2", 8, (1, 1, 1, 0, 1, 1, 1, 0)),
    ("[0, 1]+[1]", 3, (0, 1, 1)),
    ("(([0]*2+[1])+[1])*2", 8, (0, 0, 1, 1, 0, 0, 1, 1)),
])
def test_megatrons_layer_patterns(text: str, layers: int, want: tuple) -> None:
    assert layer_pattern(text, layers) == want


@pytest.mark.parametrize(("text", "reason"), [
    ("__import__('os')", "an integer or a list expression"),
    ("[0]*2+[2]*2", "holds 1 \\(experts\\) and 0 \\(dense\\) only"),
    ("[0]*3", "gives 3 layers, the model has 4"),
    ("([0]*2+[1]*2", "cannot read"),
    ("0", "must be >= 1"),
    ("2*[1]", "cannot read"),
])
def test_bad_layer_patterns(text: str, reason: str) -> None:
    with pytest.raises(ShardplanError, match=reason):
        layer_pattern(text, 4)
