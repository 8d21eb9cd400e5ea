"""Import a torchtitan run (``shardplan import torchtitan``): a v0.2 TOML file or a file of
current torchtitan's ``--section.option`` flags.

Option names follow torchtitan's ``config/job_config.py`` of the 0.2 releases (the
``[parallelism]``, ``[training]``, ``[activation_checkpoint]`` sections the published
benchmarks' TOML files use) and, for flag files, its later command line (``--module M --config
llama3_8b`` recipes; ``--training.num_tokens_per_microbatch_per_dp_rank`` /
``num_tokens_per_train_step`` batches in tokens; tyro's ``--section.no-option`` switches).
TOML is read with :mod:`tomllib`, flags with :mod:`shlex`; nothing in either is run.

What is read:

- ``[model] name, flavor`` (``llama3`` 8B / 70B / 405B, ``llama2`` 7B / 13B / 70B; the
  mixtures of experts ``deepseek_v3``, ``qwen3``'s MoE flavors and ``gpt_oss`` as the zoo's
  flavors, :mod:`shardplan.importers._torchtitan_moe`) and
  ``converters = ["float8"]`` (or ``[float8] enable_float8_linear``): precision ``fp8``.
- ``[training] local_batch_size`` (older ``batch_size``): samples per data-parallel rank and
  step of gradient accumulation; ``global_batch_size`` (-1: local x data-parallel degree; a
  multiple of it accumulates gradients); ``seq_len``; ``mixed_precision_param`` (bfloat16:
  ``bf16``, float16: ``fp16``, float32: ``fp32``); ``mixed_precision_reduce`` (FSDP's
  ``reduce_dtype``; float32, torchtitan's default: ``grad_reduce`` ``fp32`` when the
  parameters are sharded in half precision; the parameters' own precision: ``param``).
- ``[parallelism] data_parallel_replicate_degree`` (``dp``), ``data_parallel_shard_degree``
  (``dp_shard``; -1: the GPUs the other degrees leave), ``tensor_parallel_degree``,
  ``pipeline_parallel_degree`` with ``pipeline_parallel_schedule`` (1F1B, GPipe,
  Interleaved1F1B; the other looped schedules are modelled as interleaved 1F1B, with a note),
  ``pipeline_parallel_microbatch_size``, ``context_parallel_degree``,
  ``enable_async_tensor_parallel`` (``tp_comm_overlap``; 0.3.0:
  ``[compile] enable_async_tensor_parallel``), ``expert_parallel_degree`` and 0.2's
  ``expert_tensor_parallel_degree`` (the plan's ``ep`` and ``etp``). Tensor parallelism in
  torchtitan shards the norms' activations by the sequence (``sequence_parallel``) unless
  ``enable_sequence_parallel = false``.
- The pipeline split, as torchtitan makes it (:func:`~shardplan.ir.parallel.\
torchtitan_stage_layers`): ``module_fqns_per_model_part`` (one list of module names per
  virtual stage; a stage's blocks are its ``layers.N``), else
  ``pipeline_parallel_layers_per_stage`` L (``ceil((blocks + first + last) / L)`` virtual
  stages, which must be a multiple of the pipeline degree; without it one stage per rank, two
  for looped schedules) with ``pipeline_parallel_first_stage_less_layers`` /
  ``last_stage_less_layers`` (default 1: the embedding and the output count as a layer each).
  Uneven counts (Llama 3.1 405B's 126 blocks on PP 8: 15, 16 x 6, 15) are the plan's
  ``ParallelConfig.stage_layers``.
- ``[activation_checkpoint] mode`` none / selective / full; ``selective_ac_option = "op"`` is
  ``op`` (torchtitan's per-op policy), a layer period N is ``full`` with ``recompute_every``
  N (every N-th block checkpointed). torchtitan 0.3.0 selects the policy by a subcommand
  (``activation_checkpoint:full``, ``:selective``, per-op, ``:none``, ``:memory-budget``).
- torchtitan 0.3.0's recipes (``--module llama3 --config llama3_405b``) start from what
  torchtitan's own config function sets (:data:`RECIPES`: batch, sequence, TP, checkpointing,
  Float8, async TP); the flags override it.
- ``[optimizer] name`` (AdamW, Adam).

Gradients: with ``dp_shard > 1`` FSDP2 shards everything (``sharded``); plain replicas run
DDP (``bucketed``). The batch: without a pipeline a data-parallel rank's micro-batch is its
``local_batch_size``; with one, ``pipeline_parallel_microbatch_size``. Keys of the sections
in :data:`IGNORED` are skipped; any other key or section may change the run and gets a note.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.importers import _torchtitan_moe as moe
from shardplan.importers._run import ModelDims, RunConfig, execution_of, flavor_dims
from shardplan.ir.parallel import ParallelConfig

__all__ = ["IGNORED", "READ", "parse_torchtitan_flags", "parse_torchtitan_toml",
           "run_of_torchtitan", "torchtitan_options"]

#: The keys read, by section.
READ: dict[str, frozenset[str]] = {
    "model": frozenset({"name", "flavor", "converters"}),
    "training": frozenset({"batch_size", "local_batch_size", "global_batch_size", "seq_len",
                           "mixed_precision_param", "mixed_precision_reduce",
                           "num_tokens_per_microbatch_per_dp_rank",
                           "num_tokens_per_train_step"}),
    "parallelism": frozenset({
        "data_parallel_replicate_degree", "data_parallel_shard_degree",
        "tensor_parallel_degree", "pipeline_parallel_degree", "pipeline_parallel_schedule",
        "pipeline_parallel_layers_per_stage", "pipeline_parallel_microbatch_size",
        "context_parallel_degree", "enable_async_tensor_parallel", "enable_sequence_parallel",
        "num_pp_microbatches", "module_fqns_per_model_part",
        "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
        "expert_parallel_degree", "expert_tensor_parallel_degree"}),
    "activation_checkpoint": frozenset({"mode", "selective_ac_option"}),
    "compile": frozenset({"enable_async_tensor_parallel"}),
    "float8": frozenset({"enable_float8_linear"}),
    "optimizer": frozenset({"name"}),
}
#: Keys that do not change what shardplan models, by section ("*": the whole section).
IGNORED: dict[str, frozenset[str]] = {
    **{s: frozenset({"*"}) for s in ("job", "profiling", "metrics", "checkpoint",
                                     "lr_scheduler", "validation", "comm", "fault_tolerance",
                                     "memory_estimation", "debug")},
    "model": frozenset({"tokenizer_path", "hf_assets_path", "print_after_conversion"}),
    "training": frozenset({"steps", "max_norm", "dataset", "dataset_path", "warmup_steps",
                           "seed", "deterministic", "gc_freq",
                           "dataloader", "disable_cuda_graphs"}),
    "optimizer": frozenset({"lr", "eps", "weight_decay", "beta1", "beta2", "implementation",
                            "min_lr_factor"}),
    "parallelism": frozenset({"disable_loss_parallel", "enable_compiled_autograd",
                              "pipeline_parallel_schedule_csv", "world_size",
                              "context_parallel_rotate_method",
                              "expert_parallel_comm_backend"}),
    "activation_checkpoint": frozenset({"preserve_rng_state", "determinism_check", "debug",
                                        "per_op_sac_force_recompute_mm_shapes_by_fqns"}),
    "float8": frozenset({"recipe_name", "precompute_float8_dynamic_scale_for_fsdp",
                         "enable_fsdp_float8_all_gather", "filter_fqns", "emulate"}),
}
_SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved-1f1b"}
_LOOPED = ("loopedbfs", "interleavedzerobubble", "zbvzerobubble", "dualpipev")
_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_RECIPE = re.compile(r"^(llama[23])_(\d+b)$", re.IGNORECASE)
_FLOAT8 = ("float8", "quantize.linear.float8")  # 0.1 / 0.2.x converter names
#: What torchtitan 0.3.0's own config functions (``torchtitan/models/llama3/
#: config_registry.py``) set, as sections: the flags after ``--config NAME`` override it.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "llama3_8b": {"training": {"local_batch_size": 1, "seq_len": 8192},
                  "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"}},
    "llama3_70b": {"training": {"local_batch_size": 8, "seq_len": 8192},
                   "parallelism": {"tensor_parallel_degree": 8},
                   "activation_checkpoint": {"mode": "full"}},
    "llama3_405b": {"model": {"converters": ["float8"]},
                    "training": {"local_batch_size": 2, "seq_len": 8192},
                    "parallelism": {"tensor_parallel_degree": 8},
                    "compile": {"enable_async_tensor_parallel": True},
                    "activation_checkpoint": {"mode": "full"}},
    **moe.MOE_RECIPES,
}
#: torchtitan 0.3.0's activation checkpointing subcommands, as 0.2's ``mode``
_AC_SUBCOMMANDS = {"selective": {"mode": "selective", "selective_ac_option": "op"},
                   "full": {"mode": "full"}, "none": {"mode": "none"},
                   "memory-budget": {"mode": "memory_budget"},
                   "memory_budget": {"mode": "memory_budget"}}
_SUBCOMMAND = re.compile(r"^activation[-_]checkpoint:([\w-]+)$")


def parse_torchtitan_toml(text: str, *, source: str = "<toml>") -> dict[str, dict[str, Any]]:
    """The sections of a torchtitan TOML file (:mod:`tomllib`); one-line error if it is not
    TOML or a section is not a table."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ShardplanError(f"{source}: not TOML: {exc}") from None
    for name, section in data.items():
        if not isinstance(section, dict):
            raise ShardplanError(f"{source}: {name!r} is not a [section]")
    return data


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return text


def parse_torchtitan_flags(text: str) -> dict[str, dict[str, Any]]:
    """The ``--section.option value`` flags of current torchtitan as sections (what
    :func:`parse_torchtitan_toml` gives for a TOML file).

    ``--a.b=v`` and ``--a.b v`` are the same; a flag with no value is ``true`` and tyro's
    ``--a.no-b`` / ``--a.no_b`` is ``b = false``; hyphens in names are underscores; several
    values make a list. ``--module M --config NAME`` (a recipe) are kept under the section
    ``""``; torchtitan 0.3.0's subcommand ``activation_checkpoint:full`` (``selective``,
    ``none``, ``memory-budget``) is ``[activation_checkpoint] mode`` (selective: per op).

    Raises
    ------
    ShardplanError
        Unbalanced quotes, a value before the first flag, or a flag without a section.
    """
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise ShardplanError(f"cannot split the flags: {exc}") from None
    pairs: list[tuple[str, list[str]]] = []
    subcommands: dict[str, Any] = {}
    for tok in tokens:
        sub = _SUBCOMMAND.match(tok)
        if sub:
            if sub.group(1) not in _AC_SUBCOMMANDS:
                raise ShardplanError(f"unknown activation checkpointing subcommand {tok!r} "
                                     f"(choose from {', '.join(_AC_SUBCOMMANDS)})")
            subcommands = dict(_AC_SUBCOMMANDS[sub.group(1)])
        elif tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok.partition("=")
            pairs.append((name[2:], [value] if eq else []))
        elif not pairs:
            raise ShardplanError(f"expected flags like --parallelism.tensor_parallel_degree 8,"
                                 f" got {tok!r} first")
        else:
            pairs[-1][1].append(tok)
    out: dict[str, dict[str, Any]] = {}
    for name, values in pairs:
        section, dot, option = name.partition(".")
        if not dot:
            if name in ("module", "config"):
                out.setdefault("", {})[name] = values[0] if values else ""
                continue
            raise ShardplanError(f"torchtitan flag --{name} has no section (--section.option)")
        option = option.replace("-", "_")
        v: Any
        if not values and option.startswith("no_"):
            option, v = option[3:], False
        elif not values:
            v = True
        elif len(values) == 1:
            v = _value(values[0])
        else:
            v = [_value(x) for x in values]
        out.setdefault(section.replace("-", "_"), {})[option] = v
    if subcommands:
        out.setdefault("activation_checkpoint", {}).update(subcommands)
    return out


def _int(sections: Mapping[str, Mapping[str, Any]], section: str, key: str, default: int,
         minimum: int = 1) -> int:
    from shardplan._limits import check_size

    v = sections.get(section, {}).get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ShardplanError(f"[{section}] {key} must be an integer >= {minimum}, got {v!r}")
    kind = ("sequence" if key == "seq_len" else "degree" if key.endswith("degree") else
            "layers" if "layers" in key else "tokens" if key.startswith("num_tokens") else
            "batch")
    return int(check_size(f"[{section}] {key}", v, kind))


def _switch(sections: Mapping[str, Mapping[str, Any]], section: str, key: str,
            default: bool) -> bool:
    """A true/false option; one line naming it when it is anything else (``"no"``, 1)."""
    v = sections.get(section, {}).get(key, default)
    if not isinstance(v, bool):
        raise ShardplanError(f"[{section}] {key} is true or false, got {v!r}")
    return v


def _notes_of_unread(sections: Mapping[str, Mapping[str, Any]]) -> list[str]:
    notes = []
    for section, table in sections.items():
        if section == "":
            continue
        ignored = IGNORED.get(section, frozenset())
        if "*" in ignored:
            continue
        if section not in READ and section not in IGNORED:
            notes.append(f"torchtitan section [{section}] changes the run and is not modelled")
            continue
        for key in table:
            if key not in READ.get(section, ()) and key not in ignored:
                notes.append(f"torchtitan option {section}.{key} changes the run and is not "
                             f"modelled")
    return notes


def _model(sections: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    model = sections.get("model", {})
    recipe = sections.get("", {}).get("config")
    if "name" in model or "flavor" in model or not recipe:
        if "name" not in model or "flavor" not in model:
            raise ShardplanError("the model needs [model] name and flavor (llama3, 8B)")
        return str(model["name"]), str(model["flavor"])
    m = _RECIPE.match(str(recipe))
    if m is None:
        raise ShardplanError(f"recipe --config {recipe!r} names no model shardplan knows "
                             f"(llama3_8b, llama3_70b, llama3_405b, llama2_7b, "
                             f"{', '.join(moe.MOE_RECIPES)})")
    return m.group(1).lower(), m.group(2).upper()


def run_of_torchtitan(sections: Mapping[str, Mapping[str, Any]], *,
                      num_gpus: int | None = None, cluster: str | None = None) -> RunConfig:
    """Read the sections of a torchtitan config into a checked :class:`RunConfig`.

    Parameters
    ----------
    sections : mapping
        From :func:`parse_torchtitan_toml` or :func:`parse_torchtitan_flags`.
    num_gpus : int, optional
        GPUs of the cluster: resolves ``data_parallel_shard_degree = -1`` and must equal the
        product of the degrees.
    cluster : str, optional
        The cluster spec, recorded in the result.

    Raises
    ------
    ShardplanError
        A missing or malformed option, or an inconsistent run (the degrees' product not the
        GPUs, a batch that does not divide, ...).
    """
    sections = _with_recipe(sections)
    notes = _notes_of_unread(sections)
    train = sections.get("training", {})
    par_s = sections.get("parallelism", {})
    name, flavor = _model(sections)
    seq = _int(sections, "training", "seq_len", 2048)
    model: ModelDims = moe.moe_dims(name, flavor, seq) or flavor_dims(name, flavor, seq)
    rep = _int(sections, "parallelism", "data_parallel_replicate_degree", 1)
    tp = _int(sections, "parallelism", "tensor_parallel_degree", 1)
    pp = _int(sections, "parallelism", "pipeline_parallel_degree", 1)
    cp = _int(sections, "parallelism", "context_parallel_degree", 1)
    shard = par_s.get("data_parallel_shard_degree", -1)
    if shard == -1 and not isinstance(shard, (bool, float)):
        if num_gpus is None:
            raise ShardplanError("data_parallel_shard_degree -1 takes the GPUs the other "
                                 "degrees leave: give the cluster (--cluster)")
        rest = rep * tp * pp * cp
        if num_gpus % rest:
            raise ShardplanError(f"the cluster's {num_gpus} GPUs are not a multiple of "
                                 f"replicate x tp x pp x cp = {rest}")
        shard = num_gpus // rest
    shard = _int({"parallelism": {"data_parallel_shard_degree": shard}}, "parallelism",
                 "data_parallel_shard_degree", 1)
    sched_name = str(par_s.get("pipeline_parallel_schedule", "1F1B"))
    key = sched_name.lower().replace("_", "")
    if key in _SCHEDULES:
        schedule = _SCHEDULES[key]
    elif key in _LOOPED:
        schedule = "interleaved-1f1b"
        if pp > 1:
            notes.append(f"pipeline schedule {sched_name} is modelled as Interleaved1F1B")
    else:
        raise ShardplanError(f"unknown pipeline_parallel_schedule {sched_name!r}")
    vp, stage_layers = 1, None
    if pp > 1:
        stage_layers = _stage_layers(sections, model.num_layers, pp,
                                     looped=schedule == "interleaved-1f1b")
        vp = len(stage_layers) // pp
        if schedule == "interleaved-1f1b" and vp == 1:
            schedule = "1f1b"
        if len(set(stage_layers)) == 1:
            stage_layers = None
    else:
        schedule = "1f1b"
    ep, etp = moe.expert_grid(par_s, model, tp=tp, cp=cp, dp_shard=shard, notes=notes)
    parallel = ParallelConfig(tp=tp, pp=pp, cp=cp, dp=rep, dp_shard=shard, vp=vp,
                              stage_layers=stage_layers, ep=ep, etp=etp)
    dp_total = parallel.data_parallel
    if "num_tokens_per_microbatch_per_dp_rank" in train:
        tokens = _int(sections, "training", "num_tokens_per_microbatch_per_dp_rank", 1)
        if tokens % seq:
            raise ShardplanError(f"{tokens} tokens per micro-batch are not whole sequences of "
                                 f"{seq}")
        local = tokens // seq
        step = _int(sections, "training", "num_tokens_per_train_step", tokens * dp_total)
        if step % seq:
            raise ShardplanError(f"{step} tokens per step are not whole sequences of {seq}")
        glob = step // seq
        micro = local
    else:
        local_key = "local_batch_size" if "local_batch_size" in train else "batch_size"
        local = _int(sections, "training", local_key, 8)
        glob = train.get("global_batch_size", -1)
        glob = local * dp_total if glob == -1 else _int(sections, "training",
                                                        "global_batch_size", 1)
        if glob % (local * dp_total):
            raise ShardplanError(f"global_batch_size {glob} is not a multiple of "
                                 f"{local_key} {local} x data-parallel degree {dp_total}")
        micro = local
        if pp > 1:
            micro = _int(sections, "parallelism", "pipeline_parallel_microbatch_size", 1)
            if local % micro:
                raise ShardplanError(f"{local_key} {local} is not a multiple of "
                                     f"pipeline_parallel_microbatch_size {micro}")
    param = str(train.get("mixed_precision_param", "bfloat16"))
    if param not in _PRECISION:
        raise ShardplanError(f"unknown mixed_precision_param {param!r} (choose from "
                             f"{', '.join(_PRECISION)})")
    precision = _PRECISION[param]
    reduce = str(train.get("mixed_precision_reduce", "float32"))
    if reduce not in ("float32", param):
        raise ShardplanError(f"mixed_precision_reduce is float32 or the parameters' "
                             f"{param}, got {reduce!r}")
    converters = sections.get("model", {}).get("converters", [])
    converters = [converters] if isinstance(converters, str) else converters
    if not isinstance(converters, list) or not all(isinstance(c, str) for c in converters):
        raise ShardplanError(f"[model] converters is a list of names (\"float8\"), got "
                             f"{converters!r}")
    if any(c in _FLOAT8 for c in converters) or \
            _switch(sections, "float8", "enable_float8_linear", False):
        precision = "fp8"
    written = sections.get("optimizer", {}).get("name", "AdamW")
    optimizer = str(written).lower()
    if optimizer not in ("adamw", "adam"):
        raise ShardplanError(f"[optimizer] name {written!r} is not one shardplan models "
                             f"(AdamW, Adam)")
    sync = "sharded" if shard > 1 else "bucketed" if rep > 1 else "end"
    seq_par = _switch(sections, "parallelism", "enable_sequence_parallel", True) and tp > 1
    execution = execution_of(parallel, micro_batch_size=micro, global_batch=glob,
                             schedule=schedule, precision=precision,
                             recompute=_recompute(sections, notes), gradient_sync=sync,
                             recompute_every=_recompute_every(sections),
                             sequence_parallel=seq_par,
                             tp_comm_overlap=_switch(sections, "parallelism",
                                                     "enable_async_tensor_parallel", False) or
                             _switch(sections, "compile", "enable_async_tensor_parallel", False),
                             optimizer=optimizer,
                             grad_reduce="fp32" if shard > 1 and reduce == "float32" and
                             precision != "fp32" else "param", stack="torchtitan",
                             # its run_train.sh launches with expandable_segments:True
                             expandable_segments=True,
                             moe=moe.MOE_SETTINGS if model.moe else None)
    return RunConfig(model=model, cluster=cluster, num_gpus=num_gpus, parallel=parallel,
                     micro_batch_size=micro, global_batch=glob, execution=execution,
                     notes=tuple(notes), source="torchtitan")


def _with_recipe(sections: Mapping[str, Mapping[str, Any]]
                 ) -> dict[str, dict[str, Any]]:
    """The sections with torchtitan 0.3.0's recipe (``--config llama3_405b``) under them: what
    the config function sets, each option the flags give overriding it."""
    recipe = str(sections.get("", {}).get("config", "")).lower()
    out: dict[str, dict[str, Any]] = {k: dict(v) for k, v in RECIPES.get(recipe, {}).items()}
    if "model" in sections and ("name" in sections["model"] or "flavor" in sections["model"]):
        out = {}  # a 0.2-era run names its model: no 0.3.0 recipe under it
    for name, table in sections.items():
        out.setdefault(name, {}).update(table)
    return out


def _stage_layers(sections: Mapping[str, Mapping[str, Any]], num_layers: int, pp: int, *,
                  looped: bool) -> tuple[int, ...]:
    """Blocks per virtual stage of a pipeline of ``pp`` ranks, as torchtitan splits the model
    (module docstring); refuses what torchtitan's pipeline checks refuse."""
    from shardplan.ir.parallel import torchtitan_stage_layers

    par_s = sections.get("parallelism", {})
    parts = par_s.get("module_fqns_per_model_part")
    if parts is not None:
        return _layers_of_parts(parts, num_layers, pp)
    first = _int(sections, "parallelism", "pipeline_parallel_first_stage_less_layers", 1, 0)
    last = _int(sections, "parallelism", "pipeline_parallel_last_stage_less_layers", 1, 0)
    if par_s.get("pipeline_parallel_layers_per_stage") is None:
        stages = pp * (2 if looped else 1)
    else:
        lps = _int(sections, "parallelism", "pipeline_parallel_layers_per_stage", 1)
        stages = -(-(num_layers + first + last) // lps)
        if stages % pp:
            raise ShardplanError(f"torchtitan makes ceil(({num_layers} layers + {first} + "
                                 f"{last}) / {lps}) = {stages} virtual stages, not a multiple "
                                 f"of the {pp} pipeline ranks")
        if looped and stages // pp < 2:
            raise ShardplanError(f"a looped schedule needs 2 or more stages per rank, and "
                                 f"pipeline_parallel_layers_per_stage {lps} gives "
                                 f"{stages // pp}")
        if not looped and stages != pp:
            raise ShardplanError(f"a single-stage schedule runs one stage per rank, and "
                                 f"pipeline_parallel_layers_per_stage {lps} gives {stages} "
                                 f"stages on {pp} ranks")
    return torchtitan_stage_layers(num_layers, stages, first_less=first, last_less=last)


def _layers_of_parts(parts: Any, num_layers: int, pp: int) -> tuple[int, ...]:
    """Blocks per part of ``module_fqns_per_model_part`` (TOML: a list of lists; flags: one
    comma-separated list per part)."""
    if isinstance(parts, str):
        parts = [parts]
    if not isinstance(parts, list):
        raise ShardplanError("module_fqns_per_model_part must be a list of module lists")
    lists = [p.split(",") if isinstance(p, str) else p for p in parts]
    if len(lists) % pp:
        raise ShardplanError(f"module_fqns_per_model_part has {len(lists)} parts, not a "
                             f"multiple of the {pp} pipeline ranks")
    counts, seen = [], 0
    for names in lists:
        blocks = [str(n) for n in names if re.fullmatch(r"layers\.\d+", str(n))]
        if blocks != [f"layers.{i}" for i in range(seen, seen + len(blocks))]:
            raise ShardplanError(f"module_fqns_per_model_part holds {blocks[:3]}... where "
                                 f"layers.{seen} and the blocks after it come, in order")
        counts.append(len(blocks))
        seen += len(blocks)
    if seen != num_layers:
        raise ShardplanError(f"module_fqns_per_model_part places {seen} of the model's "
                             f"{num_layers} layers")
    return tuple(counts)


def _recompute(sections: Mapping[str, Mapping[str, Any]], notes: list[str]) -> str:
    ac = sections.get("activation_checkpoint", {})
    mode = str(ac.get("mode", "selective"))
    if mode in ("none", "full"):
        return mode
    if mode == "memory_budget":
        notes.append("activation_checkpoint mode memory_budget is modelled as per-op "
                     "checkpointing (op)")
        return "op"
    if mode != "selective":
        raise ShardplanError(f"activation_checkpoint mode is none, selective or full, got "
                             f"{mode!r}")
    option = str(ac.get("selective_ac_option", "2"))
    if option == "op":
        return "op"
    if not option.isdigit() or int(option) < 1:
        raise ShardplanError(f"selective_ac_option is 'op' or a layer period, got {option!r}")
    return "full"


def _recompute_every(sections: Mapping[str, Mapping[str, Any]]) -> int:
    """torchtitan's layer-selective checkpointing, ``selective_ac_option = "k"``: full
    recompute of every k-th block (1 for every other mode)."""
    ac = sections.get("activation_checkpoint", {})
    option = str(ac.get("selective_ac_option", "2"))
    if str(ac.get("mode", "selective")) == "selective" and option.isdigit():
        return int(option)
    return 1


def torchtitan_options(text: str, *, source: str = "<config>") -> dict[str, dict[str, Any]]:
    """The sections of a torchtitan config file's text: ``--section.option`` flags when its
    first line that is not blank or a comment starts with ``--``, else TOML. A byte-order
    mark (as some Windows editors write) is skipped: TOML's parser would refuse it."""
    text = text.removeprefix("\ufeff")
    lines = [ln.strip() for ln in text.splitlines()]
    first = next((ln for ln in lines if ln and not ln.startswith("#")), "")
    if first.startswith("--"):
        return parse_torchtitan_flags(text)
    return parse_torchtitan_toml(text, source=source)
