"""The chrome-trace export event by event (issue 38): the Trace Event Format fields Perfetto
and ``chrome://tracing`` read (``ph``, ``name``, ``pid``, ``tid``, ``ts``, ``dur``, ``args``,
``displayTimeUnit``), the names of the actions, and that the settings and schedule asked for
are the ones simulated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardplan.export import export
from shardplan.ir import Graph, Objective, Plan, Stage
from shardplan.ir.schedule import gpipe
from shardplan.simulate import simulate
from shardplan.topology import build

_N = 12


def _inputs(microbatches: int = 3) -> tuple[Plan, Graph, object]:
    g = Graph.from_arrays(name="chain", fwd_flops=np.full(_N, 1e9), src=np.arange(_N - 1),
                          dst=np.arange(1, _N), output_bytes=np.full(_N, 4096),
                          param_bytes=np.full(_N, 1024), names=[f"n{i}" for i in range(_N)],
                          batch_size=4)
    # 2 stages x 2 replicas: stage 0 on devices 0 and 2, stage 1 on 1 and 3
    plan = Plan("chain", "flat", "hand", (Stage(tuple(range(6)), (0, 2)),
                                          Stage(tuple(range(6, _N)), (1, 3))),
                Objective("x", 0.0))
    plan = plan.with_settings(plan.settings.override(microbatches=microbatches,
                                                     schedule="1f1b")[0])
    return plan, g, build("flat", num_devices=4)


def _trace(plan, g, topo, **kw) -> dict:
    return json.loads(export(plan, g, topo, "chrome-trace", **kw).text)


def test_processes_and_tracks_are_named() -> None:
    plan, g, topo = _inputs()
    trace = _trace(plan, g, topo)
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert meta[:4] == [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
         "args": {"name": f"device 0: {topo.devices[0].name}"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "compute"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "send"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 2, "args": {"name": "collective"}}]
    assert [e["pid"] for e in meta if e["name"] == "process_name"] == [0, 1, 2, 3]
    assert len(meta) == 16
    assert trace["displayTimeUnit"] == "ms"


def test_the_iteration_is_described() -> None:
    plan, g, topo = _inputs()
    trace = _trace(plan, g, topo)
    res = simulate(plan, g, topo)
    assert trace["otherData"] == {"format": "shardplan.trace/1", "graph": "chain",
                                  "topology": "flat", "schedule": "1f1b", "microbatches": 3,
                                  "iteration_seconds": res.iteration_seconds}


def _by_name(trace: dict, pid: int) -> dict[str, dict]:
    return {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid}


def test_stage_actions_messages_and_collectives() -> None:
    plan, g, topo = _inputs()
    trace = _trace(plan, g, topo)
    res = simulate(plan, g, topo)
    dev1 = _by_name(trace, 1)
    f0 = dev1["1F0"]
    iv = next(i for i in res.intervals if i.device == 1 and i.kind == "F"
              and i.microbatch == 0)
    assert f0 == {"ph": "X", "name": "1F0", "cat": "F", "pid": 1, "tid": 0,
                  "ts": pytest.approx(iv.start * 1e6, rel=1e-12, abs=1e-9),
                  "dur": pytest.approx((iv.end - iv.start) * 1e6, rel=1e-12),
                  "args": {"kind": "forward", "stage": 1, "microbatch": 0}}
    assert dev1["1B2"]["args"] == {"kind": "backward", "stage": 1, "microbatch": 2}
    assert dev1["optimizer step"]["args"] == {"kind": "optimizer step", "stage": 1}
    assert dev1["optimizer step"]["tid"] == 0 and dev1["optimizer step"]["cat"] == "OPT"
    sends = {n: e for n, e in _by_name(trace, 0).items() if e["tid"] == 1}
    assert sends["activation 0:1 -> device 1"]["args"] == {
        "kind": "activation", "stage": 0, "microbatch": 1, "peer": 1}
    grads = {n: e for n, e in dev1.items() if e["tid"] == 1}
    assert grads["gradient 1:0 -> device 0"]["args"] == {
        "kind": "gradient", "stage": 1, "microbatch": 0, "peer": 0}
    coll = [e for e in dev1.values() if e["tid"] == 2]
    assert [e["name"] for e in coll] == ["allreduce stage 1"]
    assert coll[0]["args"] == {"kind": "allreduce", "stage": 1, "peer": 3}  # its replica
    ends = [e["ts"] + e["dur"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert max(ends) == pytest.approx(res.iteration_seconds * 1e6, rel=1e-12)
    starts = sorted(i.start for i in res.intervals if i.start > 0)
    assert min(e["ts"] for e in trace["traceEvents"] if e["ph"] == "X" and e["ts"] > 0) == \
        pytest.approx(starts[0] * 1e6, rel=1e-12)


def test_the_settings_and_schedule_given_are_simulated() -> None:
    plan, g, topo = _inputs(microbatches=3)
    other = plan.settings.override(microbatches=4)[0]
    trace = _trace(plan, g, topo, settings=other)
    assert trace["otherData"]["microbatches"] == 4
    assert "1F3" in _by_name(trace, 1)
    trace = _trace(plan, g, topo, schedule=gpipe(2, 2))
    assert trace["otherData"]["schedule"] == "gpipe"
    assert trace["otherData"]["microbatches"] == 2
    assert "1F2" not in _by_name(trace, 1)
