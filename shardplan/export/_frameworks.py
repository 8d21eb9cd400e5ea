"""Exporters to torch.distributed.pipelining, torchtitan, Megatron-LM and DeepSpeed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.export import EXPORT_FORMAT, Export, torch_schedule_name
from shardplan.export._layers import PipelineParts, pipeline_parts
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology

__all__ = ["EXPORTERS"]


def _common(plan: Plan, graph: Graph, settings: ExecutionSettings, schedule: Any, fmt: str
            ) -> tuple[PipelineParts, Any, int]:
    """The pipeline parts, the schedule run and the replica count every stage shares."""
    from shardplan.simulate import PipelineView

    parts = pipeline_parts(plan, graph, fmt)
    reps = {len(st.devices) for st in plan.stages}
    if len(reps) > 1:
        raise ShardplanError(f"{fmt} gives every stage the same data-parallel degree, and the "
                             f"plan's stages have {sorted(reps)} replicas")
    view = PipelineView.build(plan, graph, settings, schedule=schedule)
    return parts, view.schedule, reps.pop()


def _per_replica(settings: ExecutionSettings, replicas: int, fmt: str) -> int:
    mbs = int(settings.microbatch_size or 0)
    if mbs % replicas:
        raise ShardplanError(f"{fmt} gives every data-parallel rank whole samples, and the "
                             f"micro-batch of {mbs} does not split over {replicas} replicas")
    return mbs // replicas


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


def _torch(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
           schedule: Any) -> Export:
    parts, sch, reps = _common(plan, graph, settings, schedule, "torch")
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
           "stage_modules": [list(s) for s in parts.stage_layers], "python": code}
    return Export("torch", _dumps(out))


def _toml_list(items: list[Any]) -> str:
    return "[" + ", ".join(json.dumps(x) for x in items) + "]"


def _torchtitan(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
                schedule: Any) -> Export:
    parts, sch, reps = _common(plan, graph, settings, schedule, "torchtitan")
    parts.whole_layers("torchtitan")
    per = _per_replica(settings, reps, "torchtitan")
    lines = [
        f"# shardplan export of plan {plan.graph!r} on {plan.topology!r}: {sch.num_stages} "
        f"stages on {sch.num_ranks} ranks x {reps} replicas, {sch.name}",
        "[parallelism]",
        f"pipeline_parallel_degree = {sch.num_ranks}",
        f"data_parallel_replicate_degree = {reps}",
        "data_parallel_shard_degree = 1",
        "tensor_parallel_degree = 1",
        f"pipeline_parallel_schedule = "
        f"{json.dumps(torch_schedule_name(sch.name, sch.num_stages // sch.num_ranks))}",
        'pipeline_parallel_schedule_csv = "SCHEDULE_CSV"',
        f"pipeline_parallel_microbatch_size = {per}",
        "module_fqns_per_model_part = [",
        *(f"    {_toml_list(list(s))}," for s in parts.stage_layers),
        "]",
        "",
        "[training]",
        f"local_batch_size = {per * sch.num_microbatches}",
        "",
    ]
    return Export("torchtitan", "\n".join(lines), {".schedule.csv": sch.to_text()})


def _megatron(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
              schedule: Any) -> Export:
    parts, sch, reps = _common(plan, graph, settings, schedule, "megatron")
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
    if any(kind[k] != "t" for k in parts.layers[first:last + 1]):
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
           "layers": {k: kind[k] for k in parts.layers}, "args": args}
    return Export("megatron", _dumps(out))


def _uniform_parts(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: equal runs, the remainder one by one from the
    first part."""
    chunk, rest = divmod(num_items, num_parts)
    out = [0]
    for p in range(num_parts):
        out.append(out[-1] + chunk + (1 if p < rest else 0))
    return out


def _deepspeed(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
               schedule: Any) -> Export:
    parts, sch, reps = _common(plan, graph, settings, schedule, "deepspeed")
    parts.whole_layers("deepspeed")
    if sch.num_stages != sch.num_ranks:
        raise ShardplanError("deepspeed's PipelineModule runs one stage per rank, and the "
                             f"plan's schedule runs {sch.num_stages} stages on "
                             f"{sch.num_ranks} ranks")
    bounds = [0]
    for layers in parts.stage_layers:
        bounds.append(bounds[-1] + len(layers))
    per = _per_replica(settings, reps, "deepspeed")
    uniform = _uniform_parts(len(parts.layers), sch.num_stages) == bounds
    out = {"format": EXPORT_FORMAT, "to": "deepspeed", "graph": plan.graph,
           "num_stages": sch.num_stages, "layers": list(parts.layers), "parts": bounds,
           "partition_method": "uniform" if uniform else "parts",
           "note": "" if uniform else
           "no built-in partition_method gives these boundaries: set PipelineModule.parts "
           "to them (layers parts[i]..parts[i+1]-1 on stage i)",
           "ds_config": {"train_batch_size": per * reps * sch.num_microbatches,
                         "train_micro_batch_size_per_gpu": per,
                         "gradient_accumulation_steps": sch.num_microbatches}}
    return Export("deepspeed", _dumps(out))


EXPORTERS: dict[str, Callable[..., Export]] = {
    "torch": _torch, "torchtitan": _torchtitan, "megatron": _megatron,
    "deepspeed": _deepspeed}
