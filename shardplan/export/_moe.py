"""A mixture of experts in the exports of an LLM plan (issue 47): the expert grid (``ep``,
``etp``), the experts' own arguments and the MoE settings, in Megatron-LM's and torchtitan's
terms; and Megatron-Core's ``--pipeline-model-parallel-layout`` of a split no other argument
expresses.

The experts are read from the graph (``meta["transformer"]``: ``experts``, ``top_k``,
``moe_ffn``, ``shared_experts``, ``first_k_dense``, as the zoo's MoE models record them); a
plan with an expert grid on a graph without experts is refused.

- Megatron-LM: ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
  ``--moe-shared-expert-intermediate-size`` (shared experts x their width),
  ``--moe-layer-freq ([0]*K+[1]*N)`` (the dense layers first), ``--expert-model-parallel-size``,
  ``--expert-tensor-parallel-size`` (when set apart from TP), ``--moe-token-dispatcher-type``,
  ``--moe-grouped-gemm``, ``--moe-expert-capacity-factor`` (a dropping plan), and the router's
  load balancing an import recorded (``--moe-router-load-balancing-type``). The rest of the
  model (attention, router scores) is the user's, as a dense model's is.
- torchtitan 0.3.0: ``parallelism.expert_parallel_degree``; its experts are split over EP
  borrowing FSDP's and TP's ranks (``efsdp x ep = dp_shard x cp x tp``), never by tensor
  parallelism under EP, and over the TP ranks without EP; torchtitan 0.2 also has
  ``expert_tensor_parallel_degree``, 1 or TP. Its dispatch is an all-to-all and its experts
  are grouped GEMMs without token dropping: a dropping plan is refused, an allgather
  dispatcher or per-expert GEMMs are written as torchtitan runs them, with a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan
from shardplan.ir.parallel import ParallelConfig

__all__ = ["megatron_layout", "megatron_moe_args", "moe_of", "moe_record",
           "torchtitan_experts"]


def moe_of(plan: Plan, graph: Graph) -> Mapping[str, Any] | None:
    """The graph's mixture of experts (its ``meta["transformer"]``), or None for a dense
    model; refuses an expert grid without experts."""
    meta = graph.meta.get("transformer") or {}
    if meta.get("experts"):
        return meta
    par = plan.parallel
    if par is not None and par.is_expert_parallel:
        raise ShardplanError(f"the plan splits experts ({par.label()}) and graph "
                             f"{plan.graph!r} has no mixture of experts (meta transformer "
                             f"experts)")
    return None


def moe_record(plan: Plan, graph: Graph) -> dict[str, Any]:
    """The expert grid and the experts by name, for the formats that record every degree
    (empty for a dense model)."""
    moe = moe_of(plan, graph)
    par = plan.parallel
    if moe is None or par is None:
        return {}
    return {"expert_parallel": par.ep, "expert_tensor_parallel": par.expert_tp,
            "expert_data_parallel": par.expert_dp, "num_experts": int(moe["experts"])}


def megatron_moe_args(plan: Plan, graph: Graph, settings: ExecutionSettings
                      ) -> list[str]:
    """Megatron-LM's arguments of the plan's experts, grid and MoE settings (module
    docstring); none for a dense model."""
    moe = moe_of(plan, graph)
    par = plan.parallel
    if moe is None or par is None:
        return []
    ffn = int(moe["moe_ffn"])
    args = ["--num-experts", str(int(moe["experts"])), "--moe-router-topk",
            str(int(moe["top_k"])), "--moe-ffn-hidden-size", str(ffn)]
    if moe.get("shared_experts"):
        args += ["--moe-shared-expert-intermediate-size", str(int(moe["shared_experts"]) * ffn)]
    dense = int(moe.get("first_k_dense") or 0)
    if dense:
        rest = int(moe["layers"]) - dense
        args += ["--moe-layer-freq", f"([0]*{dense}+[1]*{rest})" if rest else f"[0]*{dense}"]
    args += ["--expert-model-parallel-size", str(par.ep)]
    if par.etp is not None:
        args += ["--expert-tensor-parallel-size", str(par.etp)]
    args += ["--moe-token-dispatcher-type", settings.moe_dispatcher]
    if settings.moe_grouped_gemm:
        args.append("--moe-grouped-gemm")
    if settings.moe_force_balance:
        args.append("--moe-router-force-load-balancing")
    if settings.moe_a2a_overlap:
        args.append("--overlap-moe-expert-parallel-comm")
    if settings.moe_capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", repr(float(settings.moe_capacity_factor))]
    recorded = (plan.meta.get("imported_from") or {}).get("execution") or {}
    if recorded.get("moe_load_balancing"):
        args += ["--moe-router-load-balancing-type",
                 *str(recorded["moe_load_balancing"]).split(",")]
    return args


def megatron_layout(par: ParallelConfig) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` of the plan's virtual stages: the
    embedding (``E``) on the first, the loss (``L``) on the last, each stage's blocks as
    ``t``; runs of equal stages as ``(...|)*n``. O(stages).

    Examples
    --------
    >>> megatron_layout(ParallelConfig(pp=2, vp=2, stage_layers=(1, 2, 2, 0)))
    'Et|(tt|)*2L'
    >>> megatron_layout(ParallelConfig(pp=2, stage_layers=(3, 5)))
    'Et*3|t*5L'
    """
    counts = par.stage_layers or par.layers_per_stage(0)
    bodies = []
    for j, n in enumerate(counts):
        body = f"t*{n}" if n > 2 else "t" * n
        bodies.append(("E" if j == 0 else "") + body + ("L" if j == len(counts) - 1 else ""))
    pieces, j = [], 0
    while j < len(bodies):
        k = j
        while k + 1 < len(bodies) and bodies[k + 1] == bodies[j]:
            k += 1
        run = k - j + 1
        pieces.append(f"({bodies[j]}|)*{run}" if run > 1 else bodies[j] + "|")
        j = k + 1
    return "".join(pieces)[:-1]


def torchtitan_experts(plan: Plan, graph: Graph, settings: ExecutionSettings, *,
                       legacy: bool) -> tuple[dict[str, Any], list[str]]:
    """torchtitan's expert options of the plan (``parallelism`` keys) and the notes; none
    for a dense model (module docstring).

    Raises
    ------
    ShardplanError
        An expert grid torchtitan does not build (the expert tensor-parallel degree under
        EP in 0.3.0, other than 1 or TP in 0.2, not TP without EP; EP not inside the
        ranks it borrows), or token dropping.
    """
    moe = moe_of(plan, graph)
    par = plan.parallel
    if moe is None or par is None:
        return {}, []
    version = "0.2" if legacy else "0.3.0"
    ep, etp = par.ep, par.expert_tp
    if ep == 1 and etp != par.tp:
        raise ShardplanError(f"torchtitan splits the experts over the TP ranks without expert "
                             f"parallelism: the plan's ETP {etp} with TP {par.tp} cannot be "
                             f"written")
    if ep > 1 and etp != 1 and (not legacy or etp != par.tp):
        raise ShardplanError(f"torchtitan {version} splits the experts by tensor parallelism "
                             f"under EP {'only with ETP = TP or 1' if legacy else 'never'}: "
                             f"the plan's ETP {etp} with EP {ep} cannot be written"
                             + ("" if legacy else " (torchtitan 0.2 can with ETP = TP)"))
    borrowed = par.dp_shard * par.cp * (par.tp if etp == 1 else 1)
    inner = par.cp * (par.tp if etp == 1 else 1) if legacy else 1
    if ep > 1 and (borrowed % ep or ep % inner):
        what = "dp_shard x cp" + (" x tp" if etp == 1 else "")
        raise ShardplanError(f"torchtitan {version} builds expert parallelism inside "
                             f"{what} = {borrowed}"
                             + (f" and over all of cp{' x tp' if etp == 1 else ''} = {inner}"
                                if legacy else "")
                             + f": the plan's EP {ep} ({par.label()}) cannot be written")
    if settings.moe_capacity_factor is not None:
        raise ShardplanError(f"torchtitan's experts drop no token: the plan's capacity factor "
                             f"{settings.moe_capacity_factor:g} cannot be written")
    notes = []
    if settings.moe_dispatcher != "alltoall":
        notes.append(f"torchtitan dispatches tokens to their experts by all-to-all: the "
                     f"plan's {settings.moe_dispatcher} is written as all-to-all")
    if not settings.moe_grouped_gemm:
        notes.append("torchtitan runs the experts as grouped GEMMs: the plan's per-expert "
                     "GEMMs are written as grouped ones")
    out: dict[str, Any] = {"expert_parallel_degree": ep}
    if legacy:
        out["expert_tensor_parallel_degree"] = etp
    return out, notes
