"""The parallel configuration of an LLM plan (one with ``parallel``) for Megatron-LM and
torchtitan: the degrees, batch and training settings a run of the plan is started with.

What ``shardplan import megatron`` / ``import torchtitan`` read, written back: importing the
result gives the same :class:`~shardplan.ir.ParallelConfig` and execution settings. The model's
own arguments (``--num-layers``, ``[model] flavor``) are not part of a plan: the Megatron
arguments leave them to the user, the torchtitan file names the flavor when the plan was
imported from one.

A mixture of experts adds its experts, its expert grid and its MoE settings
(:mod:`shardplan.export._moe`); a split Megatron-LM's other arguments cannot express is written
as Megatron-Core's ``--pipeline-model-parallel-layout``.

Settings the plan's :class:`~shardplan.ir.ExecutionSettings` do not carry yet (``precision``,
``sequence_parallel``, ``tp_comm_overlap``, recompute granularity, ``zero1``) are taken from
what the importer recorded in the plan (``imported_from.execution``), else their defaults.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.export._common import (
    EXPORT_FORMAT,
    Export,
    ExportOptions,
    _batch,
    _setting,
)
from shardplan.export._moe import megatron_layout, megatron_moe_args, moe_record
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.ir.parallel import ParallelConfig

__all__ = ["PARALLEL_EXPORTERS", "deepspeed_parallel", "llm_record", "megatron_parallel",
           "torch_parallel", "torchtitan_parallel"]



def _per_rank(par: ParallelConfig) -> list[int] | None:
    """Blocks per pipeline rank when ``stage_layers`` is set and each rank's blocks are even
    over its virtual stages; None when it is not set or they are not."""
    if par.stage_layers is None:
        return None
    ranks = [0] * par.pp
    for j, n in enumerate(par.stage_layers):
        ranks[j % par.pp] += n
    if any(n * par.vp != ranks[j % par.pp] for j, n in enumerate(par.stage_layers)):
        return None
    return ranks


def megatron_parallel(plan: Plan, graph: Graph, topology: Topology,
                      settings: ExecutionSettings, schedule: Any, opts: ExportOptions
                      ) -> Export:
    """Megatron-LM arguments of an LLM plan (module docstring); JSON with ``args`` (a
    list), ``args_text`` (one shell-quoted string) and the sizes."""
    par = plan.parallel
    assert par is not None
    micro, count = _batch(par, settings, "megatron")
    args = ["--tensor-model-parallel-size", str(par.tp),
            "--pipeline-model-parallel-size", str(par.pp), *_pipeline_args(par, settings.stack)]
    deepspeed = settings.stack == "megatron-deepspeed"
    if par.cp > 1:
        args += ["--context-parallel-size", str(par.cp)]
    if settings.stack == "megatron":  # Megatron's own modules, not Transformer Engine's
        args += ["--transformer-impl", "local"]
    args += ["--micro-batch-size", str(micro),
             "--global-batch-size", str(micro * par.data_parallel * count)]
    if par.pp > 1 and settings.schedule == "gpipe":
        raise ShardplanError("megatron runs 1F1B (interleaved with virtual stages), not gpipe")
    precision = _setting(plan, settings, "precision")
    args += {"fp16": ["--fp16"], "bf16": ["--bf16"], "fp8": ["--bf16", "--fp8-format", "hybrid"],
             "fp32": []}[precision]
    if _setting(plan, settings, "sequence_parallel") and par.tp > 1:
        args.append("--sequence-parallel")
    recompute = _setting(plan, settings, "recompute")
    if recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    elif recompute in ("selective", "op"):
        args += ["--recompute-granularity", "selective"]
        modules = tuple(getattr(settings, "recompute_modules", ("core_attn",)))
        if recompute == "selective" and modules != ("core_attn",):
            args += ["--recompute-modules", *modules]
    sync = _setting(plan, settings, "gradient_sync")
    if par.dp_shard > 1 or sync == "sharded":
        if par.dp > 1 and par.dp_shard > 1:
            raise ShardplanError(f"the plan shards over {par.dp_shard} and replicates over "
                                 f"{par.dp} ranks (HSDP), which shardplan does not write as "
                                 f"Megatron-LM arguments")
        if settings.shard_unit == "module":
            # DeepSpeed ZeRO-3 (imported from Megatron-DeepSpeed's arguments)
            if par.pp > 1:
                raise ShardplanError("the plan gathers module by module (DeepSpeed ZeRO-3) "
                                     "under pipeline parallelism, which DeepSpeed does not run")
            args += ["--deepspeed", "--zero-stage", "3"]
        else:
            args.append("--use-torch-fsdp2")
    elif deepspeed:  # Megatron-DeepSpeed's ZeRO-1 (its optimizer), or none
        args += ["--deepspeed", "--zero-stage", "1" if sync == "zero1" else "0"]
    elif sync == "zero1":
        args.append("--use-distributed-optimizer")
        args += [flag for flag, key in (("--overlap-grad-reduce", "overlap_grad_reduce"),
                                        ("--overlap-param-gather", "overlap_param_gather"))
                 if _setting(plan, settings, key)]
    elif sync == "bucketed":
        args.append("--overlap-grad-reduce")
    if _setting(plan, settings, "tp_comm_overlap"):
        args.append("--tp-comm-overlap")
    optimizer = _setting(plan, settings, "optimizer")
    notes = []
    if recompute == "op":
        notes.append("Megatron-LM has no per-op checkpointing policy (torchtitan's op): "
                     "written as its selective recomputation")
    if recompute == "full" and settings.recompute_every > 1:
        notes.append(f"Megatron-LM checkpoints the first layers of each stage, not every "
                     f"{settings.recompute_every}-th block: written as every block")
    if optimizer not in ("adam", "adamw", "sgd"):
        notes.append(f"Megatron-LM's optimizers are adam and sgd: {optimizer} written as sgd")
    grad_reduce = _setting(plan, settings, "grad_reduce")
    if precision == "fp16" and grad_reduce == "fp32":
        args.append("--accumulate-allreduce-grads-in-fp32")
    elif precision in ("bf16", "fp8") and grad_reduce == "param" and \
            settings.shard_unit != "module" and not deepspeed:
        args.append("--grad-reduce-in-bf16")  # else Megatron-LM reduces bf16 grads in fp32
    args += ["--optimizer", "adam" if optimizer in ("adam", "adamw") else "sgd"]
    args += megatron_moe_args(plan, graph, settings)
    out = {"format": EXPORT_FORMAT, "to": "megatron", "graph": plan.graph,
           "parallel": par.to_dict(), "world_size": par.world_size,
           "tensor_model_parallel_size": par.tp, "pipeline_model_parallel_size": par.pp,
           "context_parallel_size": par.cp, "data_parallel_size": par.data_parallel,
           "virtual_stages_per_rank": par.vp, "micro_batch_size": micro,
           "global_batch_size": micro * par.data_parallel * count,
           **_expert_sizes(plan, graph), "args": args, "args_text": shlex.join(args)}
    return Export("megatron", json.dumps(out, indent=2) + "\n", notes=tuple(notes))


def _expert_sizes(plan: Plan, graph: Graph) -> dict[str, int]:
    """The expert grid's sizes in Megatron-LM's names (a mixture of experts only)."""
    rec = moe_record(plan, graph)
    if not rec:
        return {}
    return {"expert_model_parallel_size": rec["expert_parallel"],
            "expert_tensor_parallel_size": rec["expert_tensor_parallel"],
            "num_experts": rec["num_experts"]}


def _pipeline_args(par: ParallelConfig, stack: str) -> list[str]:
    """Megatron-LM's arguments of the plan's virtual stages and their split: the virtual
    stages per rank with a split the stack balances itself or the first and last rank set
    apart; else (uneven virtual stages of a rank, middle ranks unequal) Megatron-Core's
    ``--pipeline-model-parallel-layout`` (:func:`~shardplan.export._moe.megatron_layout`),
    which sets the virtual stages too. DeepSpeed's pipeline engine takes only its own
    balanced splits."""
    vp = ["--num-virtual-stages-per-pipeline-rank", str(par.vp)] if par.vp > 1 else []
    deepspeed = stack == "megatron-deepspeed"
    split_args = _balanced_split_args(par, deepspeed)
    if split_args is not None:
        return vp + split_args
    if deepspeed and par.stage_layers is not None:
        raise ShardplanError(f"the plan's stages hold {list(par.stage_layers)} layers: "
                             f"DeepSpeed's pipeline engine balances them (type:transformer, "
                             f"or with the embeddings type:transformer|embedding), not so")
    if par.stage_layers is None:
        return vp
    ranks = _per_rank(par)
    if ranks is None or len(set(ranks[1:-1])) > 1:  # only a layout says so
        return ["--pipeline-model-parallel-layout", megatron_layout(par)]
    if len(set(ranks)) == 1:
        return vp
    middle = ranks[1:-1]
    out = vp
    if not middle or ranks[0] != middle[0]:
        out = out + ["--decoder-first-pipeline-num-layers", str(ranks[0])]
    if not middle or ranks[-1] != middle[0]:
        out = out + ["--decoder-last-pipeline-num-layers", str(ranks[-1])]
    return out


def _balanced_split_args(par: Any, deepspeed: bool) -> list[str] | None:
    """The arguments of a split the stack balances itself (None when the plan's is not
    one): Megatron-DeepSpeed's ``--pp-partition-method type:transformer|embedding``, or
    Megatron-Core's ``--account-for-embedding/loss-in-pipeline-split``, each checked by
    :func:`~shardplan.ir.parallel.balanced_stage_layers` (what the importer reads them
    as)."""
    from shardplan.ir.parallel import balanced_stage_layers

    if par.stage_layers is None or len(set(par.stage_layers)) == 1:
        return [] if deepspeed else None
    layers, stages = sum(par.stage_layers), par.num_stages
    if deepspeed and par.stage_layers == balanced_stage_layers(layers, stages):
        return []  # DeepSpeed's default type:transformer
    if tuple(par.stage_layers) != balanced_stage_layers(layers, stages, embedding=True,
                                                        loss=True):
        return None
    if deepspeed:
        return ["--pp-partition-method", "type:transformer|embedding"]
    if (layers + 2) % stages:
        return None
    return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]



def torchtitan_parallel(plan: Plan, graph: Graph, topology: Topology,
                        settings: ExecutionSettings, schedule: Any, opts: ExportOptions
                        ) -> Export:
    """torchtitan's export of an LLM plan: a torchtitan 0.3.0 recipe module and its flags, or
    (``torchtitan_version="0.2"``) the TOML of torchtitan 0.2.x
    (:mod:`shardplan.export._torchtitan`)."""
    from shardplan.export._torchtitan import llm_torchtitan

    return llm_torchtitan(plan, graph, topology, settings, schedule, opts)


def llm_record(plan: Plan, settings: ExecutionSettings, tool: str) -> dict[str, Any]:
    """Every degree and training setting of an LLM plan, by name: what each export carries
    (the formats without a field of their own for one write it here, or refuse)."""
    par = plan.parallel
    assert par is not None
    micro, count = _batch(par, settings, tool)
    return {"tensor_parallel": par.tp, "pipeline_parallel": par.pp,
            "virtual_stages": par.vp, "context_parallel": par.cp,
            "data_parallel_replicate": par.dp, "data_parallel_shard": par.dp_shard,
            "data_parallel": par.data_parallel, "world_size": par.world_size,
            "stage_layers": None if par.stage_layers is None else list(par.stage_layers),
            "micro_batch_size": micro, "microbatches": count,
            "global_batch": micro * par.data_parallel * count,
            "precision": _setting(plan, settings, "precision"),
            "recompute": _setting(plan, settings, "recompute"),
            "recompute_every": int(settings.recompute_every),
            "sequence_parallel": bool(_setting(plan, settings, "sequence_parallel")),
            "tp_comm_overlap": bool(_setting(plan, settings, "tp_comm_overlap")),
            "gradient_sync": _setting(plan, settings, "gradient_sync")}


#: torch's DeviceMesh of an LLM plan: dimensions slowest first, in the plan's rank order
#: (tensor-parallel index fastest, pipeline slowest; :mod:`shardplan.ir.parallel`).
_MESH = (("pp", "pp"), ("dp_replicate", "dp"), ("dp_shard", "dp_shard"), ("cp", "cp"),
         ("tp", "tp"))


def torch_parallel(plan: Plan, graph: Graph, topology: Topology,
                   settings: ExecutionSettings, schedule: Any, opts: ExportOptions
                   ) -> Export:
    """torch.distributed.pipelining's export of an LLM plan: the split points and schedule
    of the pipeline (virtual stage ``j`` on pipeline rank ``j % pp``, as torch's looped
    schedules place them), ``data_parallel`` the data-parallel ranks (``dp x dp_shard``, not
    every device of a pipeline rank), the device mesh (``init_device_mesh`` dimensions in the
    plan's rank order) and every degree and setting (:func:`llm_record`)."""
    from shardplan.export._common import torch_schedule_name
    from shardplan.export._frameworks import _torch
    from shardplan.ir.schedule import interleaved_1f1b

    par = plan.parallel
    assert par is not None
    record = {**llm_record(plan, settings, "torch"), **moe_record(plan, graph)}
    base = _torch(plan, graph, topology, settings, schedule, opts)
    out = json.loads(base.text)
    notes = [n for n in base.notes if "ranks of one stage each" not in n]
    if par.vp > 1 and schedule is None:  # the plan's virtual stages share their rank's devices
        sch = interleaved_1f1b(par.pp, par.vp, record["microbatches"])
        out.update(num_ranks=sch.num_ranks, stage_rank=list(sch.stage_rank),
                   schedule=torch_schedule_name(sch.name, par.vp),
                   schedule_csv=sch.to_text())
    shape = [getattr(par, f) for _, f in _MESH]
    names = [n for n, _ in _MESH]
    out.update(data_parallel=par.data_parallel, parallel=par.to_dict(), **{
        k: v for k, v in record.items() if k not in ("data_parallel", "micro_batch_size",
                                                      "microbatches")},
        micro_batch_size_per_rank=record["micro_batch_size"],
        mesh={"shape": shape, "dim_names": names}, moved=notes)
    out["python"] = (f"from torch.distributed.device_mesh import init_device_mesh\n"
                     f"mesh = init_device_mesh('cuda', {tuple(shape)!r}, "
                     f"mesh_dim_names={tuple(names)!r})\n" + out["python"])
    return Export("torch", json.dumps(out, indent=2) + "\n", notes=tuple(notes))


def deepspeed_parallel(plan: Plan, graph: Graph, topology: Topology,
                       settings: ExecutionSettings, schedule: Any, opts: ExportOptions
                       ) -> Export:
    """DeepSpeed's export of an LLM plan: the ``PipelineModule`` split (uniform partition
    only, one stage per pipeline rank, ``activation_checkpoint_interval`` for full
    recompute) and the DeepSpeed config (batch over the data-parallel ranks only,
    ``bf16`` / ``fp16``, ``zero_optimization.stage``, ``tensor_parallel.autotp_size``).
    What DeepSpeed has no setting for is refused in one line naming it: context
    parallelism (its sequence parallelism is Ulysses' all-to-all, not ring attention),
    virtual stages, fully sharded data parallelism under a pipeline or beside replicas
    (HSDP), fp8, and selective / per-op recompute."""
    from shardplan.export._frameworks import _uniform_parts
    from shardplan.export._layers import pipeline_parts

    par = plan.parallel
    assert par is not None
    rec = llm_record(plan, settings, "deepspeed")
    label = par.label()
    if par.is_expert_parallel:
        raise ShardplanError(f"deepspeed's config has no expert parallelism (DeepSpeed-MoE's "
                             f"ep_size is the model code's): the plan's EP {par.ep} x ETP "
                             f"{par.expert_tp} ({label}) cannot be written")
    if par.cp > 1:
        raise ShardplanError(f"deepspeed has no context-parallel degree (its sequence "
                             f"parallelism is Ulysses' all-to-all, not ring attention): the "
                             f"plan's CP {par.cp} ({label}) cannot be written")
    if par.vp > 1:
        raise ShardplanError(f"deepspeed's PipelineModule runs one stage per pipeline rank: "
                             f"the plan's VP {par.vp} (virtual stages per rank) cannot be "
                             f"written")
    if par.dp_shard > 1 and (par.pp > 1 or par.dp > 1):
        what = f"PP {par.pp}" if par.pp > 1 else f"DP {par.dp} replicas (HSDP)"
        raise ShardplanError(f"deepspeed shards parameters (ZeRO-3) over all data-parallel "
                             f"ranks and not under a pipeline: the plan's FSDP "
                             f"{par.dp_shard} with {what} cannot be written")
    if rec["precision"] == "fp8":
        raise ShardplanError("deepspeed's config has no fp8 training: the plan's fp8 "
                             "precision cannot be written")
    if rec["recompute"] in ("selective", "op"):
        raise ShardplanError(f"deepspeed's PipelineModule recomputes whole layers "
                             f"(activation_checkpoint_interval): the plan's {rec['recompute']} "
                             f"recompute cannot be written")
    if par.pp > 1 and settings.schedule == "gpipe":
        raise ShardplanError("deepspeed's pipeline engine runs 1F1B, not the plan's gpipe")
    parts = pipeline_parts(plan, graph, "deepspeed", exact=opts.exact)
    parts.whole_layers("deepspeed")
    bounds = [0]
    for layers in parts.stage_layers:
        bounds.append(bounds[-1] + len(layers))
    uniform = _uniform_parts(len(parts.layers), par.pp)
    if uniform != bounds:
        raise ShardplanError(f"deepspeed's PipelineModule places layers by partition_method "
                             f"(uniform, parameters or type:REGEX), not by boundaries, and the "
                             f"plan's layer boundaries {bounds} are not uniform's {uniform}")
    notes = list(parts.moved)
    for key, what in (("sequence_parallel", "Megatron's sequence parallelism"),
                      ("tp_comm_overlap", "tensor-parallel communication overlap")):
        if rec[key] and par.tp > 1:
            notes.append(f"deepspeed's config has no {what}: it is the model code's to do "
                         f"(written in the export's {key!r} only)")
    sync = rec["gradient_sync"]
    stage = 3 if par.dp_shard > 1 else 1 if sync == "zero1" else 0
    config: dict[str, Any] = {
        "train_batch_size": rec["global_batch"],
        "train_micro_batch_size_per_gpu": rec["micro_batch_size"],
        "gradient_accumulation_steps": rec["microbatches"],
        "zero_optimization": {"stage": stage}}
    if rec["precision"] in ("bf16", "fp16"):
        config[rec["precision"]] = {"enabled": True}
    if par.tp > 1:
        config["tensor_parallel"] = {"autotp_size": par.tp}
    interval = rec["recompute_every"] if rec["recompute"] == "full" else 0
    out = {"format": EXPORT_FORMAT, "to": "deepspeed", "graph": plan.graph,
           "num_stages": par.pp, "layers": list(parts.layers), "parts": bounds,
           "partition_method": "uniform", "activation_checkpoint_interval": interval,
           "moved": notes, "parallel": par.to_dict(), **rec, "ds_config": config}
    return Export("deepspeed", json.dumps(out, indent=2) + "\n", notes=tuple(notes))


PARALLEL_EXPORTERS = {"megatron": megatron_parallel, "torchtitan": torchtitan_parallel,
                      "torch": torch_parallel, "deepspeed": deepspeed_parallel}
