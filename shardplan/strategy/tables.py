"""The search's whole input as tables: per node its configurations and cost vector, per edge its
cost matrix (``--export-tables`` / ``--import-tables``).

Any outside solver can read the JSON form and minimise exactly what PaSE minimises:
``sum_v node_cost[v][c_v] + sum_(u,v) edge_cost[(u,v)][c_u, c_v]`` (paper 004, equation 1).

JSON (``shardplan.pase-tables/1``)::

    {"format": "shardplan.pase-tables/1", "graph": "alexnet", "devices": 32,
     "cost_model": "pase", "objective": "pase_cost",
     "nodes": [{"id": 0, "name": "conv1", "dims": ["b", ...], "configs": [[1, 1, ...], ...],
                "cost": [...]}],
     "edges": [{"src": 0, "dst": 1, "cost": [[...], ...]}]}

Infinite costs (configurations ruled out by the memory limit) are written as ``null``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Topology
from shardplan.strategy.spaces import configurations, graph_spaces

__all__ = ["TABLES_FORMAT", "Tables", "build_tables", "execution_of", "graph_spaces",
           "make_cost_model", "priced_settings", "search_graph"]

TABLES_FORMAT = "shardplan.pase-tables/1"


@dataclass(frozen=True, eq=False)
class Tables:
    """Configurations and costs of one graph on ``devices`` devices.

    Attributes
    ----------
    names : tuple of str
    dims : tuple of tuple of str
        Per node, the dimension names its configurations list factors for.
    configs : tuple of ndarray
        Per node, ``(K_v, d_v)`` split factors.
    node_cost : tuple of ndarray
        Per node, ``(K_v,)`` layer cost of each configuration.
    edges : tuple of (int, int, ndarray)
        ``(u, v, M)`` with ``M[c_u, c_v]`` the edge's cost; at most one entry per pair.
    """

    graph: str
    devices: int
    cost_model: str
    objective: str
    names: tuple[str, ...]
    dims: tuple[tuple[str, ...], ...]
    configs: tuple[np.ndarray, ...]
    node_cost: tuple[np.ndarray, ...]
    edges: tuple[tuple[int, int, np.ndarray], ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    def evaluate(self, choice: Sequence[int] | np.ndarray) -> float:
        """Total cost of picking configuration ``choice[v]`` for every node. O(n + m)."""
        c = np.asarray(choice, dtype=np.int64)
        total = float(sum(float(self.node_cost[v][c[v]]) for v in range(self.num_nodes)))
        for u, v, m in self.edges:
            total += float(m[c[u], c[v]])
        return total

    def strategy(self, choice: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """The plan's ``strategy`` field: node id -> split factors."""
        return {str(v): tuple(int(x) for x in self.configs[v][int(choice[v])])
                for v in range(self.num_nodes)}

    def index_of(self, v: int, factors: Sequence[int]) -> int:
        """Row of ``factors`` among node ``v``'s configurations (ShardplanError if none)."""
        if len(factors) != self.configs[v].shape[1]:
            raise ShardplanError(f"node {v} ({self.names[v]!r}) needs {self.configs[v].shape[1]}"
                                 f" split factors (one per dimension of its space), got "
                                 f"{len(factors)}")
        want = np.asarray(factors, dtype=np.int64)
        hit = np.flatnonzero(np.all(self.configs[v] == want[None, :], axis=1))
        if not hit.size:
            raise ShardplanError(f"configuration {tuple(int(x) for x in want)} is not valid "
                                 f"for node {v} ({self.names[v]!r})")
        return int(hit[0])

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TABLES_FORMAT, "graph": self.graph, "devices": self.devices,
            "cost_model": self.cost_model, "objective": self.objective,
            "nodes": [{"id": v, "name": self.names[v], "dims": list(self.dims[v]),
                       "configs": self.configs[v].tolist(),
                       "cost": self.node_cost[v].tolist()} for v in range(self.num_nodes)],
            "edges": [{"src": u, "dst": v, "cost": m.tolist()} for u, v, m in self.edges],
            **dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tables:
        if not isinstance(data, Mapping) or data.get("format") != TABLES_FORMAT:
            raise InvalidFileError(f"expected format {TABLES_FORMAT!r}")
        try:
            nodes = sorted(data["nodes"], key=lambda nd: int(nd["id"]))
            if [int(nd["id"]) for nd in nodes] != list(range(len(nodes))):
                raise InvalidFileError("table node ids must be 0..n-1")
            configs = tuple(np.asarray(nd["configs"], dtype=np.int64).reshape(
                len(nd["configs"]), -1) for nd in nodes)
            costs = tuple(_floats(nd["cost"]) for nd in nodes)
            edges = []
            for e in data.get("edges", []):
                u, v = int(e["src"]), int(e["dst"])
                m = _floats(e["cost"])
                if m.shape != (len(costs[u]), len(costs[v])):
                    raise InvalidFileError(f"edge {u}->{v} cost matrix has shape {m.shape}, "
                                           f"expected {(len(costs[u]), len(costs[v]))}")
                edges.append((u, v, m))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            if isinstance(exc, InvalidFileError):
                raise
            raise InvalidFileError(f"malformed tables: {type(exc).__name__}: {exc}") from None
        for v, (cf, co) in enumerate(zip(configs, costs, strict=False)):
            if cf.shape[0] != co.shape[0] or cf.shape[0] == 0 or co.ndim != 1:
                raise InvalidFileError(f"node {v}: configs and cost differ in length or are "
                                       f"empty")
            if np.any(np.isnan(co)) or np.any(co < 0):
                raise InvalidFileError(f"node {v}: costs must be numbers >= 0 (null for "
                                       "infinite)")
        for u, v, m in edges:
            if np.any(np.isnan(m)) or np.any(m < 0):
                raise InvalidFileError(f"edge {u}->{v}: costs must be numbers >= 0 (null for "
                                       "infinite)")
        return cls(graph=str(data.get("graph", "")), devices=int(data.get("devices", 1)),
                   cost_model=str(data.get("cost_model", "")),
                   objective=str(data.get("objective", "pase_cost")),
                   names=tuple(str(nd.get("name", f"n{i}")) for i, nd in enumerate(nodes)),
                   dims=tuple(tuple(str(x) for x in nd.get("dims", ())) for nd in nodes),
                   configs=configs, node_cost=costs, edges=_merge(edges))


def _floats(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=object)
    a = np.where(a == None, np.inf, a)  # noqa: E711 - elementwise test for JSON nulls
    return a.astype(np.float64)


def _merge(edges: list[tuple[int, int, np.ndarray]]) -> tuple[tuple[int, int, np.ndarray], ...]:
    """One entry per unordered pair (matrices of parallel edges summed, oriented u < v)."""
    acc: dict[tuple[int, int], np.ndarray] = {}
    for u, v, m in edges:
        if u == v:
            raise InvalidFileError(f"edge {u}->{v} is a self loop")
        if u > v:
            u, v, m = v, u, m.T
        acc[(u, v)] = acc[(u, v)] + m if (u, v) in acc else np.array(m, dtype=np.float64)
    return tuple((u, v, acc[(u, v)]) for u, v in sorted(acc))


def execution_of(value: Any) -> ExecutionSettings | None:
    """A strategy search's ``execution`` option: settings, their JSON form, or None."""
    if value is None or isinstance(value, ExecutionSettings):
        return value
    if isinstance(value, Mapping):
        try:
            return ExecutionSettings.from_dict(value)
        except InvalidFileError as exc:
            raise ShardplanError(str(exc)) from None
    raise ShardplanError(f"execution must be execution settings, got {value!r}")


def priced_settings(graph: Graph, settings: ExecutionSettings | None) -> ExecutionSettings:
    """The settings the ``default`` model prices a strategy at: ``settings``, else one
    micro-batch of the graph's batch (what the plan records, so that recomputing its
    objective prices the same iteration). O(1)."""
    s = settings if settings is not None else ExecutionSettings(microbatches=1)
    return s.resolve(graph)


def search_graph(graph: Graph, cost_model: str, settings: ExecutionSettings | None) -> Graph:
    """The graph a strategy search builds its tables on: under the ``default`` model (the
    simulator's price) the graph at the plan's micro-batch size, its iteration spaces
    included (default settings: one micro-batch of the graph's batch); the graph itself
    under ``pase``. O(n + m)."""
    if cost_model != "default":
        return graph
    return priced_settings(graph, settings).graph_for(graph)


def make_cost_model(name: str, topology: Topology | None, devices: int,
                    memory_limit: float | None = None, *, graph: Graph | None = None,
                    settings: ExecutionSettings | None = None,
                    loss_on_shards: bool = True, exposed: float | None = None) -> Any:
    """The cost model called ``name``: ``pase`` (the paper's formulas, in FLOP-equivalents)
    or ``default`` (the simulator's price of the plan, :class:`~shardplan.strategy._price.
    SimulatorCostModel`, which needs the ``graph`` and prices it as ``settings`` run it)."""
    if name == "pase":
        from shardplan.strategy._cost_pase import PaseCostModel

        return PaseCostModel()
    if name == "default":
        from shardplan.strategy._price import SimulatorCostModel
        from shardplan.topology import flat

        if graph is None:
            raise ShardplanError("the default cost model prices a graph")
        return SimulatorCostModel(graph, topology if topology is not None else flat(devices),
                                  devices, settings, memory_limit,
                                  loss_on_shards=loss_on_shards, exposed=exposed)
    raise ShardplanError(f"unknown cost model {name!r} (choose pase or default)")


def build_tables(graph: Graph, devices: int, *, cost_model: str = "pase",
                 topology: Topology | None = None, cutoff: int | None = None,
                 memory_limit: float | None = None,
                 check: Callable[[], bool] | None = None,
                 only: Sequence[np.ndarray] | None = None,
                 settings: ExecutionSettings | None = None,
                 loss_on_shards: bool = True, exposed: float | None = None
                 ) -> Tables | None:
    """Enumerate configurations and evaluate the cost model on every node and edge.

    Parameters
    ----------
    graph : Graph
        Nodes carry ``space`` (others get a batch-only space).
    devices : int
        p, the devices every layer may use.
    cost_model : {"pase", "default"}
    topology : Topology, optional
        For the ``default`` model (default: a flat topology of ``devices`` devices).
    cutoff : int, optional
        Smallest per-device size of a split dimension (default: the graph's ``pase_cutoff``
        meta field, else 4, as the note says).
    memory_limit : float, optional
        Bytes per device (``default`` model only).
    check : callable, optional
        Called between nodes and edges; when it returns True the build stops and returns
        None (a time limit).
    only : sequence of ndarray, optional
        Per node, the configurations to cost (rows of split factors) instead of all of them:
        a strategy's own costs without the whole tables (what a search that ran out of time
        reports). Memory limits are not checked then.
    settings : ExecutionSettings, optional
        How the plan runs (``default`` model: micro-batch size and count, precision,
        gradient synchronisation; default one micro-batch of the graph's batch). The tables
        are built on the graph at that micro-batch size.
    loss_on_shards : bool
        ``default`` model: the graph's outputs feed a strategy run's loss (False: a hybrid
        stage's, which leave whole).
    exposed : float, optional
        ``default`` model under ``bucketed`` sync: the share of the gradients' ring time the
        backward leaves exposed (:func:`shardplan.strategy._price.exposed_share`; default:
        data parallelism's). The tables record it (``meta["sync_exposure"]``).

    Notes
    -----
    O(sum_v K_v d_v + sum_(u,v) K_u K_v t_uv) time and memory for the edge matrices.
    """
    if devices < 1:
        raise ShardplanError(f"devices must be positive, got {devices}")
    cut = int(cutoff if cutoff is not None else graph.meta.get("pase_cutoff", 4))
    model = make_cost_model(cost_model, topology, devices, memory_limit, graph=graph,
                            settings=settings, loss_on_shards=loss_on_shards,
                            exposed=exposed)
    graph = getattr(model, "graph", graph)  # the simulator's model: at the micro-batch size
    spaces = graph_spaces(graph)
    if only is not None:
        configs = [np.asarray(c, dtype=np.int64).reshape(-1, len(s.dims))
                   for c, s in zip(only, spaces, strict=True)]
    else:
        configs = [configurations(s, devices, cut) for s in spaces]
    costs = []
    for i, (s, c) in enumerate(zip(spaces, configs, strict=True)):
        if check is not None and check():
            return None
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            cv = np.asarray(model.node_cost(s, c, node=i), dtype=np.float64)
        if only is None and not np.any(np.isfinite(cv)):
            raise ShardplanError(f"no configuration of node {i} ({graph.names[i]!r}) fits the "
                                 f"memory limit")
        costs.append(cv)
    edges = []
    for e in range(graph.num_edges):
        if check is not None and (e & 3) == 0 and check():
            return None
        u, v = int(graph.src[e]), int(graph.dst[e])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            m = model.edge_cost(spaces[u], spaces[v], u, configs[u], configs[v],
                                float(graph.edge_bytes[e]), dst_id=v)
        if m is not None:
            edges.append((u, v, np.asarray(m, dtype=np.float64)))
    if check is not None and check():
        return None
    return Tables(graph=graph.name, devices=int(devices), cost_model=cost_model,
                  objective=model.objective, names=tuple(graph.names),
                  dims=tuple(s.dims for s in spaces), configs=tuple(configs),
                  node_cost=tuple(costs), edges=_merge(edges),
                  meta={"cutoff": cut, **({"sync_exposure": model.exposed}
                                          if getattr(model, "exposed", 1.0) != 1.0 else {})})
