"""``shardplan demo`` end to end on a small model: every step's file, a readable report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardplan.ir import load_graph, load_plan, load_topology
from shardplan.simulate import Schedule
from tests.helpers import run_cli


@pytest.mark.torch
def test_demo_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert run_cli(["demo", "--out-dir", str(out), "--model", "mlp", "--batch-size", "4",
                    "--boxes", "1", "--stages", "2", "--replicas", "2", "--microbatches", "4",
                    "--time-limit", "10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    steps = [s["step"] for s in data["steps"]]
    for step in ("partition", "map", "simulate", "report"):
        assert step in steps
    graph = load_graph(out / "graph.json")
    topo = load_topology(out / "topology.json")
    plan = load_plan(out / "plan.json")
    plan.validate(graph, topo)
    assert plan.num_stages == 2 and plan.num_replicas == 2
    sim = json.loads((out / "simulation.json").read_text())
    assert sim["iteration_seconds"] > 0 and len(sim["peak_memory_bytes"]) == 4
    assert Schedule.from_text((out / "schedule.txt").read_text()).num_stages == 2
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    for name in ("timeline", "graph", "bandwidth"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")


def test_demo_rejects_too_many_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["demo", "--boxes", "1", "--stages", "4", "--replicas", "4"]) == 2
    assert "need more than the 8 GPUs" in capsys.readouterr().err
