"""``shardplan map``: the command writes a valid mapped plan that ``shardplan cost`` agrees
with, and fails in one line on bad input."""

from __future__ import annotations

import json

import pytest

from shardplan.ir import load_plan, save
from tests.helpers import run_cli
from tests.mapping.test_optimal import make_instance


@pytest.fixture
def files(tmp_path):
    graph, topo, plan = make_instance(4, 3, 2, 6)
    for obj, name in ((plan, "plan.json"), (graph, "g.json"), (topo, "t.json")):
        save(obj, tmp_path / name)
    return [str(tmp_path / n) for n in ("plan.json", "g.json", "t.json")]


@pytest.mark.parametrize("algorithm", ["optimal", "consecutive"])
@pytest.mark.parametrize("model", ["overlap", "p2p", "allreduce"])
def test_map_then_cost(files, tmp_path, capsys, algorithm, model):
    out = tmp_path / "mapped.json"
    assert run_cli(["map", *files, "--algorithm", algorithm, "--model", model,
                    "-o", str(out)]) == 0
    assert "wrote plan" in capsys.readouterr().out
    plan = load_plan(out)
    assert plan.algorithm == algorithm
    assert plan.objective.name == f"max_stage_seconds_{model}"
    assert run_cli(["cost", str(out), *files[1:], "--objective", "max-stage", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["value"] == pytest.approx(plan.objective.value, rel=1e-12)


def test_map_json_and_auto_model(files, capsys):
    assert run_cli(["map", *files, "--algorithm", "optimal", "--json", "--seed", "3",
                    "--time-limit", "30"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "shardplan.plan/1" and data["seed"] == 3
    assert data["options"]["model"] == "overlap"  # auto: the simulator's view
    assert data["mapped_from"]["algorithm"] == "test"
    # the simulator judged the optimum against the consecutive mapping
    judge = data["judge"]
    assert judge["kept"] in ("optimal", "consecutive")
    if judge["kept"] == "optimal":
        assert data["status"] == "optimal"
        assert judge["simulated_seconds"] <= judge["consecutive_simulated_seconds"]
    else:
        assert data["status"] == "feasible"
        assert judge["consecutive_simulated_seconds"] < judge["simulated_seconds"]


def test_map_flag_overrides_the_plan_setting_with_a_note(files, capsys):
    assert run_cli(["map", *files, "--algorithm", "consecutive", "--json",
                    "--microbatches", "3"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["execution"]["microbatches"] == 3
    assert "shardplan: note: microbatches 3 overrides the plan's 8" in out.err


@pytest.mark.parametrize("extra, message", [
    (["--algorithm", "nope", "--json"], "unknown map algorithm"),
    (["--algorithm", "optimal"], "-o FILE or --json"),
    (["--algorithm", "consecutive", "--json", "--workers", "2"], "does not take option"),
])
def test_map_errors(files, capsys, extra, message):
    assert run_cli(["map", *files, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardplan: error:") and message in err and err.count("\n") == 1


def test_map_respects_device_memory_and_refuses_when_nothing_fits(tmp_path, capsys):
    import numpy as np

    from shardplan.ir import Device, Topology

    graph, topo, plan = make_instance(4, 2, 1, 4)
    need = float(graph.param_bytes.max()) * 4  # params, gradients and Adam state of a node
    small = tuple(Device(f"d{i}", 1.0 if i < 2 else 1e15, d.flops)
                  for i, d in enumerate(topo.devices))
    for name, devices in (("part", small), ("none", tuple(
            Device(d.name, 1.0, d.flops) for d in topo.devices))):
        t = Topology(name="t", devices=devices, bandwidth=topo.bandwidth,
                     latency=topo.latency)
        for obj, fname in ((plan, "plan.json"), (graph, "g.json"), (t, f"{name}.json")):
            save(obj, tmp_path / fname)
        args = ["map", str(tmp_path / "plan.json"), str(tmp_path / "g.json"),
                str(tmp_path / f"{name}.json"), "--algorithm", "optimal", "--json"]
        if name == "part":
            assert need > 1.0
            assert run_cli(args) == 0
            data = json.loads(capsys.readouterr().out)
            used = np.array([d for st in data["stages"] for d in st["devices"]])
            assert set(used.tolist()) <= {2, 3}  # devices 0 and 1 have 1 byte of memory
        else:
            assert run_cli(args) == 2
            err = capsys.readouterr().err
            assert err.startswith("shardplan: error: optimal: no mapping fits in device "
                                  "memory") and err.count("\n") == 1


def test_map_onto_devices_that_cannot_talk_exits_2(tmp_path, capsys):
    import numpy as np

    from shardplan.ir import Topology

    graph, topo, plan = make_instance(4, 3, 1, 3)
    assert graph.edge_bytes.sum() > 0
    t = Topology(name="t", devices=topo.devices, bandwidth=np.zeros((3, 3)),
                 latency=np.zeros((3, 3)))
    for obj, fname in ((plan, "plan.json"), (graph, "g.json"), (t, "t.json")):
        save(obj, tmp_path / fname)
    assert run_cli(["map", *(str(tmp_path / f) for f in ("plan.json", "g.json", "t.json")),
                    "--algorithm", "optimal", "--json"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach" in err and err.count("\n") == 1
