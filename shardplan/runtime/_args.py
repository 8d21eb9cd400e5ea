"""The arguments of a training run and the :class:`TrainConfig` they describe.

Shared by ``shardplan train`` (:mod:`shardplan.cli.train`) and ``torchrun ... -m
shardplan.runtime`` (:mod:`shardplan.runtime.__main__`); no torch and no ``shardplan.cli``
here, so the launcher stays light and the runtime does not depend on the command line.

Everything a run needs is read from the plan and the graph: the plan's execution settings
(:attr:`shardplan.ir.Plan.settings`: micro-batch size, micro-batches, schedule, virtual
stages, optimizer, recompute), the pipeline the simulator simulates
(:class:`shardplan.simulate.PipelineView`: stage order, per-rank action lists, devices per
rank) and the input shapes the graph was captured at. A flag that overrides one of them
returns a one-line note saying so. Bad input is found here, before any process starts.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from shardplan._argtypes import nonnegative_int, positive_float, positive_int
from shardplan.errors import ShardplanError
from shardplan.runtime._config import OPTIMIZERS, SCHEDULES, TrainConfig

__all__ = ["BASELINES", "Prepared", "add_arguments", "check_model_trust", "config_for_plan",
           "config_from_args", "input_sizes", "model_code_file", "operator_view",
           "pipeline_fields", "plan_fields", "resolve_settings", "strategy_fields"]

BASELINES = ("fsdp", "ddp", "single")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments shared by ``shardplan train`` and ``python -m shardplan.runtime``."""
    p.add_argument("plan", metavar="PLAN", help="plan file (shardplan.plan/1)")
    p.add_argument("graph", metavar="GRAPH", help="graph file (shardplan.graph/1)")
    p.add_argument("topology", metavar="TOPO", help="topology file (shardplan.topology/1)")
    p.add_argument("--model", default=None,
                   help="the model spec the graph was captured from (default: the graph's)")
    p.add_argument("--trust-model-code", action="store_true",
                   help="allow building the model from the Python file the graph's 'model' "
                        "field names (FILE.py:FN): that runs the file's code")
    p.add_argument("--steps", type=positive_int, required=True, help="training iterations")
    p.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="override the plan's pipeline schedule")
    p.add_argument("--microbatches", type=positive_int, default=None,
                   help="override the plan's micro-batches per step")
    p.add_argument("--microbatch-size", type=positive_int, default=None,
                   help="override the plan's samples per micro-batch (shared by the replicas)")
    p.add_argument("--global-batch", "--batch-size", dest="global_batch", type=positive_int,
                   default=None,
                   help="override the samples per step (micro-batch size x micro-batches)")
    p.add_argument("--seq-len", type=positive_int, default=None,
                   help="override the tokens per sample the graph was captured at")
    p.add_argument("--image-size", type=positive_int, default=None,
                   help="override the image height and width the graph was captured at")
    p.add_argument("--lr", type=positive_float, default=1e-3)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="override the plan's optimizer")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the synthetic data and the random state of every forward")
    p.add_argument("--checkpoint-dir", default=None, metavar="D")
    p.add_argument("--checkpoint-every", type=nonnegative_int, default=0, metavar="K",
                   help="save every K steps (and after the last one)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir (LLM plans: "
                        "under any layout and process count, resharded by torch's DCP)")
    p.add_argument("--baseline", choices=BASELINES, default=None,
                   help="train the same model on the same data with FSDP2, DDP or one process")
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="processes of an fsdp/ddp baseline (default: the pipeline's)")
    p.add_argument("--timeout", type=positive_float, default=300.0,
                   help="seconds a collective may wait before the run fails")
    p.add_argument("--measure-memory", action="store_true",
                   help="LLM plans: track the last step with torch's MemTracker and add every "
                        "rank's peak bytes by category to the result ('memory')")
    p.add_argument("-o", "--output", metavar="FILE", help="write the result here (atomically)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


@dataclass(frozen=True, slots=True)
class Prepared:
    """A run ready to start: its config, the settings it runs with and the notes to print."""

    config: TrainConfig
    settings: Any
    notes: tuple[str, ...]

    def summary(self) -> dict[str, Any]:
        """What the result JSON records about the run besides losses and times (``mesh``: the
        device mesh of each stage, for strategy and hybrid plans)."""
        cfg = self.config
        out = {"kind": cfg.kind, "schedule": cfg.schedule, "processes": cfg.world_size,
               "microbatches": cfg.microbatches, "microbatch_size": cfg.microbatch_size,
               "global_batch": cfg.global_batch, "settings": self.settings.to_dict()}
        if cfg.shardings:
            out["mesh"] = list(cfg.mesh_shape)
        if cfg.parallel is not None:
            out["parallel"] = cfg.parallel.to_dict()
        return out


# --------------------------------------------------------------------------- settings
def resolve_settings(plan: Any, graph: Any, **flags: Any) -> tuple[Any, list[str]]:
    """The plan's execution settings with ``microbatch_size`` resolved from the graph, then
    overridden by ``flags`` (``microbatches``, ``schedule``, ``optimizer``, ``global_batch``,
    ``microbatch_size``; None = not given); returns the settings and one note per override."""
    settings = plan.settings.resolve(graph)
    flags = {k: v for k, v in flags.items() if v is not None}
    mbs, glob = flags.get("microbatch_size"), flags.get("global_batch")
    if mbs is not None and glob is not None:
        m = int(flags.get("microbatches", settings.microbatches))
        if mbs * m != glob:
            raise ShardplanError(f"--global-batch {glob} is not --microbatch-size {mbs} x "
                                 f"{m} micro-batches")
        flags.pop("global_batch")
    return settings.override(**flags)


def input_sizes(graph: Any, seq_len: int | None, image_size: int | None
                ) -> tuple[int | None, int | None, tuple[tuple[int, ...], ...] | None, list[str]]:
    """``(seq_len, image_size, shapes to check, notes)`` from the graph's recorded input
    shapes (``meta["input_shapes"]``, written by ``shardplan capture``), overridden by the
    flags given (each override one note)."""
    shapes = graph.meta.get("input_shapes")
    dtypes = graph.meta.get("input_dtypes") or []
    notes: list[str] = []
    if not isinstance(shapes, list) or not all(isinstance(s, list) and s for s in shapes):
        if seq_len is None and image_size is None:
            notes.append("the graph does not record its input shapes (captured by an older "
                         "shardplan): training at the model's default input size "
                         "(--seq-len/--image-size choose one)")
        return seq_len, image_size, None, notes
    g_seq = g_img = None
    for i, shape in enumerate(shapes):
        dtype = str(dtypes[i]) if i < len(dtypes) else ""
        if len(shape) == 2 and "int" in dtype and g_seq is None:
            g_seq = int(shape[1])
        if len(shape) == 4 and shape[2] == shape[3] and g_img is None:
            g_img = int(shape[3])
    check: tuple[tuple[int, ...], ...] | None = tuple(tuple(int(d) for d in s[1:])
                                                     for s in shapes)
    for name, flag, have in (("seq-len", seq_len, g_seq), ("image-size", image_size, g_img)):
        if flag is None or flag == have:
            continue
        check = None
        notes.append(f"{name} {flag} overrides the graph's {have}" if have is not None
                     else f"{name} {flag} is used (the graph's inputs have no such size)")
    return (seq_len if seq_len is not None else g_seq,
            image_size if image_size is not None else g_img, check, notes)


# ----------------------------------------------------------------------------- plans
def _check_graph(plan: Any, graph: Any) -> None:
    plan.validate(graph)
    module = graph.meta.get("granularity", "op") == "module"
    if module and plan.strategy is not None:
        raise ShardplanError("a strategy configures operators: train it on an operator-level "
                             "graph (capture --granularity op)")
    if module and (graph.node_extra is None
                   or not all(isinstance(e.get("ops"), list) for e in graph.node_extra)):
        raise ShardplanError("this module-level graph does not list its operators (captured "
                             "by an older shardplan): capture it again to train it")
    if graph.meta.get("granularity", "op") not in ("op", "module"):
        raise ShardplanError("train needs a graph captured from the model (capture "
                             "--granularity op or module)")
    if graph.meta.get("mode", "train") != "train":
        raise ShardplanError("train needs a graph captured in train mode")


def operator_view(graph: Any) -> tuple[tuple[tuple[str, str, str], ...],
                                       tuple[tuple[str, ...], ...]]:
    """``(operators, members)``: the model's operators as ``(fx name, operator, module)`` in
    program order (what the runtime matches against its export), and per graph node the fx
    names of its operators. An operator-level graph's nodes are operators; a module-level
    graph's nodes list theirs (``ops``, written by ``capture --granularity module``). O(n)."""
    if graph.meta.get("granularity", "op") != "module":
        return (tuple(zip(graph.names, graph.ops, graph.modules, strict=True)),
                tuple((n,) for n in graph.names))
    rows = sorted((int(i), str(name), str(op), str(mod), v)
                  for v, extra in enumerate(graph.node_extra) for i, name, op, mod in extra["ops"])
    members: list[list[str]] = [[] for _ in range(graph.num_nodes)]
    for _, name, _, _, v in rows:
        members[v].append(name)
    return (tuple((name, op, mod) for _, name, op, mod, _ in rows),
            tuple(tuple(m) for m in members))


def pipeline_fields(plan: Any, graph: Any, settings: Any) -> dict[str, Any]:
    """The pipeline fields of a :class:`TrainConfig`: the plan's stages as graph node names,
    the graph's nodes (to match against the runtime's export), and the pipeline the
    simulator simulates (stage order, per-rank action lists, devices per rank).

    Raises
    ------
    ShardplanError
        A plan that does not fit the graph, stages that form a cycle, a schedule the plan's
        stages cannot run, an eval-mode graph, a module-level graph without its operators.
        A module-level graph's stages are the operators of their modules
        (:func:`operator_view`).
    """
    from shardplan.simulate import PipelineView

    _check_graph(plan, graph)
    view = PipelineView.build(plan, graph, settings)
    sch = view.schedule
    reps = {len(d) for d in view.rank_devices}
    if len(reps) != 1:
        raise ShardplanError(f"every stage needs the same number of "
                             f"{'devices' if plan.strategy is not None else 'replicas'} to "
                             f"run (the plan has {sorted(reps)})")
    operators, members = operator_view(graph)
    return dict(
        stages=tuple(tuple(n for i in sorted(st.nodes) for n in members[i])
                     for st in plan.stages),
        graph_nodes=operators,
        order=tuple(int(s) for s in view.order),
        actions=tuple(tuple(str(a) for a in acts) for acts in sch.ranks),
        stage_rank=tuple(int(r) for r in sch.stage_rank),
        rank_devices=tuple(tuple(int(d) for d in devs) for devs in view.rank_devices),
        replicas=reps.pop(), schedule=settings.schedule, export_batch=int(graph.batch_size),
        microbatches=int(settings.microbatches), microbatch_size=int(settings.microbatch_size),
        recompute=settings.recompute == "full",
    )


def strategy_fields(plan: Any, graph: Any, settings: Any) -> dict[str, Any]:
    """The fields of a :class:`TrainConfig` running a one-stage strategy plan (PaSE,
    data-parallel, expert): every node's configuration laid out on the mesh of the stage's
    devices (:func:`shardplan.runtime._sharding.node_shardings`), one process per device.

    Raises
    ------
    ShardplanError
        As :func:`pipeline_fields`, and a configuration the mesh cannot lay out.
    """
    from shardplan.runtime._sharding import mesh_shape, node_shardings

    _check_graph(plan, graph)
    if plan.num_stages != 1:
        raise ShardplanError("a strategy run has one stage (a pipeline of strategies is a "
                             "hybrid plan)")
    stage = plan.stages[0]
    devices = len(stage.devices)
    names = graph.names
    return dict(
        kind="strategy", nproc=devices,
        stages=(tuple(names[i] for i in sorted(stage.nodes)),), order=(0,),
        graph_nodes=tuple(zip(names, graph.ops, graph.modules, strict=True)),
        shardings=node_shardings(graph, plan.strategy, [(stage.nodes, devices)],
                                 run_batch=int(settings.microbatch_size)),
        mesh_shape=mesh_shape(devices), schedule=settings.schedule,
        export_batch=int(graph.batch_size), microbatches=int(settings.microbatches),
        microbatch_size=int(settings.microbatch_size), recompute=settings.recompute == "full",
        gradient_sync=_strategy_sync(settings), bucket_bytes=int(settings.bucket_bytes))


def _strategy_sync(settings: Any) -> str:
    """A strategy run's gradient synchronisation: ``end`` or ``bucketed`` (what the
    simulator prices for such plans); ``sharded`` is refused in one line."""
    sync = str(getattr(settings, "gradient_sync", "end"))
    if sync not in ("end", "bucketed"):
        raise ShardplanError(f"a strategy plan synchronises gradients with 'end' or "
                             f"'bucketed', not {sync!r}")
    return sync


def llm_fields(plan: Any, graph: Any, settings: Any) -> dict[str, Any]:
    """The fields of a :class:`TrainConfig` running an LLM plan (its ``parallel`` layout,
    :mod:`shardplan.runtime._llm`): one process per device of the layout, the model split
    by its module names, so the graph's operators are not matched (the plan's stages name
    the devices of each virtual stage, in the layout's rank order: the ``k``-th device of
    pipeline rank ``p`` runs layout rank ``p * devices_per_rank + k``, which is process
    ``p * devices_per_rank + k``, since torch's pipeline schedules take a pipeline group's
    ranks in increasing order; the stages' nodes are the planner's record). The layout's
    ``vp`` decides the schedule: interleaved 1F1B when > 1 (the settings'
    ``virtual_stages`` are not read), else the settings' GPipe or 1F1B.

    Raises
    ------
    ShardplanError
        A plan that does not fit the graph, an eval-mode graph, stages that are not the
        layout's ``pp * vp`` virtual stages on ``devices_per_rank`` devices each, a layout
        the model's recorded dimensions (``meta["transformer"]``) do not allow.
    """
    plan.validate(graph)
    if graph.meta.get("mode", "train") != "train":
        raise ShardplanError("train needs a graph captured in train mode")
    pc = plan.parallel
    if plan.num_stages != pc.num_stages or \
            any(len(st.devices) != pc.devices_per_rank for st in plan.stages):
        raise ShardplanError(f"an LLM plan of {pc.label()} has pp x vp = {pc.num_stages} "
                             f"stages of {pc.devices_per_rank} devices each")
    _check_llm_dimensions(pc, graph.meta.get("transformer"))
    layout_devices = tuple(int(plan.stages[p].devices[k]) for p in range(pc.pp)
                           for k in range(pc.devices_per_rank))
    # The layout's vp decides: interleaved 1F1B when > 1, and 1F1B for one stage per rank.
    schedule = "interleaved-1f1b" if pc.vp > 1 else \
        "1f1b" if settings.schedule == "interleaved-1f1b" else settings.schedule
    return dict(kind="llm", parallel=pc, nproc=pc.world_size, schedule=schedule,
                layout_devices=layout_devices, **_llm_precision(pc, settings),
                sequence_parallel=bool(getattr(settings, "sequence_parallel", False)),
                export_batch=int(graph.batch_size), microbatches=int(settings.microbatches),
                microbatch_size=int(settings.microbatch_size),
                recompute=settings.recompute == "full")


def _llm_precision(pc: Any, settings: Any) -> dict[str, str]:
    """The precision an LLM plan runs in: half precision under FSDP (torch FSDP2's
    ``MixedPrecisionPolicy``; fp8 as bf16), fp32 otherwise (:func:`precision_notes`)."""
    precision = getattr(settings, "precision", "fp32")
    if pc.dp_shard == 1 or precision == "fp32":
        return {}
    return {"precision": "fp16" if precision == "fp16" else "bf16",
            "grad_reduce": getattr(settings, "grad_reduce", "param")}


def precision_notes(settings: Any, config: TrainConfig) -> list[str]:
    """One note when the run's precision is not the plan's."""
    want = getattr(settings, "precision", "fp32")
    if want == config.precision:
        return []
    if config.precision != "fp32":  # fp8 under FSDP
        return [f"the plan trains in {want}, whose matrix products need fp8 tensor cores: "
                f"this run is {config.precision}"]
    return [f"the plan trains in {want}; the runtime runs half precision only for LLM plans "
            f"under FSDP (dp_shard > 1, torch's MixedPrecisionPolicy): this run is fp32"]


def moe_notes(settings: Any, graph: Any, config: TrainConfig) -> list[str]:
    """Notes on the MoE settings an LLM plan of a mixture of experts has and its run does not
    read (:mod:`shardplan.runtime._llm_moe`): the dispatcher is always ``alltoall`` and the
    experts' capacity the model's own ``capacity_factor``."""
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    if config.kind != "llm" or not isinstance(dims, dict) or "experts" not in dims:
        return []
    notes = []
    if getattr(settings, "moe_dispatcher", "alltoall") != "alltoall":
        notes.append(f"the plan dispatches tokens by {settings.moe_dispatcher}; the runtime "
                     f"runs the alltoall dispatcher")
    if getattr(settings, "moe_capacity_factor", None) is not None:
        notes.append("the plan's moe_capacity_factor is not read: the experts' capacity is "
                     "the model's capacity_factor")
    return notes


def _check_llm_dimensions(pc: Any, dims: Any) -> None:
    """The layout against the model's dimensions, when the graph records them (``capture``
    writes ``meta["transformer"]`` for Llama, GPT and MoE models): blocks for every virtual
    stage, heads, key/value heads, feed-forward width and vocabulary divisible by ``tp``, the
    experts by ``ep`` and their hidden width by the expert tensor-parallel degree."""
    if not isinstance(dims, dict):
        return
    if isinstance(dims.get("layers"), int):
        pc.layers_per_stage(int(dims["layers"]))
    for key, what in (("heads", "attention heads"), ("kv_heads", "key/value heads"),
                      ("ffn", "the feed-forward width"), ("vocab", "the vocabulary")):
        n = dims.get(key)
        if isinstance(n, int) and n % pc.tp:
            raise ShardplanError(f"tensor parallelism {pc.tp} does not divide {what} ({n})")
    experts, width = dims.get("experts"), dims.get("moe_ffn")  # a mixture of experts
    if isinstance(experts, int) and experts % pc.ep:
        raise ShardplanError(f"expert parallelism {pc.ep} does not divide the {experts} "
                             f"experts")
    if isinstance(experts, int) and isinstance(width, int) and width % pc.expert_tp:
        raise ShardplanError(f"expert tensor parallelism {pc.expert_tp} does not divide an "
                             f"expert's hidden width ({width})")


def plan_fields(plan: Any, graph: Any, settings: Any) -> dict[str, Any]:
    """``kind`` and the fields of the :class:`TrainConfig` that runs ``plan``: a pipeline
    (stages replicated over their devices), a strategy (one stage whose devices split its
    layers) or a hybrid (a pipeline whose stages' devices split their layers, with the
    pipeline's schedule). A one-stage plan replicated with ``gradient_sync`` ``bucketed`` or
    ``sharded`` runs as DDP or FSDP, what the simulator prices. A plan with a ``parallel``
    layout is an LLM plan (:func:`llm_fields`). Every check happens here, before any process
    starts."""
    if plan.parallel is not None:
        return llm_fields(plan, graph, settings)
    if plan.strategy is None:
        fields = {"kind": "pipeline", **pipeline_fields(plan, graph, settings)}
        sync = getattr(settings, "gradient_sync", "end")
        if plan.num_stages == 1 and fields["replicas"] > 1 and sync in ("bucketed", "sharded"):
            # data parallelism as planned: DDP's overlapped buckets, or FSDP's sharding
            fields.update(kind="ddp" if sync == "bucketed" else "fsdp", nproc=fields["replicas"])
        return fields
    if plan.num_stages == 1:
        return strategy_fields(plan, graph, settings)
    from shardplan.runtime._sharding import mesh_shape, node_shardings

    fields = pipeline_fields(plan, graph, settings)
    groups = [(st.nodes, len(st.devices)) for st in plan.stages]
    fields.update(kind="pipeline", shardings=node_shardings(
                      graph, plan.strategy, groups, run_batch=int(settings.microbatch_size)),
                  mesh_shape=mesh_shape(fields["replicas"]))
    return fields


def config_for_plan(plan: Any, graph: Any, settings: Any = None, **options: Any) -> TrainConfig:
    """A pipeline :class:`TrainConfig` for ``plan`` on ``graph``.

    ``settings`` (default: the plan's) are overridden by the execution settings among
    ``options`` (``schedule``, ``microbatches``, ``microbatch_size``, ``optimizer``,
    ``virtual_stages``, ``recompute``, and ``global_batch`` or its alias ``batch_size``); the
    other options
    are :class:`TrainConfig` fields (``model``, ``steps``, ``lr``, ``seq_len``, ...). The
    model defaults to the graph's ``meta["model"]``.
    """
    base = (plan.settings if settings is None else settings).resolve(graph)
    glob = options.pop("global_batch", None) or options.pop("batch_size", None)
    changes = {k: options.pop(k) for k in ("schedule", "microbatches", "microbatch_size",
                                            "optimizer", "virtual_stages", "recompute")
               if k in options}
    settings, _ = base.override(global_batch=glob, **changes)
    if "model" not in options and graph.meta.get("model"):
        options["model"] = graph.meta["model"]
    if "model" not in options:
        raise ShardplanError("say which model the graph was captured from: --model SPEC")
    if "seq_len" not in options and "image_size" not in options:
        seq, img, check, _ = input_sizes(graph, None, None)
        options.update(seq_len=seq, image_size=img, input_shapes=check)
    options.setdefault("optimizer", settings.optimizer)
    return TrainConfig(**plan_fields(plan, graph, settings), **options)


# ------------------------------------------------------------------------------- CLI
def _check_checkpoint_dir(directory: str | None, resume: bool) -> None:
    if directory is None:
        if resume:
            raise ShardplanError("--resume needs --checkpoint-dir")
        return
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ShardplanError(f"--checkpoint-dir {directory!r} is a file, not a folder")
    if resume:
        if not os.path.isdir(directory):
            raise ShardplanError(f"--resume: checkpoint folder {directory!r} does not exist")
        if not os.path.isfile(os.path.join(directory, "latest")):
            raise ShardplanError(f"--resume: {directory!r} holds no complete checkpoint (no "
                                 f"'latest' file)")
    else:
        parent = os.path.dirname(os.path.abspath(directory))
        if not os.path.isdir(parent):
            raise ShardplanError(f"--checkpoint-dir {directory!r}: folder {parent!r} does "
                                 f"not exist")


def model_code_file(spec: str) -> str | None:
    """The Python file a model spec runs (``FILE.py:FUNCTION``), else None: the zoo's names
    (``mlp``, ``torchvision:NAME``, ...) run no code of the user's."""
    head = spec.strip().rsplit(":", 1)[0] if ":" in spec else ""
    return head if head.endswith(".py") else None


def check_model_trust(spec: str, *, from_file: str, trusted: bool) -> None:
    """Refuse to build a model whose spec came from a file (a graph's ``model`` field)
    and names Python code, unless the user said ``--trust-model-code``: a graph or plan
    from someone else must never run code. A spec typed on the command line is the user's
    own choice and is not checked here."""
    code = model_code_file(spec)
    if code is not None and not trusted:
        raise ShardplanError(f"{from_file} names the model {spec!r}, which would run the code "
                             f"in {code!r}: pass --trust-model-code if you trust that file "
                             f"(or --model SPEC)")


def _same_model(a: str, b: str) -> bool:
    def norm(s: str) -> str:
        return ",".join(part.strip() for part in s.strip().split(","))

    return norm(a) == norm(b)


def config_from_args(args: argparse.Namespace) -> Prepared:
    """The run the arguments describe, checked before any process starts."""
    from shardplan.ir import load_graph, load_plan, load_topology

    plan = load_plan(args.plan)
    graph = load_graph(args.graph)
    topology = load_topology(args.topology)
    plan.validate(graph, topology)
    captured_from = graph.meta.get("model")
    model = args.model or captured_from
    if not model:
        raise ShardplanError("the graph does not name its model: pass --model SPEC")
    if args.model and captured_from and not _same_model(args.model, str(captured_from)):
        raise ShardplanError(f"the graph was captured from {captured_from!r}, not {args.model!r}: "
                             f"the plan's operators are that model's (capture --model's graph "
                             f"and plan it, or drop --model)")
    if not args.model:
        check_model_trust(model, from_file=f"the graph {args.graph}",
                          trusted=getattr(args, "trust_model_code", False))
    _check_checkpoint_dir(args.checkpoint_dir, args.resume)
    settings, notes = resolve_settings(
        plan, graph, microbatches=args.microbatches, schedule=args.schedule,
        optimizer=args.optimizer, global_batch=args.global_batch,
        microbatch_size=args.microbatch_size)
    seq, img, check, size_notes = input_sizes(graph, args.seq_len, args.image_size)
    notes += size_notes
    used = {int(d) for st in plan.stages for d in st.devices}
    if len(used) < topology.num_devices and not args.baseline:
        notes.append(f"the plan uses {len(used)} of the {topology.num_devices} devices of "
                     f"topology {topology.name!r}: the run starts {len(used)} processes")
    fields = plan_fields(plan, graph, settings)  # also checks the plan before any process
    common = dict(
        model=model, steps=args.steps, seq_len=seq, image_size=img, input_shapes=check,
        lr=args.lr, optimizer=settings.optimizer, seed=args.seed,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        resume=args.resume, timeout=args.timeout, export_batch=fields["export_batch"],
        schedule=settings.schedule, microbatches=fields["microbatches"],
        microbatch_size=fields["microbatch_size"])
    if getattr(args, "measure_memory", False) and args.baseline:
        raise ShardplanError("--measure-memory measures the plan's run, not a baseline")
    if args.baseline == "single":
        if fields["kind"] in ("strategy", "llm"):  # one process running each micro-batch whole
            cfg = TrainConfig(kind="single", **common)
        else:
            cfg = TrainConfig(kind="single", stages=fields["stages"],
                              graph_nodes=fields["graph_nodes"], order=fields["order"],
                              replicas=1 if fields.get("shardings") else fields["replicas"],
                              **common)
    elif args.baseline:
        devices = fields["nproc"] if fields["kind"] in ("strategy", "llm") else \
            len(fields["rank_devices"]) * fields["replicas"]
        cfg = TrainConfig(kind=args.baseline, nproc=args.nproc or devices, **common)
    else:
        if args.nproc is not None:
            raise ShardplanError("--nproc is for --baseline ddp|fsdp: a plan runs one "
                                 "process per device it uses")
        if getattr(args, "measure_memory", False):
            if fields["kind"] != "llm":
                raise ShardplanError("--measure-memory is for LLM plans (a plan with "
                                     "'parallel')")
            common["measure_memory"] = True
        common.update({k: v for k, v in fields.items() if k not in common})
        cfg = TrainConfig(**common)
        if cfg.kind == "llm" and cfg.resume:  # the checkpoint fits the run (its model: ranks)
            from shardplan.runtime._checkpoint_state import check_resume

            check_resume(cfg)
        notes += precision_notes(settings, cfg) + moe_notes(settings, graph, cfg)
        if cfg.shardings:
            from shardplan.runtime._sharding import strategy_notes

            notes += strategy_notes(cfg.shardings)
    return Prepared(cfg, settings, tuple(notes))
