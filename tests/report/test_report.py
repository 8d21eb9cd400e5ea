"""Pictures, the HTML report and the simulate/report commands on small hand-built plans."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest

from shardplan.ir import Graph, Objective, Plan, Stage, load_topology, save
from shardplan.report import bandwidth_png, graph_png, timeline_png, write_report
from shardplan.simulate import load_schedule, simulate
from shardplan.topology import build
from tests.helpers import run_cli

PNG = b"\x89PNG\r\n\x1a\n"


def _graph(n: int) -> Graph:
    rng = np.random.default_rng(0)
    src = list(range(n - 1)) + [0, 2]
    dst = list(range(1, n)) + [3, n - 1]
    return Graph.from_arrays(name="toy", fwd_flops=rng.uniform(1e11, 1e12, n), src=src,
                             dst=dst, output_bytes=rng.integers(1e6, 3e7, n),
                             param_bytes=rng.integers(0, 4e7, n))


def _plan(n: int, s: int, r: int) -> Plan:
    parts = np.array_split(np.arange(n), s)
    return Plan("toy", "dgx1-x2", "hand",
                tuple(Stage(tuple(map(int, p)), tuple(range(i * r, (i + 1) * r)))
                      for i, p in enumerate(parts)), Objective("max_stage_seconds", 1.0, 0.5))


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    g = _graph(12)
    topo = build("dgx1", boxes=2)
    paths = tmp_path / "plan.json", tmp_path / "graph.json", tmp_path / "topo.json"
    save(_plan(12, 4, 2), paths[0])
    save(g, paths[1])
    save(topo, paths[2])
    return paths


@pytest.mark.parametrize("n", [12, 90])  # operator drawing, stage drawing
def test_pictures_are_pngs(tmp_path: Path, n: int) -> None:
    g, plan, topo = _graph(n), _plan(n, 4, 2), build("dgx1", boxes=2)
    res = simulate(plan, g, topo, schedule="1f1b", num_microbatches=4)
    timeline_png(res, tmp_path / "t.png", topology=topo)
    drawer = graph_png(plan, g, tmp_path / "g.png", topo)
    bandwidth_png(topo, tmp_path / "b.png", plan, g)
    assert drawer in (("operators", "graphviz") if n <= 60 else ("stages",))
    for name in ("t", "g", "b"):
        data = (tmp_path / f"{name}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_report_is_self_contained(tmp_path: Path) -> None:
    g, plan, topo = _graph(12), _plan(12, 2, 4), build("dgx1", boxes=2)
    out = write_report(plan, g, topo, tmp_path / "r.html", png_dir=tmp_path / "png",
                       schedule="gpipe", num_microbatches=3)
    text = (tmp_path / "r.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 3
    assert all(base64.b64decode(im).startswith(PNG) for im in images)
    assert "src=\"http" not in text and "<script" not in text
    assert f"{out['iteration_seconds'] * 1e3:.4g} ms" in text
    assert sorted(Path(p).name for p in out["pngs"].values()) == ["bandwidth.png", "graph.png",
                                                                 "timeline.png"]


def test_simulate_cli(files: tuple[Path, Path, Path], tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    plan, graph, topo = map(str, files)
    sched = tmp_path / "s.txt"
    png = tmp_path / "t.png"
    assert run_cli(["simulate", plan, graph, topo, "--schedule", "gpipe", "--microbatches",
                    "3", "--json", "--schedule-out", str(sched), "--timeline", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("iteration_seconds", "throughput", "bubble_fraction"):
        assert isinstance(data[key], float) and data[key] > 0
    assert len(data["peak_memory_bytes"]) == 8
    assert data["plan_lower_bound"] == 0.5
    assert load_schedule(sched).name == "gpipe"
    # the CSV itself is what torch's _load_csv reads: no header, no REDUCE_GRAD
    assert not sched.read_text().startswith("#") and "REDUCE" not in sched.read_text()
    assert json.loads(Path(f"{sched}.meta.json").read_text())["name"] == "gpipe"
    assert png.read_bytes().startswith(PNG)
    # the schedule file runs the same schedule again
    assert run_cli(["simulate", plan, graph, topo, "--schedule-file", str(sched),
                    "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["iteration_seconds"] == pytest.approx(data["iteration_seconds"])
    assert run_cli(["simulate", plan, graph, topo, "--recompute"]) == 0
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0W0\n")
    assert "samples/s" in capsys.readouterr().out
    assert run_cli(["simulate", plan, graph, topo, "--schedule-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weight gradient before its input" in err


def test_report_cli(files: tuple[Path, Path, Path], tmp_path: Path,
                    capsys: pytest.CaptureFixture[str]) -> None:
    plan, graph, topo = map(str, files)
    out = tmp_path / "r.html"
    assert run_cli(["report", plan, graph, topo, "-o", str(out), "--schedule",
                    "interleaved-1f1b"]) == 0
    assert "wrote report" in capsys.readouterr().out
    assert out.read_text().count("data:image/png;base64,") == 3


def test_cli_errors(files: tuple[Path, Path, Path], tmp_path: Path,
                    capsys: pytest.CaptureFixture[str]) -> None:
    plan, graph, topo = map(str, files)
    bad = tmp_path / "bad.txt"
    bad.write_text("0F0,0B0,0REDUCE_GRAD\n")
    assert run_cli(["simulate", plan, graph, topo, "--schedule-file", str(bad)]) == 2
    assert "schedule has 1 stages, the plan 4" in capsys.readouterr().err
    assert run_cli(["simulate", plan, graph, topo, "--microbatches", "0"]) == 2
    assert "positive integer" in capsys.readouterr().err
    small = tmp_path / "small.json"
    save(load_topology(topo).replace(devices=load_topology(topo).devices[:4],
                                     bandwidth=np.ones((4, 4)), latency=np.zeros((4, 4)),
                                     levels=()), small)
    assert run_cli(["simulate", plan, graph, str(small)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardplan: error: stage 2 uses a device") and err.count("\n") == 1


@pytest.mark.parametrize("value, text", [("full", ", recompute full"),
                                         ("selective", ", recompute selective"),
                                         ("none", ""), (None, ""), (True, ", recompute full"),
                                         (False, "")])
def test_the_simulation_row_names_the_recompute_setting(value, text) -> None:
    from shardplan.report._html import _recompute_text

    assert _recompute_text(value) == text
