"""The device-mapping problem of Parmesan section 5, priced by the one stage-time model.

A :class:`MappingProblem` holds everything the search needs as arrays, computed once from the
three files and the plan's execution settings by :func:`build_problem`, from the same
quantities :func:`shardplan.cost.stage_times` uses: the compute of every stage replica on
every device, the bytes and tensors between stages, the stages' parameter bytes, the
topology's latency and inverse bandwidth, and which devices have the memory a stage needs. A
mapping is an int array ``devices`` of shape (S, R): ``devices[s, r]`` is the device of
replica r of stage s (G' of section 5 is R copies of the stage graph; replica r of stage s
talks to replica r of the neighbouring stages).

Stage times, shape (S, R), are the views of :mod:`shardplan.cost._pipeline` (the *model*):

- ``p2p`` (equation 6)::

      t(s_r) = C[s, p(s_r)] + sum over adjacent s' of
               T[s, s'] (lat[x, y] + lat[y, x]) + M[s, s'] (1/B[x, y] + 1/B[y, x])

  with ``x = p(s_r)``, ``y = p(s'_r)``: a replica is charged everything it sends and
  receives in both passes (activations forward, gradients backward) -- equation 3's stage
  time at this placement, so a partition's ``eq3`` value and its mapping's ``p2p`` value
  are one function;
- ``overlap`` (the simulator's model)::

      t(s_r) = max(C[s, x], sum over adjacent s' of T[s, s'] lat[x, y] + M[s, s'] / B[x, y])
               + AR(s) / (M + P - 1)

  what the replica sends (it computes meanwhile) and its stage's all-reduce spread over the
  iteration's pipeline steps;
- ``allreduce`` (equation 7): ``t(s_r) = C[s, p(s_r)] + AR(s)``,
  ``AR(s) = max over ring links (x, y) of 2 (R - 1) (lat[x, y] + P(s) / (R B[x, y]))``.

Link contention (``contention``, the default on topologies with physical ``links``: meshes,
tori and any topology file that lists its links): the transfers of ``p2p`` and ``overlap``
are priced as :mod:`shardplan.cost._pipeline` prices them with contention. The transfer of
replica r from stage s (device x) to an adjacent stage s' (device y) carries ``M[s, s']``
bytes (activations forward and the gradients of what s' sent s); all transfers of all
replicas stream at once, and a transfer's bandwidth term becomes ``max over the links l of
its route of (M[s, s'] + bytes of the other devices' transfers over l) / bandwidth(l)``
(a device's own transfers go one after another and do not slow each other). The *extra*
seconds over the uncontended term are added to the sender (and under ``p2p`` also to the
receiver, which pays for what it receives). Loads only grow as replicas are placed, so the
search's partial times stay lower bounds. ``allreduce`` charges no transfers: contention
changes nothing there and is off. The objective name then ends in ``_contention``.

``C[s, d]`` is the replica's share (1/R) of the stage's forward + backward seconds on device
d, plus what does not shrink with the share and the gradient accumulation
(:attr:`~shardplan.cost.CostModel.replica_fixed`,
:attr:`~shardplan.cost.CostModel.accumulation_seconds`, as ``stage_times``),
``M[s, s']`` the bytes per replica of the tensors between the two stages (each tensor
once per receiving stage, both directions), ``T`` their count, ``P(s)`` the stage's parameter
bytes, the ring the replicas in order ``s_0 .. s_R-1, s_0``. A replica on a device without
the memory its stage needs takes ``inf``. Decisions where the paper is silent: equation 6
prints no latency term (we charge one per tensor, as the simulator sends them), and neither
6 nor 7 divides compute by R (we do, as equation 3 does: replicas split the micro-batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.cost import (
    CostModel,
    inverse_bandwidth,
    message_seconds,
    pipeline_factor,
    ring_allreduce_seconds,
    stage_traffic,
)
from shardplan.cost._contention import LinkTable, link_contention, link_table, route_links
from shardplan.cost._memory import in_flight_microbatches
from shardplan.cost._pipeline import objective_name as _view_objective_name
from shardplan.cost._pipeline import pipeline_positions
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.mapping._symmetry import grid_automorphisms

__all__ = ["MODELS", "MappingProblem", "allreduce_times", "build_problem", "choose_model",
           "contention_extra", "cost_settings", "memory_note", "objective_name", "p2p_times",
           "permute_devices", "resolve_contention", "routes_preserved", "stage_times"]

MODELS = ("overlap", "p2p", "allreduce")


@dataclass(frozen=True, eq=False)
class MappingProblem:
    """The arrays of one mapping problem (trusted, read-only by convention).

    Attributes
    ----------
    compute : ndarray, shape (S, D)
        A replica's forward + backward seconds for stage s on device d (its 1/R share, and
        the parts that do not shrink with it: module docstring).
    stage_bytes : ndarray, shape (S, S)
        Symmetric: bytes per replica of the tensors between stages s and s' (either
        direction).
    tensors : ndarray, shape (S, S)
        Symmetric: how many tensors those are (one latency each).
    adjacent : ndarray of bool, shape (S, S)
        Symmetric, False on the diagonal: at least one graph edge joins the stages.
    param_bytes : ndarray, shape (S,)
    num_replicas : int
        R.
    latency, inv_bandwidth : ndarray, shape (D, D)
        Seconds, and seconds per byte (``inf`` where no route, 0 on the diagonal).
    device_flops : ndarray, shape (D,)
    fits : ndarray of bool, shape (S, D)
        Whether device d has the memory a replica of stage s needs.
    view : {"overlap", "p2p", "allreduce"}
        The stage-time model the pair costs below are built for.
    pair_latency, pair_inv_bandwidth : ndarray, shape (D, D)
        What one tensor and one byte between two stages cost a replica on x talking to one
        on y: round trips ``lat + lat.T``, ``1/B + 1/B.T`` under ``p2p`` (both directions,
        both passes), the sends ``lat``, ``1/B`` under ``overlap``.
    ar_weight : float
        Weight of the all-reduce in a stage's time: 0 (``p2p``), ``1 / (M + P - 1)``
        (``overlap``), 1 (``allreduce``).
    automorphisms : ndarray, shape (G, D), or None
        Device permutations that preserve every stage time (a grid's translations and
        reflections, :func:`~shardplan.mapping._symmetry.grid_automorphisms`), row 0 the
        identity; None when none are known. With contention they also preserve every route.
    contention : bool
        Whether transfers share links (module docstring); then ``links`` is set.
    links : LinkTable or None
        The topology's links and routes, in the topology's device ids.
    device_ids : ndarray of int64, shape (D,), or None
        The topology's id of every device of the problem (devices may be relabelled,
        :func:`permute_devices`); None: the same ids.
    route_table : ndarray of int32, shape (D0, D0, H), or None
        Link ids of every route in the topology's ids, -1 padded, when small enough to
        hold (else routes are walked when needed).
    """

    compute: np.ndarray
    stage_bytes: np.ndarray
    tensors: np.ndarray
    adjacent: np.ndarray
    param_bytes: np.ndarray
    num_replicas: int
    latency: np.ndarray
    inv_bandwidth: np.ndarray
    device_flops: np.ndarray
    fits: np.ndarray
    view: str
    pair_latency: np.ndarray
    pair_inv_bandwidth: np.ndarray
    ar_weight: float
    automorphisms: np.ndarray | None = None
    contention: bool = False
    links: LinkTable | None = None
    device_ids: np.ndarray | None = None
    route_table: np.ndarray | None = None

    @property
    def num_stages(self) -> int:
        return int(self.compute.shape[0])

    def topology_ids(self, devices: Any) -> np.ndarray:
        """The topology's ids of the problem's devices ``devices``."""
        d = np.asarray(devices, dtype=np.int64)
        return d if self.device_ids is None else self.device_ids[d]

    def paths(self, src: Any, dst: Any) -> np.ndarray:
        """Link ids of the routes ``src[k] -> dst[k]`` (problem device ids, any equal
        shapes), shape (..., H), -1 padded. O(size H)."""
        assert self.links is not None
        x, y = self.topology_ids(src), self.topology_ids(dst)
        if self.route_table is not None:
            return self.route_table[x, y].astype(np.int64)
        return route_links(self.links, x.reshape(-1), y.reshape(-1)).reshape(
            *x.shape, self.links.max_hops)

    @property
    def transfer_stages(self) -> tuple[np.ndarray, np.ndarray]:
        """The ordered stage pairs (s, t) whose replicas send each other bytes: ``(s, t)``
        arrays, both directions of every pair (``stage_bytes`` is symmetric)."""
        s, t = np.nonzero(self.stage_bytes > 0)
        return s.astype(np.int64), t.astype(np.int64)

    @property
    def num_devices(self) -> int:
        return int(self.compute.shape[1])

    @property
    def allreduce_factor(self) -> np.ndarray:
        """``2 (R - 1) P(s) / R`` of every stage, shape (S,): a ring link's seconds per unit
        of inverse bandwidth."""
        r = self.num_replicas
        return 2.0 * (r - 1) * self.param_bytes / r

    @property
    def allreduce_latency_factor(self) -> np.ndarray:
        """``2 (R - 1)`` for every stage with gradients to reduce, else 0, shape (S,): a
        ring link's seconds per second of latency."""
        r = self.num_replicas
        return np.where((r > 1) & (self.param_bytes > 0), 2.0 * (r - 1), 0.0)

    def ring_cost(self, s: int, src: Any, dst: Any) -> Any:
        """All-reduce seconds of stage s if its slowest ring link is ``src -> dst``
        (broadcasts over device arrays). O(size)."""
        return ring_allreduce_seconds(self.num_replicas, self.param_bytes[s],
                                      self.latency[src, dst], self.inv_bandwidth[src, dst])

    def combine(self, compute: Any, comm: Any) -> Any:
        """A replica's time from its compute and its (summed) communication, without the
        all-reduce: ``compute + comm``, or ``max`` under ``overlap``."""
        if self.view == "overlap":
            return np.maximum(compute, comm)
        if self.view == "allreduce":
            return compute + 0.0 * comm
        return compute + comm

    def pair_cost(self, s: int, t: int) -> np.ndarray:
        """What stage s's replica on device x pays to talk to stage t's on y, shape (D, D):
        ``T[s, t] pair_latency + M[s, t] pair_inv_bandwidth`` (inf on the diagonal: one
        device per replica; 0 under ``allreduce``). O(D^2)."""
        if self.view == "allreduce":
            c = np.zeros_like(self.latency)
        else:  # nothing to send is free, even without a route
            c = message_seconds(self.tensors[s, t], self.pair_latency, self.stage_bytes[s, t],
                                self.pair_inv_bandwidth)
            c = np.where(np.isnan(c), np.inf, c)
        c = np.array(c, dtype=np.float64)
        np.fill_diagonal(c, np.inf)
        return c


def _resolve_view(model: str, settings: ExecutionSettings) -> str:
    if model == "auto":
        return "overlap" if settings.overlap else "p2p"
    if model not in MODELS:
        raise ShardplanError(f"model must be one of {', '.join(MODELS)} or auto, got "
                             f"{model!r}")
    return model


#: Largest route table (device pairs x hops) held in memory; beyond it routes are walked.
ROUTE_TABLE_ENTRIES = 1 << 23


def resolve_contention(contention: Any, view: str, topology: Topology) -> bool:
    """The contention option (``auto``, True or False) for ``view`` on ``topology``: on when
    the topology has physical links and the view charges transfers (not ``allreduce``),
    unless False. Raises :class:`ShardplanError` for any other value."""
    if not isinstance(contention, bool) and not (isinstance(contention, str)
                                                  and contention == "auto"):
        raise ShardplanError(f"contention must be auto, true or false, got {contention!r}")
    return contention is not False and view != "allreduce" and bool(topology.links)


def build_problem(plan: Plan, graph: Graph, topology: Topology, *,
                  settings: ExecutionSettings | None = None, model: str = "auto",
                  automorphisms: bool = False, contention: Any = "auto") -> MappingProblem:
    """The mapping problem of ``plan``'s stages on ``topology`` under ``settings`` (default:
    the plan's) and ``model`` (``auto``: ``overlap``, or ``p2p`` when the settings turn
    overlap off); with ``automorphisms``, also the topology's known automorphism group (for
    the search's symmetry breaking); ``contention`` (``auto``, True, False:
    :func:`resolve_contention`) prices link sharing (module docstring).

    Raises :class:`ShardplanError` when the stages have different replica counts or when
    there are fewer devices than replicas. O(n + m log m + S D + D^2).
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
    settings = (plan.settings if settings is None else settings).resolve(graph)
    view = _resolve_view(model, settings)
    cm = CostModel.from_settings(graph, topology, settings)
    g = cm.graph
    a = plan.assignment(graph.num_nodes)
    extra = np.bincount(a, weights=cm.replica_extra_seconds(r), minlength=s_count)
    compute = cm.compute_matrix(a, s_count) / r + extra[:, None]
    b, t = stage_traffic(g, a, s_count)
    adj = graph.stage_adjacency(a, s_count)
    params = np.bincount(a, weights=g.param_bytes.astype(np.float64), minlength=s_count)
    lat = np.array(topology.latency, dtype=np.float64)
    np.fill_diagonal(lat, 0.0)
    inv = inverse_bandwidth(topology)
    flops = np.asarray(topology.device_flops, dtype=np.float64)
    # memory of every stage per device (placement-independent), against every device
    order = pipeline_positions(graph, a, s_count)
    flight = np.zeros(s_count)
    flight[list(order)] = in_flight_microbatches(s_count, settings.microbatches,
                                                 settings.schedule,
                                                 virtual_stages=settings.virtual_stages)
    mem = cm.memory_breakdown(a, s_count, in_flight=flight, replicas=r)["total"]
    fits = mem[:, None] <= topology.device_memory[None, :]
    if view == "p2p":
        pair_lat, pair_inv = lat + lat.T, inv + inv.T
    else:
        pair_lat, pair_inv = lat, inv
    ranks = -(-s_count // settings.stages_per_rank)
    weight = {"p2p": 0.0, "allreduce": 1.0,
              "overlap": 1.0 / pipeline_factor(settings.microbatches, ranks)}[view]
    contended = resolve_contention(contention, view, topology)
    links = link_table(topology) if contended else None
    table = None
    if links is not None and topology.num_devices ** 2 * links.max_hops <= ROUTE_TABLE_ENTRIES:
        ids = np.arange(topology.num_devices)
        table = route_links(links, np.repeat(ids, ids.size), np.tile(ids, ids.size)).reshape(
            ids.size, ids.size, links.max_hops).astype(np.int32)
    group = None
    if automorphisms:
        group = grid_automorphisms(topology.meta, lat, inv, flops,
                                   routes=None if links is None else
                                   (lambda g: routes_preserved(links, g)))
    return MappingProblem(
        compute=compute, stage_bytes=(b + b.T) / r, tensors=t + t.T, adjacent=adj | adj.T,
        param_bytes=params, num_replicas=int(r), latency=lat, inv_bandwidth=inv,
        device_flops=flops, fits=fits, view=view, pair_latency=pair_lat,
        pair_inv_bandwidth=pair_inv, ar_weight=weight, automorphisms=group,
        contention=contended, links=links, route_table=table)


def routes_preserved(links: LinkTable, g: np.ndarray) -> bool:
    """Whether the device permutation ``g`` (device i goes to ``g[i]``) maps every route to
    the route of the mapped pair, link by link, onto links of the same bandwidth: then it
    preserves the contended times too. O(D^2 H)."""
    n = g.size
    src, dst = links.keys // n, links.keys % n
    mapped = g[src] * n + g[dst]
    pos = np.searchsorted(links.keys, mapped)
    pos = np.minimum(pos, links.keys.size - 1)
    if not np.array_equal(links.keys[pos], mapped) or \
            not np.array_equal(links.inv_bandwidth[pos], links.inv_bandwidth):
        return False
    ids = np.arange(n)
    for i in range(n):  # row by row: O(D H) memory
        a = route_links(links, np.full(n, i), ids)
        b = route_links(links, np.full(n, g[i]), g)
        if not np.array_equal(np.where(a >= 0, pos[np.maximum(a, 0)], -1), b):
            return False
    return True


def permute_devices(problem: MappingProblem, perm: np.ndarray) -> MappingProblem:
    """The same problem with device ``i`` renamed from ``perm[i]``. O(D^2 + G D)."""
    perm = np.asarray(perm, dtype=np.int64)
    group = problem.automorphisms
    if group is not None:
        inv = np.argsort(perm)
        group = inv[group[:, perm]]
    ix = np.ix_(perm, perm)
    ids = perm if problem.device_ids is None else problem.device_ids[perm]
    return MappingProblem(
        compute=problem.compute[:, perm], stage_bytes=problem.stage_bytes,
        tensors=problem.tensors, adjacent=problem.adjacent, param_bytes=problem.param_bytes,
        num_replicas=problem.num_replicas, latency=problem.latency[ix],
        inv_bandwidth=problem.inv_bandwidth[ix], device_flops=problem.device_flops[perm],
        fits=problem.fits[:, perm], view=problem.view,
        pair_latency=problem.pair_latency[ix], pair_inv_bandwidth=problem.pair_inv_bandwidth[ix],
        ar_weight=problem.ar_weight, automorphisms=group, contention=problem.contention,
        links=problem.links, device_ids=ids if problem.contention else None,
        route_table=problem.route_table)


def choose_model(problem: MappingProblem) -> str:
    """The model the problem was built for (``auto`` is resolved by :func:`build_problem`)."""
    return problem.view


def objective_name(model: str, contention: bool = False) -> str:
    """The objective name of a mapping under ``model``, with or without contention."""
    return _view_objective_name(model, contention)


def _check(problem: MappingProblem, devices: Any) -> np.ndarray:
    dev = np.asarray(devices, dtype=np.int64)
    if dev.shape[-2:] != (problem.num_stages, problem.num_replicas):
        raise ShardplanError(f"a mapping must have shape ({problem.num_stages}, "
                             f"{problem.num_replicas}), got {dev.shape}")
    return dev


def _allreduce(problem: MappingProblem, dev: np.ndarray) -> np.ndarray:
    """Every stage's all-reduce seconds on its ring, shape (..., S)."""
    if problem.num_replicas == 1:
        return np.zeros(dev.shape[:-1])
    nxt = np.roll(dev, -1, axis=-1)
    links = ring_allreduce_seconds(problem.num_replicas, problem.param_bytes[:, None],
                                   problem.latency[dev, nxt], problem.inv_bandwidth[dev, nxt])
    return links.max(axis=-1)


def p2p_times(problem: MappingProblem, devices: Any) -> np.ndarray:
    """The problem's stage time of every replica of every stage, shape (S, R), for its
    ``p2p`` or ``overlap`` view (module docstring).

    ``devices`` may carry leading batch dimensions (..., S, R): a batch of mappings is
    evaluated in one vectorised pass. O(B S^2 R)."""
    dev = _check(problem, devices)
    s_idx = np.arange(problem.num_stages)[:, None]
    comp = problem.compute[s_idx, dev]
    a, b = dev[..., :, None, :], dev[..., None, :, :]  # (.., S, 1, R), (.., 1, S, R)
    cost = message_seconds(problem.tensors[:, :, None], problem.pair_latency[a, b],
                           problem.stage_bytes[:, :, None], problem.pair_inv_bandwidth[a, b])
    cost = np.where(np.isnan(cost), np.inf, cost)
    comm = cost.sum(axis=-2)
    if problem.contention:
        comm = comm + contention_extra(problem, dev)
    t = problem.combine(comp, comm)
    if problem.ar_weight:
        t = t + problem.ar_weight * _allreduce(problem, dev)[..., None]
    return np.where(problem.fits[s_idx, dev], t, np.inf)


def contention_extra(problem: MappingProblem, devices: Any, *,
                     max_entries: int = 1 << 20) -> np.ndarray:
    """The seconds link contention adds to every replica's communication, shape (..., S, R)
    like ``devices`` (module docstring): for each transfer, its contended bandwidth seconds
    (:func:`~shardplan.cost._pipeline.link_contention`) less ``bytes / bottleneck
    bandwidth``, charged to the sender (and the receiver under ``p2p``). Mappings of a batch
    are independent; they are evaluated in chunks of about ``max_entries`` route links.
    O(B K H log(K H)) for K transfers of H hops."""
    dev = np.asarray(devices, dtype=np.int64)
    lead = dev.shape[:-2]
    s_count, r_count = problem.num_stages, problem.num_replicas
    flat = dev.reshape(-1, s_count, r_count)
    out = np.zeros(flat.shape)
    ts, tt = problem.transfer_stages
    if ts.size == 0 or not problem.contention:
        return out.reshape(dev.shape)
    assert problem.links is not None  # contention is on only with a link table
    nbytes = np.repeat(problem.stage_bytes[ts, tt], r_count)  # (K,) transfer-major
    ks, kt = np.repeat(ts, r_count), np.repeat(tt, r_count)
    kr = np.tile(np.arange(r_count), ts.size)
    hops = max(problem.links.max_hops, 1)
    per = max(1, max_entries // (nbytes.size * hops))
    for lo in range(0, flat.shape[0], per):
        part = flat[lo:lo + per]
        b = part.shape[0]
        x, y = part[:, ks, kr], part[:, kt, kr]  # (b, K)
        paths = problem.paths(x, y).reshape(b * nbytes.size, -1)
        w = np.tile(nbytes, b)
        tau = link_contention(paths, problem.links.inv_bandwidth,
                              problem.topology_ids(x).reshape(-1), w,
                              group=np.repeat(np.arange(b), nbytes.size))
        with np.errstate(invalid="ignore"):
            base = w * problem.inv_bandwidth[x, y].reshape(-1)
            extra = np.maximum(tau - base, 0.0)
        extra = np.where(np.isfinite(base), extra, 0.0).reshape(b, -1)
        rows = np.repeat(np.arange(b), nbytes.size).reshape(b, -1)
        acc = out[lo:lo + b]
        np.add.at(acc, (rows, np.broadcast_to(ks, (b, ks.size)),
                        np.broadcast_to(kr, (b, kr.size))), extra)
        if problem.view == "p2p":
            np.add.at(acc, (rows, np.broadcast_to(kt, (b, kt.size)),
                            np.broadcast_to(kr, (b, kr.size))), extra)
    return out.reshape(*lead, s_count, r_count)


def allreduce_times(problem: MappingProblem, devices: Any) -> np.ndarray:
    """Equation 7 for every replica of every stage, shape (S, R) (or (..., S, R) for a
    batch). O(B S R)."""
    dev = _check(problem, devices)
    s_idx = np.arange(problem.num_stages)[:, None]
    comp = problem.compute[s_idx, dev]
    t = comp + _allreduce(problem, dev)[..., None]
    return np.where(problem.fits[s_idx, dev], t, np.inf)


def stage_times(problem: MappingProblem, devices: Any, model: str | None = None
                ) -> np.ndarray:
    """The problem's stage times (its own view; ``model``, when given, must be it)."""
    view = problem.view if model is None else model
    if view != problem.view:
        raise ShardplanError(f"the problem was built for {problem.view!r}, not {view!r}")
    if view == "allreduce":
        return allreduce_times(problem, devices)
    return p2p_times(problem, devices)


def cost_settings(plan: Plan, options: Mapping[str, Any]) -> ExecutionSettings:
    """The plan's execution settings with the execution-setting keys among ``options``."""
    keys = set(ExecutionSettings.__dataclass_fields__) | {"global_batch"}
    settings, _ = plan.settings.override(**{k: v for k, v in options.items() if k in keys})
    return settings


def memory_note(problem: MappingProblem) -> str | None:
    """Why no device fits some stage, if so (one line)."""
    bad = np.flatnonzero(problem.fits.sum(axis=1) < problem.num_replicas)
    if not bad.size:
        return None
    return (f"stage {int(bad[0])} fits on {int(problem.fits[bad[0]].sum())} devices, it needs "
            f"{problem.num_replicas}")

