"""``shardplan import megatron`` / ``import torchtitan``: the run as JSON, notes, one-line
refusals, and DIR's three files (capture and the LLM layout stood in for where this
shardplan lacks them)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from shardplan.ir import Graph, Objective, Plan, Stage, load_graph, load_plan, load_topology
from tests.helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "importers" / "data"
ARGS = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
        "--vocab-size 1000 --micro-batch-size 2 --global-batch-size 16 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16 ")


def test_megatron_run_as_json(capsys) -> None:
    rc = run_cli(["import", "megatron", "--args", ARGS + "--num-experts 4 --lr 1e-3",
                  "--cluster", "flat,devices=8", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0
    run = json.loads(out)
    assert run["model"] == "gpt:hidden=64,layers=4,heads=4,vocab=1024,seq=32"
    assert run["parallel"] == {"tp": 2, "pp": 2, "dp": 2, "dp_shard": 1, "cp": 1, "vp": 1}
    assert run["execution"]["microbatches"] == 4 and run["num_gpus"] == 8
    assert err.splitlines() == ["shardplan: note: Megatron-LM argument --num-experts changes "
                                "the run and is not modelled"]


def test_torchtitan_run_as_json(capsys) -> None:
    rc = run_cli(["import", "torchtitan", str(DATA / "llama3_8b.toml"), "--cluster",
                  "flat,devices=16", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    run = json.loads(out)
    assert run["model"] == "llama3:8B,seq=8192" and run["parallel"]["dp_shard"] == 16


@pytest.mark.parametrize(("argv", "reason"), [
    (["megatron", "--args", ARGS.replace("heads 4", "heads 3"), "--json"], "attention heads"),
    (["megatron", "--args", ARGS + "--tensor-model-parallel-size 8", "--cluster",
      "flat,devices=16", "--json"], "does not divide the 4 attention heads"),
    (["megatron", "--args", ARGS, "--cluster", "flat,devices=12", "--json"],
     "global batch 16 is not a multiple"),
    (["megatron", "--args", ARGS, "-o", "DIR"], "needs the cluster"),
    (["megatron", "--args", ARGS], "-o DIR or --json"),
    (["megatron", "--args", "--num-layers 'x", "--json"], "cannot split"),
    (["torchtitan", str(DATA / "llama3_8b.toml"), "--json"], "give the cluster"),
    (["torchtitan", str(DATA / "missing.toml"), "--cluster", "flat,devices=2", "--json"],
     "missing.toml"),
])
def test_bad_runs_are_one_line_and_exit_2(argv: list[str], reason: str, tmp_path: Path,
                                          capsys) -> None:
    argv = [str(tmp_path / "d") if a == "DIR" else a for a in argv]
    assert run_cli(["import", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardplan: error: ") and reason in err[0], err
    assert not (tmp_path / "d").exists()


def test_no_traceback_from_the_console(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "shardplan", "import", "megatron", "--args",
                           ARGS + "--global-batch-size 7", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("shardplan: error: global batch 7")


def _stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """A captured graph and the LLM layout, by hand: the calls they get are recorded."""
    calls: list[tuple] = []

    def capture_spec(spec: str, *, batch_size: int, seq_len: int) -> Graph:
        calls.append(("capture", spec, batch_size, seq_len))
        n = 6
        return Graph.from_arrays(name=spec, fwd_flops=np.ones(n), src=np.arange(n - 1),
                                 dst=np.arange(1, n), batch_size=batch_size,
                                 modules=["emb", "layers.0", "layers.1", "layers.2",
                                          "layers.3", "head"])

    def layout_plan(graph, topology, parallel, settings) -> Plan:  # noqa: ANN001
        calls.append(("layout", parallel, settings.microbatches))
        per = parallel.devices_per_rank
        stages = (Stage((0, 1, 2), tuple(range(per))),
                  Stage((3, 4, 5), tuple(range(per, 2 * per))))
        return Plan(graph.name, topology.name, "llm-layout", stages, Objective("x", 0.0),
                    execution=settings, parallel=parallel)

    import shardplan.capture

    monkeypatch.setattr(shardplan.capture, "capture_spec", capture_spec)
    monkeypatch.setitem(sys.modules, "shardplan.strategy.llm",
                        types.SimpleNamespace(layout_plan=layout_plan))
    return calls


def test_writes_graph_topology_and_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys) -> None:
    calls = _stand_ins(monkeypatch)
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--args", ARGS, "--cluster", "flat,devices=8",
                    "-o", str(out)]) == 0
    assert "wrote graph.json, topology.json, plan.json" in capsys.readouterr().out
    assert calls[0] == ("capture", "gpt:hidden=64,layers=4,heads=4,vocab=1024,seq=32", 2, 32)
    graph, topo = load_graph(out / "graph.json"), load_topology(out / "topology.json")
    plan = load_plan(out / "plan.json")
    plan.validate(graph, topo)
    assert topo.num_devices == 8 and plan.parallel is not None
    assert (plan.parallel.tp, plan.parallel.pp, plan.parallel.dp) == (2, 2, 2)
    assert plan.settings.microbatches == 4 and plan.settings.microbatch_size == 4
    assert plan.meta["imported_from"]["tool"] == "megatron"
    # export gives the parallel configuration back
    exp = tmp_path / "megatron.json"
    assert run_cli(["export", str(out / "plan.json"), str(out / "graph.json"),
                    str(out / "topology.json"), "--to", "megatron", "-o", str(exp)]) == 0
    args = json.loads(exp.read_text())["args"]
    assert args[:4] == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                        "2"]


def test_nothing_is_written_when_a_step_fails(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(monkeypatch)
    monkeypatch.delitem(sys.modules, "shardplan.strategy.llm")
    monkeypatch.setitem(sys.modules, "shardplan.strategy.llm", None)  # not importable
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--args", ARGS, "--cluster", "flat,devices=8",
                    "-o", str(out)]) == 2
    assert not out.exists() or not any(out.iterdir())


def test_with_the_real_capture_and_layout(tmp_path: Path) -> None:
    """The whole import, once the zoo knows the GPT-by-dimensions spec and the LLM layout
    exists (branches llm-models and the lead's strategy.llm)."""
    pytest.importorskip("torch")
    from shardplan.capture import list_models

    try:
        import shardplan.strategy.llm  # noqa: F401
    except ImportError:
        pytest.skip("shardplan.strategy.llm.layout_plan is not in this shardplan yet")
    if not any(m.startswith("gpt") for m in list_models()):
        pytest.skip("the zoo has no gpt:hidden=... spec yet")
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--args", ARGS, "--cluster", "flat,devices=8",
                    "-o", str(out)]) == 0
    assert run_cli(["simulate", str(out / "plan.json"), str(out / "graph.json"),
                    str(out / "topology.json"), "--json"]) == 0
