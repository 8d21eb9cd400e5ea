"""Issue 34's bad inputs: each one line ``shardplan: error: ...`` and exit 2 (no traceback,
no hang, no allocation of the machine's memory), or a note where the input is legal but
probably not what was meant."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from shardplan.cli.main import main
from shardplan.generate import generate
from shardplan.ir import save
from shardplan.topology import build


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    from shardplan import registry

    graph = generate("chain", num_nodes=6, seed=0)
    topo = build("flat", num_devices=2)
    plan = registry.run("partition", "uniform", graph, topo, stages=2).plan
    out = {}
    for name, obj in (("g", graph), ("t", topo), ("p", plan),
                      ("t4", build("flat", num_devices=4))):
        save(obj, tmp_path / f"{name}.json")
        out[name] = str(tmp_path / f"{name}.json")
    data = json.loads(Path(out["g"]).read_text())
    empty = {**data, "nodes": [], "edges": []}
    (tmp_path / "empty.json").write_text(json.dumps(empty))
    data["nodes"][0]["fwd_flops"] = 1e308
    (tmp_path / "huge.json").write_text(json.dumps(data))
    out.update(empty=str(tmp_path / "empty.json"), huge=str(tmp_path / "huge.json"))
    return out


CASES = {
    "inspect a graph with no nodes": (lambda f: ["inspect", f["empty"]], "at least one node"),
    "plan a graph with no nodes": (lambda f: ["plan", f["empty"], "--cluster", f["t"]],
                                   "at least one node"),
    "plan a graph with 1e308 FLOPs": (lambda f: ["plan", f["huge"], "--cluster", f["t"]],
                                      "must be below"),
    "plan on a million-device torus": (lambda f: ["plan", f["g"], "--cluster",
                                                  "torus2d,shape=1000x1000"], "at most 4096"),
    "plan on 4,097 DGX A100 nodes": (lambda f: ["plan", f["g"], "--cluster",
                                                "dgx-a100,nodes=4097"], "at most 32768"),
    "plan --families ''": (lambda f: ["plan", f["g"], "--cluster", f["t"], "--families", ""],
                           "names no family"),
    "plan --cluster with a repeated key": (lambda f: ["plan", f["g"], "--cluster",
                                                      "flat,devices=2,devices=4"], "twice"),
    "inspect /dev/zero": (lambda f: ["--max-input-size", "1MiB", "inspect", "/dev/zero"],
                          "larger than the 1 MiB"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_line_and_exit_2(case: str, files: dict[str, str], capsys) -> None:
    argv, message = CASES[case]
    assert main(argv(files)) == 2, case
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardplan: error: "), err
    assert message in err and "Traceback" not in err


def test_a_file_over_the_size_limit_is_refused_before_reading(tmp_path: Path, capsys) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: 300 MB that take no disk and would take > 90 s
        fh.truncate(300 * 10**6)
    t0 = time.monotonic()
    assert main(["inspect", str(big)]) == 2
    assert time.monotonic() - t0 < 60  # generous: what matters is it does not read 300 MB
    err = capsys.readouterr().err
    assert "larger than the 256 MiB" in err and "--max-input-size" in err


def test_the_size_limit_can_be_raised_or_lowered(files, capsys, monkeypatch) -> None:
    assert main(["--max-input-size", "100", "inspect", files["g"]]) == 2
    assert "larger than the 100 bytes" in capsys.readouterr().err
    assert "SHARDPLAN_MAX_INPUT_BYTES" not in os.environ  # restored after the command
    monkeypatch.setenv("SHARDPLAN_MAX_INPUT_BYTES", "100")
    assert main(["inspect", files["g"]]) == 2
    assert main(["--max-input-size", "1MiB", "inspect", files["g"]]) == 0


def test_export_against_a_larger_topology_is_a_note(files, tmp_path, capsys) -> None:
    out = str(tmp_path / "trace.json")
    assert main(["export", files["p"], files["g"], files["t4"], "--to", "chrome-trace",
                 "-o", out]) == 0
    err = capsys.readouterr().err
    assert "shardplan: note: the plan uses 2 of the 4 devices" in err
    assert main(["export", files["p"], files["g"], files["t"], "--to", "chrome-trace",
                 "-o", out]) == 0
    assert "devices" not in capsys.readouterr().err
