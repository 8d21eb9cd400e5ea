"""The device-mapping problem of Parmesan section 5 and its two stage-time models (eq. 6, 7).

A :class:`MappingProblem` holds everything the search needs as arrays, computed once from the
three files: the compute time of every stage on every device, the bytes between stages, the
stages' parameter bytes and the topology's latency and inverse bandwidth. A mapping is an
int array ``devices`` of shape (S, R): ``devices[s, r]`` is the device of replica r of stage
s (G' of section 5 is R copies of the stage graph; replica r of stage s talks to replica r of
the neighbouring stages).

Stage times, shape (S, R) (section 5.2):

- ``p2p`` (equation 6)::

      t(s_r) = C[s, p(s_r)] + sum over adjacent s' of
               latency[p(s_r), p(s'_r)] + M[s, s'] / bandwidth[p(s_r), p(s'_r)]

- ``allreduce`` (equation 7)::

      t(s_r) = C[s, p(s_r)] + max over ring pairs (s_i, s_i+1) of
               2 (R - 1) P(s) / (R bandwidth[p(s_i), p(s_i+1)])

``C[s, d]`` is the stage's forward + backward seconds on device d
(:meth:`shardplan.cost.CostModel.compute_matrix`, at the device's peak by default),
``M[s, s']`` the summed bytes of the graph edges between the two stages in either direction,
``P(s)`` the stage's parameter bytes; the ring is the replicas in order ``s_0 .. s_R-1, s_0``.

Decisions where the paper is silent: equation 6 prints no latency term; the issue asks for one
per adjacent stage (one message per stage pair), which we add. Two stages are adjacent when at
least one graph edge joins them (even one of 0 bytes: it still costs a latency). Neither
formula divides compute by R: each replica runs its own micro-batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.cost import CostModel, inverse_bandwidth
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan, Topology
from shardplan.mapping._symmetry import grid_automorphisms

__all__ = ["COST_OPTIONS", "MODELS", "MappingProblem", "allreduce_times", "build_problem",
           "choose_model", "cost_options", "objective_name", "p2p_times", "permute_devices",
           "stage_times"]

MODELS = ("p2p", "allreduce")
#: Cost-model options a mapping takes (and records, so ``shardplan cost`` can recompute).
COST_OPTIONS: dict[str, Any] = {"efficiency": 1.0, "recompute": False, "profile_flops": None}


@dataclass(frozen=True, eq=False)
class MappingProblem:
    """The arrays of one mapping problem (trusted, read-only by convention).

    Attributes
    ----------
    compute : ndarray, shape (S, D)
        Forward + backward seconds of stage s on device d.
    stage_bytes : ndarray, shape (S, S)
        Symmetric: bytes on graph edges between stages s and s' (either direction).
    adjacent : ndarray of bool, shape (S, S)
        Symmetric, False on the diagonal: at least one graph edge joins the stages.
    param_bytes : ndarray, shape (S,)
    num_replicas : int
        R.
    latency, inv_bandwidth : ndarray, shape (D, D)
        Seconds, and seconds per byte (``inf`` where no route, 0 on the diagonal).
    device_flops : ndarray, shape (D,)
    automorphisms : ndarray, shape (G, D), or None
        Device permutations that preserve every stage time (a grid's translations and
        reflections, :func:`~shardplan.mapping._symmetry.grid_automorphisms`), row 0 the
        identity; None when none are known.
    """

    compute: np.ndarray
    stage_bytes: np.ndarray
    adjacent: np.ndarray
    param_bytes: np.ndarray
    num_replicas: int
    latency: np.ndarray
    inv_bandwidth: np.ndarray
    device_flops: np.ndarray
    automorphisms: np.ndarray | None = None

    @property
    def num_stages(self) -> int:
        return int(self.compute.shape[0])

    @property
    def num_devices(self) -> int:
        return int(self.compute.shape[1])

    @property
    def allreduce_factor(self) -> np.ndarray:
        """``2 (R - 1) P(s) / R`` of every stage, shape (S,): seconds per (byte/s)^-1."""
        r = self.num_replicas
        return 2.0 * (r - 1) * self.param_bytes / r

    def pair_cost(self, s: int, t: int) -> np.ndarray:
        """p2p cost of stage s talking to stage t for every device pair, shape (D, D):
        ``latency + M[s, t] * inv_bandwidth`` (inf on the diagonal: one device per replica).
        O(D^2)."""
        with np.errstate(invalid="ignore"):
            c = self.latency + self.stage_bytes[s, t] * self.inv_bandwidth
        c = np.where(np.isnan(c), np.inf, c)
        np.fill_diagonal(c, np.inf)
        return c


def build_problem(plan: Plan, graph: Graph, topology: Topology, *,
                  efficiency: float = 1.0, recompute: bool = False,
                  profile_flops: float | None = None,
                  automorphisms: bool = False) -> MappingProblem:
    """The mapping problem of ``plan``'s stages on ``topology``; with ``automorphisms``, also
    the topology's known automorphism group (for the search's symmetry breaking).

    Raises :class:`ShardplanError` when the stages have different replica counts or when
    there are fewer devices than replicas. O(n + m + S D + D^2).
    """
    plan.validate(graph)
    counts = {len(st.devices) for st in plan.stages}
    if len(counts) != 1:
        raise ShardplanError("device mapping needs the same number of replicas in every stage,"
                             f" got {sorted(counts)}")
    s_count, r = plan.num_stages, counts.pop()
    if s_count * r > topology.num_devices:
        raise ShardplanError(f"{s_count} stages x {r} replicas need {s_count * r} devices, the "
                             f"topology has {topology.num_devices}")
    a = plan.assignment(graph.num_nodes)
    model = CostModel(graph, topology, efficiency=efficiency, recompute=bool(recompute),
                      profile_flops=profile_flops)
    compute = model.compute_matrix(a, s_count)
    m = graph.stage_graph(a, s_count)  # every edge's bytes, as equation 6 sums them
    # Stages joined by any edge, zero-byte ones too: they still pay the latency.
    adj = graph.stage_adjacency(a, s_count)
    params = np.bincount(a, weights=graph.param_bytes.astype(np.float64), minlength=s_count)
    lat = np.array(topology.latency, dtype=np.float64)
    inv = inverse_bandwidth(topology)
    flops = np.asarray(topology.device_flops, dtype=np.float64)
    group = grid_automorphisms(topology.meta, lat, inv, flops) if automorphisms else None
    return MappingProblem(
        compute=compute, stage_bytes=m + m.T, adjacent=adj | adj.T, param_bytes=params,
        num_replicas=int(r), latency=lat, inv_bandwidth=inv, device_flops=flops,
        automorphisms=group)


def permute_devices(problem: MappingProblem, perm: np.ndarray) -> MappingProblem:
    """The same problem with device ``i`` renamed from ``perm[i]``. O(D^2 + G D)."""
    perm = np.asarray(perm, dtype=np.int64)
    group = problem.automorphisms
    if group is not None:
        inv = np.argsort(perm)
        group = inv[group[:, perm]]
    return MappingProblem(
        compute=problem.compute[:, perm], stage_bytes=problem.stage_bytes,
        adjacent=problem.adjacent, param_bytes=problem.param_bytes,
        num_replicas=problem.num_replicas, latency=problem.latency[np.ix_(perm, perm)],
        inv_bandwidth=problem.inv_bandwidth[np.ix_(perm, perm)],
        device_flops=problem.device_flops[perm], automorphisms=group)


def choose_model(problem: MappingProblem) -> str:
    """Section 5.2's automatic choice: ``allreduce`` when the all-reduce bytes exceed the
    inter-stage bytes, else ``p2p``.

    The paper compares "the allreduce communication size and total inter-stage communication
    size" without defining either; we take ``sum_s P(s)`` (0 when R = 1: nothing to reduce)
    against the bytes of all edges cut between stages. O(S^2).
    """
    ar = float(problem.param_bytes.sum()) if problem.num_replicas > 1 else 0.0
    cut = float(np.triu(problem.stage_bytes, 1).sum())
    return "allreduce" if ar > cut else "p2p"


def objective_name(model: str) -> str:
    return f"max_stage_seconds_{model}"


def _check(problem: MappingProblem, devices: Any) -> np.ndarray:
    dev = np.asarray(devices, dtype=np.int64)
    if dev.shape[-2:] != (problem.num_stages, problem.num_replicas):
        raise ShardplanError(f"a mapping must have shape ({problem.num_stages}, "
                             f"{problem.num_replicas}), got {dev.shape}")
    return dev


def p2p_times(problem: MappingProblem, devices: Any) -> np.ndarray:
    """Equation 6 for every replica of every stage, shape (S, R).

    ``devices`` may carry leading batch dimensions (..., S, R): a batch of mappings is
    evaluated in one vectorised pass. O(B S^2 R)."""
    dev = _check(problem, devices)
    comp = problem.compute[np.arange(problem.num_stages)[:, None], dev]
    a, b = dev[..., :, None, :], dev[..., None, :, :]  # (.., S, 1, R), (.., 1, S, R)
    with np.errstate(invalid="ignore"):
        cost = problem.latency[a, b] + problem.stage_bytes[:, :, None] * \
            problem.inv_bandwidth[a, b]
    cost = np.where(problem.adjacent[:, :, None], cost, 0.0)
    cost = np.where(np.isnan(cost), np.inf, cost)
    return comp + cost.sum(axis=-2)


def allreduce_times(problem: MappingProblem, devices: Any) -> np.ndarray:
    """Equation 7 for every replica of every stage, shape (S, R) (or (..., S, R) for a
    batch). O(B S R)."""
    dev = _check(problem, devices)
    comp = problem.compute[np.arange(problem.num_stages)[:, None], dev]
    if problem.num_replicas == 1:
        return comp
    ib = problem.inv_bandwidth[dev, np.roll(dev, -1, axis=-1)]  # ring pairs (s_i, s_i+1)
    k = problem.allreduce_factor
    with np.errstate(invalid="ignore"):
        ar = np.where(k > 0, k * ib.max(axis=-1), 0.0)
    return comp + ar[..., None]


def stage_times(problem: MappingProblem, devices: Any, model: str) -> np.ndarray:
    """:func:`p2p_times` or :func:`allreduce_times` by ``model``."""
    if model == "p2p":
        return p2p_times(problem, devices)
    if model == "allreduce":
        return allreduce_times(problem, devices)
    raise ShardplanError(f"model must be p2p or allreduce, got {model!r}")


def cost_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The cost-model keywords among ``options`` (defaults filled in)."""
    return {k: options.get(k, v) for k, v in COST_OPTIONS.items()}
