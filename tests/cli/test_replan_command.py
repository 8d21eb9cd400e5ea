"""``shardplan replan`` and ``simulate --failures`` (issue 48): the whole loop on a small
model (plan -> simulate --failures -> replan -> simulate the new plan), and the bad inputs
that end in one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardplan.ir import load_plan, save
from tests.cost.llm_graph import gpt_graph
from tests.helpers import hand_plan, run_cli

CLUSTER = "dgx-h100,nodes=2"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("replan")
    graph = d / "graph.json"
    save(gpt_graph(layers=2, hidden=32, seq=16, vocab=64), graph)
    plan = d / "plan.json"
    assert run_cli(["-q", "plan", str(graph), "--cluster", CLUSTER, "--families", "llm",
                    "--global-batch", "8", "--time-limit", "30", "-o", str(plan),
                    "--json"]) == 0
    topo = d / "topo.json"
    assert run_cli(["-q", "topology", "dgx-h100", "--nodes", "2", "-o", str(topo)]) == 0
    return {"dir": d, "graph": graph, "plan": plan, "topo": topo}


def test_plan_keeps_what_replan_reuses(files: dict[str, Path]) -> None:
    data = json.loads(files["plan"].read_text())
    ctx = data["replan"]
    assert ctx["format"] == "shardplan.replan/1" and ctx["global_batch"] == 8
    assert ctx["model_is_file"] and ctx["cluster"] == CLUSTER
    assert 1 <= len(ctx["candidates"]) <= 20
    assert load_plan(files["plan"]).parallel is not None  # still an ordinary plan


def test_replan_after_losing_a_node(files: dict[str, Path],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    d = files["dir"]
    capsys.readouterr()
    out, topo, moves = d / "new.json", d / "new-topo.json", d / "moves.csv"
    assert run_cli(["replan", str(files["plan"]), "--remove", "node1", "-o", str(out),
                    "--topology-out", str(topo), "--moves", str(moves), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    best = res["best"]
    assert res["cluster"]["after"]["devices"] == 8 and best["gpus"] <= 8
    assert all(best["iteration_seconds"] <= c["iteration_seconds"] for c in res["changes"])
    assert set(best["reshard"]["bytes_by_link"]) == {"nvlink", "network", "checkpoint"}
    assert res["search"]["priced"] > 0 and res["reused"]["first_search_layouts"] >= 1
    new = load_plan(out)
    assert new.parallel is not None and new.meta["replan"]["cluster"].endswith("new-topo.json")
    rows = moves.read_text().splitlines()
    assert rows[0].startswith("rank,device,old_rank") and len(rows) == best["gpus"] + 1
    # the new plan is an ordinary plan on its topology, and re-plans in turn
    assert run_cli(["simulate", str(out), str(files["graph"]), str(topo), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_seconds"] == pytest.approx(best["iteration_seconds"], rel=1e-9)
    assert run_cli(["replan", str(out), "--add-nodes", "1", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["cluster"]["added"][0].endswith("/gpu0")


def test_replan_text(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run_cli(["replan", str(files["plan"]), "--add-gpus", "8"]) == 0
    text = capsys.readouterr().out
    assert "best" in text and "same layout" in text and "reused:" in text


def test_simulate_failures(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    argv = ["simulate", str(files["plan"]), str(files["graph"]), str(files["topo"]),
            "--failures", "1e-3", "--checkpoint-interval", "30"]
    assert run_cli([*argv, "--json"]) == 0
    f = json.loads(capsys.readouterr().out)["failures"]
    assert 0 < f["goodput_without_replan"] <= f["goodput_with_replan"] <= 1
    assert f["replan"]["failed_node"] == "node1"
    assert f["assumed"]["restart"].startswith("a restart takes 10 min")
    assert run_cli([*argv, "--restart-minutes", "0", "--checkpoint-seconds", "0"]) == 0
    text = capsys.readouterr().out
    assert "goodput without re-planning" in text and "goodput with re-planning" in text
    assert run_cli(["simulate", str(files["plan"]), str(files["graph"]), str(files["topo"]),
                    "--failures", "0", "--checkpoint-interval", "30", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)["failures"]
    assert f["goodput_without_replan"] == f["goodput_with_replan"] == 1.0


def test_plan_ranks_by_goodput(files: dict[str, Path], capsys: pytest.CaptureFixture[str]
                               ) -> None:
    capsys.readouterr()
    assert run_cli(["-q", "plan", str(files["graph"]), "--cluster", CLUSTER, "--families",
                    "llm", "--global-batch", "8", "--time-limit", "30", "--failures", "1e-3",
                    "--checkpoint-interval", "30", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["failures"].startswith("ranked by expected seconds per useful step")
    notes = [r["note"] for r in res["ranked"][:5] if r["fits"]]
    assert notes and all("under failures" in n for n in notes)
    expected = [float(n.rsplit(": ", 1)[1].split(" s")[0]) for n in notes]
    assert expected == sorted(expected)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    capsys.readouterr()
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardplan: error: "), err
    return err[0]


def test_bad_inputs(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    plan = str(files["plan"])
    assert "no device or node of that name" in _error(
        capsys, ["replan", plan, "--remove", "node7/gpu0"])
    assert "nodes left to remove" in _error(capsys, ["replan", plan, "--remove-nodes", "3"])
    assert "leaves none" in _error(capsys, ["replan", plan, "--remove-gpus", "16"])
    assert "say what changed" in _error(capsys, ["replan", plan])
    assert "either as --cluster" in _error(
        capsys, ["replan", plan, "--cluster", "dgx-h100", "--remove", "node1"])
    assert "--topology-out" in _error(capsys, ["replan", plan, "--remove", "node1", "-o",
                                               str(files["dir"] / "x.json")])
    assert "one of this command's inputs" in _error(
        capsys, ["replan", plan, "--remove", "node1", "-o", plan, "--topology-out",
                 str(files["dir"] / "t.json")])
    other = files["dir"] / "hand.json"
    save(hand_plan([2], 4), other)
    assert "not an LLM plan" in _error(capsys, ["replan", str(other), "--remove-nodes", "1"])
    assert "not a checkpoint folder" in _error(
        capsys, ["replan", plan, "--remove", "node1", "--checkpoint", str(files["dir"])])
    sim = ["simulate", plan, str(files["graph"]), str(files["topo"])]
    assert "--checkpoint-interval" in _error(capsys, [*sim, "--failures", "1e-5"])
    assert "needs --failures" in _error(capsys, [*sim, "--checkpoint-interval", "30"])
    assert "llama3" in _error(capsys, [*sim, "--failures", "often",
                                       "--checkpoint-interval", "30"])
    assert "--checkpoint-interval" in _error(capsys, ["plan", str(files["graph"]), "--cluster",
                                                      CLUSTER, "--failures", "1e-5"])


def test_checkpoint_folder(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint as train writes it (runtime._checkpoint_state's folder), read without
    torch; one written under another layout is refused."""
    plan = load_plan(files["plan"])
    ck = files["dir"] / "ckpt"
    (ck / "step-00000012").mkdir(parents=True)
    state = {"format": "shardplan.checkpoint/1", "step": 12, "kind": "llm",
             "optimizer": "adam", "param_groups": [{"lr": 0.001}], "global_batch": 8,
             "parallel": plan.parallel.to_dict()}
    (ck / "step-00000012" / "state.json").write_text(json.dumps(state))
    (ck / "latest").write_text("step-00000012\n")
    capsys.readouterr()
    assert run_cli(["replan", str(files["plan"]), "--remove", "node1", "--checkpoint",
                    str(ck), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["checkpoint"]["step"] == 12 and res["checkpoint"]["global_batch"] == 8
    other = dict(state, parallel={"tp": 1, "pp": 1, "dp": 1})
    (ck / "step-00000012" / "state.json").write_text(json.dumps(other))
    assert "written under one device" in _error(
        capsys, ["replan", str(files["plan"]), "--remove", "node1", "--checkpoint", str(ck)])
