"""Bad input: one line on stderr, exit status 2, never a traceback, nothing half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from shardplan.cli.main import main
from shardplan.ir import Graph, save


def _write(path: Path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def _graph_dict(**change):
    d = {"format": "shardplan.graph/1", "name": "g", "batch_size": 1,
         "nodes": [{"id": 0, "fwd_flops": 1.0}, {"id": 1, "fwd_flops": 2.0}],
         "edges": [{"src": 0, "dst": 1, "bytes": 4}]}
    d.update(change)
    return d


def _topo_dict(**change):
    d = {"format": "shardplan.topology/1", "name": "t",
         "devices": [{"name": "a", "memory_bytes": 1e9, "flops": 1e12},
                     {"name": "b", "memory_bytes": 1e9, "flops": 1e12}],
         "bandwidth": [[0, 1e9], [1e9, 0]], "latency": [[0, 1e-5], [1e-5, 0]]}
    d.update(change)
    return d


CASES = {
    "missing file": lambda t: ["inspect", str(t / "nope.json")],
    "invalid json": lambda t: ["inspect", _write(t / "x.json", "{oops")],
    "unknown format": lambda t: ["inspect", _write(t / "x.json", {"format": "x/9"})],
    "graph cycle": lambda t: ["inspect", _write(t / "x.json", _graph_dict(
        edges=[{"src": 0, "dst": 1}, {"src": 1, "dst": 0}]))],
    "dangling edge": lambda t: ["inspect", _write(t / "x.json", _graph_dict(
        edges=[{"src": 0, "dst": 7}]))],
    "negative size": lambda t: ["inspect", _write(t / "x.json", _graph_dict(
        nodes=[{"id": 0, "param_bytes": -3}]))],
    "non-square matrix": lambda t: ["inspect", _write(t / "x.json", _topo_dict(
        bandwidth=[[0, 1e9, 1], [1e9, 0, 1]]))],
    "matrix size mismatch": lambda t: ["inspect", _write(t / "x.json", _topo_dict(
        latency=[[0.0]]))],
    "plan node twice": lambda t: ["inspect", _write(t / "x.json", {
        "format": "shardplan.plan/1", "stages": [{"nodes": [0], "devices": [0]},
                                                 {"nodes": [0], "devices": [1]}],
        "objective": {"name": "x", "value": 1.0}, "status": "optimal"})],
    "plan bad status": lambda t: ["inspect", _write(t / "x.json", {
        "format": "shardplan.plan/1", "stages": [{"nodes": [0], "devices": [0]}],
        "objective": {"name": "x", "value": 1.0}, "status": "great"})],
    "plan misses nodes of its graph": lambda t: ["inspect", _write(t / "p.json", {
        "format": "shardplan.plan/1", "stages": [{"nodes": [0], "devices": [0]}],
        "objective": {"name": "x", "value": 1.0}}), "--graph", _write(t / "g.json",
                                                                    _graph_dict())],
    "devices on a topology": lambda t: ["inspect", _write(t / "x.json", _topo_dict()),
                                        "--devices", "4"],
    "devices zero": lambda t: ["inspect", _write(t / "x.json", _graph_dict()), "--devices", "0"],
    "unknown command": lambda t: ["frobnicate"],
    "output cannot be written": lambda t: ["generate", "chain", "-o", "/proc/nope/g.json"],
    "unknown option": lambda t: ["inspect", "--colour", "x.json"],
    "unknown algorithm": lambda t: ["partition", "g.json", "t.json", "--algorithm", "x"],
    "unknown model": lambda t: ["capture", "nosuchmodel", "-o", str(t / "out.json")],
    "unknown torchvision model": lambda t: ["capture", "torchvision:resnet9000",
                                            "-o", str(t / "out.json")],
    "model file missing": lambda t: ["capture", str(t / "missing.py") + ":build",
                                     "-o", str(t / "out.json")],
    "generate zero nodes": lambda t: ["generate", "layered", "--nodes", "0",
                                      "-o", str(t / "out.json")],
    "generate unknown kind": lambda t: ["generate", "spiral", "-o", str(t / "out.json")],
    "topology unknown kind": lambda t: ["topology", "hypercube", "-o", str(t / "out.json")],
    "topology zero boxes": lambda t: ["topology", "dgx1", "--boxes", "0",
                                      "-o", str(t / "out.json")],
    "topology shape does not fit kind": lambda t: ["topology", "mesh3d", "--shape", "4x4",
                                                   "-o", str(t / "out.json")],
    "hierarchical levels mismatch": lambda t: ["topology", "hierarchical", "--shape", "2x4",
                                               "--bandwidth", "1e9,1e10,1e11",
                                               "-o", str(t / "out.json")],
    "measure zero processes": lambda t: ["topology", "measure", "--nproc", "0",
                                         "-o", str(t / "out.json")],
    "pipedream malformed": lambda t: ["import", "pipedream", _write(t / "p.txt", "garbage\n"),
                                      "-o", str(t / "out.json")],
    "no output given": lambda t: ["generate", "chain", "--nodes", "3"],
    # issue 13 items 9-10: tracebacks and endless runs, now refused up front
    "json nested 100000 deep": lambda t: ["inspect", _write(t / "x.json",
                                                           "[" * 100_000 + "]" * 100_000)],
    "integer of 5000 digits": lambda t: ["inspect", _write(
        t / "x.json", '{"format": "shardplan.graph/1", "batch_size": ' + "9" * 5000 + "}")],
    "tables nested 100000 deep": lambda t: ["strategy", "--import-tables",
                                            _write(t / "x.json", "[" * 100_000), "--json"],
    "strategy on 10^12 devices": lambda t: ["strategy", _write(t / "g.json", _graph_dict()),
                                            "--devices", "1000000000000", "-o",
                                            str(t / "out.json")],
    "strategy of the wrong length": lambda t: [
        "cost", _write(t / "p.json", {
            "format": "shardplan.plan/1", "stages": [{"nodes": [0, 1], "devices": [0]}],
            "objective": {"name": "pase_cost", "value": 1.0}, "options": {"devices": 1},
            "strategy": {"0": [1, 1], "1": [1]}}),
        _write(t / "g.json", _graph_dict()), _write(t / "t.json", _topo_dict()),
        "--objective", "strategy"],
    "space dimension beyond 2^53": lambda t: ["strategy", _write(t / "g.json", _graph_dict(
        nodes=[{"id": 0, "fwd_flops": 1.0, "space": {"kind": "elementwise",
                                                     "dims": [["b", 10**20]]}},
               {"id": 1, "fwd_flops": 2.0}])), "--devices", "4", "-o", str(t / "out.json")],
    "strategy of an empty graph": lambda t: ["strategy", _write(t / "g.json", _graph_dict(
        nodes=[], edges=[])), "--devices", "4", "-o", str(t / "out.json")],
    "all-infinite tables": lambda t: ["strategy", "--import-tables", _write(t / "x.json", {
        "format": "shardplan.pase-tables/1", "devices": 2,
        "nodes": [{"id": 0, "configs": [[1], [2]], "cost": [None, None]},
                  {"id": 1, "configs": [[1]], "cost": [1.0]}],
        "edges": [{"src": 0, "dst": 1, "cost": [[None], [None]]}]}), "-o",
        str(t / "out.json")],
    "topology flat of 10^7 devices": lambda t: ["topology", "flat", "--devices", "10000000",
                                                "-o", str(t / "out.json")],
    "topology hierarchical 10^4x10^4": lambda t: ["topology", "hierarchical", "--shape",
                                                  "10000x10000", "-o", str(t / "out.json")],
    "topology torus3d of 10^9 devices": lambda t: ["topology", "torus3d", "--shape",
                                                   "1000x1000x1000", "-o", str(t / "out.json")],
    "generate random-dag of 10^9 nodes": lambda t: ["generate", "random-dag", "--nodes",
                                                    "1000000000", "-o", str(t / "out.json")],
    "generate random-dag of 5e9 edges": lambda t: ["generate", "random-dag", "--nodes",
                                                   "100000", "--edge-probability", "1",
                                                   "-o", str(t / "out.json")],
    # Numbers a JSON parser accepts but a graph cannot hold (null stays "not measured").
    "literal NaN fwd_seconds": lambda t: ["inspect", _write(t / "x.json", _graph_dict(
        nodes=[{"id": 0, "fwd_flops": 1.0, "fwd_seconds": float("nan")},
               {"id": 1, "fwd_flops": 2.0}]))],
    "infinite memory_bytes": lambda t: ["inspect", _write(t / "x.json", _graph_dict(
        nodes=[{"id": 0, "fwd_flops": 1.0, "memory_bytes": float("inf")},
               {"id": 1, "fwd_flops": 2.0}]))],
    "1e30 parameter bytes": lambda t: ["inspect", _write(t / "x.json", _graph_dict(
        nodes=[{"id": 0, "fwd_flops": 1.0, "param_bytes": 1e30}, {"id": 1}]))],
    "1e30 edge bytes": lambda t: ["inspect", _write(t / "x.json", _graph_dict(
        edges=[{"src": 0, "dst": 1, "bytes": 10**30}]))],
    "strategy with a wrong factor count": lambda t: _strategy_case(t, "count"),
    "strategy with a configuration not allowed": lambda t: _strategy_case(t, "config"),
    "option typo in partition": lambda t: ["partition", *_pair(t), "--algorithm", "heuristic",
                                           "--option", "efficency=0.5", "-o",
                                           str(t / "out.json")],
    "option typo in map": lambda t: ["map", _pipeline_plan(t), *_pair(t), "--algorithm",
                                     "optimal", "--option", "efficency=0.5", "-o",
                                     str(t / "out.json")],
    "option typo in cost": lambda t: ["cost", _pipeline_plan(t), *_pair(t), "--objective",
                                      "max-stage", "--option", "efficency=0.5"],
    "option typo in cost of a sharding plan": lambda t: [
        "cost", _sharding_plan(t), *_pair(t), "--objective", "max-stage", "--option",
        "efficency=0.5"],
    # Three nodes that all exchange data, on three devices of which 0 and 1 have no link.
    "devices that cannot reach each other": lambda t: [
        "partition", _write(t / "g3.json", _graph_dict(
            nodes=[{"id": i, "fwd_flops": 1.0} for i in range(3)],
            edges=[{"src": 0, "dst": 1}, {"src": 0, "dst": 2}, {"src": 1, "dst": 2}])),
        _write(t / "hole.json", _topo_dict(
            devices=[{"name": n, "memory_bytes": 1e9, "flops": 1e12} for n in "abc"],
            bandwidth=[[0, 0, 1e9], [0, 0, 1e9], [1e9, 1e9, 0]],
            latency=[[0, 1e-5, 1e-5], [1e-5, 0, 1e-5], [1e-5, 1e-5, 0]])),
        "--algorithm", "heuristic", "-o", str(t / "out.json")],
    "model file calls sys.exit": lambda t: ["capture", _write(t / "m.py", "import sys\n"
                                                              "sys.exit(3)\n") + ":build",
                                            "-o", str(t / "out.json")],
    "model function calls sys.exit": lambda t: [
        "capture", _write(t / "m.py", "import sys\ndef build():\n    sys.exit(3)\n") + ":build",
        "-o", str(t / "out.json")],
}


def _pair(t: Path) -> list[str]:
    """A 2-node graph and a 2-device topology."""
    return [_write(t / "g.json", _graph_dict()), _write(t / "t.json", _topo_dict())]


def _pipeline_plan(t: Path) -> str:
    from shardplan import registry
    from shardplan.ir import load_graph, load_topology

    g, topo = (load_graph(p) if i == 0 else load_topology(p) for i, p in enumerate(_pair(t)))
    save(registry.run("partition", "uniform", g, topo, stages=2).plan, t / "p.json")
    return str(t / "p.json")


def _sharding_plan(t: Path) -> str:
    """A plan whose objective is not a max-stage view (paper 000's sharding cost)."""
    from shardplan import registry
    from shardplan.ir import load_graph, load_topology

    g, topo = (load_graph(p) if i == 0 else load_topology(p) for i, p in enumerate(_pair(t)))
    save(registry.run("partition", "heuristic", g, topo).plan, t / "p.json")
    return str(t / "p.json")


def _strategy_case(t: Path, kind: str) -> list[str]:
    """``inspect`` of a PaSE plan whose strategy was edited: a node given one factor too
    many, or a configuration the search would never allow (a split above the devices)."""
    import dataclasses

    from shardplan import registry
    from shardplan.generate import generate
    from shardplan.topology import build

    graph, topo = generate("alexnet", batch_size=8), build("flat", num_devices=4)
    plan = registry.run("strategy", "pase", graph, topo).plan
    strategy = dict(plan.strategy)
    factors = strategy["0"]
    strategy["0"] = (*factors, 1) if kind == "count" else (64, *factors[1:])
    save(dataclasses.replace(plan, strategy=strategy), t / "p.json")
    save(graph, t / "g.json")
    save(topo, t / "t.json")
    return ["inspect", str(t / "p.json"), "--graph", str(t / "g.json"), "--topology",
            str(t / "t.json")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(case: str, tmp_path: Path, capsys) -> None:
    argv = CASES[case](tmp_path)
    with pytest.raises(SystemExit) as exc_info, warnings.catch_warnings():
        warnings.simplefilter("error")  # a NumPy warning on the way is a failure too
        sys.exit(main(argv))
    assert exc_info.value.code == 2, case
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{case}: {err!r}"
    assert lines[0].startswith("shardplan: error: "), lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "out.json").exists()


def test_subprocess_error_has_no_traceback(tmp_path: Path) -> None:
    bad = _write(tmp_path / "x.json", _graph_dict(edges=[{"src": 0, "dst": 1},
                                                         {"src": 1, "dst": 0}]))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "shardplan", "inspect", bad],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "cycle" in proc.stderr
    assert proc.stdout == ""


def test_inspect_summarises_each_kind(tmp_path: Path, capsys, diamond: Graph) -> None:
    save(diamond, tmp_path / "g.json")
    assert main(["inspect", str(tmp_path / "g.json"), "--json", "--devices", "2"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["kind"] == "graph" and s["nodes"] == 4 and s["param_bytes"] == 28
    assert s["lower_bounds_flops"]["2"]["bound"] == pytest.approx(15.0)
    topo = _write(tmp_path / "t.json", _topo_dict())
    assert main(["inspect", topo, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["devices"] == 2 and s["bandwidth_classes"] == [{"bandwidth": 1e9, "pairs": 2}]
    plan = _write(tmp_path / "p.json", {
        "format": "shardplan.plan/1", "graph": "diamond",
        "stages": [{"nodes": [0, 1], "devices": [0]}, {"nodes": [2, 3], "devices": [1]}],
        "objective": {"name": "x", "value": 1.0}, "status": "feasible"})
    assert main(["inspect", plan, "--graph", str(tmp_path / "g.json"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["stages"] == 2 and s["stage_graph_acyclic"] is True
    assert s["inter_stage_bytes"] == 20 + 30
    assert main(["inspect", plan]) == 0  # the rich table
    assert "plan" in capsys.readouterr().out


def test_null_measurements_stay_allowed(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path / "x.json", _graph_dict(
        nodes=[{"id": 0, "fwd_flops": 1.0, "fwd_seconds": None, "memory_bytes": 5.0},
               {"id": 1, "fwd_flops": 2.0, "fwd_seconds": 0.5}]))
    assert main(["inspect", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured_seconds"] is True


def test_inspect_reports_a_valid_strategy_cost(tmp_path: Path, capsys) -> None:
    from shardplan import registry
    from shardplan.generate import generate
    from shardplan.topology import build

    graph, topo = generate("alexnet", batch_size=8), build("flat", num_devices=4)
    plan = registry.run("strategy", "pase", graph, topo).plan
    for obj, name in ((plan, "p"), (graph, "g"), (topo, "t")):
        save(obj, tmp_path / f"{name}.json")
    assert main(["inspect", str(tmp_path / "p.json"), "--graph", str(tmp_path / "g.json"),
                 "--topology", str(tmp_path / "t.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy_value"] == pytest.approx(plan.objective.value)


def test_disconnected_topology_is_a_note_and_a_plan(tmp_path: Path, capsys) -> None:
    topo = _write(tmp_path / "t.json", _topo_dict(
        devices=[{"name": n, "memory_bytes": 1e9, "flops": 1e12} for n in "abc"],
        bandwidth=[[0, 1e9, 0], [1e9, 0, 0], [0, 0, 0]],
        latency=[[0, 1e-5, 0], [1e-5, 0, 0], [0, 0, 0]]))
    graph = _write(tmp_path / "g.json", _graph_dict())
    assert main(["partition", graph, topo, "--algorithm", "heuristic", "--workers", "1",
                 "--json"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardplan: note: ") and "0-1" in lines[0]
    plan = json.loads(captured.out)
    assert sorted(d for st in plan["stages"] for d in st["devices"]) == [0, 1]


@pytest.mark.torch
def test_failing_trace_prints_one_line(tmp_path: Path) -> None:
    model = _write(tmp_path / "m.py", "import torch\n"
                   "class M(torch.nn.Module):\n"
                   "    def forward(self, x):\n"
                   "        return x * 2 if x.sum() > 0 else x - 1\n"
                   "def build():\n"
                   "    return M(), (torch.randn(4, 3),)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "shardplan", "capture", f"{model}:build",
                           "-o", str(tmp_path / "out.json")], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardplan: error: torch.export"), \
        proc.stderr
    assert not (tmp_path / "out.json").exists()
