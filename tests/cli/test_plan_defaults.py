"""``shardplan plan``'s defaults said out loud (issue 45, item 2): an LLM trains in bf16 on
GPUs with bf16 tensor cores, a flavor at its training sequence, within 60 s by default; every
assumption in one ``assumed:`` line under the table; ``--gpus N`` and ``--target STACK``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from shardplan.ir import load_plan, load_topology
from tests.helpers import run_cli

pytestmark = pytest.mark.torch

SPEC = "gpt:hidden=64,layers=4,heads=4,vocab=1024,seq=32"
LLM = ("--families", "llm", "--time-limit", "20")


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert run_cli(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llm_plan_on_tensor_cores_trains_in_bf16_and_says_what_it_assumed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    best = tmp_path / "best.json"
    res = _plan_json(capsys, SPEC, "--cluster", "dgx-a100,nodes=1", *LLM, "-o", str(best))
    assert load_plan(best).settings.precision == "bf16"
    assert all(r["llm"]["precision"] == "bf16" for r in res["ranked"])
    assumed = res["assumptions"]
    assert assumed["precision"].startswith("bf16 (tensor cores; --precision")
    assert assumed["global_batch"].startswith("global batch 64 (8 per GPU")
    assert assumed["gpus"].startswith("all 8 GPUs of dgx-a100")
    assert assumed["stack"].startswith("stack megatron")
    assert "sequence" not in assumed  # the spec gave seq=32
    assert "time_limit" not in assumed  # --time-limit was given
    assert res["assumed"] == "assumed: " + ", ".join(assumed.values())


def test_what_the_user_gave_is_not_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    res = _plan_json(capsys, SPEC, "--cluster", "dgx-a100,nodes=1", *LLM, "--precision",
                     "fp32", "--global-batch", "16", "--stack", "megatron-core")
    assert set(res["assumptions"]) == {"gpus"}
    assert {r["llm"]["precision"] for r in res["ranked"]} == {"fp32"}
    assert {r["llm"]["stack"] for r in res["ranked"]} == {"megatron-core"}


def test_no_bf16_without_bf16_tensor_cores(capsys: pytest.CaptureFixture[str]) -> None:
    res = _plan_json(capsys, SPEC, "--cluster", "dgx2-v100,nodes=1", *LLM)
    assert res["assumptions"]["precision"].startswith("fp32 (no bf16 tensor cores")
    assert {r["llm"]["precision"] for r in res["ranked"]} == {"fp32"}


def test_a_flavor_is_planned_at_its_training_sequence(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    # Llama 3's dimensions cut down (capture stays quick); no seq= and no --seq-len
    spec = "llama3:8B,n_layers=2,dim=256,n_heads=4,n_kv_heads=2,vocab_size=1024"
    res = _plan_json(capsys, spec, "--cluster", "dgx-h100,nodes=1", *LLM, "--top", "3")
    assert res["assumptions"]["sequence"].startswith(
        "sequence 8192 (llama3's training length; seq= or --seq-len")
    assert {r["llm"]["sequence"] for r in res["ranked"]} == {8192}
    res = _plan_json(capsys, spec + ",seq=256", "--cluster", "dgx-h100,nodes=1", *LLM,
                     "--top", "3")
    assert "sequence" not in res["assumptions"]
    assert {r["llm"]["sequence"] for r in res["ranked"]} == {256}


def test_a_spec_of_dimensions_keeps_its_default_sequence(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    res = _plan_json(capsys, "gpt:hidden=64,layers=4,heads=4,vocab=1024", "--cluster",
                     "dgx-a100,nodes=1", *LLM, "--top", "3")
    assert res["assumptions"]["sequence"].startswith("sequence 128 (the default")


def test_the_default_time_limit_is_a_minute(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import shardplan.planner as planner

    seen: list[float] = []
    real = planner.search

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["time_limit"])
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "search", spy)
    res = _plan_json(capsys, SPEC, "--cluster", "dgx-a100,nodes=1", "--families", "llm")
    assert 50 < seen[0] <= 60
    assert res["assumptions"]["time_limit"] == "time limit 60 s (--time-limit to change)"
    _plan_json(capsys, SPEC, "--cluster", "dgx-a100,nodes=1", "--families", "llm",
               "--time-limit", "5")
    assert seen[1] <= 5


def test_the_table_and_the_assumed_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["plan", SPEC, "--cluster", "dgx-a100,nodes=1", "--families", "llm,uniform",
                    "--time-limit", "20", "--top", "30"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "TP x PP x DP" in line)
    for col in ("micro-batch x count", "precision", "recompute", "SP", "s/step",
                "tokens/s/GPU", "MFU %", "memory GiB", "search s"):
        assert col in lines[header], col
    assert "other families" in out and "uniform" in out  # non-LLM rows: the papers' table
    assumed = [line for line in lines if line.startswith("assumed: ")]
    assert len(assumed) == 1 and "time" not in assumed[0]
    assert assumed[0].startswith("assumed: bf16 (tensor cores; --precision to change)")
    assert lines.index(assumed[0]) > header
    body = "\n".join(line for line in lines if line.startswith("│"))
    assert not re.search(r"\d[eE][+-]?\d", body)  # plain numbers: no scientific notation
    first = next(line for line in lines[header:] if re.match(r"│\s+\d+ │", line))
    cells = [c.strip() for c in first.strip("│").split("│")]
    assert cells[3] == "bf16" and cells[5] in ("yes", "no")
    assert 0 < float(cells[8]) < 100  # MFU in per cent
    assert float(cells[7].replace(",", "")) > 0  # tokens/s per GPU


# ---------------------------------------------------------------------------- --gpus
def test_gpus_uses_n_of_the_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    best = tmp_path / "best.json"
    res = _plan_json(capsys, SPEC, "--cluster", "dgx-h100,nodes=1", "--gpus", "2", *LLM,
                     "-o", str(best))
    assert load_plan(best).parallel is not None
    assert load_plan(best).parallel.world_size == 2
    assert {r["llm"]["gpus"] for r in res["ranked"]} == {2}
    assert res["assumptions"]["gpus"] == "2 of the cluster's 8 GPUs (--gpus)"
    assert res["global_batch"] == 16  # 8 per GPU used
    # the cluster spec's own key says the same
    again = _plan_json(capsys, SPEC, "--cluster", "dgx-h100,nodes=1,gpus=2", *LLM)
    assert again["ranked"][0]["llm"]["layout"] == res["ranked"][0]["llm"]["layout"]


def test_gpus_whole_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    res = _plan_json(capsys, SPEC, "--cluster", "dgx-a100,nodes=4", "--gpus", "16", *LLM,
                     "--top", "3")
    assert {r["llm"]["gpus"] for r in res["ranked"]} == {16}


@pytest.mark.parametrize(("cluster", "gpus", "says"), [
    ("dgx-a100,nodes=1", "9", "more than the 8 GPUs"),
    ("dgx-a100,nodes=2", "12", "does not fill whole nodes of 8 GPUs"),
    ("dgx-a100,nodes=1,gpus=2", "4", "give the GPU count once"),
])
def test_gpus_refused_in_one_line(cluster: str, gpus: str, says: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["plan", SPEC, "--cluster", cluster, "--gpus", gpus, *LLM]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def test_import_megatron_on_2_of_8_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    run = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
           "--vocab-size 1000 --micro-batch-size 2 --global-batch-size 16 "
           "--tensor-model-parallel-size 2 --bf16")
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--args", run, "--cluster", "dgx-a100,nodes=1",
                    "--gpus", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    plan = load_plan(out / "plan.json")
    assert plan.parallel is not None and (plan.parallel.tp, plan.parallel.dp) == (2, 1)
    assert load_topology(out / "topology.json").num_devices == 2
    assert run_cli(["import", "megatron", "--args", run, "--gpus", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_gpus"] == 2
    assert run_cli(["import", "megatron", "--args", run, "--cluster", "dgx-a100,nodes=1",
                    "--gpus", "16", "--json"]) == 2
    assert "more than the 8 GPUs" in capsys.readouterr().err


# ---------------------------------------------------------------------------- --target
def test_target_keeps_only_what_the_stack_exports(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from shardplan.capture import capture_spec
    from shardplan.export import export
    from shardplan.ir import Plan
    from shardplan.topology import build_spec

    best = tmp_path / "best.json"
    res = _plan_json(capsys, SPEC, "--cluster", "dgx-a100,nodes=1", "--families",
                     "llm,pase", "--time-limit", "30", "--target", "torchtitan", "--top",
                     "50", "-o", str(best))
    target = res["target"]
    assert target["name"] == "torchtitan" and target["dropped"] > 0
    assert "pase" in target["dropped_by_family"]  # torchtitan runs no PaSE strategy
    assert all(r["family"] == "llm" for r in res["ranked"])
    assert res["assumptions"]["target"].startswith("--target torchtitan: dropped ")
    assert res["assumptions"]["stack"].startswith("stack torchtitan (--target torchtitan")
    graph = capture_spec(SPEC, batch_size=8, seq_len=32)
    topology = build_spec("dgx-a100,nodes=1")
    winner = load_plan(best)
    assert winner.settings.stack == "torchtitan"
    export(winner, graph, topology, "torchtitan")  # the winner exports
    shown = Plan.from_dict(res["winner"])
    assert (shown.parallel, shown.settings) == (winner.parallel, winner.settings)


def test_target_megatron_drops_what_megatron_refuses(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    res = _plan_json(capsys, SPEC, "--cluster", "dgx-a100,nodes=1", "--families",
                     "llm,pase", "--time-limit", "30", "--target", "megatron", "--top", "50")
    assert {r["family"] for r in res["ranked"]} == {"llm"}
    assert "pase" in res["target"]["dropped_by_family"]
    # Megatron-LM runs Megatron-Core with Transformer Engine by default
    assert res["assumptions"]["stack"].startswith("stack megatron-core (--target megatron")


def test_target_that_runs_nothing_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["plan", SPEC, "--cluster", "dgx-a100,nodes=1", "--families", "pase",
                    "--time-limit", "20", "--target", "torchtitan"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no plan found runs on torchtitan" in err
