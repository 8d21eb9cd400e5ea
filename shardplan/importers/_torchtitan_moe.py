"""torchtitan's mixtures of experts, for :func:`shardplan.importers.torchtitan.run_of_torchtitan`.

torchtitan 0.3.0's MoE models (``torchtitan/models/deepseek_v3``, ``qwen3``, ``gpt_oss``;
0.3.0 has no ``llama4``) by flavor, as the zoo names them (:data:`TORCHTITAN_MOE`): the
flavors with the zoo's shape are its flavors (DeepSeek-V3 671B, Qwen3 30B-A3B and
235B-A22B, GPT-OSS 120B), the others a zoo flavor with overrides (DeepSeek's 16B and 236B,
GPT-OSS 20B, the debug models; ``tests/importers/test_torchtitan_moe.py`` counts both
models' parameters). ``kimi_k2_7`` and ``qwen3_5`` have no zoo flavor and are refused.

The expert grid: ``parallelism.expert_parallel_degree`` (``ep``); torchtitan 0.3.0 splits the
experts over EP ranks borrowed from FSDP, CP and TP (``efsdp x ep = dp_shard x cp x tp``:
``etp`` 1 under EP), and over the TP ranks without EP (``etp`` = ``tp``, recorded as unset).
torchtitan 0.2's ``expert_tensor_parallel_degree`` (1, its default, or ``tp``: EP then
borrows from FSDP and CP only) is read too. Its tokens go to their experts by all-to-all,
dropless, as grouped GEMMs (the run's MoE settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.importers._moe import MOE_FLAVORS, moe_model
from shardplan.importers._run import ModelDims

__all__ = ["MOE_RECIPES", "MOE_SETTINGS", "TORCHTITAN_MOE", "expert_grid", "moe_dims"]

_DSV3_SMALL = {"q_lora_rank": 0, "first_k_dense": 1, "num_shared_experts": 2,
               "score_func": "softmax", "n_groups": 1, "topk_groups": 1, "route_scale": 1.0,
               "route_norm": False}
#: torchtitan's (model, flavor) -> (zoo flavor, MoEConfig overrides), from each model's
#: ``__init__.py`` (``deepseekv3_configs``, ``qwen3_configs``, ``gptoss_configs``).
TORCHTITAN_MOE: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("deepseek_v3", "671B"): ("deepseek_v3:671B", {}),
    ("deepseek_v3", "236B"): ("deepseek_v3:671B", {
        **_DSV3_SMALL, "dim": 5120, "n_layers": 60, "vocab_size": 102400, "q_lora_rank": 1536,
        "dense_ffn_dim": 12288, "num_experts": 160, "top_k": 6, "moe_dim": 1536,
        "n_groups": 8, "topk_groups": 3, "route_scale": 16.0}),
    ("deepseek_v3", "16B"): ("deepseek_v3:671B", {
        **_DSV3_SMALL, "dim": 2048, "n_layers": 27, "n_heads": 16, "vocab_size": 102400,
        "dense_ffn_dim": 10944, "num_experts": 64, "top_k": 6, "moe_dim": 1408}),
    ("deepseek_v3", "debugmodel"): ("deepseek_v3:671B", {
        **_DSV3_SMALL, "dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048,
        "dense_ffn_dim": 1024, "num_experts": 8, "top_k": 3, "moe_dim": 256}),
    ("qwen3", "30B-A3B"): ("qwen3_moe:30B-A3B", {}),
    ("qwen3", "235B-A22B"): ("qwen3_moe:235B-A22B", {}),
    ("qwen3", "debugmodel_moe"): ("qwen3_moe:30B-A3B", {
        "dim": 256, "n_layers": 8, "n_heads": 16, "n_kv_heads": 8, "vocab_size": 2048,
        "num_experts": 64}),
    ("gpt_oss", "120b"): ("gpt_oss:120B", {}),
    ("gpt_oss", "20b"): ("gpt_oss:120B", {"n_layers": 24, "num_experts": 32}),
    ("gpt_oss", "debugmodel"): ("gpt_oss:120B", {"dim": 256, "n_layers": 4,
                                                 "vocab_size": 2048, "num_experts": 8}),
}

_SELECTIVE = {"mode": "selective", "selective_ac_option": "op"}
#: What torchtitan 0.3.0's MoE config functions (``models/*/config_registry.py``) set, as
#: sections (the flags after ``--config NAME`` override them).
MOE_RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "deepseek_v3_debugmodel": {
        "model": {"name": "deepseek_v3", "flavor": "debugmodel"},
        "training": {"local_batch_size": 8, "seq_len": 2048},
        "activation_checkpoint": _SELECTIVE},
    "deepseek_v3_16b": {
        "model": {"name": "deepseek_v3", "flavor": "16B"},
        "training": {"local_batch_size": 4, "seq_len": 4096},
        "parallelism": {"pipeline_parallel_schedule": "Interleaved1F1B",
                        "expert_parallel_degree": 8},
        "activation_checkpoint": _SELECTIVE},
    "deepseek_v3_671b": {
        "model": {"name": "deepseek_v3", "flavor": "671B"},
        "training": {"local_batch_size": 4, "seq_len": 4096},
        "parallelism": {"pipeline_parallel_schedule": "Interleaved1F1B",
                        "expert_parallel_degree": 2},
        "activation_checkpoint": _SELECTIVE},
    "qwen3_moe_debug": {
        "model": {"name": "qwen3", "flavor": "debugmodel_moe"},
        "training": {"local_batch_size": 4, "seq_len": 4096},
        "activation_checkpoint": _SELECTIVE},
    "qwen3_30b_a3b": {
        "model": {"name": "qwen3", "flavor": "30B-A3B"},
        "training": {"local_batch_size": 2, "seq_len": 4096},
        "activation_checkpoint": {"mode": "full"}},
    "gpt_oss_debugmodel": {
        "model": {"name": "gpt_oss", "flavor": "debugmodel"},
        "training": {"local_batch_size": 8, "seq_len": 2048},
        "activation_checkpoint": {"mode": "none"}},
    "gpt_oss_20b": {
        "model": {"name": "gpt_oss", "flavor": "20b"},
        "training": {"local_batch_size": 1, "seq_len": 8192},
        "activation_checkpoint": {"mode": "full"}},
    "gpt_oss_120b": {
        "model": {"name": "gpt_oss", "flavor": "120b"},
        "training": {"local_batch_size": 1, "seq_len": 8192},
        "activation_checkpoint": {"mode": "full"}},
}
#: torchtitan's MoE execution: all-to-all dispatch, dropless, grouped GEMMs.
MOE_SETTINGS = {"moe_dispatcher": "alltoall", "moe_capacity_factor": None,
                "moe_grouped_gemm": True}


def moe_dims(name: str, flavor: str, seq_len: int) -> ModelDims | None:
    """The zoo's model of torchtitan's MoE ``name`` / ``flavor``; None for a model
    torchtitan names that is no mixture of experts.

    Raises
    ------
    ShardplanError
        A MoE model or flavor shardplan has no zoo model of.
    """
    key = {(n, f.lower()): (n, f) for n, f in TORCHTITAN_MOE}.get((name, flavor.lower()))
    if key is not None:
        base, overrides = TORCHTITAN_MOE[key]
        return moe_model({**MOE_FLAVORS[base], **overrides}, seq_len)
    if any(n == name for n, _ in TORCHTITAN_MOE):
        known = ", ".join(f for n, f in TORCHTITAN_MOE if n == name)
        raise ShardplanError(f"torchtitan's {name} has no mixture-of-experts flavor {flavor!r} "
                             f"shardplan knows (choose from {known})")
    if name in ("kimi_k2_7", "qwen3_5", "llama4"):
        raise ShardplanError(f"torchtitan's {name} has no model in shardplan's zoo (its "
                             f"mixtures of experts: deepseek_v3, qwen3, gpt_oss)")
    return None


def expert_grid(par_s: Mapping[str, Any], model: ModelDims, *, tp: int, cp: int,
                dp_shard: int, notes: list[str]) -> tuple[int, int | None]:
    """``(ep, etp)`` of the ``[parallelism]`` options (module docstring), ``etp`` None when it
    is ``tp``.

    Raises
    ------
    ShardplanError
        A degree below 1, an expert tensor-parallel degree other than 1 or ``tp``, or EP not
        inside the ranks torchtitan borrows for it.
    """
    ep = par_s.get("expert_parallel_degree", 1)
    etp = par_s.get("expert_tensor_parallel_degree", 1)
    for key, v in (("expert_parallel_degree", ep), ("expert_tensor_parallel_degree", etp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ShardplanError(f"[parallelism] {key} must be an integer >= 1, got {v!r}")
    if model.moe is None:
        if ep > 1:
            notes.append(f"expert_parallel_degree {ep} has no effect on a dense model "
                         f"(torchtitan ignores it)")
        return 1, None
    if ep == 1:
        return 1, None
    if etp not in (1, tp):
        raise ShardplanError(f"torchtitan's expert_tensor_parallel_degree is 1 or the tensor "
                             f"parallel degree {tp}, got {etp}")
    borrowed = dp_shard * cp * (tp if etp == 1 else 1)
    if borrowed % ep:
        what = "dp_shard x cp" + (" x tp" if etp == 1 else "")
        raise ShardplanError(f"torchtitan builds expert parallelism {ep} inside {what} = "
                             f"{borrowed} ranks, which it does not divide")
    return ep, None if etp == tp else 1
