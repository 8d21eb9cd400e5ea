"""``shardplan train`` on every plan kind (issue #16): strategy plans from ``shardplan
strategy`` run with DTensor and equal ``--baseline single``; plans the runtime cannot lay out
are refused in one line before any process starts."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("torch")

from helpers import run_cli  # noqa: E402

from shardplan.ir import load_graph, load_plan, save  # noqa: E402
from shardplan.runtime import contiguous_plan  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("plans")
    g, t2, t4 = str(d / "g.json"), str(d / "t2.json"), str(d / "t4.json")
    assert run_cli(["capture", "mlp", "--batch-size", "12", "-o", g]) == 0
    assert run_cli(["topology", "flat", "--devices", "2", "-o", t2]) == 0
    assert run_cli(["topology", "flat", "--devices", "4", "-o", t4]) == 0
    s = str(d / "s.json")
    assert run_cli(["strategy", g, "--devices", "2", "--algorithm", "data-parallel",
                    "--cutoff", "1", "--quiet", "-o", s]) == 0
    graph = load_graph(g)
    plan = load_plan(s)
    # A split of 3 on 4 devices: the 2 x 2 mesh has no axis of 3.
    three = dict(plan.strategy)
    three["0"] = (3, 1, 1)
    p3 = str(d / "three.json")
    save(replace(plan, stages=(replace(plan.stages[0], devices=(0, 1, 2, 3)),),
                 strategy=three), p3)
    short = dict(plan.strategy)
    short["1"] = (2,)
    ps = str(d / "short.json")
    save(replace(plan, strategy=short), ps)
    # A hybrid whose stages differ in device count.
    pipe = contiguous_plan(graph, 2, 1)
    uneven = replace(pipe, stages=(replace(pipe.stages[0], devices=(0,)),
                                   replace(pipe.stages[1], devices=(1, 2))),
                     strategy={str(v): (1,) * len(plan.strategy[str(v)])
                               for v in range(graph.num_nodes)})
    pu = str(d / "uneven.json")
    save(uneven, pu)
    return {"graph": g, "t2": t2, "t4": t4, "strategy": s, "three": p3, "short": ps,
            "uneven": pu}


@pytest.fixture
def no_spawn(monkeypatch):
    import shardplan.runtime._launch as launch

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch, "run_ranks", refuse)


@pytest.mark.parametrize("plan,topo,message", [
    ("short", "t2", "has 1 factors, its space 2 dimensions"),
    ("uneven", "t4", "every stage needs the same number of devices"),
])
def test_plans_the_runtime_cannot_lay_out_are_one_line(files, capsys, no_spawn, plan, topo,
                                                       message) -> None:
    code = run_cli(["train", files[plan], files["graph"], files[topo], "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("shardplan: error: ")
    assert message in err


def test_a_split_the_mesh_cannot_make_is_noted(files) -> None:
    """PaSE may leave a device idle (a split of 3 on 4 devices); the 2 x 2 mesh runs that
    layer unsplit and says so before the run."""
    from shardplan.cli.main import build_parser
    from shardplan.runtime._args import config_from_args

    args = build_parser().parse_args(["train", files["three"], files["graph"], files["t4"],
                                      "--steps", "1"])
    prepared = config_from_args(args)
    assert prepared.config.kind == "strategy" and prepared.config.mesh_shape == (2, 2)
    assert any("linear [3, 1, 1] -> [1, 1, 1]" in n for n in prepared.notes)


@pytest.mark.multiprocess
def test_strategy_plan_trains_like_one_process(files, capsys) -> None:
    base = ["train", files["strategy"], files["graph"], files["t2"], "--steps", "2",
            "--microbatches", "2", "--json"]
    assert run_cli(base) == 0
    cap = capsys.readouterr()
    run = json.loads(cap.out)
    assert cap.err.strip() == "shardplan: note: microbatches 2 overrides the plan's 8"
    assert run_cli([*base, "--baseline", "single"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert run["kind"] == "strategy" and run["processes"] == 2 and run["mesh"] == [2]
    assert run["reshards"] == 0 and run["replicated"] == []
    assert single["kind"] == "single" and run["settings"] == single["settings"]
    assert run["losses"] == pytest.approx(single["losses"], rel=1e-6)


@pytest.mark.parametrize("algorithm", ["heuristic", "brute-force", "hierarchical"])
def test_sharding_partitions_are_accepted_by_train(files, tmp_path, capsys, algorithm) -> None:
    """Paper 000's partitioners make acyclic plans by default: ``train`` accepts them as
    GPipe pipelines of one device per stage (checked up to the start of the processes)."""
    from shardplan.cli.main import build_parser
    from shardplan.runtime._args import config_from_args

    plan = str(tmp_path / "p.json")
    argv = ["partition", files["graph"], files["t2"], "--algorithm", algorithm, "-o", plan]
    if algorithm == "brute-force":
        argv += ["--time-limit", "20"]
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "acyclic (a pipeline runs it); without the constraint" in out
    args = build_parser().parse_args(["train", plan, files["graph"], files["t2"],
                                      "--steps", "1"])
    cfg = config_from_args(args).config
    assert cfg.kind == "pipeline" and cfg.schedule == "gpipe" and cfg.world_size == 2
