"""PipeDream's stage time and the ``pipedream`` objective (what ``--algorithm pipedream``
optimises, recomputable by ``shardplan cost PLAN GRAPH TOPO --objective pipedream``).

PipeDream (Narayanan et al., SOSP 2019, section 3.1) prices a stage of layers with total
forward + backward time ``T``, parameter bytes ``P``, replicated on ``r`` workers joined by
bandwidth ``B`` (bytes/s), as its optimizer code (``optimizer_graph_hierarchical.py``) does:

    t(stage) = (T + 4 (r - 1) P / (B r)) / r

compute plus weight synchronisation, *summed* (the paper writes their maximum), divided by
the replicas. A stage that is not the first of its part also pays the activations it receives
and sends, ``2 X / (B r c)`` each (forward and backward, over the stage's r links, ``c`` the
activation compression ratio), as a maximum with the above: the code adds these terms only
with ``--activation_compression_ratio``; here they are on by default (``transfers``) with
``c = 1``, which is the paper's equation (its ``2 C_i``). ``X`` is the bytes of the tensors that
cross the cut: the outputs of the nodes before the cut that have a consumer after it, each
tensor once. (PipeDream's code sums the outputs of the cut's *augmented antichain*, which
also counts the nodes with two consumers both before the cut; we count what actually moves.)
The pipeline's value is the largest stage time.

Two levels (PipeDream's hierarchical optimizer, e.g. GPUs in servers): ``n1`` workers per
group at bandwidth ``B1``, groups joined at ``B2``. The plan is a sequence of *ranges*, each
run on ``g`` whole groups; inside a range, every group runs the same pipeline of stages with
``rho`` workers each (``sum rho = n1``). The range's inner value ``C`` is its largest stage time
at level 1 (``B1``, replicas ``rho``), and the range costs

    t(range) = (C + 4 (g - 1) P_range / (B2 g) / w) / g    (max its transfers at B2, per g)

with ``w = n1`` for the first range and 1 for the others: PipeDream's code divides the
synchronisation by the group size in the first (its DP's initial) term only; we keep that, so
values agree with its optimizer. A stage's plan replica count is ``rho * g``.

O(n + m + k) per evaluation for k stages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.cost import CostModel
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.objectives import Evaluation, objective
from shardplan.partition._pipeline_common import tensor_bytes

__all__ = ["OBJECTIVE", "PipeDreamConfig", "evaluate_stages", "node_work", "pipedream_cost",
           "prefix_cut_bytes", "stage_seconds"]

OBJECTIVE = "pipedream_seconds"


@dataclass(frozen=True)
class PipeDreamConfig:
    """The resolved model of a PipeDream plan, as its ``options`` record it.

    Attributes
    ----------
    levels : tuple of (int, float)
        ``(workers, bandwidth)`` per level, innermost first: one level ``((D, B),)`` or two
        ``((n1, B1), (n2, B2))`` with ``n1 * n2`` devices.
    transfers : bool
        Whether stages pay the activations they receive and send.
    compression : float
        Activation compression ratio ``c`` (>= 1 shrinks transfers).
    """

    levels: tuple[tuple[int, float], ...]
    transfers: bool = True
    compression: float = 1.0

    def to_options(self) -> dict[str, Any]:
        return {"levels": len(self.levels), "devices": int(np.prod([n for n, _ in self.levels])),
                "group_size": int(self.levels[0][0]) if len(self.levels) == 2 else None,
                "bandwidths": [float(b) for _, b in self.levels],
                "transfers": bool(self.transfers), "compression": float(self.compression)}

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> PipeDreamConfig:
        """Read the config a plan recorded (see :meth:`to_options`)."""
        try:
            nlev = int(options["levels"])
            bws = [float(b) for b in options["bandwidths"]]
            devices = int(options["devices"])
            if nlev == 1:
                levels: tuple[tuple[int, float], ...] = ((devices, bws[0]),)
            elif nlev == 2:
                n1 = int(options["group_size"])
                levels = ((n1, bws[0]), (devices // n1, bws[1]))
            else:
                raise ValueError(nlev)
        except (KeyError, TypeError, ValueError, IndexError):
            raise ShardplanError("the plan does not record PipeDream's levels, bandwidths and "
                                 "devices (make it with --algorithm pipedream)") from None
        return cls(levels, bool(options.get("transfers", True)),
                   float(options.get("compression", 1.0)))


def stage_seconds(work: Any, params: Any, x_in: Any, x_out: Any, replicas: Any,
                  bandwidth: float, *, transfers: bool, compression: float,
                  within: float = 1.0, first: Any = False) -> np.ndarray:
    """PipeDream's time of stages (arrays broadcast together); see the module docstring.

    ``first`` marks stages that start their part (no transfer term); ``within`` divides the
    synchronisation (the group size in a two-level plan's first range).
    """
    w = np.asarray(work, dtype=np.float64)
    p = np.asarray(params, dtype=np.float64)
    r = np.asarray(replicas, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sync = np.where(r > 1, 4.0 * (r - 1.0) * p / (bandwidth * r) / within, 0.0)
        t = (w + sync) / r
        if transfers:
            move = 2.0 * np.maximum(np.asarray(x_in, dtype=np.float64),
                                    np.asarray(x_out, dtype=np.float64)) \
                / (bandwidth * r * compression)
            move = np.where(move > 0, move, 0.0)  # 0 bytes cost 0, even on a missing link
            t = np.where(np.asarray(first, dtype=bool), t, np.maximum(t, move))
    return np.asarray(t, dtype=np.float64)


def node_work(graph: Graph, topology: Topology, settings: ExecutionSettings
              ) -> tuple[np.ndarray, Graph]:
    """Forward + backward seconds of every node on the topology's fastest device with the
    plan's execution settings (the shared cost model: measured times where the graph has
    them, else FLOPs at the settings' efficiency, at their micro-batch size), and the graph
    at that micro-batch size (whose bytes the transfers use). O(n + m)."""
    model = CostModel.from_settings(graph, topology, settings)
    fwd, bwd = model.node_seconds(int(np.argmax(topology.device_flops)))
    return fwd + bwd, model.graph


def prefix_cut_bytes(graph: Graph, stage_of: np.ndarray, num_stages: int) -> np.ndarray:
    """Bytes leaving the union of stages ``0..s-1``, for s = 0..k (first and last are 0).

    Each tensor (a node's largest out-edge) counts once per cut it crosses: from its
    producer's stage to its last consumer's. O(n + m + k).
    """
    n = graph.num_nodes
    last = np.full(n, -1, dtype=np.int64)
    if graph.num_edges:
        np.maximum.at(last, graph.src, stage_of[graph.dst])
    tb = tensor_bytes(graph)
    has = last > stage_of
    diff = np.zeros(num_stages + 2)
    np.add.at(diff, stage_of[has] + 1, tb[has])
    np.add.at(diff, last[has] + 1, -tb[has])
    out = np.cumsum(diff)[:num_stages + 1]
    out[0] = 0.0
    return out


def evaluate_stages(work: np.ndarray, params: np.ndarray, cuts: np.ndarray,
                    replicas: Sequence[int], config: PipeDreamConfig,
                    ranges: Sequence[Sequence[int]] | None = None
                    ) -> tuple[float, dict[str, Any]]:
    """The pipeline value of k stages in order: per-stage ``work``/``params`` sums (k,),
    ``cuts`` (k + 1,) from :func:`prefix_cut_bytes`, plan replica counts; two-level plans
    also need ``ranges`` ``[(first stage, stop stage, groups), ...]``. O(k)."""
    k = len(work)
    reps = np.asarray(replicas, dtype=np.int64)
    x_in = cuts[:k]
    x_out = np.where(np.arange(k) == k - 1, 0.0, cuts[1:k + 1])
    kw: dict[str, Any] = {"transfers": config.transfers, "compression": config.compression}
    if len(config.levels) == 1:
        (_, bw), = config.levels
        t = stage_seconds(work, params, x_in, x_out, reps, bw, first=np.arange(k) == 0, **kw)
        return float(t.max()) if k else 0.0, {"stage_seconds": t.tolist()}
    (n1, b1), (n2, b2) = config.levels
    if not ranges:
        raise ShardplanError("a two-level PipeDream plan needs its 'pipedream_ranges'")
    inner = np.zeros(k)
    outer = []
    pos = 0
    for t_idx, rng in enumerate(ranges):
        a, b, g = (int(x) for x in rng)
        if a != pos or not a < b <= k or g < 1:
            raise ShardplanError(f"pipedream_ranges entry {list(rng)} does not continue the "
                                 f"stages at {pos}")
        rho = reps[a:b] / g
        if np.any(rho != np.round(rho)) or int(rho.sum()) != n1:
            raise ShardplanError(f"stages {a}..{b - 1} on {g} groups do not use {n1} workers "
                                 "per group")
        inner[a:b] = stage_seconds(work[a:b], params[a:b], x_in[a:b], x_out[a:b], rho, b1,
                                   first=np.arange(a, b) == a, **kw)
        c1 = float(inner[a:b].max())
        outer.append(float(stage_seconds(c1, params[a:b].sum(), cuts[a],
                                         0.0 if b == k else cuts[b], g, b2,
                                         within=float(n1) if t_idx == 0 else 1.0,
                                         first=t_idx == 0, **kw)))
        pos = b
    if pos != k or sum(int(r[2]) for r in ranges) != n2:
        raise ShardplanError(f"pipedream_ranges must cover the {k} stages on {n2} groups")
    return max(outer), {"stage_seconds": inner.tolist(), "range_seconds": outer}


def _stage_order(plan: Plan, graph: Graph) -> np.ndarray:
    """Stage id of every node; the stages, in plan order, must be a pipeline (every edge
    forward or within a stage), else PipeDream's transfers are undefined."""
    a = plan.assignment(graph.num_nodes)
    if graph.num_edges and np.any(a[graph.src] > a[graph.dst]):
        raise ShardplanError("the plan's stages are not in pipeline order (an edge goes from a "
                             "later stage to an earlier one)")
    return a


_SETTINGS = set(ExecutionSettings.__dataclass_fields__) | {"global_batch"}


def pipedream_cost(plan: Plan, graph: Graph, topology: Topology,
                   options: Mapping[str, Any] | None = None) -> Evaluation:
    """``pipedream_seconds`` of ``plan``: its recorded PipeDream config and cost-model
    settings (``options`` override them), its stages in order, their replica counts."""
    merged = dict(plan.options)
    merged.update(options or {})
    settings, _ = plan.settings.override(
        **{k: v for k, v in (options or {}).items() if k in _SETTINGS})
    config = PipeDreamConfig.from_options(merged)
    a = _stage_order(plan, graph)
    k = plan.num_stages
    node, scaled = node_work(graph, topology, settings.resolve(graph))
    work = np.bincount(a, weights=node, minlength=k)
    params = np.bincount(a, weights=graph.param_bytes.astype(np.float64), minlength=k)
    cuts = prefix_cut_bytes(scaled, a, k)
    reps = [len(st.devices) for st in plan.stages]
    if len(config.levels) == 1 and sum(reps) > config.levels[0][0]:
        raise ShardplanError(f"the plan uses {sum(reps)} devices, its PipeDream config "
                             f"{config.levels[0][0]}")
    value, details = evaluate_stages(work, params, cuts, reps, config,
                                     plan.meta.get("pipedream_ranges"))
    details = {**details, "replicas": reps, "config": config.to_options()}
    return OBJECTIVE, value, details


@objective("pipedream")
def _objective(plan: Plan, graph: Graph, topology: Topology, **options: Any) -> Evaluation:
    """PipeDream's pipeline value (see the module docstring)."""
    unknown = sorted(set(options) - _SETTINGS - {"transfers", "compression", "bandwidths"})
    if unknown:
        raise ShardplanError(f"the pipedream objective does not take option {unknown[0]!r}")
    value = pipedream_cost(plan, graph, topology, options)
    if not math.isfinite(value[1]) and value[1] != math.inf:
        raise ShardplanError("the pipedream objective is not a number for this plan")
    return value
