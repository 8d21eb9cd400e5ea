"""``shardplan generate``: output files, determinism, one-line errors with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardplan.ir import load_graph
from tests.helpers import run_cli


def run(argv: list[str]) -> int:
    return run_cli(argv)


def test_layered_file_is_the_api_graph(tmp_path: Path, capsys) -> None:
    out = tmp_path / "g.json"
    assert run(["generate", "layered", "--nodes", "201", "--seed", "3", "--width", "20",
                "--skip-probability", "0.2", "-o", str(out)]) == 0
    assert "wrote graph to" in capsys.readouterr().out
    g = load_graph(out)
    assert g.num_nodes == 201 and g.name == "layered-201"
    assert g.to_dict()["generator"]["width"] == 20
    again = tmp_path / "again.json"
    assert run(["generate", "layered", "--nodes", "201", "--seed", "3", "--width", "20",
                "--skip-probability", "0.2", "-o", str(again)]) == 0
    assert out.read_bytes() == again.read_bytes()


@pytest.mark.parametrize("argv", [
    ["generate", "chain", "--nodes", "4", "--json"],
    ["generate", "random-dag", "--nodes", "30", "--avg-degree", "3", "--name", "r", "--json"],
    ["generate", "random-dag", "--nodes", "30", "--edge-probability", "0.5", "--json"],
])
def test_json_to_stdout(argv: list[str], capsys) -> None:
    assert run(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "shardplan.graph/1"
    assert len(data["nodes"]) == int(argv[3])


BAD = {
    "zero nodes": (["--nodes", "0"], "positive integer"),
    "text nodes": (["--nodes", "many"], "positive integer"),
    "negative seed": (["--seed", "-2"], "integer >= 0"),
    "probability": (["--skip-probability", "2"], "probability"),
    "weights reversed": (["--weight-low", "9", "--weight-high", "2"], "weight_high"),
    "option of another kind": (["--edge-probability", "0.1"], "--edge-probability does not "
                                                               "apply to 'generate layered'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(case: str, tmp_path: Path, capsys) -> None:
    extra, match = BAD[case]
    out = tmp_path / "out.json"
    assert run(["generate", "layered", *extra, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardplan: error: ") and match in err[0]
    assert not out.exists()


@pytest.mark.parametrize("kind", ["alexnet", "inception-v3", "rnnlm", "transformer"])
def test_pase_benchmark_kinds_write_graphs_with_spaces(kind: str, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert run(["generate", kind, "--batch-size", "32", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["batch_size"] == 32
    assert all("space" in nd for nd in data["nodes"])
    assert run(["generate", kind, "--nodes", "5", "-o", str(tmp_path / "x.json")]) == 2


def test_unknown_kind_and_missing_output(tmp_path: Path, capsys) -> None:
    assert run(["generate", "spiral", "-o", str(tmp_path / "x.json")]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert run(["generate", "chain", "--nodes", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-o FILE or --json" in err


def test_help(capsys) -> None:
    assert run(["generate", "--help"]) == 0
    assert "--max-fanin" in capsys.readouterr().out
