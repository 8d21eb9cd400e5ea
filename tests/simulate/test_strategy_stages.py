"""Strategy stages (PaSE / DTensor plans): what the runtime's program pays beyond its
layers' own costs."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.ir import Device, ExecutionSettings, Graph, Objective, Plan, Stage, Topology
from shardplan.simulate import simulate


def _graph() -> Graph:
    g = Graph.from_arrays(name="g", batch_size=4, fwd_flops=[1e9, 2e9, 3e9], src=[0, 1],
                          dst=[1, 2], output_bytes=[1000, 1000, 4000])
    last = {"kind": "elementwise", "dims": [["b", 4], ["n", 250]], "output": [["b"], ["n"]],
            "output_shape": [4, 250], "inputs": {"1": [["b"], []]}}
    return g.replace(spaces=(None, None, last))


def _topo(gather_seconds: float | None) -> Topology:
    devs = tuple(Device(f"d{i}", 1e9, 1e12) for i in range(2))
    bw = np.array([[0.0, 1e9], [1e9, 0.0]])
    meta = {}
    if gather_seconds is not None:
        meta = {"collectives": {"allgather": {"2": [[1.0, gather_seconds],
                                                     [1e9, gather_seconds]]}}}
    return Topology(name="t", devices=devs, bandwidth=bw, latency=np.zeros((2, 2)), meta=meta)


def _seconds(last: list[int], gather: float | None) -> float:
    settings = ExecutionSettings(microbatches=3, optimizer="sgd", efficiency=1.0)
    plan = Plan("g", "t", "pase", (Stage((0, 1, 2), (0, 1)),), Objective("x", 0.0),
                strategy={"0": [2], "1": [2], "2": last})
    return simulate(plan.with_settings(settings), _graph(), _topo(gather)).iteration_seconds


def test_a_split_model_output_is_gathered_whole_every_microbatch() -> None:
    """The program returns whole outputs unless they are split by their batch alone (each
    device then computes the loss of its part, as data parallelism does): a model output
    split over the stage's 2 devices on another dimension costs one all-gather per
    micro-batch, by the measured curve; split by its batch, or not split, nothing."""
    slow, fast = _seconds([1, 2], 0.010), _seconds([1, 2], 0.004)
    assert slow - fast == pytest.approx(3 * 0.006)
    for last in ([2, 1], [1, 1]):  # the batch alone, and not split
        assert _seconds(last, 0.010) == pytest.approx(_seconds(last, 0.004))


