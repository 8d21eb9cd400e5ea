"""``shardplan import megatron`` / ``import torchtitan``: the run as JSON, notes, one-line
refusals, and DIR's three files, which simulate, report and export accept (the capture stood in
for until the zoo builds GPT and Llama models by their dimensions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardplan.ir import Graph, load_graph, load_plan, load_topology
from tests.helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "importers" / "data"
ARGS = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
        "--vocab-size 1000 --micro-batch-size 2 --global-batch-size 16 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16 ")


def test_megatron_run_as_json(capsys) -> None:
    rc = run_cli(["import", "megatron", "--args", ARGS + "--cpu-offloading --lr 1e-3",
                  "--cluster", "flat,devices=8,device=a100", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0
    run = json.loads(out)
    assert run["model"] == "gpt:hidden=64,layers=4,heads=4,vocab=1024,seq=32"
    assert run["parallel"] == {"tp": 2, "pp": 2, "dp": 2, "dp_shard": 1, "cp": 1, "vp": 1}
    assert run["execution"]["microbatches"] == 4 and run["num_gpus"] == 8
    assert err.splitlines() == ["shardplan: note: Megatron-LM argument --cpu-offloading "
                                "changes the run and is not modelled"]


def test_torchtitan_run_as_json(capsys) -> None:
    rc = run_cli(["import", "torchtitan", str(DATA / "llama3_8b.toml"), "--cluster",
                  "flat,devices=16,device=a100", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    run = json.loads(out)
    assert run["model"] == "llama3:8B,seq=8192" and run["parallel"]["dp_shard"] == 16


@pytest.mark.parametrize(("argv", "reason"), [
    (["megatron", "--args", ARGS.replace("heads 4", "heads 3"), "--json"],
     "--hidden-size 64 is not a multiple of --num-attention-heads 3"),
    (["megatron", "--args", ARGS + "--tensor-model-parallel-size 8", "--cluster",
      "flat,devices=16,device=a100", "--json"], "does not divide the 4 attention heads"),
    (["megatron", "--args", ARGS, "--cluster", "flat,devices=12,device=a100", "--json"],
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


def _stand_in_capture(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The captured graph, by hand (the planning core's GPT of tests/cost): the calls the
    capture gets are recorded."""
    from tests.cost.llm_graph import gpt_graph

    calls: list[tuple] = []

    def capture_spec(spec: str, *, batch_size: int, seq_len: int) -> Graph:
        calls.append(("capture", spec, batch_size, seq_len))
        return gpt_graph(hidden=64, layers=4, heads=4, vocab=1024, seq=seq_len,
                         batch=batch_size)

    import shardplan.capture

    monkeypatch.setattr(shardplan.capture, "capture_spec", capture_spec)
    return calls


def test_writes_files_every_command_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys) -> None:
    calls = _stand_in_capture(monkeypatch)
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--args", ARGS, "--cluster", "flat,devices=8,device=a100",
                    "-o", str(out)]) == 0
    assert "wrote graph.json, topology.json, plan.json" in capsys.readouterr().out
    assert calls == [("capture", "gpt:hidden=64,layers=4,heads=4,vocab=1024,seq=32", 2, 32)]
    files = [str(out / f) for f in ("plan.json", "graph.json", "topology.json")]
    graph, topo, plan = load_graph(files[1]), load_topology(files[2]), load_plan(files[0])
    plan.validate(graph, topo)
    assert topo.num_devices == 8 and plan.parallel is not None
    assert (plan.parallel.tp, plan.parallel.pp, plan.parallel.dp) == (2, 2, 2)
    assert plan.settings.microbatches == 4 and plan.settings.microbatch_size == 4
    assert plan.settings.mixed_precision
    assert plan.meta["imported_from"]["tool"] == "megatron"
    assert plan.meta["imported_from"]["execution"]["precision"] == "bf16"
    assert run_cli(["simulate", *files, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_seconds"] > 0
    assert run_cli(["report", *files, "-o", str(tmp_path / "r.html")]) == 0
    # export gives the parallel configuration back
    exp = tmp_path / "megatron.json"
    assert run_cli(["export", *files, "--to", "megatron", "-o", str(exp)]) == 0
    args = json.loads(exp.read_text())["args"]
    assert args[:4] == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                        "2"]
    assert "--bf16" in args


def test_torchtitan_writes_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in_capture(monkeypatch)
    config = tmp_path / "run.toml"
    config.write_text((DATA / "llama3_8b.toml").read_text().replace(
        "data_parallel_shard_degree = -1", "data_parallel_shard_degree = 2\n"
        "tensor_parallel_degree = 2").replace("tensor_parallel_degree = 1\n", ""))
    out = tmp_path / "run"
    assert run_cli(["import", "torchtitan", str(config), "--cluster", "flat,devices=4,device=a100",
                    "-o", str(out)]) == 0
    plan = load_plan(out / "plan.json")
    assert plan.parallel is not None and plan.parallel.dp_shard == 2
    assert plan.settings.gradient_sync == "sharded"


def test_nothing_is_written_when_a_step_fails(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in_capture(monkeypatch)
    monkeypatch.setitem(sys.modules, "shardplan.strategy.llm", None)  # not importable
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--args", ARGS, "--cluster", "flat,devices=8,device=a100",
                    "-o", str(out)]) == 2
    assert not out.exists() or not any(out.iterdir())


def test_with_the_real_capture_and_layout(tmp_path: Path) -> None:
    """The whole import, once the zoo knows the GPT-by-dimensions spec (branch llm-models)."""
    pytest.importorskip("torch")
    from shardplan.capture import list_models

    if not any(m.startswith("gpt") for m in list_models()):
        pytest.skip("the zoo has no gpt:hidden=... spec yet")
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--args", ARGS, "--cluster", "flat,devices=8,device=a100",
                    "-o", str(out)]) == 0
    assert run_cli(["simulate", str(out / "plan.json"), str(out / "graph.json"),
                    str(out / "topology.json"), "--json"]) == 0


def test_an_input_in_dir_is_not_overwritten(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    out.mkdir()
    config = out / "plan.json"
    config.write_text((DATA / "llama3_8b.toml").read_text())
    before = config.read_bytes()
    assert run_cli(["import", "torchtitan", str(config), "--cluster", "flat,devices=8,device=a100",
                    "-o", str(out)]) == 2
    assert "one of this command's inputs" in capsys.readouterr().err
    assert config.read_bytes() == before and sorted(p.name for p in out.iterdir()) == [
        "plan.json"]
