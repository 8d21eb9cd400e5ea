"""Across commands: the execution settings a plan is made with survive partition -> map ->
cost -> simulate -> report, a later flag overrides them and says so, and the numbers every
command prints come from one stage-time model."""

from __future__ import annotations

import json

import pytest

from shardplan.generate import layered
from shardplan.ir import load_plan, save
from shardplan.topology import build
from tests.helpers import run_cli


@pytest.fixture
def files(tmp_path):
    g = layered(num_nodes=60, width=4, seed=3, skip_probability=0.2)
    topo = build("hierarchical", shape=(2, 4), level_names=("box", "gpu"),
                 bandwidth=(1e9, 2e10), latency=(2e-5, 2e-6))
    save(g, tmp_path / "g.json")
    save(topo, tmp_path / "t.json")
    return tmp_path, str(tmp_path / "g.json"), str(tmp_path / "t.json")


SETTINGS = ["--efficiency", "0.5", "--microbatches", "4", "--schedule", "gpipe",
            "--recompute", "--optimizer", "sgd", "--global-batch", "64"]


def test_settings_survive_every_command(files, capsys):
    tmp, g, t = files
    part, mapped = str(tmp / "part.json"), str(tmp / "mapped.json")
    assert run_cli(["partition", g, t, "--algorithm", "parmesan", "--stages", "4",
                    "--replicas", "2", *SETTINGS, "-o", part]) == 0
    made = load_plan(part).settings
    assert (made.efficiency, made.microbatches, made.schedule, made.recompute,
            made.optimizer) == (0.5, 4, "gpipe", "full", "sgd")
    assert (made.microbatch_size, made.global_batch) == (16, 64)
    assert run_cli(["map", part, g, t, "--algorithm", "optimal", "-o", mapped]) == 0
    assert load_plan(mapped).settings == made
    capsys.readouterr()
    # cost recomputes the mapping's recorded objective with the plan's settings
    assert run_cli(["cost", mapped, g, t, "--objective", "max-stage", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["value"] == pytest.approx(cost["recorded"], rel=1e-12)
    assert cost["settings"]["efficiency"] == 0.5
    # simulate runs them; nothing is overridden, so nothing is said
    assert run_cli(["simulate", mapped, g, t, "--json"]) == 0
    out = capsys.readouterr()
    sim = json.loads(out.out)
    assert out.err == ""
    assert (sim["num_microbatches"], sim["schedule"]) == (4, "gpipe")
    assert sim["options"]["recompute"] == "full" and sim["options"]["efficiency"] == 0.5
    assert sim["samples_per_iteration"] == 64
    # a flag overrides one setting, says so, and the rest stay
    assert run_cli(["simulate", mapped, g, t, "--json", "--efficiency", "1.0"]) == 0
    out = capsys.readouterr()
    faster = json.loads(out.out)
    assert out.err.strip() == "shardplan: note: efficiency 1 overrides the plan's 0.5"
    assert faster["options"]["efficiency"] == 1.0
    assert sum(faster["busy_seconds"]) < sum(sim["busy_seconds"])  # the compute is faster
    assert faster["num_microbatches"] == 4
    # the report simulates the same iteration
    assert run_cli(["report", mapped, g, t, "-o", str(tmp / "r.html"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["iteration_seconds"] == pytest.approx(sim["iteration_seconds"], rel=1e-12)


@pytest.mark.parametrize("algorithm", ["parmesan", "pipedream", "uniform", "params", "metis"])
def test_partition_value_is_the_model_view_and_bounds_the_simulation(files, capsys,
                                                                     algorithm):
    """The objective is the view's largest stage time; (M + P - 1) times it bounds nothing
    in general, but the simulated iteration is never below M times the slowest replica's
    compute (the plan's lower bound)."""
    tmp, g, t = files
    part = str(tmp / "p.json")
    assert run_cli(["partition", g, t, "--algorithm", algorithm, "--stages", "4",
                    "--replicas", "2", "-o", part]) == 0
    plan = load_plan(part)
    capsys.readouterr()
    assert run_cli(["simulate", part, g, t, "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_seconds"] >= sim["ideal_seconds"] * (1 - 1e-12)
    assert plan.objective.lower_bound <= plan.objective.value
    assert sim["plan_lower_bound"] == plan.objective.lower_bound


def test_an_older_plan_without_settings_runs_with_the_defaults(files, capsys):
    tmp, g, t = files
    part = tmp / "p.json"
    assert run_cli(["partition", g, t, "--algorithm", "uniform", "--stages", "2",
                    "-o", str(part)]) == 0
    data = json.loads(part.read_text())
    del data["execution"]
    data["objective"]["name"] = "max_stage_seconds"
    data["options"] = {"microbatches": 3}
    part.write_text(json.dumps(data))
    capsys.readouterr()
    assert run_cli(["simulate", str(part), g, t, "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["num_microbatches"] == 3 and sim["schedule"] == "1f1b"
    assert run_cli(["cost", str(part), g, t, "--objective", "max-stage", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["objective"] == "max_stage_seconds"


@pytest.mark.torch
@pytest.mark.multiprocess
def test_settings_reach_training(tmp_path, capsys):
    """partition -> map -> simulate -> train: the run trains what was planned (the plan's
    micro-batch size, micro-batches, schedule and optimizer), and says what it ran with."""
    pytest.importorskip("torch")
    g, t = str(tmp_path / "g.json"), str(tmp_path / "t.json")
    part, mapped = str(tmp_path / "part.json"), str(tmp_path / "mapped.json")
    assert run_cli(["capture", "mlp", "--batch-size", "8", "-o", g]) == 0
    assert run_cli(["topology", "flat", "--devices", "2", "-o", t]) == 0
    assert run_cli(["partition", g, t, "--algorithm", "parmesan", "--stages", "2",
                    "--replicas", "1", "--microbatches", "4", "--global-batch", "16",
                    "--optimizer", "sgd", "--schedule", "1f1b", "-o", part]) == 0
    assert run_cli(["map", part, g, t, "--algorithm", "consecutive", "-o", mapped]) == 0
    planned = load_plan(mapped).settings
    capsys.readouterr()
    assert run_cli(["simulate", mapped, g, t, "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["samples_per_iteration"] == 16 and sim["num_microbatches"] == 4
    assert run_cli(["train", mapped, g, t, "--steps", "2", "--json"]) == 0
    out = capsys.readouterr()
    run = json.loads(out.out)
    assert "overrides" not in out.err
    assert run["settings"] == planned.to_dict()
    assert (run["microbatch_size"], run["global_batch"], run["microbatches"]) == (4, 16, 4)
    assert run["schedule"] == "1f1b" and len(run["losses"]) == 2
