"""Run the LLM plan kind (a plan whose ``parallel`` field is a
:class:`~shardplan.ir.ParallelConfig`) with torch's own pieces, as torchtitan composes them.

One :class:`~torch.distributed.device_mesh.DeviceMesh` of every rank, its dimensions in
:class:`~shardplan.ir.ParallelConfig`'s rank order, slowest first: ``pp``, ``dp_replicate``,
``dp_shard``, ``cp``, ``tp`` (so the mesh's row-major numbering is Megatron's rank
numbering). Process ``r`` runs layout rank ``r`` (torch's pipeline schedules take the ranks
of a pipeline group in increasing order as pipeline ranks 0, 1, ...), on the plan's device
of that rank (``TrainConfig.layout_devices``; with CUDA, that index modulo the host's GPUs).
Every rank builds the whole model (the zoo's seeded weights) and keeps its own virtual
stages, then, each in its own step:

1. **Pipeline split** by whole transformer blocks (:meth:`ParallelConfig.layers_per_stage`):
   virtual stage ``j`` (on pipeline rank ``j % pp``) is a module of the model's class over
   its own blocks (the model's, not copies), with the token embedding replaced by
   ``nn.Identity`` unless ``j`` is the first stage and the final norm and output head
   replaced by ``nn.Identity`` unless it is the last. Parameter names stay the model's
   (``layers.3.attention.wq.weight``). The model's forward
   must therefore be the plain chain ``output(norm(blocks(tok_embeddings(tokens))))``, which
   torchtitan's Llama is.
2. **Tensor parallelism** by module names (:func:`torch.distributed.tensor.parallel.
   parallelize_module`, Megatron's layout): ``attention.wq/wk/wv`` and ``feed_forward.w1/w3``
   column-wise, ``attention.wo`` and ``feed_forward.w2`` row-wise, so that each rank runs
   ``n_heads / tp`` query heads and ``n_kv_heads / tp`` key/value heads (the attention's
   ``view(..., -1, head_dim)`` finds them; integer head counts on the attention module are
   divided too). The embedding is split by the vocabulary (row-wise, its output all-reduced)
   and so is the output head (column-wise, its logits left split by the vocabulary: the loss
   runs under torch's ``loss_parallel``, torchtitan's choice and the computation of
   Megatron-LM's vocabulary-parallel cross entropy, so that no rank gathers the whole
   logits and the run is the one the cost model prices). Norms are replicated; with
   ``sequence_parallel`` (Megatron's sequence parallelism, torchtitan's layout) they run on
   sequence shards, the embedding reduce-scatters its output, the attention and the MLP
   all-gather the sequence at their input and their row-wise projections reduce-scatter
   it, and the output head gathers the sequence before its vocabulary split. The sequence
   length must divide by ``tp``. Blocks of an MoE decoder
   (:func:`shardplan.runtime._llm_moe.moe_block_plan`) split their attention the same way
   (DeepSeek's latent attention by its up-projections), their shared experts as the MLP,
   and leave the router replicated and the routed experts to the expert grid (below).
3. **Activation recomputation** (``recompute``): every block's forward runs under
   :func:`torch.utils.checkpoint.checkpoint` (non-reentrant), the block's names unchanged.
4. **FSDP2** (:func:`torch.distributed.fsdp.fully_shard`) over ``dp_shard``, per block and
   then per stage (HSDP over ``dp_replicate`` x ``dp_shard`` when both are > 1), in half
   precision (``TrainConfig.precision``) with torch's ``MixedPrecisionPolicy`` as torchtitan
   runs it: fp32 shards stepped by the optimizer and all-gathered as bf16 or fp16, gradients
   reduce-scattered in that precision or in fp32 (``grad_reduce``); with
   ``dp_shard == 1`` and ``dp > 1`` the gradients are all-reduced over ``dp_replicate`` after
   the step's backward (DDP's sum, as one flat all-reduce), divided by ``dp``.
5. **Pipelining** (:mod:`torch.distributed.pipelining`): one ``PipelineStage`` per virtual
   stage; ``ScheduleInterleaved1F1B`` when ``vp > 1``, else ``ScheduleGPipe`` or
   ``Schedule1F1B`` as the settings say; with ``pp == 1`` the micro-batches run one after
   another (gradient accumulation).

**Mixture of experts** (:mod:`shardplan.runtime._llm_moe`, between steps 1 and 2, when a
pipeline rank has more than one device): a second DeviceMesh of every rank, dimensions
``pp, edp, ep, etp`` (:meth:`ParallelConfig.expert_coordinates`: Megatron-Core's parallel
folding over the same devices), holds the routed experts: rank ``(etp_i, ep_i, edp_i)``
keeps experts ``ep_i * E / ep`` to ``(ep_i + 1) * E / ep - 1`` and the ``etp_i``-th slice
of their hidden width, as DTensor parameters of the model's names. Each tensor-parallel
rank routes its slice of its data-parallel part's tokens; with a capacity factor, one
all-gather of the choices per expert over the pipeline rank's devices makes the drops those
of one process running the micro-batch whole. Tokens go to their experts' ranks and back
with ``all_to_all_single`` (variable splits; Megatron-Core's ``alltoall`` dispatcher) among
the ``ep * etp`` ranks of one expert data-parallel replica. Expert gradients are summed over
the ``expert_dp`` replicas and divided by ``dp * dp_shard``; the dense ones are reduced as
step 4 says (FSDP ignores the experts).

Data: step ``t``'s batch (:func:`~shardplan.workload.batch_for_step`) is cut into micro-batches
and each of those into ``dp * dp_shard`` equal parts; the ranks of data-parallel index
``dp_i * dp_shard + shard_i`` run that part (every tensor-parallel and pipeline rank of it
the same). Each micro-batch's loss is its mean, gradients are averaged over micro-batches and
data-parallel ranks: the step equals one process running the micro-batches whole.

Checkpoints (``checkpoint_dir``, ``checkpoint_every``, ``resume``;
:mod:`shardplan.runtime._llm_checkpoint`): torch's distributed checkpoint (DCP) writes the
stages' and the optimizer's state as :func:`~torch.distributed.checkpoint.state_dict.
get_state_dict` names it (the model's names; DTensors of TP, FSDP2 and HSDP saved as the
global tensors they are pieces of) and ``state.json`` the step, data position and seed; a
checkpoint is published only once every rank has written its part. A resumed run may have
any other layout and process count: each rank asks DCP for its own stages' tensors in its
own sharding, and DCP reads them from whatever pieces the writers left (no resharding code
here); the run continues with the checkpoint's next step's batch, split among its own
data-parallel ranks, and reports the sample ids of every step (``RunResult.samples``).

Not run yet (refused in one line): context parallelism (``cp > 1``), GPT-OSS's attention
sinks under tensor parallelism. Not read: the plan's ``moe_dispatcher`` and
``moe_capacity_factor`` (the dispatch is ``alltoall``, the capacity the model's
``capacity_factor``); FSDP does not shard the experts over ``expert_dp``. The random
state is set once per step (from ``(seed, step)``), so models with dropout do not repeat one
process's masks; the Llama has no dropout.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.runtime import _llm_checkpoint as llm_ckpt
from shardplan.runtime._checkpoint import due
from shardplan.runtime._config import RunResult, TrainConfig, mix_seed
from shardplan.runtime._data import chunks
from shardplan.runtime._llm_moe import (
    apply_expert_parallel,
    build_expert_grid,
    has_moe,
    parallelize_moe_block,
    reduce_expert_gradients,
)
from shardplan.runtime._rank import (
    _build,
    _device,
    _gather_to_rank0,
    _maybe_fault,
    _report,
    _time,
    seed_random,
)
from shardplan.runtime._reduce import all_reduce_mean
from shardplan.workload._data import batch_for_step, loss_fn_for

__all__ = ["MESH_DIMS", "build_mesh", "run_llm", "split_stages", "tensor_parallel_plan"]

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
_PARTS = ("tok_embeddings", "layers", "norm", "output")
_HEAD_COUNTS = ("n_heads", "n_kv_heads", "n_local_heads", "n_local_kv_heads", "num_heads",
                "num_kv_heads")


# ---------------------------------------------------------------------------- layout
def build_mesh(parallel: Any, device_type: str) -> Any:
    """The device mesh of every rank, dimensions :data:`MESH_DIMS` (sizes ``pp, dp,
    dp_shard, cp, tp``): its row-major order is :meth:`ParallelConfig.rank`'s."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = (parallel.pp, parallel.dp, parallel.dp_shard, parallel.cp, parallel.tp)
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


class _Blocks(nn.ModuleDict):
    """A stage's blocks under the model's indices (``layers.3``), iterated by value as the
    ``nn.ModuleList`` they came from."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return iter(self._modules.values())


def _parts(model: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
    missing = [n for n in _PARTS if not isinstance(getattr(model, n, None), nn.Module)]
    if missing:
        raise ShardplanError(f"the LLM plan kind runs models with torchtitan's module names; "
                             f"this one has no {', '.join(missing)}")
    layers = model.layers
    if not isinstance(layers, (nn.ModuleDict, nn.ModuleList)):
        raise ShardplanError("the model's 'layers' must be a ModuleList or ModuleDict")
    return model.tok_embeddings, layers, model.norm, model.output


def split_stages(model: nn.Module, parallel: Any, stages: Sequence[int]) -> list[nn.Module]:
    """Virtual stages ``stages`` of ``model`` (module docstring, step 1): each a module of the
    model's class holding its own blocks, the embedding only on the first stage, the norm and
    head only on the last.

    Nothing is copied: the stages share the model's submodules (each block is in one stage)
    and its buffers; the model itself is left as it was.

    Raises
    ------
    ShardplanError
        A model without torchtitan's parts, or blocks that do not fill the stages.
    """
    _, layers, _, _ = _parts(model)
    keys = list(layers.keys()) if isinstance(layers, nn.ModuleDict) else \
        [str(i) for i in range(len(layers))]
    blocks = list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)
    counts = parallel.layers_per_stage(len(keys))
    starts = [sum(counts[:j]) for j in range(len(counts))]
    last = parallel.num_stages - 1
    out = []
    for j in stages:
        stage = _shell(model)
        span = range(starts[j], starts[j] + counts[j])
        stage.layers = _Blocks({keys[i]: blocks[i] for i in span})
        if j != 0:
            stage.tok_embeddings = nn.Identity()
        if j != last:
            stage.norm = nn.Identity()
            stage.output = nn.Identity()
        out.append(stage)
    return out


def _shell(model: nn.Module) -> nn.Module:
    """A module of ``model``'s class with its own hooks and registries (so that FSDP and
    the checkpoint wrapper change only it) over the model's submodules, parameters, buffers
    and plain attributes."""
    stage = type(model).__new__(type(model))
    nn.Module.__init__(stage)
    own = set(stage.__dict__)
    for k, v in model.__dict__.items():
        if k not in own:
            stage.__dict__[k] = v
    stage._parameters.update(model._parameters)
    stage._buffers.update(model._buffers)
    stage._non_persistent_buffers_set.update(model._non_persistent_buffers_set)
    stage._modules.update(model._modules)
    return stage


def tensor_parallel_plan(*, sequence_parallel: bool = False) -> dict[str, Any]:
    """Megatron's layout of one block by torchtitan's module names (module docstring,
    step 2); with ``sequence_parallel``, Megatron's sequence parallelism as torchtitan lays it
    out: the norms run on sequence shards (``SequenceParallel``), the attention and the MLP
    gather the sequence at their input and the row-wise projections reduce-scatter it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel()}
    if sequence_parallel:
        plan.update({
            "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
            # the attention's further inputs (rotary tables) stay plain tensors
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),)),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))})
    return plan


def _apply_tensor_parallel(stage: nn.Module, tp_mesh: Any, tp: int,
                           sequence_parallel: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    if not isinstance(stage.tok_embeddings, nn.Identity):
        _divisible(stage.tok_embeddings.weight.shape[0], tp, "the vocabulary")
        parallelize_module(stage.tok_embeddings, tp_mesh, RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()))
    if not isinstance(stage.output, nn.Identity):
        _divisible(stage.output.weight.shape[0], tp, "the vocabulary")
        if sp:
            parallelize_module(stage.norm, tp_mesh, SequenceParallel())
        parallelize_module(stage.output, tp_mesh, ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1),
            use_local_output=False))
    for block in stage.layers.values():
        attention = block.attention
        for name in _HEAD_COUNTS:
            v = getattr(attention, name, None)
            if isinstance(v, int) and not isinstance(v, bool):
                _divisible(v, tp, f"attention's {name}")
                setattr(attention, name, v // tp)
        if hasattr(block, "moe") or hasattr(attention, "wkv_b"):  # an MoE decoder's block
            parallelize_moe_block(block, tp_mesh, tp, sequence_parallel=sp)
            continue
        _divisible(block.feed_forward.w1.weight.shape[0], tp, "the feed-forward width")
        parallelize_module(block, tp_mesh, tensor_parallel_plan(sequence_parallel=sp))


def _divisible(n: int, tp: int, what: str) -> None:
    if n % tp:
        raise ShardplanError(f"tensor parallelism {tp} does not divide {what} ({n})")


def _apply_recompute(stage: nn.Module) -> None:
    """Full recomputation: each block's forward checkpointed (its names unchanged)."""
    from torch.utils.checkpoint import checkpoint

    for block in stage.layers.values():
        inner = block.forward
        block.forward = functools.partial(checkpoint, inner, use_reentrant=False)


def _apply_fsdp(stage: nn.Module, mesh: Any, parallel: Any, precision: str = "fp32",
                grad_reduce: str = "param", ignored: set[nn.Parameter] | None = None) -> None:
    """FSDP2 per block, then the stage; in half precision with torch's
    ``MixedPrecisionPolicy`` (torchtitan's: the fp32 shards all-gathered as half precision,
    the gradients reduce-scattered in half precision or fp32). ``ignored``: parameters FSDP
    leaves alone (the routed experts, reduced over their own grid)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dp_mesh = mesh["dp_replicate", "dp_shard"] if parallel.dp > 1 else mesh["dp_shard"]
    reshard = parallel.pp == 1  # torchtitan: keep blocks unsharded between micro-batches
    kw: dict[str, Any] = {"ignored_params": ignored} if ignored else {}
    if precision != "fp32":
        half = torch.bfloat16 if precision == "bf16" else torch.float16
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=half, reduce_dtype=torch.float32 if grad_reduce == "fp32" else half)
    for block in stage.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, **kw)
    fully_shard(stage, mesh=dp_mesh, reshard_after_forward=reshard, **kw)


# ------------------------------------------------------------------------------ run
def run_llm(cfg: TrainConfig, rank: int, world: int) -> RunResult:
    """Train ``cfg`` (kind ``llm``) on this rank of an initialised process group.

    Returns
    -------
    RunResult
        Losses (every micro-batch's mean loss, averaged over the step), seconds per step;
        ``params`` (``return_params``, rank 0): ``{name: [full tensor per holder]}``;
        ``memory`` (``measure_memory``, rank 0): per rank, the peak bytes by category of the
        last step (:func:`shardplan.runtime._llm_memory.peak_by_category`).
    """
    pc = cfg.parallel
    if world != pc.world_size:
        raise ShardplanError(f"the plan needs {pc.world_size} processes, the run has {world}")
    device = _device()
    if cfg.layout_devices and torch.cuda.is_available():  # the plan's device of this rank
        torch.cuda.set_device(cfg.layout_devices[rank] % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    coords = pc.coordinates(rank)
    mesh = build_mesh(pc, device.type)
    model, inputs, _ = _build(cfg, cfg.microbatch_size)
    if cfg.sequence_parallel and pc.tp > 1:
        _divisible(int(inputs[0].shape[1]), pc.tp, "the sequence length")
    with torch.no_grad():
        classes = int(model.output.weight.shape[0]) if hasattr(model, "output") else \
            int(model(*inputs).shape[-1])
    shapes = llm_ckpt.model_shapes(model) if cfg.resume else {}  # hook: checkpoints
    mine = [coords["pp"] + k * pc.pp for k in range(pc.vp)]
    # MoE layers: the expert grid of the layout (_llm_moe), unless one device runs them whole
    grid = build_expert_grid(pc, rank, device.type, mesh) \
        if pc.devices_per_rank > 1 and has_moe(model) else None
    stages = split_stages(model, pc, mine)
    del model
    experts: list[nn.Parameter] = []
    for st in stages:
        st.to(device)
        if grid is not None:
            experts.extend(apply_expert_parallel(st, grid))
        if pc.tp > 1:
            _apply_tensor_parallel(st, mesh["tp"], pc.tp, cfg.sequence_parallel)
        if cfg.recompute:
            _apply_recompute(st)
        if pc.dp_shard > 1:
            _apply_fsdp(st, mesh, pc, cfg.precision, cfg.grad_reduce, set(experts))
    params = [p for st in stages for p in st.parameters()]
    routed = {id(p) for p in experts}
    dense = [p for p in params if id(p) not in routed]
    opt = _make_optimizer(cfg, params)
    loss_fn = loss_fn_for(cfg.model)
    m = cfg.microbatches
    parts = pc.data_parallel
    my_part = coords["dp"] * pc.dp_shard + coords["shard"]
    first, last = 0 in mine, pc.num_stages - 1 in mine
    schedule = _schedule(cfg, stages, mine, mesh, device, loss_fn) if pc.pp > 1 else None
    dp_group = mesh["dp_replicate"].get_group() if pc.dp > 1 and pc.dp_shard == 1 else None
    tracker = None
    # hook: checkpoints (resumed under this layout, resharded by DCP) and the data position
    start = llm_ckpt.load(cfg, stages, opt, shapes) if cfg.resume else 0
    result = RunResult(start_step=start)
    fed: list[list[list[list[int]]]] = []  # per step, per micro-batch: this part's samples
    for step in range(start, cfg.steps):
        _maybe_fault(cfg, rank, step)
        seed_random(mix_seed(cfg.seed, step, 0, 0))
        x, y = batch_for_step(inputs, classes, batch_size=cfg.global_batch, seed=cfg.seed,
                              step=step)
        pieces = chunks(x, y, m, parts)
        fed.append(llm_ckpt.part_samples(step, cfg.global_batch, m, parts, my_part))
        xs = [tuple(t.to(device) for t in pieces[j * parts + my_part][0]) for j in range(m)]
        ys = [pieces[j * parts + my_part][1].to(device) for j in range(m)]
        if cfg.measure_memory and step == cfg.steps - 1:
            from shardplan.runtime._llm_memory import start_tracking

            tracker = start_tracking(stages, opt)
        t0 = _time()
        losses: list[torch.Tensor] = []
        with _loss_context(pc.tp):
            if schedule is None:
                for j in range(m):
                    loss = loss_fn(stages[0](*xs[j]), ys[j])
                    (loss / m).backward()
                    losses.append(loss.detach())
            else:
                kw: dict[str, Any] = {}
                if first:
                    kw["arg_mbs"] = xs
                if last:
                    kw["target_mbs"] = ys
                schedule.step(losses=losses, return_outputs=False, **kw)
        if dp_group is not None:
            all_reduce_mean(dense, dp_group, pc.dp)
        if grid is not None:
            reduce_expert_gradients(experts, grid)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if tracker is not None:
            from shardplan.runtime._llm_memory import stop_tracking

            stop_tracking(tracker)
        elapsed = _time() - t0
        counted = last and coords["tp"] == 0 and coords["cp"] == 0
        part = sum(_scalar(v) for v in losses) / m / parts if counted else 0.0
        _report(result, part, elapsed)
        if due(cfg, step + 1):  # hook: checkpoints
            llm_ckpt.save(cfg, stages, opt, step + 1)
    feeds = first and coords["tp"] == 0 and coords["cp"] == 0
    result.samples = llm_ckpt.gather_samples((my_part, fed) if feeds else None, rank)
    if tracker is not None:
        from shardplan.runtime._llm_memory import peak_by_category

        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, peak_by_category(tracker))
        result.memory = every if rank == 0 else None
    if cfg.return_params:
        result.params = _gather_params(stages, rank)
    return result


def _loss_context(tp: int) -> Any:
    """torch's ``loss_parallel`` under tensor parallelism (the cross-entropy of logits split
    by the vocabulary, forward and backward, as Megatron-LM's vocabulary-parallel cross
    entropy computes it: no rank gathers the whole logits); a null context otherwise."""
    import contextlib

    if tp == 1:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _scalar(loss: torch.Tensor) -> float:
    """A micro-batch's loss as a float (under ``loss_parallel`` a replicated DTensor)."""
    from torch.distributed.tensor import DTensor

    return float(loss.to_local() if isinstance(loss, DTensor) else loss)


def _make_optimizer(cfg: TrainConfig, params: Sequence[nn.Parameter]) -> torch.optim.Optimizer:
    """The settings' optimizer, for-loop implementation: ``foreach`` kernels refuse a list
    mixing DTensors (split layers) and plain tensors (replicated norms)."""
    kw: dict[str, Any] = {"lr": cfg.lr, "foreach": False}
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, **kw)
    if cfg.optimizer in ("sgd-momentum", "momentum"):
        return torch.optim.SGD(params, momentum=0.9, **kw)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, **kw)
    return torch.optim.Adam(params, **kw)


def _schedule(cfg: TrainConfig, stages: Sequence[nn.Module], mine: Sequence[int], mesh: Any,
              device: torch.device, loss_fn: Any) -> Any:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import (
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    pc = cfg.parallel
    group = mesh["pp"].get_group()
    pipe = [PipelineStage(st, j, pc.num_stages, device, group=group)
            for st, j in zip(stages, mine, strict=True)]
    if pc.vp > 1:
        return ScheduleInterleaved1F1B(pipe, n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    cls = ScheduleGPipe if cfg.schedule == "gpipe" else Schedule1F1B
    return cls(pipe[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn)


def _gather_params(stages: Sequence[nn.Module], rank: int) -> dict[str, list[Any]] | None:
    """Every rank's whole parameters on rank 0, ``{name: [tensor per holder]}`` (the
    tensor-parallel and data-parallel copies of each; callers check they agree)."""
    from torch.distributed.tensor import DTensor

    local: dict[str, Any] = {}
    for st in stages:
        for name, p in st.named_parameters():
            t = p.detach()
            t = t.full_tensor() if isinstance(t, DTensor) else t  # collective in its mesh
            local[name] = t.cpu().clone()
    return _gather_to_rank0(local, rank)
