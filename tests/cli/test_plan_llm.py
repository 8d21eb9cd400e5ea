"""``shardplan plan`` with the LLM family and ``--baseline``: a user's imported Megatron run
searched beside the candidates, the winner never slower, the knobs it moved named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardplan.ir import load_plan
from tests.helpers import run_cli

pytestmark = pytest.mark.torch

SPEC = "gpt:hidden=64,layers=4,heads=4,vocab=1024,seq=32"
ARGS = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
        "--vocab-size 1000 --micro-batch-size 2 --global-batch-size 16 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16 "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")


def test_plan_with_an_imported_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    out = tmp_path / "run"
    assert run_cli(["import", "megatron", "--args", ARGS, "--cluster", "dgx-a100,nodes=1",
                    "-o", str(out)]) == 0
    capsys.readouterr()
    best = tmp_path / "best.json"
    assert run_cli(["plan", SPEC, "--cluster", "dgx-a100,nodes=1", "--baseline",
                    str(out / "plan.json"), "--families", "llm", "--time-limit", "60",
                    "--top", "50", "--json", "-o", str(best)]) == 0
    res = json.loads(capsys.readouterr().out)
    cmp_ = res["baseline"]
    assert cmp_["baseline"] == "TP 2 x PP 2 x DP 2"
    # the user's configuration was a candidate: the winner is at least as fast
    assert cmp_["winner_seconds"] <= cmp_["baseline_seconds"]
    assert cmp_["speedup"] == pytest.approx(cmp_["baseline_seconds"] / cmp_["winner_seconds"])
    assert res["global_batch"] == 16  # the baseline's
    assert all(r["family"] == "llm" for r in res["ranked"])
    assert any("your configuration" in r["note"] for r in res["ranked"])
    winner = load_plan(best)
    assert winner.parallel is not None and winner.parallel.world_size == 8
    # the baseline's training settings: bf16, whose gradients Megatron-LM reduces in fp32
    assert (winner.settings.precision, winner.settings.grad_reduce) == ("bf16", "fp32")
    if cmp_["speedup"] > 1:
        assert cmp_["moved"]


def test_baseline_must_be_an_llm_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    from shardplan.ir import Objective, Plan, Stage, save

    p = tmp_path / "plain.json"
    save(Plan("g", "t", "hand", (Stage((0,), (0,)),), Objective("x", 0.0)), p)
    rc = run_cli(["plan", SPEC, "--cluster", "dgx-a100,nodes=1", "--baseline", str(p),
                  "--families", "llm"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "not an LLM plan" in err
