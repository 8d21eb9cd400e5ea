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
                    "--boxes", "1", "--time-limit", "20", "--no-run", "--no-llm",
                    "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    steps = {s["step"]: s for s in data["steps"]}
    for step in ("capture (operator level)", "plan", "report"):
        assert step in steps
    graph = load_graph(out / "graph.json")
    topo = load_topology(out / "topology.json")
    plan = load_plan(out / "plan.json")
    plan.validate(graph, topo)
    winner = steps["plan"]["winner"]
    assert (plan.num_stages, plan.settings.schedule) == (winner["stages"], winner["schedule"])
    assert steps["plan"]["candidates"] > 10
    sim = json.loads((out / "simulation.json").read_text())
    assert sim["iteration_seconds"] == winner["iteration_seconds"]
    assert Schedule.from_text((out / "schedule.txt").read_text()).num_stages == \
        plan.num_stages
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    assert "Candidates, ranked by the simulator" in html
    for name in ("timeline", "graph", "bandwidth"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.torch
def test_demos_llm_story(tmp_path: Path) -> None:
    """The published GPT-3 175B run imported, a layout no slower found (the import is among
    the candidates), and Megatron-LM arguments that carry the winner's degrees."""
    from shardplan.cli.demo import _llm_story

    lines: list[str] = []
    got = _llm_story(tmp_path, lines.append, 3.0)
    assert got["baseline"] == "TP 8 x PP 12 x DP 8"
    assert got["winner_seconds"] <= got["baseline_seconds"]
    plan = load_plan(tmp_path / "llm-plan.json")
    assert plan.parallel is not None and plan.parallel.label() == got["winner"]
    assert f"--tensor-model-parallel-size {plan.parallel.tp} " in got["megatron_args"]
    assert any("launch it with" in line for line in lines)


def test_demo_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["demo", "--boxes", "0"]) == 2
    assert "positive integer" in capsys.readouterr().err
