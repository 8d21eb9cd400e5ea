"""Exporters to torch.distributed.pipelining, torchtitan, Megatron-LM and DeepSpeed."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.export._common import EXPORT_FORMAT, Export, ExportOptions, torch_schedule_name
from shardplan.export._layers import PipelineParts, pipeline_parts
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology

__all__ = ["EXPORTERS"]


def _common(plan: Plan, graph: Graph, settings: ExecutionSettings, schedule: Any, fmt: str,
            *, unit: str = "layer", exact: bool = False
            ) -> tuple[PipelineParts, Any, int, list[str]]:
    """The pipeline parts, the schedule run, the replica count every stage shares and the
    notes (what moved, how the schedule was placed)."""
    from shardplan.ir.schedule import interleaved_1f1b
    from shardplan.simulate import PipelineView

    parts = pipeline_parts(plan, graph, fmt, unit=unit, exact=exact)
    reps = {len(st.devices) for st in plan.stages}
    if len(reps) > 1:
        raise ShardplanError(f"{fmt} gives every stage the same data-parallel degree, and the "
                             f"plan's stages have {sorted(reps)} replicas")
    notes = list(parts.moved)
    sch = PipelineView.build(plan, graph, settings, schedule=schedule).schedule
    k = plan.num_stages
    if schedule is None and sch.num_ranks < k:
        # A plan gives every stage devices of its own; the simulator's interleaving (v stages
        # per rank on k / v ranks) would leave the other stages' devices without a rank.
        notes.append(f"the plan places its {k} stages on devices of their own: exported as "
                     f"{k} ranks of one stage each (torch's Interleaved1F1B order), not the "
                     f"simulated {k // sch.num_ranks} stages on each of {sch.num_ranks} rank(s)")
        sch = interleaved_1f1b(k, 1, sch.num_microbatches)
    return parts, sch, reps.pop(), notes


def _per_replica(settings: ExecutionSettings, replicas: int, fmt: str) -> int:
    mbs = int(settings.microbatch_size or 0)
    if mbs % replicas:
        raise ShardplanError(f"{fmt} gives every data-parallel rank whole samples, and the "
                             f"micro-batch of {mbs} does not split over {replicas} replicas")
    return mbs // replicas


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


def _torch(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
           schedule: Any, opts: ExportOptions) -> Export:
    parts, sch, reps, notes = _common(plan, graph, settings, schedule, "torch", unit="module",
                                      exact=opts.exact)
    spec = {path: "BEGINNING" for path in parts.starts}
    code = ("from torch.distributed.pipelining import SplitPoint, pipeline\n"
            "split_spec = {" + ", ".join(f"{p!r}: SplitPoint.BEGINNING" for p in parts.starts)
            + "}\npipe = pipeline(model, mb_args=(microbatch,), split_spec=split_spec)\n")
    out = {"format": EXPORT_FORMAT, "to": "torch", "graph": plan.graph,
           "split_spec": spec, "num_stages": sch.num_stages, "num_ranks": sch.num_ranks,
           "stage_rank": list(sch.stage_rank), "data_parallel": reps,
           "schedule": torch_schedule_name(sch.name, sch.num_stages // sch.num_ranks),
           "schedule_csv": sch.to_text(), "microbatches": sch.num_microbatches,
           "microbatch_size": settings.microbatch_size,
           "stage_modules": [list(s) for s in parts.stage_layers], "moved": notes,
           "python": code}
    return Export("torch", _dumps(out), notes=tuple(notes))


def _toml_list(items: list[Any]) -> str:
    return "[" + ", ".join(json.dumps(x) for x in items) + "]"


def _seq_len(graph: Graph) -> int | None:
    """The sequence length of a token model's input (the first input of shape (batch,
    sequence) and an integer dtype), or None."""
    shapes, dtypes = graph.meta.get("input_shapes"), graph.meta.get("input_dtypes")
    if not shapes or not dtypes or len(shapes[0]) != 2 or "int" not in str(dtypes[0]):
        return None
    return int(shapes[0][1])


_RECIPE = '''"""{title}.

A torchtitan 0.3.0 recipe (one config function returning ``Trainer.Config``). Run it from
any folder, with this file's folder on the import path (PYTHONPATH):
    torchrun ... -m torchtitan.train --module {module} --config shardplan_plan
``{flags_name}`` beside it holds the same settings as torchtitan's ``--section.option`` flags.
Set BASE to your model's recipe (``module:function`` returning ``Trainer.Config``): this
function takes it and sets the plan's pipeline split, schedule, degrees and batch.
"""

import importlib
from pathlib import Path

from torchtitan.trainer import Trainer

BASE = {base}
# the schedule CSV written beside this file, found from here whatever torchtitan's folder
SCHEDULE_CSV = str(Path(__file__).resolve().with_name({csv_name}))
MODULE_FQNS_PER_MODEL_PART = {fqns}


def shardplan_plan() -> Trainer.Config:
    module, _, function = BASE.partition(":")
    if not module or not function:
        raise ValueError(f"set BASE in {{__file__}} to your model's recipe, as module:function")
    config = getattr(importlib.import_module(module), function)()
    par = config.parallelism
    par.pipeline_parallel_degree = {pp}
    par.pipeline_parallel_layers_per_stage = None
    par.module_fqns_per_model_part = MODULE_FQNS_PER_MODEL_PART
    par.pipeline_parallel_schedule = {schedule}
    par.pipeline_parallel_schedule_csv = SCHEDULE_CSV
    par.pipeline_parallel_microbatch_size = {micro}
    par.data_parallel_replicate_degree = {replicate}
    par.data_parallel_shard_degree = 1
    par.tensor_parallel_degree = 1
    par.context_parallel_degree = 1
    config.training.local_batch_size = {local}
    config.training.global_batch_size = {glob}
    config.training.disable_cuda_graphs = {no_graphs}  # torchtitan's graphs refuse a pipeline
    return config
'''


def _torchtitan(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
                schedule: Any, opts: ExportOptions) -> Export:
    parts, sch, reps, notes = _common(plan, graph, settings, schedule, "torchtitan",
                                      exact=opts.exact)
    parts.whole_layers("torchtitan")
    per = _per_replica(settings, reps, "torchtitan")
    name = torch_schedule_name(sch.name, sch.num_stages // sch.num_ranks)
    title = (f"shardplan export of plan {plan.graph!r} on {plan.topology!r}: {sch.num_stages} "
             f"stages on {sch.num_ranks} ranks x {reps} replicas, {sch.name}")
    fqns = [list(s) for s in parts.stage_layers]
    beside = {".schedule.csv": sch.to_text()}
    if opts.torchtitan_version == "0.2":
        lines = [
            f"# {title}",
            "[parallelism]",
            f"pipeline_parallel_degree = {sch.num_ranks}",
            f"data_parallel_replicate_degree = {reps}",
            "data_parallel_shard_degree = 1",
            "tensor_parallel_degree = 1",
            f"pipeline_parallel_schedule = {json.dumps(name)}",
            f"pipeline_parallel_schedule_csv = {json.dumps(opts.schedule_csv)}",
            f"pipeline_parallel_microbatch_size = {per}",
            "module_fqns_per_model_part = [",
            *(f"    {_toml_list(s)}," for s in fqns),
            "]",
            "",
            "[training]",
            f"local_batch_size = {per * sch.num_microbatches}",
            "",
        ]
        return Export("torchtitan", "\n".join(lines), beside, notes=tuple(notes))
    local, glob = per * sch.num_microbatches, per * sch.num_microbatches * reps
    base_module, _, function = opts.torchtitan_base.partition(":")
    flags = ["--module", base_module, "--config", function,
             "--parallelism.pipeline_parallel_degree", str(sch.num_ranks),
             "--parallelism.module_fqns_per_model_part", *(",".join(s) for s in fqns),
             "--parallelism.pipeline_parallel_schedule", name,
             "--parallelism.pipeline_parallel_schedule_csv", opts.schedule_csv,
             "--parallelism.pipeline_parallel_microbatch_size", str(per),
             "--parallelism.data_parallel_replicate_degree", str(reps),
             "--parallelism.data_parallel_shard_degree", "1",
             "--parallelism.tensor_parallel_degree", "1",
             "--parallelism.context_parallel_degree", "1",
             "--training.local_batch_size", str(local),
             "--training.global_batch_size", str(glob)]
    if sch.num_ranks > 1:
        flags.append("--training.disable_cuda_graphs")
    csv_name = opts.schedule_csv.replace("\\", "/").rsplit("/", 1)[-1]
    module = opts.output_name.removesuffix(".py")
    text = _RECIPE.format(title=title, module=module, flags_name=f"{opts.output_name}.flags",
                          base=json.dumps(opts.torchtitan_base), csv_name=json.dumps(csv_name),
                          fqns=json.dumps(fqns), pp=sch.num_ranks, schedule=json.dumps(name),
                          micro=per, replicate=reps, local=local, glob=glob,
                          no_graphs=sch.num_ranks > 1)
    beside[".flags"] = shlex.join(flags) + "\n"  # read back with shlex.split
    return Export("torchtitan", text, beside, notes=tuple(notes))


def _megatron(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
              schedule: Any, opts: ExportOptions) -> Export:
    parts, sch, reps, notes = _common(plan, graph, settings, schedule, "megatron",
                                      exact=opts.exact)
    parts.whole_layers("megatron")
    if parts.block_depth is None:
        raise ShardplanError("megatron's layout counts transformer layers, and the graph has "
                             "no repeated block list (module paths like layers.0)")
    blocks = [k for k in parts.layers if k.split(".")[-1].isdigit()]
    first, last = parts.layers.index(blocks[0]), parts.layers.index(blocks[-1])
    depth = parts.block_depth
    ops_of: dict[str, list[str]] = {}
    for v in range(graph.num_nodes):
        if graph.modules[v]:
            from shardplan.export._layers import layer_key

            ops_of.setdefault(layer_key(graph.modules[v], depth), []).append(graph.ops[v])
    if not any("attention" in op or op in ("bmm", "matmul", "baddbmm")
               for op in ops_of[blocks[0]]):
        raise ShardplanError(f"megatron's layout counts transformer layers, and "
                             f"{blocks[0]!r} has no attention")
    kind = {k: "E" if i < first else "L" if i > last else "t"
            for i, k in enumerate(parts.layers)}
    if any(k not in blocks for k in parts.layers[first:last + 1]):
        raise ShardplanError("megatron's layout has the transformer layers together, and the "
                             "graph has other modules between its blocks")
    segs = []
    for q, layers in enumerate(parts.stage_layers):
        text = "".join(kind[k] for k in layers)
        compact = text.replace("E" * text.count("E"), "E", 1) if "E" in text else text
        compact = compact.replace("L" * compact.count("L"), "L", 1) if "L" in compact \
            else compact
        if "E" in compact and q != 0:
            raise ShardplanError("megatron keeps the embedding on the first pipeline stage")
        if "L" in compact and q != len(parts.stage_layers) - 1:
            raise ShardplanError("megatron keeps the output layer on the last pipeline stage")
        segs.append(compact)
    layout = "|".join(segs)
    per = _per_replica(settings, reps, "megatron")
    if sch.name not in ("1f1b", "interleaved-1f1b"):
        raise ShardplanError(f"megatron runs 1F1B (interleaved with a layout of more stages "
                             f"than ranks), not {sch.name}")
    args = ["--tensor-model-parallel-size", "1",
            "--pipeline-model-parallel-size", str(sch.num_ranks),
            "--pipeline-model-parallel-layout", layout,
            "--num-layers", str(len(blocks)),
            "--micro-batch-size", str(per),
            "--global-batch-size", str(per * reps * sch.num_microbatches)]
    out = {"format": EXPORT_FORMAT, "to": "megatron", "graph": plan.graph,
           "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": sch.num_ranks,
           "data_parallel_size": reps, "virtual_stages_per_rank": sch.num_stages // sch.num_ranks,
           "pipeline_model_parallel_layout": layout, "num_layers": len(blocks),
           "micro_batch_size": per, "global_batch_size": per * reps * sch.num_microbatches,
           "layers": {k: kind[k] for k in parts.layers}, "moved": notes, "args": args}
    return Export("megatron", _dumps(out), notes=tuple(notes))

def _uniform_parts(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: equal runs, the remainder one by one from the
    first part."""
    chunk, rest = divmod(num_items, num_parts)
    out = [0]
    for p in range(num_parts):
        out.append(out[-1] + chunk + (1 if p < rest else 0))
    return out


def _deepspeed(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
               schedule: Any, opts: ExportOptions) -> Export:
    parts, sch, reps, notes = _common(plan, graph, settings, schedule, "deepspeed",
                                      exact=opts.exact)
    parts.whole_layers("deepspeed")
    if sch.num_stages != sch.num_ranks:
        raise ShardplanError("deepspeed's PipelineModule runs one stage per rank, and the "
                             f"plan's schedule runs {sch.num_stages} stages on "
                             f"{sch.num_ranks} ranks")
    bounds = [0]
    for layers in parts.stage_layers:
        bounds.append(bounds[-1] + len(layers))
    per = _per_replica(settings, reps, "deepspeed")
    uniform = _uniform_parts(len(parts.layers), sch.num_stages)
    if uniform != bounds:
        # PipelineModule's partition_method is "uniform", "parameters" or "type:REGEX"
        # (balanced counts of the layers whose class matches); any other string, explicit
        # boundaries included, raises NotImplementedError in DeepSpeed.
        raise ShardplanError(f"deepspeed's PipelineModule places layers by partition_method "
                             f"(uniform, parameters or type:REGEX), not by boundaries, and the "
                             f"plan's layer boundaries {bounds} are not uniform's {uniform}")
    out = {"format": EXPORT_FORMAT, "to": "deepspeed", "graph": plan.graph,
           "num_stages": sch.num_stages, "layers": list(parts.layers), "parts": bounds,
           "partition_method": "uniform", "moved": notes,
           "ds_config": {"train_batch_size": per * reps * sch.num_microbatches,
                         "train_micro_batch_size_per_gpu": per,
                         "gradient_accumulation_steps": sch.num_microbatches}}
    return Export("deepspeed", _dumps(out), notes=tuple(notes))


EXPORTERS: dict[str, Callable[..., Export]] = {
    "torch": _torch, "torchtitan": _torchtitan, "megatron": _megatron,
    "deepspeed": _deepspeed}
