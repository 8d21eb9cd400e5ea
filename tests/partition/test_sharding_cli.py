"""``shardplan partition --algorithm brute-force|heuristic|hierarchical`` end to end, checked
with ``shardplan cost --objective sharding`` on the files written."""

from __future__ import annotations

import json
import math

import pytest
from helpers import run_cli


@pytest.fixture
def files(tmp_path):
    graph, topo = tmp_path / "g.json", tmp_path / "t.json"
    assert run_cli(["generate", "layered", "--nodes", "41", "--width", "5", "--seed", "1",
                    "-o", str(graph)]) == 0
    assert run_cli(["topology", "hierarchical", "--shape", "2x2", "--level-names", "box,gpu",
                    "-o", str(topo)]) == 0
    return tmp_path, graph, topo


@pytest.mark.parametrize("algorithm,extra", [
    ("heuristic", ["--workers", "1", "--restarts", "3", "--start", "topo"]),
    ("hierarchical", ["--restarts", "2"]),
    ("brute-force", ["--stages", "2", "--time-limit", "0.5"]),
])
def test_partition_then_cost(files, capsys, algorithm, extra) -> None:
    tmp, graph, topo = files
    plan = tmp / f"{algorithm}.json"
    assert run_cli(["partition", str(graph), str(topo), "--algorithm", algorithm, "--seed", "4",
                    *extra, "-o", str(plan)]) == 0
    capsys.readouterr()
    data = json.loads(plan.read_text())
    assert data["algorithm"] == algorithm and data["seed"] == 4
    assert data["objective"]["name"] == "sharding_cost"
    assert data["status"] in ("optimal", "feasible", "timed_out")
    assert all(len(st["devices"]) == 1 for st in data["stages"])
    assert run_cli(["cost", str(plan), str(graph), str(topo), "--objective", "sharding",
                    "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"] == "sharding_cost"
    assert math.isclose(out["value"], data["objective"]["value"], rel_tol=1e-9)
    assert math.isclose(out["weight_imbalance"] + out["cross_edge_cost"], out["value"],
                        rel_tol=1e-9)


def test_same_seed_same_plan_file(files, capsys) -> None:
    tmp, graph, topo = files
    texts = []
    for i in range(2):
        out = tmp / f"p{i}.json"
        assert run_cli(["partition", str(graph), str(topo), "--algorithm", "heuristic",
                        "--workers", "1", "--restarts", "2", "--seed", "9", "-o",
                        str(out)]) == 0
        data = json.loads(out.read_text())
        texts.append((data["stages"], data["objective"]["value"]))
    assert texts[0] == texts[1]


def test_exact_small_problem_is_optimal(tmp_path, capsys) -> None:
    graph, topo = tmp_path / "g.json", tmp_path / "t.json"
    assert run_cli(["generate", "layered", "--nodes", "9", "--width", "3", "--seed", "0",
                    "-o", str(graph)]) == 0
    assert run_cli(["topology", "flat", "--devices", "3", "-o", str(topo)]) == 0
    capsys.readouterr()
    assert run_cli(["partition", str(graph), str(topo), "--algorithm", "brute-force",
                    "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "optimal"
    assert data["objective"]["lower_bound"] == data["objective"]["value"]


@pytest.mark.parametrize("argv,message", [
    (["--algorithm", "heuristic", "--stages", "5"], "stages"),
    (["--algorithm", "heuristic", "--start", "best"], "start"),
    (["--algorithm", "hierarchical", "--workers", "2"], "does not take"),
    (["--algorithm", "brute-force", "--option", "incumbent=maybe"], "incumbent"),
])
def test_bad_input_is_one_line(files, capsys, argv, message) -> None:
    tmp, graph, topo = files
    assert run_cli(["partition", str(graph), str(topo), *argv, "-o",
                    str(tmp / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardplan: error:") and message in err[0]
    assert not (tmp / "x.json").exists()
