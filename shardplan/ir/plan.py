"""The plan value object (``shardplan.plan/1``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardplan.errors import InvalidFileError
from shardplan.ir.parallel import ParallelConfig
from shardplan.ir.settings import ExecutionSettings

__all__ = ["PLAN_FORMAT", "STATUSES", "Objective", "Plan", "Stage"]

PLAN_FORMAT = "shardplan.plan/1"
STATUSES = ("optimal", "feasible", "timed_out")


@dataclass(frozen=True, slots=True)
class Stage:
    """A set of nodes run on one device per replica."""

    nodes: tuple[int, ...]
    devices: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "devices": list(self.devices)}


@dataclass(frozen=True, slots=True)
class Objective:
    """What the algorithm optimised, its value and a lower bound where one is known."""

    name: str
    value: float
    lower_bound: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "value": self.value}
        if self.lower_bound is not None:
            d["lower_bound"] = self.lower_bound
        return d


@dataclass(frozen=True, eq=False)
class Plan:
    """Stages (node sets) placed on devices, with the objective that produced them.

    Attributes
    ----------
    graph, topology : str
        Names of the graph and topology the plan was made for.
    algorithm : str
    seed : int
    options : mapping
        The algorithm's options, as given.
    search_seconds : float
    stages : tuple of Stage
    objective : Objective
    status : {"optimal", "feasible", "timed_out"}
    strategy : mapping of str to tuple of int, or None
        PaSE: per node id, the split factor of each dimension of its ``space``.
    execution : ExecutionSettings or None
        How the plan runs (micro-batches, schedule, optimizer, ...), as the command that
        made it planned; :attr:`settings` gives the defaults when absent (older files).
    parallel : ParallelConfig or None
        The LLM plan kind (tensor x pipeline x data / fully sharded x context, see
        :mod:`shardplan.ir.parallel`): its stages are the ``pp * vp`` virtual stages, those of
        one pipeline rank on the same devices.
    """

    graph: str
    topology: str
    algorithm: str
    stages: tuple[Stage, ...]
    objective: Objective
    status: str = "feasible"
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)
    search_seconds: float = 0.0
    strategy: Mapping[str, tuple[int, ...]] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    execution: ExecutionSettings | None = None
    parallel: ParallelConfig | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise InvalidFileError(f"plan status must be one of {', '.join(STATUSES)}, got "
                                   f"{self.status!r}")
        object.__setattr__(self, "stages", tuple(self.stages))
        seen: dict[int, int] = {}
        used: dict[int, int] = {}
        for s, st in enumerate(self.stages):
            if not st.devices:
                raise InvalidFileError(f"stage {s} has no device")
            for v in st.nodes:
                if v in seen:
                    raise InvalidFileError(f"node {v} is in stages {seen[v]} and {s}")
                seen[v] = s
            if self.parallel is not None and s >= self.parallel.pp:
                # interleaved virtual stages share their pipeline rank's devices
                if st.devices != self.stages[s % self.parallel.pp].devices:
                    raise InvalidFileError(f"virtual stage {s} must run on the devices of "
                                           f"stage {s % self.parallel.pp} (its pipeline rank)")
                continue
            for d in st.devices:
                if d in used:
                    raise InvalidFileError(f"device {d} is used by stages {used[d]} and {s}")
                used[d] = s

    # ------------------------------------------------------------------ queries
    @property
    def settings(self) -> ExecutionSettings:
        """The plan's execution settings: its ``execution`` field, or for a plan written
        before that field the defaults with what it kept among its options."""
        if self.execution is not None:
            return self.execution
        return ExecutionSettings.from_legacy_options(self.options)

    def with_settings(self, settings: ExecutionSettings) -> Plan:
        """The same plan carrying ``settings``."""
        from dataclasses import replace

        return replace(self, execution=settings)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_replicas(self) -> int:
        """Replicas per stage (the maximum, when stages differ)."""
        return max((len(s.devices) for s in self.stages), default=0)

    def assignment(self, num_nodes: int) -> np.ndarray:
        """Stage id of every node (``-1`` for a node in no stage)."""
        a = np.full(num_nodes, -1, dtype=np.int64)
        for s, st in enumerate(self.stages):
            a[list(st.nodes)] = s
        return a

    def validate(self, graph: Any, topology: Any | None = None) -> None:
        """Check the plan against its graph (and topology): every node in exactly one stage,
        ids in range, devices in range. Raises :class:`InvalidFileError`."""
        n = graph.num_nodes
        count = np.zeros(n, dtype=np.int64)
        for s, st in enumerate(self.stages):
            idx = np.asarray(st.nodes, dtype=np.int64)
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise InvalidFileError(f"stage {s} names a node outside 0..{n - 1}")
            np.add.at(count, idx, 1)
        missing = np.flatnonzero(count == 0)
        if missing.size:
            raise InvalidFileError(f"{missing.size} nodes are in no stage (first: node "
                                   f"{int(missing[0])})")
        if topology is not None:
            d = topology.num_devices
            for s, st in enumerate(self.stages):
                if any(not 0 <= x < d for x in st.devices):
                    raise InvalidFileError(f"stage {s} uses a device outside 0..{d - 1}")

    def __repr__(self) -> str:
        """One short line (the default dataclass repr lists every node of every stage)."""
        kind = ", strategy" if self.strategy is not None else ""
        if self.parallel is not None:
            kind = f", {self.parallel.label()}"
        return (f"Plan(graph={self.graph!r}, topology={self.topology!r}, "
                f"algorithm={self.algorithm!r}, stages={self.num_stages}, "
                f"replicas={self.num_replicas}, {self.objective.name}="
                f"{self.objective.value:.6g}, status={self.status!r}{kind})")

    def _repr_html_(self) -> str:
        """A table for notebooks: one row per stage (nodes, devices) under the objective."""
        from html import escape

        def short(xs: tuple[int, ...]) -> str:
            return ", ".join(map(str, xs[:8])) + (f", ... ({len(xs)})" if len(xs) > 8 else "")

        head = (f"plan {escape(self.algorithm)} of {escape(self.graph)} on "
                f"{escape(self.topology)}: {escape(self.objective.name)} = "
                f"{self.objective.value:.6g} ({escape(self.status)}), schedule "
                f"{escape(self.settings.schedule)}, {self.settings.microbatches} micro-batches")
        rows = "".join(f"<tr><td>{s}</td><td>{len(st.nodes)}</td><td>{escape(short(st.nodes))}"
                       f"</td><td>{escape(short(st.devices))}</td></tr>"
                       for s, st in enumerate(self.stages))
        return (f"<table><caption>{head}</caption><tr><th>stage</th><th>nodes</th>"
                f"<th>node ids</th><th>devices</th></tr>{rows}</table>")

    def summary(self) -> dict[str, Any]:
        return {
            "kind": "plan",
            "graph": self.graph,
            "topology": self.topology,
            "algorithm": self.algorithm,
            "stages": self.num_stages,
            "replicas": self.num_replicas,
            "stage_sizes": [len(s.nodes) for s in self.stages],
            "objective": self.objective.to_dict(),
            "status": self.status,
            "search_seconds": self.search_seconds,
            "has_strategy": self.strategy is not None,
            "execution": self.settings.to_dict(),
        }

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": PLAN_FORMAT, "graph": self.graph, "topology": self.topology,
            "algorithm": self.algorithm, "seed": self.seed, "options": dict(self.options),
            "search_seconds": self.search_seconds,
            "stages": [s.to_dict() for s in self.stages],
            "objective": self.objective.to_dict(), "status": self.status,
        }
        if self.strategy is not None:
            out["strategy"] = {k: list(v) for k, v in self.strategy.items()}
        if self.execution is not None:
            out["execution"] = self.execution.to_dict()
        if self.parallel is not None:
            out["parallel"] = self.parallel.to_dict()
        for k, v in self.meta.items():
            out.setdefault(k, v)
        from shardplan._version import __version__

        out["shardplan_version"] = __version__  # the version that wrote the file
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        if not isinstance(data, Mapping):
            raise InvalidFileError("a plan must be a JSON object")
        if data.get("format") != PLAN_FORMAT:
            raise InvalidFileError(f"expected format {PLAN_FORMAT!r}, got "
                                   f"{data.get('format')!r}")
        stages = []
        raw = data.get("stages")
        if not isinstance(raw, list):
            raise InvalidFileError("plan 'stages' must be a list")
        for s, st in enumerate(raw):
            try:
                nodes = tuple(_as_int(x) for x in st["nodes"])
                devices = tuple(_as_int(x) for x in st["devices"])
            except (KeyError, TypeError, ValueError):
                raise InvalidFileError(f"stage {s} needs integer lists 'nodes' and 'devices'") \
                    from None
            stages.append(Stage(nodes, devices))
        obj = data.get("objective")
        if not isinstance(obj, Mapping) or "value" not in obj:
            raise InvalidFileError("plan 'objective' must be an object with a 'value'")
        try:
            # Non-finite values are written as null (plain JSON); an infinite value is the
            # only one a plan can legitimately carry (an infeasible objective).
            value = float("inf") if obj["value"] is None else float(obj["value"])
            objective = Objective(str(obj.get("name", "")), value,
                                  None if obj.get("lower_bound") is None
                                  else float(obj["lower_bound"]))
        except (TypeError, ValueError):
            raise InvalidFileError("plan objective value and lower_bound must be numbers") \
                from None
        strategy = data.get("strategy")
        if strategy is not None:
            try:
                strategy = {str(k): tuple(_as_int(x) for x in v) for k, v in strategy.items()}
            except (AttributeError, TypeError, ValueError):
                raise InvalidFileError("plan 'strategy' must map node ids to integer lists") \
                    from None
        execution = data.get("execution")
        if execution is not None:
            execution = ExecutionSettings.from_dict(execution)
        parallel = data.get("parallel")
        if parallel is not None:
            parallel = ParallelConfig.from_dict(parallel)
        known = {"format", "graph", "topology", "algorithm", "seed", "options",
                 "search_seconds", "stages", "objective", "status", "strategy", "execution",
                 "parallel"}
        return cls(
            graph=str(data.get("graph", "")), topology=str(data.get("topology", "")),
            algorithm=str(data.get("algorithm", "")), stages=tuple(stages),
            objective=objective, status=str(data.get("status", "feasible")),
            seed=int(data.get("seed", 0) or 0), options=dict(data.get("options") or {}),
            search_seconds=float(data.get("search_seconds", 0.0) or 0.0), strategy=strategy,
            meta={k: v for k, v in data.items() if k not in known}, execution=execution,
            parallel=parallel,
        )


def _as_int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(x)
    return int(x)
