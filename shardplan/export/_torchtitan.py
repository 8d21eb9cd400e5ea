"""torchtitan's export of an LLM plan (one with ``parallel``): a torchtitan 0.3.0 recipe module
and its flags, or (``--torchtitan-version 0.2``) the TOML file of torchtitan 0.2.x.

torchtitan 0.3.0 configures a run by a config function returning ``Trainer.Config`` (its
``torchtitan/models/llama3/config_registry.py`` holds ``llama3_8b``, ``llama3_70b``,
``llama3_405b``), chosen by ``--module M --config FUNCTION`` and overridden by
``--section.option`` flags, which tyro parses into the same dataclasses
(``torchtitan.config.ConfigManager``). The export writes:

- the recipe module: ``shardplan_plan()`` sets every degree and setting of the plan on a base
  config: for the Llama 3 flavors torchtitan has recipes for, ``_base()`` builds it as
  torchtitan's recipe does (model, loss, optimizer, data); with ``--torchtitan-base
  MODULE:FUNCTION`` (or a model torchtitan 0.3.0 has no recipe for) that function's config;
- ``FILE.flags``: the same settings as flags on torchtitan's own recipe (``--module llama3
  --config llama3_405b``) or the base; the activation checkpointing policy is the
  subcommand ``activation_checkpoint:full|selective|none`` at the end. Only the model's
  converters (Float8) have no flag: the recipe module sets them, and a note says where the
  recipe's differ.

A mixture of experts (torchtitan 0.3.0's ``deepseek_v3``, ``qwen3`` and ``gpt_oss`` flavors, as
the zoo names them) starts from torchtitan's own config function of its flavor where there is
one (``deepseek_v3_671b``, ``qwen3_30b_a3b``, ``gpt_oss_120b``, ...) and carries the expert
grid (``expert_parallel_degree``; :func:`~shardplan.export._moe.torchtitan_experts`).

The pipeline split is written in torchtitan's own terms, where torchtitan counts the
embedding and the output as layers (:func:`~shardplan.ir.parallel.torchtitan_stage_layers`):
``pipeline_parallel_layers_per_stage`` with ``pipeline_parallel_first_stage_less_layers`` /
``last_stage_less_layers`` when those give the plan's blocks per virtual stage, else the
module names of every stage (``module_fqns_per_model_part``). What torchtitan cannot run is
refused in one line: fp16 (its ``mixed_precision_param`` is bfloat16 or float32), a layer
period of checkpointing in 0.3.0 (it checkpoints every block or per op), turning sequence
parallelism off in 0.2 (no option).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.export._common import Export, ExportOptions
from shardplan.export._moe import torchtitan_experts
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.ir.parallel import ParallelConfig, torchtitan_stage_layers

__all__ = ["llm_torchtitan", "split_options"]

_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved-1f1b": "Interleaved1F1B"}
_PRECISION = {"bf16": "bfloat16", "fp32": "float32", "fp8": "bfloat16"}
#: torchtitan 0.3.0's recipes of Llama 3: flavor -> (recipe, learning rate, steps, HF assets)
_LLAMA3 = {"8B": ("llama3_8b", "3e-4", 1000, "./assets/hf/Llama-3.1-8B"),
           "70B": ("llama3_70b", "1.5e-4", 1000, "./assets/hf/Llama-3.1-70B"),
           "405B": ("llama3_405b", "8e-5", 3000, "./assets/hf/Llama-3.1-405B")}
#: the recipes that train in Float8 (their converters, which no flag changes)
_FLOAT8_RECIPES = frozenset({"llama3_405b"})
#: torchtitan 0.3.0's mixtures of experts as the zoo names them (the importer's
#: ``TORCHTITAN_MOE``, which the tests hold this against): zoo spec without ``seq`` ->
#: (torchtitan model, flavor, its config function or None)
_MOE = {
    "deepseek_v3:671B": ("deepseek_v3", "671B", "deepseek_v3_671b"),
    "deepseek_v3:671B,dim=5120,n_layers=60,vocab_size=102400,first_k_dense=1,"
    "dense_ffn_dim=12288,num_experts=160,top_k=6,moe_dim=1536,num_shared_experts=2,"
    "score_func=softmax,route_norm=false,route_scale=16.0,topk_groups=3":
        ("deepseek_v3", "236B", None),
    "deepseek_v3:671B,dim=2048,n_layers=27,n_heads=16,vocab_size=102400,q_lora_rank=0,"
    "first_k_dense=1,dense_ffn_dim=10944,num_experts=64,top_k=6,moe_dim=1408,"
    "num_shared_experts=2,score_func=softmax,route_norm=false,route_scale=1.0,n_groups=1,"
    "topk_groups=1": ("deepseek_v3", "16B", "deepseek_v3_16b"),
    "deepseek_v3:671B,dim=256,n_layers=6,n_heads=16,vocab_size=2048,q_lora_rank=0,"
    "first_k_dense=1,dense_ffn_dim=1024,num_experts=8,top_k=3,moe_dim=256,"
    "num_shared_experts=2,score_func=softmax,route_norm=false,route_scale=1.0,n_groups=1,"
    "topk_groups=1": ("deepseek_v3", "debugmodel", "deepseek_v3_debugmodel"),
    "qwen3_moe:30B-A3B": ("qwen3", "30B-A3B", "qwen3_30b_a3b"),
    "qwen3_moe:235B-A22B": ("qwen3", "235B-A22B", None),
    "qwen3_moe:30B-A3B,dim=256,n_layers=8,n_heads=16,n_kv_heads=8,vocab_size=2048,"
    "num_experts=64": ("qwen3", "debugmodel_moe", "qwen3_moe_debug"),
    "gpt_oss:120B": ("gpt_oss", "120b", "gpt_oss_120b"),
    "gpt_oss:120B,n_layers=24,num_experts=32": ("gpt_oss", "20b", "gpt_oss_20b"),
    "gpt_oss:120B,dim=256,n_layers=4,vocab_size=2048,num_experts=8":
        ("gpt_oss", "debugmodel", "gpt_oss_debugmodel"),
}


def split_options(counts: tuple[int, ...], num_layers: int) -> dict[str, int] | None:
    """torchtitan's ``pipeline_parallel_layers_per_stage`` and first / last stage weights that
    make its split (:func:`~shardplan.ir.parallel.torchtitan_stage_layers`) give ``counts``
    blocks per virtual stage, or None when no weights do. Tries torchtitan's default weights
    (1, 1) first, then the smallest. O(w^2 s) for weights up to w = max(counts) + 1.

    Examples
    --------
    >>> split_options((15, 16, 16, 16, 16, 16, 16, 15), 126)
    {'pipeline_parallel_layers_per_stage': 16, 'pipeline_parallel_first_stage_less_layers': 1, \
'pipeline_parallel_last_stage_less_layers': 1}
    >>> split_options((8, 8, 8, 8), 32)['pipeline_parallel_first_stage_less_layers']
    0
    >>> split_options((9, 7, 9, 7), 32) is None
    True
    """
    stages = len(counts)
    top = max(counts) + 2
    weights = [(1, 1)] + [(a, b) for a in range(top) for b in range(top) if (a, b) != (1, 1)]
    for first, last in weights:
        try:
            if torchtitan_stage_layers(num_layers, stages, first_less=first,
                                       last_less=last) != counts:
                continue
        except ShardplanError:
            continue
        total = num_layers + first + last
        for lps in range(-(-total // stages), total + 1):
            if -(-total // lps) == stages:
                return {"pipeline_parallel_layers_per_stage": lps,
                        "pipeline_parallel_first_stage_less_layers": first,
                        "pipeline_parallel_last_stage_less_layers": last}
            if -(-total // lps) < stages:
                break
    return None


def _model(plan: Plan, graph: Graph) -> tuple[str, str, int | None]:
    """(model name, flavor, sequence) of the plan's model spec (``llama3:405B,seq=8192``, as
    imported or captured); ``("", "", seq)`` when it names none."""
    from shardplan.export._frameworks import _seq_len

    spec = str((plan.meta.get("imported_from") or {}).get("model") or
               graph.meta.get("model") or "")
    seq = _seq_len(graph)
    head = ",".join(p for p in spec.split(",") if not p.startswith("seq="))
    if head in _MOE:
        m_seq = re.search(r"(?:^|,)seq=(\d+)(?:,|$)", spec)
        return _MOE[head][0], _MOE[head][1], int(m_seq.group(1)) if m_seq else seq
    m = re.match(r"^(llama[23]):(\w+)(?:,(.*))?$", spec)
    if m is None:
        return "", "", seq
    for opt in (m.group(3) or "").split(","):
        key, _, value = opt.partition("=")
        if key == "seq" and value.isdigit():
            seq = int(value)
    return m.group(1), m.group(2), seq


def llm_torchtitan(plan: Plan, graph: Graph, topology: Topology,
                   settings: ExecutionSettings, schedule: Any, opts: ExportOptions) -> Export:
    """torchtitan's export of an LLM plan (module docstring)."""
    from shardplan.export._common import _batch, _num_layers, _setting

    par = plan.parallel
    assert par is not None
    micro, count = _batch(par, settings, "torchtitan")
    legacy = opts.torchtitan_version == "0.2"
    version = "0.2" if legacy else "0.3.0"
    name, flavor, seq = _model(plan, graph)
    precision = _setting(plan, settings, "precision")
    if precision not in _PRECISION:
        raise ShardplanError(f"torchtitan's mixed_precision_param is bfloat16 or float32: the "
                             f"plan's {precision} cannot be written")
    recompute = _setting(plan, settings, "recompute")
    notes: list[str] = []
    if recompute == "full" and settings.recompute_every > 1 and not legacy:
        raise ShardplanError(f"torchtitan 0.3.0 checkpoints every block or per op: the plan's "
                             f"checkpointing of every {settings.recompute_every}-th block "
                             f"cannot be written (torchtitan 0.2's selective_ac_option can: "
                             f"--torchtitan-version 0.2)")
    if recompute == "selective":
        notes.append("torchtitan has no attention-only recomputation (Megatron-LM's "
                     "selective): written as its per-op policy (selective_ac_option op)")
    seq_par = bool(_setting(plan, settings, "sequence_parallel"))
    if legacy and par.tp > 1 and not seq_par:
        raise ShardplanError(f"torchtitan 0.2 shards the norms' activations by the sequence "
                             f"under tensor parallelism (no enable_sequence_parallel): the "
                             f"plan's TP {par.tp} without sequence parallelism cannot be "
                             f"written (torchtitan 0.3.0 can)")
    if (par.dp_shard > 1 or par.cp > 1) and precision != "fp32" and \
            _setting(plan, settings, "grad_reduce") == "param":
        notes.append("torchtitan reduces FSDP gradients in float32 (mixed_precision_reduce "
                     "has no other value): the plan's half-precision reduction is written "
                     "as float32")
    optimizer = _setting(plan, settings, "optimizer")
    if optimizer not in ("adam", "adamw") or (optimizer == "adam" and not legacy):
        notes.append(f"torchtitan{'' if legacy else ' 0.3.0'}'s recipes train with AdamW: "
                     f"the plan's {optimizer} is written as AdamW")

    par_opts: dict[str, Any] = {
        "data_parallel_replicate_degree": par.dp, "data_parallel_shard_degree": par.dp_shard,
        "tensor_parallel_degree": par.tp, "context_parallel_degree": par.cp,
        "pipeline_parallel_degree": par.pp}
    if par.tp > 1 and not legacy:
        par_opts["enable_sequence_parallel"] = seq_par
    experts, moe_notes = torchtitan_experts(plan, graph, settings, legacy=legacy)
    par_opts.update(experts)
    notes += moe_notes
    local, glob = micro, micro * count * par.data_parallel
    if par.pp > 1:
        sched = "interleaved-1f1b" if par.vp > 1 else settings.schedule
        if sched not in _SCHEDULES or (par.vp > 1) != (sched == "interleaved-1f1b"):
            raise ShardplanError(f"torchtitan runs 1F1B, GPipe or Interleaved1F1B by name: the "
                                 f"plan's {sched} schedule with VP {par.vp} cannot be written")
        par_opts["pipeline_parallel_schedule"] = _SCHEDULES[sched]
        par_opts["pipeline_parallel_microbatch_size"] = micro
        local = micro * count
        par_opts.update(_split(par, _num_layers(plan, graph), "output" if legacy else "lm_head"))
    if legacy:
        par_opts["enable_async_tensor_parallel"] = bool(_setting(plan, settings,
                                                                 "tp_comm_overlap"))
    training: dict[str, Any] = {"local_batch_size": local, "global_batch_size": glob}
    if seq is not None:
        training["seq_len"] = seq
    training["mixed_precision_param"] = _PRECISION[precision]
    training["mixed_precision_reduce"] = "float32"
    if (par.pp > 1 or par.ep > 1) and not legacy:
        # torchtitan 0.3.0 refuses CUDA graphs with a pipeline, and with expert parallelism's
        # all-to-all dispatch (its CPU synchronisation)
        training["disable_cuda_graphs"] = True
    title = (f"shardplan export of plan {plan.graph!r} on {plan.topology!r}: {par.label()} "
             f"(torchtitan {version})")
    if legacy:
        return _toml(title, name, flavor, precision, par_opts, training, recompute,
                     settings.recompute_every, optimizer, notes)
    compile_opts: dict[str, Any] = {"enable_async_tensor_parallel": False}
    if _setting(plan, settings, "tp_comm_overlap"):
        # 0.3.0: async TP is a compile option, and it needs the model compiled
        compile_opts = {"enable": True, "enable_async_tensor_parallel": True}
    ac = {"none": "none", "full": "full", "op": "selective", "selective": "selective"}[
        recompute]
    return _recipe(title, opts, name, flavor, precision, {
        "parallelism": par_opts, "training": training, "compile": compile_opts}, ac, notes)


def _split(par: ParallelConfig, num_layers: int, head: str) -> dict[str, Any]:
    """The options of the plan's split in torchtitan's terms (module docstring)."""
    counts = tuple(par.layers_per_stage(num_layers))
    found = split_options(counts, num_layers)
    if found is not None:
        return found
    parts: list[list[str]] = []
    start = 0
    for j, n in enumerate(counts):
        names = [f"layers.{i}" for i in range(start, start + n)]
        start += n
        if j == 0:
            names.insert(0, "tok_embeddings")
        if j == len(counts) - 1:
            names += ["norm", head]
        parts.append(names)
    return {"module_fqns_per_model_part": parts}


def _toml(title: str, name: str, flavor: str, precision: str, par_opts: dict[str, Any],
          training: dict[str, Any], recompute: str, every: int, optimizer: str,
          notes: list[str]) -> Export:
    """torchtitan 0.2.x's TOML (``--job.config_file``): only options its ``JobConfig`` has
    (its loader refuses any other key)."""
    sections: dict[str, dict[str, Any]] = {}
    if name:
        sections["model"] = {"name": name, "flavor": flavor}
    if precision == "fp8":  # 0.2.2's name of the Float8 linear converter
        sections.setdefault("model", {})["converters"] = ["quantize.linear.float8"]
    sections["training"] = training
    sections["parallelism"] = par_opts
    ac: dict[str, Any] = {"mode": "selective" if recompute == "op" else recompute}
    if recompute in ("selective", "op"):
        ac = {"mode": "selective", "selective_ac_option": "op"}
    if recompute == "full" and every > 1:
        ac = {"mode": "selective", "selective_ac_option": str(every)}
    sections["activation_checkpoint"] = ac
    sections["optimizer"] = {"name": "Adam" if optimizer == "adam" else "AdamW"}
    lines = [f"# {title}"]
    for section, table in sections.items():
        lines += ["", f"[{section}]"]
        for k, v in table.items():
            if isinstance(v, bool):
                lines.append(f"{k} = {str(v).lower()}")
            elif k == "module_fqns_per_model_part":
                lines += [f"{k} = ["] + [f"    {json.dumps(p)}," for p in v] + ["]"]
            else:
                lines.append(f"{k} = {json.dumps(v)}")
    return Export("torchtitan", "\n".join(lines) + "\n", notes=tuple(notes))


_RECIPE_HEAD = '''"""{title}.

A torchtitan 0.3.0 recipe: one config function returning ``Trainer.Config``,
{how}.
Put this file's folder on the import path (PYTHONPATH) and run
    torchrun ... -m torchtitan.train --module {module} --config shardplan_plan
``{flags_name}`` beside it holds the same settings as torchtitan's flags on
{flags_base}.
"""
'''
_LLAMA3_BASE = '''
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.optimizer import default_adamw
{float8_import}from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import model_registry
from torchtitan.trainer import Trainer


def _base() -> Trainer.Config:
    """torchtitan's {recipe} (model, loss, optimizer, data), without its profiler, metrics,
    checkpoint and validation settings."""
    model_spec = model_registry(
        {flavor},{converters}
    )
    return Trainer.Config(
        loss=ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(
                global_vocab_size=decoder_vocab_size(model_spec),
            ),
        ),
        hf_assets_path={assets},
        model_spec=model_spec,
        optimizer=default_adamw(lr={lr}),
        training=TrainingConfig(steps={steps}),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4"),
        parallelism=ParallelismConfig(),
        compile=CompileConfig(),
    )
'''
_OTHER_BASE = '''
import importlib

from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.trainer import Trainer

# your model's recipe (module:function returning Trainer.Config) the plan's settings go on
BASE = {base}


def _base() -> Trainer.Config:
    module, _, function = BASE.partition(":")
    if not module or not function:
        raise ValueError(f"set BASE in {{__file__}} to your model's recipe, as module:function")
    return getattr(importlib.import_module(module), function)()
'''
_AC_PYTHON = {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()", "none": "None"}


def _recipe(title: str, opts: ExportOptions, name: str, flavor: str, precision: str,
            sections: dict[str, dict[str, Any]], ac: str, notes: list[str]) -> Export:
    """The recipe module and ``.flags`` of torchtitan 0.3.0 (module docstring)."""
    module = opts.output_name.removesuffix(".py")
    given = opts.torchtitan_base != "MODULE:FUNCTION"
    llama = name == "llama3" and flavor in _LLAMA3 and not given
    moe_recipe = None if given else next(
        (r for n, f, r in _MOE.values() if (n, f) == (name, flavor) and r), None)
    if moe_recipe:  # torchtitan's own config function of the MoE flavor
        opts = replace(opts, torchtitan_base=f"torchtitan.models.{name}.config_registry:"
                                             f"{moe_recipe}")
        given = True
    fp8 = precision == "fp8"
    if llama:
        recipe, lr, steps, assets = _LLAMA3[flavor]
        how = (f"built as torchtitan's own {recipe} is (torchtitan/models/llama3/\n"
               f"config_registry.py), with the plan's degrees and settings")
        flags = ["--module", "llama3", "--config", recipe]
        flags_base = f"its own recipe (--module llama3 --config {recipe})"
        body = _LLAMA3_BASE.format(
            recipe=recipe, flavor=json.dumps(flavor), lr=lr, steps=steps,
            assets=json.dumps(assets),
            float8_import=("from torchtitan.components.quantization import "
                           "Float8LinearConverter\n") if fp8 else "",
            converters=("\n        converters=[\n            Float8LinearConverter.Config(\n"
                        "                filter_fqns=[\"lm_head\"],\n"
                        "                model_compile_enabled=" +
                        str(bool(sections["compile"].get("enable"))) + ",\n            ),\n"
                        "        ],") if fp8 else "")
        if fp8 != (recipe in _FLOAT8_RECIPES):
            notes.append(f"torchtitan has no flag for the model's converters: {recipe} trains "
                         f"{'in' if recipe in _FLOAT8_RECIPES else 'without'} Float8 and the "
                         f"plan {'in fp8' if fp8 else 'in ' + precision}; the recipe module "
                         f"sets them, {opts.output_name}.flags cannot")
    else:
        base_module, _, function = opts.torchtitan_base.partition(":")
        how = f"the plan's degrees and settings on {'BASE' if not given else opts.torchtitan_base}"
        # torchtitan's own recipes by their short names (--module deepseek_v3)
        flags = ["--module", name if moe_recipe else base_module, "--config", function]
        flags_base = f"that recipe (--module {base_module} --config {function})"
        body = _OTHER_BASE.format(base=json.dumps(opts.torchtitan_base))
        if not given:
            what = f"{name}:{flavor}" if name else "this model"
            notes.append(f"torchtitan 0.3.0 has no recipe of {what}: set BASE in the recipe "
                         f"(or --torchtitan-base MODULE:FUNCTION) to your model's")
        if fp8:
            notes.append("the model's Float8 converters are your recipe's to set: torchtitan "
                         "has no flag for them")
    lines = ["", "", "def shardplan_plan() -> Trainer.Config:", "    config = _base()"]
    for section, table in sections.items():
        for key, value in table.items():
            lines.append(f"    config.{section}.{key} = {_python(value)}")
            flags += _flag(section, key, value)
    lines.append(f"    config.activation_checkpoint = {_AC_PYTHON[ac]}")
    lines.append("    return config")
    flags.append(f"activation_checkpoint:{ac}")  # tyro's subcommand: after every flag
    head = _RECIPE_HEAD.format(title=title, how=how, module=module,
                               flags_name=f"{opts.output_name}.flags", flags_base=flags_base)
    text = head + body + "\n".join(lines) + "\n"
    return Export("torchtitan", text, {".flags": shlex.join(flags) + "\n"}, notes=tuple(notes))


def _python(value: Any) -> str:
    """A Python literal of an option's value (strings and lists in double quotes)."""
    return json.dumps(value) if isinstance(value, str | list) else repr(value)


def _flag(section: str, key: str, value: Any) -> list[str]:
    """tyro's command line of one option: ``--s.k`` / ``--s.no-k`` for booleans, one
    comma-separated argument per inner list."""
    if isinstance(value, bool):
        return [f"--{section}.{key}" if value else f"--{section}.no-{key.replace('_', '-')}"]
    if isinstance(value, list):
        return [f"--{section}.{key}", *(",".join(v) for v in value)]
    return [f"--{section}.{key}", str(value)]
