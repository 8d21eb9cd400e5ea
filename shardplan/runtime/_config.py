"""What one training run is (the value object every rank receives) and what it reports.

No torch here: the launcher builds configs and reads results without importing it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["KINDS", "OPTIMIZERS", "SCHEDULES", "RunResult", "TrainConfig", "mix_seed"]

KINDS = ("pipeline", "strategy", "llm", "ddp", "fsdp", "single")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "momentum")


def mix_seed(seed: int, step: int, chunk: int, stage: int) -> int:
    """The random seed of one stage's forward of one chunk of one step.

    Every run sets the random state from this before each forward (pipeline: per stage;
    unsplit baselines: stage 0 for the whole model), so dropout masks are a function of
    ``(seed, step, chunk, stage)`` and nothing else: the same seed repeats a run exactly, and
    a pipeline draws the masks a single process running the same stage modules draws.
    """
    x = (int(seed) * 1_000_003 + int(step)) % (1 << 61)
    x = (x * 65_537 + int(chunk)) % (1 << 61)
    return (x * 257 + int(stage)) % (1 << 61)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """One training run: model, data, micro-batching, schedule, layout, checkpoints.

    Batch vocabulary (that of :class:`shardplan.ir.ExecutionSettings`): one optimizer step
    trains ``global_batch = microbatch_size x microbatches`` samples; a micro-batch is cut
    into ``replicas`` equal parts, one per replica of a stage (pipeline) or per process
    (ddp/fsdp); ``single`` runs the parts one after another (gradient accumulation), which is
    what the pipeline computes.

    Attributes
    ----------
    model : str
        A zoo spec (``mlp``, ``transformer,num_layers=2``, ``transformers:gpt2,n_layer=2``).
    steps : int
        Optimizer steps (iterations) to run; with ``resume``, the total to reach.
    kind : {"pipeline", "strategy", "ddp", "fsdp", "single"}
        The planned pipeline, a strategy plan (one stage whose devices split every layer as
        its configuration says, with DTensor), or a baseline. A pipeline with ``shardings``
        is a hybrid: each stage's devices split its layers instead of replicating them.
    schedule : {"gpipe", "1f1b", "interleaved-1f1b"}
        The schedule's name (the pipeline runs ``actions``; this names them).
    microbatches : int
        Micro-batches per step.
    microbatch_size : int
        Samples per micro-batch, shared by the replicas.
    replicas : int
        Devices per pipeline stage: the plan's replicas per stage, each running its part of
        every micro-batch (``pipeline``, and ``single`` when it stands in for a replicated
        pipeline), or, with ``shardings``, the stage's device group, running every
        micro-batch together; ddp/fsdp use ``nproc``.
    seq_len, image_size : int or None
        Input sizes the model is built with (None: the zoo's default).
    input_shapes : tuple of tuple of int, or None
        The graph's recorded input shapes without the batch dimension; the model built here
        must have them (None: not recorded, not checked).
    export_batch : int
        Batch size to export the model at (the graph's; the batch dimension is dynamic).
    lr : float
    optimizer : {"adam", "adamw", "sgd", "sgd-momentum", "momentum"}
    seed : int
        Seeds the synthetic data (step ``t``'s batch is a function of ``seed`` and ``t``) and
        the random state of every forward (:func:`mix_seed`); the initial weights are the
        zoo's (its own fixed seed).
    recompute : bool
        Pipeline: recompute each stage's forward during its backward (activation
        checkpointing), as the plan's settings say.
    stages : tuple of tuple of str
        Per plan stage, the graph's names of its operators (``single`` with stages runs the
        same stage modules one after another).
    graph_nodes : tuple of (str, str, str)
        Per graph node: name, operator, module; matched against the program the runtime
        exports (:func:`shardplan.runtime._split.match_graph`).
    order : tuple of int
        Pipeline position -> plan stage (the :class:`~shardplan.simulate.PipelineView`'s).
    actions : tuple of tuple of str
        Per pipeline rank, its actions in torch's text form (``2F0``, ``1B3``,
        ``1REDUCE_GRAD``), exactly the simulator's schedule.
    stage_rank : tuple of int
        Pipeline position -> pipeline rank.
    rank_devices : tuple of tuple of int
        Per pipeline rank, its device per replica.
    nproc : int
        Baselines and ``strategy``: processes (``single`` is 1).
    shardings : tuple of NodeSharding
        Strategy plans: per graph node, its configuration laid out on its stage's mesh
        (:func:`shardplan.runtime._sharding.node_shardings`).
    mesh_shape : tuple of int
        Strategy plans: the mesh each stage's devices form (one axis per prime factor).
    checkpoint_dir : str or None
    checkpoint_every : int
        Save every that many steps (and after the last step); 0 = only after the last step.
    resume : bool
        Continue from the newest complete checkpoint in ``checkpoint_dir``.
    timeout : float
        Seconds a collective may wait before the run fails (process-group timeout).
    return_params : bool
        Collect the final parameters (by name) in the result (tests).
    fault : tuple of (int, int) or None
        Test hook: ``(rank, step)``: that rank kills itself (SIGKILL) when it starts that step.
    fault_in_save : bool
        Test hook, ``llm`` runs: with ``fault``, the rank kills itself while the checkpoint
        after ``step`` steps is written (its own tensors written, the checkpoint not yet
        published) instead of when it starts the step.
    parallel : ParallelConfig or None
        ``llm`` runs: the plan's layout (tp x pp x dp x dp_shard x cp x vp,
        :mod:`shardplan.ir.parallel`), run by :mod:`shardplan.runtime._llm`.
    measure_memory : bool
        ``llm`` runs: track the last step with torch's MemTracker and report every rank's
        peak bytes by category (:attr:`RunResult.memory`).
    sequence_parallel : bool
        ``llm`` runs with ``tp > 1``: Megatron's sequence parallelism (norms on sequence
        shards, reduce-scatter and all-gather in place of the all-reduces).
    layout_devices : tuple of int
        ``llm`` runs: the plan's device of each layout rank (:meth:`ParallelConfig.rank`
        order); process ``r`` runs layout rank ``r`` on that device (CUDA: the device of
        that index modulo the GPUs of the host); empty: device ``r``.
    precision : {"fp32", "bf16", "fp16"}
        ``llm`` runs under FSDP (``dp_shard > 1``): half precision as torch FSDP2's
        ``MixedPrecisionPolicy`` runs it (torchtitan's mixed precision): fp32 shards, stepped
        by the optimizer, all-gathered in half precision for the forward and backward.
        Other runs are fp32 (``config_from_args`` says so for a half-precision plan).
    grad_reduce : {"param", "fp32"}
        With ``precision`` half: the gradients' reduce-scatter in half precision or in fp32
        (FSDP2's ``reduce_dtype``).
    """

    model: str
    steps: int
    kind: str = "pipeline"
    schedule: str = "gpipe"
    microbatches: int = 1
    microbatch_size: int = 8
    replicas: int = 1
    seq_len: int | None = None
    image_size: int | None = None
    input_shapes: tuple[tuple[int, ...], ...] | None = None
    export_batch: int = 8
    lr: float = 1e-3
    optimizer: str = "adam"
    seed: int = 0
    recompute: bool = False
    stages: tuple[tuple[str, ...], ...] = ()
    graph_nodes: tuple[tuple[str, str, str], ...] = ()
    order: tuple[int, ...] = ()
    actions: tuple[tuple[str, ...], ...] = ()
    stage_rank: tuple[int, ...] = ()
    rank_devices: tuple[tuple[int, ...], ...] = ()
    nproc: int = 1
    shardings: tuple[Any, ...] = ()
    mesh_shape: tuple[int, ...] = ()
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    timeout: float = 300.0
    return_params: bool = False
    fault: tuple[int, int] | None = None
    fault_in_save: bool = False
    gradient_sync: str = "end"
    bucket_bytes: int = 25 * 2**20
    parallel: Any = None
    measure_memory: bool = False
    sequence_parallel: bool = False
    layout_devices: tuple[int, ...] = ()
    precision: str = "fp32"
    grad_reduce: str = "param"

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ShardplanError(f"the runtime trains in fp32, bf16 or fp16, not "
                                 f"{self.precision!r}")
        if self.grad_reduce not in ("param", "fp32"):
            raise ShardplanError(f"gradients are reduced at 'param' or 'fp32', not "
                                 f"{self.grad_reduce!r}")
        if self.kind not in KINDS:
            raise ShardplanError(f"unknown run kind {self.kind!r} (choose from "
                                 f"{', '.join(KINDS)})")
        if self.schedule not in SCHEDULES:
            raise ShardplanError(f"unknown schedule {self.schedule!r} (choose from "
                                 f"{', '.join(SCHEDULES)})")
        if self.optimizer not in OPTIMIZERS:
            raise ShardplanError(f"unknown optimizer {self.optimizer!r} (choose from "
                                 f"{', '.join(OPTIMIZERS)})")
        for name in ("steps", "microbatches", "microbatch_size", "replicas", "nproc",
                     "export_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShardplanError(f"{name.replace('_', ' ')} must be a positive integer, "
                                     f"got {v!r}")
        for name in ("seq_len", "image_size"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ShardplanError(f"{name.replace('_', ' ')} must be a positive integer, "
                                     f"got {v!r}")
        if self.gradient_sync not in ("end", "bucketed", "sharded"):
            raise ShardplanError(f"unknown gradient sync {self.gradient_sync!r}")
        if isinstance(self.bucket_bytes, bool) or not isinstance(self.bucket_bytes, int) \
                or self.bucket_bytes < 1:
            raise ShardplanError(f"bucket bytes must be a positive integer, got "
                                 f"{self.bucket_bytes!r}")
        if not self.lr > 0:
            raise ShardplanError(f"learning rate must be positive, got {self.lr!r}")
        if self.checkpoint_every < 0:
            raise ShardplanError("checkpoint-every must be >= 0")
        if self.resume and not self.checkpoint_dir:
            raise ShardplanError("--resume needs --checkpoint-dir")
        if self.fault_in_save and (self.fault is None or self.kind != "llm"
                                   or not self.checkpoint_dir):
            raise ShardplanError("fault_in_save needs a fault and an llm run that checkpoints")
        if (self.kind == "llm") != (self.parallel is not None):
            raise ShardplanError("an llm run needs the plan's parallel layout, and only it "
                                 "has one")
        if self.kind == "llm":
            self._check_llm()
        if self.kind == "pipeline":
            self._check_pipeline()
        if self.kind == "strategy" or (self.kind == "pipeline" and self.shardings):
            self._check_strategy()
        if self.microbatch_size % self.parts and self.kind in ("pipeline", "single", "llm"):
            raise ShardplanError(f"micro-batch size {self.microbatch_size} is not divisible by "
                                 f"the {self.parts} replicas that share it")
        if self.kind in ("ddp", "fsdp") and self.microbatch_size < self.parts:
            raise ShardplanError(f"micro-batch size {self.microbatch_size} is smaller than the "
                                 f"{self.parts} processes that share it")

    def _check_pipeline(self) -> None:
        if not self.stages or not self.actions or not self.rank_devices:
            raise ShardplanError("a pipeline run needs the plan's stages and schedule "
                                 "(config_for_plan builds them)")
        num = len(self.stages)
        if sorted(self.order) != list(range(num)) or len(self.stage_rank) != num:
            raise ShardplanError("the pipeline order must name every plan stage once")
        if {len(d) for d in self.rank_devices} != {self.replicas}:
            raise ShardplanError(f"every pipeline rank needs {self.replicas} replicas to run "
                                 f"(the plan has {sorted({len(d) for d in self.rank_devices})})")
        if len(self.actions) != len(self.rank_devices):
            raise ShardplanError("the schedule needs one action list per pipeline rank")
        devices = [d for devs in self.rank_devices for d in devs]
        if len(set(devices)) != len(devices):
            raise ShardplanError("a device runs two pipeline ranks")

    def _check_llm(self) -> None:
        """What the LLM runtime (:mod:`shardplan.runtime._llm`) does not run yet."""
        pc = self.parallel
        if pc.cp > 1:
            raise ShardplanError("context parallelism (cp > 1) is not run yet")
        if self.layout_devices and (len(self.layout_devices) != pc.world_size
                                    or len(set(self.layout_devices)) != pc.world_size):
            raise ShardplanError(f"an LLM run needs {pc.world_size} distinct devices, one "
                                 f"per layout rank")
        if pc.pp > 1 and pc.vp > 1 and self.microbatches % pc.pp:
            raise ShardplanError(f"interleaved 1F1B needs micro-batches ({self.microbatches}) "
                                 f"divisible by the {pc.pp} pipeline ranks")

    def _check_strategy(self) -> None:
        size = 1
        for a in self.mesh_shape:
            size *= int(a)
        group = self.nproc if self.kind == "strategy" else self.replicas
        if not self.shardings or size != group:
            raise ShardplanError("a strategy run needs every node's layout and a mesh of its "
                                 "devices (config_for_plan builds them)")
        if self.kind == "strategy" and len(self.stages) != 1:
            raise ShardplanError("a strategy run has one stage")

    @property
    def tensor_parallel(self) -> bool:
        """Whether devices split layers (a strategy plan, or a hybrid pipeline's stages)."""
        return bool(self.shardings)

    @property
    def parts(self) -> int:
        """Equal parts of one micro-batch: one per replica (pipeline, single) or process; 1
        when the devices split layers rather than data (strategy, hybrid)."""
        if self.kind == "llm":
            return int(self.parallel.data_parallel)
        if self.shardings or self.kind == "strategy":
            return 1
        return self.nproc if self.kind in ("ddp", "fsdp") else self.replicas

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step."""
        return self.microbatch_size * self.microbatches

    @property
    def world_size(self) -> int:
        if self.kind == "pipeline":
            return len(self.rank_devices) * self.replicas
        if self.kind == "llm":
            return int(self.parallel.world_size)
        return 1 if self.kind == "single" else self.nproc

    @property
    def chunk_size(self) -> int:
        """Samples one replica (or the single process) runs at once."""
        return max(1, self.microbatch_size // self.parts)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.parallel is not None:
            out["parallel"] = self.parallel.to_dict()
        return out


@dataclass(slots=True)
class RunResult:
    """What a run reports (rank 0 of a distributed run, or the single process).

    ``params`` (tests): every parameter by name, as a list of tensors, one per holder (the
    replicas of a stage, the stages sharing a tied weight); only when asked for.
    ``replicated`` (strategy and hybrid runs): the graph operators that ran on whole tensors
    on every device of their stage, although their configuration split them (no DTensor
    sharding rule for the operator, or a random operator other than dropout); ``reshards``:
    operator inputs redistributed with communication in one forward of each stage (the
    last), summed over the stages. ``memory`` (``llm`` runs with ``measure_memory``): per
    rank, the peak bytes of the last step by category
    (:func:`shardplan.runtime._llm_memory.peak_by_category`). ``boundaries`` (hybrid
    runs): the values that crossed a
    stage boundary in batch shards, device to device, and the model's output when the loss
    read it so (graph names); the others crossed whole. ``samples`` (``llm`` runs): per
    step run, the global sample ids it trained (sample ``t x global_batch + i`` is sample
    ``i`` of step ``t``'s batch) as ``[start, stop)`` ranges, in the batch's order, as the
    data-parallel ranks took them: ``[[t x B, (t + 1) x B]]`` when every sample was trained
    once.
    """

    losses: list[float] = field(default_factory=list)
    seconds_per_step: list[float] = field(default_factory=list)
    start_step: int = 0
    params: dict[str, Any] | None = None
    replicated: list[str] | None = None
    reshards: int | None = None
    memory: list[dict[str, int]] | None = None
    boundaries: list[str] | None = None
    samples: list[list[list[int]]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"losses": self.losses, "seconds_per_step": self.seconds_per_step,
                               "start_step": self.start_step}
        if self.replicated is not None:
            out["replicated"] = list(self.replicated)
        if self.reshards is not None:
            out["reshards"] = int(self.reshards)
        if self.memory is not None:
            out["memory"] = [dict(m) for m in self.memory]
        if self.boundaries is not None:
            out["boundaries"] = list(self.boundaries)
        if self.samples is not None:
            out["samples"] = [[list(r) for r in step] for step in self.samples]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        rep = data.get("replicated")
        return cls(losses=[float(v) for v in data["losses"]],
                   seconds_per_step=[float(v) for v in data["seconds_per_step"]],
                   start_step=int(data["start_step"]),
                   replicated=None if rep is None else [str(v) for v in rep],
                   reshards=None if data.get("reshards") is None else int(data["reshards"]),
                   memory=None if data.get("memory") is None else
                   [{str(k): int(v) for k, v in m.items()} for m in data["memory"]],
                   boundaries=None if data.get("boundaries") is None
                   else [str(v) for v in data["boundaries"]],
                   samples=None if data.get("samples") is None else
                   [[[int(a), int(b)] for a, b in step] for step in data["samples"]])
