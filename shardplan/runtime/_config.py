"""What one training run is: the value object every rank receives."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["KINDS", "OPTIMIZERS", "SCHEDULES", "TrainConfig"]

KINDS = ("pipeline", "ddp", "fsdp", "single")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """One training run: model, data, schedule, layout, checkpoints.

    Attributes
    ----------
    model : str
        A zoo spec (``mlp``, ``transformer,num_layers=2``, ``transformers:gpt2,n_layer=2``).
    steps : int
        Optimizer steps (iterations) to run; with ``resume``, the total to reach.
    kind : {"pipeline", "ddp", "fsdp", "single"}
        The planned pipeline, or a baseline.
    schedule : {"gpipe", "1f1b", "interleaved-1f1b"}
    microbatches : int
        Micro-batches per replica per step (pipeline: the schedule's; baselines: gradient
        accumulation over that many chunks of each rank's share).
    batch_size : int
        The global batch of one step, split evenly over replicas and micro-batches.
    seq_len : int
        Tokens per sample for language models.
    lr : float
    optimizer : {"adam", "sgd"}
    seed : int
        Seeds the synthetic data (step ``t``'s batch is a function of ``seed`` and ``t``); the
        initial weights are the zoo's (its own fixed seed).
    stages : tuple of tuple of str
        Pipeline: per plan stage, the fx names of its operators.
    devices : tuple of tuple of int
        Pipeline: per plan stage, its device per replica.
    nproc : int
        Baselines: processes (``single`` is 1).
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
    """

    model: str
    steps: int
    kind: str = "pipeline"
    schedule: str = "gpipe"
    microbatches: int = 1
    batch_size: int = 8
    seq_len: int = 16
    lr: float = 1e-3
    optimizer: str = "adam"
    seed: int = 0
    stages: tuple[tuple[str, ...], ...] = ()
    devices: tuple[tuple[int, ...], ...] = ()
    nproc: int = 1
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    timeout: float = 300.0
    return_params: bool = False
    fault: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ShardplanError(f"unknown run kind {self.kind!r} (choose from "
                                 f"{', '.join(KINDS)})")
        if self.schedule not in SCHEDULES:
            raise ShardplanError(f"unknown schedule {self.schedule!r} (choose from "
                                 f"{', '.join(SCHEDULES)})")
        if self.optimizer not in OPTIMIZERS:
            raise ShardplanError(f"unknown optimizer {self.optimizer!r} (choose from "
                                 f"{', '.join(OPTIMIZERS)})")
        for name in ("steps", "microbatches", "batch_size", "seq_len", "nproc"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShardplanError(f"{name.replace('_', ' ')} must be a positive integer, "
                                     f"got {v!r}")
        if not self.lr > 0:
            raise ShardplanError(f"learning rate must be positive, got {self.lr!r}")
        if self.checkpoint_every < 0:
            raise ShardplanError("checkpoint-every must be >= 0")
        if self.resume and not self.checkpoint_dir:
            raise ShardplanError("--resume needs --checkpoint-dir")
        if self.kind == "pipeline":
            if not self.stages or len(self.stages) != len(self.devices):
                raise ShardplanError("a pipeline run needs the plan's stages and devices")
            reps = {len(d) for d in self.devices}
            if len(reps) != 1:
                raise ShardplanError(f"every stage needs the same number of replicas to run "
                                     f"(the plan has {sorted(reps)})")
            if self.schedule == "1f1b" and self.microbatches < len(self.stages):
                raise ShardplanError(f"1f1b needs at least as many micro-batches as stages "
                                     f"({len(self.stages)}), got {self.microbatches}")
            if self.schedule == "interleaved-1f1b" and len(self.stages) % 2:
                raise ShardplanError("interleaved-1f1b runs two plan stages per device: the "
                                     "plan needs an even number of stages")
        if self.kind != "pipeline" and self.batch_size < self.replicas * self.microbatches:
            raise ShardplanError(f"batch size {self.batch_size} is smaller than processes x "
                                 f"microbatches = {self.replicas} x {self.microbatches}")
        # Baselines split uneven batches with tensor_split (shares differ by at most one
        # sample); the pipeline's stages are exported at one fixed micro-batch size.
        if self.kind == "pipeline" and self.batch_size % (self.replicas * self.microbatches):
            raise ShardplanError(f"batch size {self.batch_size} is not divisible by replicas x "
                                 f"microbatches = {self.replicas} x {self.microbatches}")

    @property
    def replicas(self) -> int:
        """Data-parallel copies: the plan's replicas per stage, or the baseline's processes."""
        if self.kind == "pipeline":
            return len(self.devices[0])
        return 1 if self.kind == "single" else self.nproc

    @property
    def world_size(self) -> int:
        if self.kind == "pipeline":
            n = sum(len(d) for d in self.devices)
            return n // 2 if self.schedule == "interleaved-1f1b" else n
        return 1 if self.kind == "single" else self.nproc

    @property
    def microbatch_size(self) -> int:
        return max(1, self.batch_size // (self.replicas * self.microbatches))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
