"""The simulated iteration as Chrome Trace Event JSON (Perfetto, ``chrome://tracing``)."""

from __future__ import annotations

from typing import Any

from shardplan.ir import ExecutionSettings, Graph, Plan, Topology

__all__ = ["TRACKS", "chrome_trace"]

#: Track (thread id) of every interval kind within a device's process.
TRACKS = {"compute": 0, "send": 1, "collective": 2}
_COMPUTE = ("F", "B", "I", "W", "OPT")
_SEND = ("activation", "gradient")
_NAMES = {"F": "forward", "B": "backward", "I": "input gradient", "W": "weight gradient",
          "OPT": "optimizer step"}


def _track(kind: str) -> int:
    if kind in _COMPUTE:
        return TRACKS["compute"]
    return TRACKS["send"] if kind in _SEND else TRACKS["collective"]


def chrome_trace(plan: Plan, graph: Graph, topology: Topology, settings: ExecutionSettings,
                 schedule: Any = None) -> dict[str, Any]:
    """Simulate ``plan`` and return the Trace Event Format object: per device a process
    (named after the topology's device), tracks ``compute`` (one ``X`` event per stage
    action and the optimizer step, named like torch's actions, ``2F0``), ``send``
    (activations and gradients, with the peer) and ``collective`` (all-reduce and the other
    collectives); times in microseconds. O(E) for E simulated intervals."""
    from shardplan.simulate import simulate

    res = simulate(plan, graph, topology, settings, schedule=schedule)
    events: list[dict[str, Any]] = []
    for d in res.devices:
        events.append({"ph": "M", "name": "process_name", "pid": int(d), "tid": 0,
                       "args": {"name": f"device {d}: {topology.devices[d].name}"}})
        for name, tid in TRACKS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": int(d), "tid": tid,
                           "args": {"name": name}})
    for iv in res.intervals:
        if iv.kind in _COMPUTE and iv.kind != "OPT":
            name = f"{iv.stage}{iv.kind}{iv.microbatch}"
        elif iv.kind == "OPT":
            name = "optimizer step"
        elif iv.kind in _SEND:
            name = f"{iv.kind} {iv.stage}:{iv.microbatch} -> device {iv.peer}"
        else:
            name = f"{iv.kind} stage {iv.stage}"
        args: dict[str, Any] = {"kind": _NAMES.get(iv.kind, iv.kind), "stage": iv.stage}
        if iv.microbatch is not None:
            args["microbatch"] = iv.microbatch
        if iv.peer is not None:
            args["peer"] = iv.peer
        events.append({"ph": "X", "name": name, "cat": iv.kind, "pid": int(iv.device),
                       "tid": _track(iv.kind), "ts": iv.start * 1e6,
                       "dur": max(iv.end - iv.start, 0.0) * 1e6, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"format": "shardplan.trace/1", "graph": plan.graph,
                          "topology": plan.topology, "schedule": res.schedule.name,
                          "microbatches": res.num_microbatches,
                          "iteration_seconds": res.iteration_seconds}}
