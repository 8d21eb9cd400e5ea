"""The max-stage objective of a partition (Parmesan eq. 1-3), checked by hand."""

from __future__ import annotations

import math

import pytest

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Objective, Plan, Stage
from shardplan.objectives import evaluate
from shardplan.topology import build


def _graph() -> Graph:
    # 0 -> 1 -> 2, 1 TFLOP forward each (backward 2 TFLOP), 1 MB activations, 100 B params
    return Graph.from_arrays(name="g", fwd_flops=[1e12, 1e12, 1e12], src=[0, 1], dst=[1, 2],
                             output_bytes=[10**6, 10**6, 0], param_bytes=[100, 0, 0])


def _plan(stages, options=None) -> Plan:
    return Plan(graph="g", topology="t", algorithm="x",
                stages=tuple(Stage(tuple(n), tuple(d)) for n, d in stages),
                objective=Objective("max_stage_seconds", 0.0), options=options or {})


def test_hand_computed_value():
    topo = build("flat", num_devices=4, bandwidth=1e9, latency=1e-3, flops=1e12)
    plan = _plan([([0, 1], [0]), ([2], [1])], {"efficiency": 0.5})
    name, value, details = evaluate(plan, _graph(), topo, "max-stage")
    # stage 0: 6 TFLOP at 0.5 TFLOP/s = 12 s + 2 x (1 ms + 1 MB / 1 GB/s) = 12.004 s
    assert name == "max_stage_seconds"
    assert math.isclose(value, 12.004)
    assert math.isclose(details["stage_seconds"][1], 6.004)
    # two replicas each: compute halves, bytes halve, latency stays
    plan = _plan([([0, 1], [0, 1]), ([2], [2, 3])], {"efficiency": 0.5})
    _, value, _ = evaluate(plan, _graph(), topo, "max-stage")
    assert math.isclose(value, 6.0 + 2 * (1e-3 + 0.5e-3))


def test_memory_uses_in_flight_microbatches():
    # stage 0 keeps min(S - 0, M) = 2 micro-batches under 1F1B: 2 x 2 MB + 100 B x 4 (adam)
    topo = build("flat", num_devices=2, memory_bytes=4_000_399, flops=1e12)
    plan = _plan([([0, 1], [0]), ([2], [1])], {"microbatches": 4})
    _, value, details = evaluate(plan, _graph(), topo, "max-stage")
    assert value == math.inf and details["fits_memory"] == [False, True]
    topo = build("flat", num_devices=2, memory_bytes=4_000_400, flops=1e12)
    _, value, _ = evaluate(plan, _graph(), topo, "max-stage")
    assert math.isfinite(value)
    # command-line options override the plan's; gpipe keeps all 4 micro-batches
    _, value, _ = evaluate(plan, _graph(), topo, "max-stage", schedule="gpipe")
    assert value == math.inf


def test_bad_settings():
    topo = build("flat", num_devices=2)
    plan = _plan([([0, 1, 2], [0])], {"microbatches": 0})
    with pytest.raises(ShardplanError, match="microbatches"):
        evaluate(plan, _graph(), topo, "max-stage")
