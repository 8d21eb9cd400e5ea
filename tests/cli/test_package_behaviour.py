"""The package behaves like one: missing extras, one version, py.typed, plug-in algorithms,
logging flags, short reprs, TOML config files and plans that record their inputs."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest

import shardplan
from shardplan import registry
from shardplan.generate import layered
from shardplan.ir import Graph, Objective, Plan, Stage, save
from shardplan.topology import build
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    g = Graph.from_arrays(name="chain", fwd_flops=np.full(4, 1e9), src=[0, 1, 2], dst=[1, 2, 3],
                          output_bytes=np.full(4, 1000), param_bytes=np.full(4, 400))
    topo = build("flat", num_devices=2)
    plan = Plan("chain", topo.name, "hand", (Stage((0, 1), (0,)), Stage((2, 3), (1,))),
                Objective("x", 0.0))
    out = []
    for obj, name in ((plan, "plan.json"), (g, "graph.json"), (topo, "topo.json")):
        save(obj, tmp_path / name)
        out.append(str(tmp_path / name))
    return out


@pytest.mark.parametrize("module, extra, argv", [
    ("matplotlib", "plot", ["simulate", "{plan}", "{graph}", "{topo}", "--timeline", "{png}"]),
    ("matplotlib", "plot", ["report", "{plan}", "{graph}", "{topo}", "-o", "{html}"]),
    ("torch", "torch", ["capture", "mlp", "-o", "{out}"]),
])
def test_missing_extra_is_one_line(module: str, extra: str, argv: list[str], files: list[str],
                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    for name in list(sys.modules):  # as if the package were not installed
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    for name in [n for n in sys.modules if n.startswith(("shardplan.report",
                                                          "shardplan.capture"))]:
        monkeypatch.delitem(sys.modules, name)
    fill = {"plan": files[0], "graph": files[1], "topo": files[2],
            "png": str(tmp_path / "t.png"), "html": str(tmp_path / "r.html"),
            "out": str(tmp_path / "g.json")}
    assert run_cli([a.format(**fill) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"needs {module}" in err and f"pip install 'shardplan[{extra}]'" in err


def test_one_version_py_typed_no_highspy() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "shardplan.__version__"}
    assert (ROOT / "shardplan" / "py.typed").exists()
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["shardplan"]
    assert not any(d.startswith("highspy") for d in project["dependencies"])
    assert not any("highspy" in p.read_text() for p in (ROOT / "shardplan").rglob("*.py"))


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"shardplan {shardplan.__version__}"


def test_plug_in_algorithm_from_an_entry_point(tmp_path: Path, files: list[str],
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "fake_plugin.py").write_text(
        "from shardplan import registry\n"
        "from shardplan.ir import Objective, Plan, Stage\n"
        "def one_stage(graph, topology, *, options, seed, time_limit, progress=None):\n"
        "    plan = Plan(graph.name, topology.name, 'fake-one-stage',\n"
        "                (Stage(tuple(range(graph.num_nodes)), (0,)),), Objective('x', 1.0))\n"
        "    return registry.Result(plan)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.available("partition")  # the built-in algorithms registered, then a copy
    eps = [EntryPoint("partition.fake-one-stage", "fake_plugin:one_stage",
                      registry.ENTRY_POINT_GROUP),
           EntryPoint("broken", "no_such_module_here", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group=None: [e for e in eps if e.group == group])
    monkeypatch.setattr(registry, "_REGISTRY", {f: dict(v) for f, v in
                                                registry._REGISTRY.items()})
    monkeypatch.setattr(registry, "_loaded", False)
    with pytest.warns(shardplan.errors.ShardplanWarning, match="'broken'"):
        assert "fake-one-stage" in registry.available("partition")
    assert "parmesan" in registry.available("partition")
    monkeypatch.setattr(registry, "_loaded", True)
    assert run_cli(["partition", "--help"]) == 0
    assert "fake-one-stage" in capsys.readouterr().out.replace("\n", " ")
    out = tmp_path / "p.json"
    assert run_cli(["partition", files[1], files[2], "--algorithm", "fake-one-stage", "-o",
                    str(out)]) == 0
    assert json.loads(out.read_text())["algorithm"] == "fake-one-stage"


def test_verbose_and_quiet(files: list[str], tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "p.json")
    try:
        assert run_cli(["-v", "partition", files[1], files[2], "--algorithm", "uniform",
                        "--stages", "2", "-o", out]) == 0
        err = capsys.readouterr().err
        assert "shardplan: INFO: partition uniform: graph chain" in err
        assert run_cli(["simulate", files[0], files[1], files[2], "--microbatches", "3"]) == 0
        assert "shardplan: note: microbatches 3 overrides" in capsys.readouterr().err
        assert run_cli(["-q", "simulate", files[0], files[1], files[2], "--microbatches",
                        "3"]) == 0
        assert capsys.readouterr().err == ""
    finally:
        run_cli(["inspect", files[1]])  # leave the logger at its default level
    assert logging.getLogger("shardplan").level == logging.WARNING


def test_short_reprs() -> None:
    g = layered(1001, seed=0)
    topo = build("flat", num_devices=64)
    plan = Plan(g.name, topo.name, "hand", (Stage(tuple(range(1001)), (0,)),),
                Objective("max_stage_seconds", 1.5))
    for obj in (g, topo, plan):
        assert len(repr(obj)) < 200, repr(obj)
    assert repr(g).startswith("Graph(name=") and "nodes=1001" in repr(g)
    assert "stages=1" in repr(plan) and "devices=64" in repr(topo)
    assert g._repr_html_().startswith("<table>") and "1001" in g._repr_html_()
    html = plan._repr_html_()
    assert html.count("<tr>") == 2 and "... (1001)" in html


def test_config_file(files: list[str], tmp_path: Path,
                     capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("microbatches = 5\nrecompute = true\n[partition]\nseed = 7\n"
                    "time-limit = 30\n")
    out = tmp_path / "p.json"
    assert run_cli(["--config", str(conf), "partition", files[1], files[2], "--algorithm",
                    "heuristic", "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["seed"] == 7 and plan["execution"]["microbatches"] == 5
    assert plan["execution"]["recompute"] == "full"  # true: plain --recompute
    assert run_cli(["--config", str(conf), "partition", files[1], files[2], "--algorithm",
                    "heuristic", "--seed", "2", "--microbatches", "3", "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["seed"] == 2 and plan["execution"]["microbatches"] == 3  # flags win
    # top-level keys reach every command that has the option, and no other
    assert run_cli(["--config", str(conf), "inspect", files[1]]) == 0
    capsys.readouterr()
    for text, match in (("bogus = 1\n", "no command has an option 'bogus'"),
                        ("[partition]\nschedule_out = 'x'\n", "[partition] has no option"),
                        ("[nosuch]\nx = 1\n", "[nosuch] is not a command"),
                        ("microbatches = 'many'\n", "microbatches"),
                        ("recompute = 3\n", "argument --recompute: invalid choice"),
                        ("overlap = 3\n", "switch"),
                        ("x = \n", "not valid TOML")):
        conf.write_text(text)
        assert run_cli(["--config", str(conf), "partition", files[1], files[2],
                        "--algorithm", "uniform", "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err, err


def test_plans_record_version_and_inputs(files: list[str], tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    assert run_cli(["partition", files[1], files[2], "--algorithm", "uniform", "--stages", "2",
                    "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["shardplan_version"] == shardplan.__version__
    want = {f: hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files[1:]}
    assert plan["inputs"] == want
    mapped = tmp_path / "m.json"
    assert run_cli(["map", str(out), files[1], files[2], "--algorithm", "consecutive", "-o",
                    str(mapped)]) == 0
    again = json.loads(mapped.read_text())
    assert set(again["inputs"]) == {str(out), *files[1:]}
    assert again["inputs"][str(out)] == hashlib.sha256(out.read_bytes()).hexdigest()
