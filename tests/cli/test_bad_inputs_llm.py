"""Issue 46's bad inputs on the LLM commands (import megatron / torchtitan, plan, simulate,
export): one line ``shardplan: error: ...`` and exit 2, or a note, never a hang, a
traceback or a silent acceptance."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardplan.cli.main import main
from tests.helpers import run_cli

_M = ("--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 256 "
      "--vocab-size 32000 --micro-batch-size 1 ")


def _mg(extra: str, cluster: str | None = "dgx-a100,nodes=1") -> list[str]:
    argv = ["import", "megatron", "--args", _M + extra, "--json"]
    return argv + (["--cluster", cluster] if cluster else [])


CASES = {
    "10^9 layers": (_mg("--global-batch-size 16 --num-layers 1000000000"),
                    "--num-layers 1,000,000,000 is above the 1,024 layers"),
    "10^12 global batch": (_mg("--global-batch-size 1000000000000"),
                           "--global-batch-size 1,000,000,000,000 is above"),
    "too many micro-batches": (_mg("--global-batch-size 1048576", None),
                               "micro-batches per iteration"),
    "hidden beyond any model": (_mg("--global-batch-size 8 --hidden-size 4294967296"),
                                "--hidden-size"),
    "a misspelled flag": (_mg("--global-batch-size 8 --micro-batch-szie 2"),
                          "did you mean --micro-batch-size?"),
    "an unknown flag": (_mg("--global-batch-size 8 --frobnicate 3"),
                        "unknown Megatron-LM argument --frobnicate (the closest known is"),
    "full recompute without a method": (
        _mg("--global-batch-size 8 --recompute-granularity full"),
        "--recompute-granularity full needs --recompute-method"),
    "fp8 on A100": (_mg("--global-batch-size 8 --bf16 --fp8-format hybrid"),
                    "precision fp8 needs fp8 tensor cores (H100), and device"),
    "bf16 on V100": (_mg("--global-batch-size 16 --bf16", "dgx2-v100,nodes=1"),
                     "precision bf16 needs bf16 units"),
    "gpu_memory=1e30": (_mg("--global-batch-size 8", "dgx-a100,nodes=1,gpu_memory=1e30"),
                        "gpu_memory=1e+30 is above"),
    "flops=1e30": (_mg("--global-batch-size 8", "dgx-a100,nodes=1,flops=1e30"),
                   "flops=1e+30 is above"),
    "plan: seq= against --seq-len": (["plan", "llama3:8B,seq=1024", "--seq-len", "2048",
                                      "--cluster", "dgx-a100,nodes=1"],
                                     "seq=1024 and --seq-len 2048 disagree"),
    "plan: layers=10^9": (["plan", "gpt:hidden=64,layers=1000000000,heads=8,vocab=100",
                           "--cluster", "dgx-a100,nodes=1"], "layers=1,000,000,000 is above"),
    "plan: --global-batch 10^12": (["plan", "mlp", "--cluster", "dgx-a100,nodes=1",
                                    "--global-batch", "1000000000000"], "--global-batch"),
    "plan: --memory-limit 1e30": (["plan", "mlp", "--cluster", "dgx-a100,nodes=1",
                                   "--memory-limit", "1e30"], "--memory-limit"),
    "topology --memory-bytes 1e30": (["topology", "flat", "--memory-bytes", "1e30", "--json"],
                                     "--memory-bytes: 1e+30 is above"),
    # issue 44's arguments
    "an unknown --transformer-impl": (_mg("--global-batch-size 8 --transformer-impl foo"),
                                      "--transformer-impl is transformer_engine or local"),
    "a partition method DeepSpeed is not read for": (
        _mg("--global-batch-size 8 --deepspeed --zero-stage 1 "
            "--pipeline-model-parallel-size 2 --pp-partition-method parameters"),
        "--pp-partition-method is one of"),
    "embedding and loss counted, not dividing": (
        _mg("--global-batch-size 8 --num-layers 7 --pipeline-model-parallel-size 4 "
            "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"),
        "do not divide evenly over pp x vp = 4 pipeline stages, as Megatron-Core requires"),
    "both uneven-split styles": (
        _mg("--global-batch-size 8 --pipeline-model-parallel-size 4 "
            "--decoder-first-pipeline-num-layers 1 --account-for-loss-in-pipeline-split"),
        "exclude each other"),
    "a spec's seq= beyond any context": (
        ["plan", "gpt:hidden=64,layers=2,heads=2,vocab=100,seq=100000000", "--cluster",
         "dgx-a100,nodes=1"], "seq=100,000,000 is above"),
    "zero GB200 racks": (["topology", "gb200-nvl72,racks=0", "--json"],
                         "racks must be an integer >= 1"),
    "a custom GPU without its figures": (["topology", "custom,nodes=1", "--json"],
                                         "custom needs flops"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_line_and_exit_2(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv, message = CASES[case]
    assert run_cli(argv) == 2, case
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if "note:" not in ln]
    assert len(lines) == 1 and lines[0].startswith("shardplan: error: "), err
    assert message in err and "Traceback" not in err


def test_a_known_argument_not_modelled_keeps_its_note(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert main(_mg("--global-batch-size 8 --cpu-offloading", None)) == 0
    assert "--cpu-offloading changes the run and is not modelled" in capsys.readouterr().err


def test_units_of_memory_are_the_same_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["topology", "flat", "--devices", "2", "--memory-bytes", "16GiB",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"][0]["memory_bytes"] == 16 * 2**30


def test_the_default_micro_batch_count_is_never_the_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "gpt:hidden=64,layers=2,heads=8,vocab=100", "--cluster",
                 "dgx-a100,nodes=1", "--global-batch", "1", "--families", "llm",
                 "--json"]) == 0
    assert "multiple of 8" not in capsys.readouterr().err


def test_baseline_of_another_model_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from shardplan.ir import Objective, ParallelConfig, Plan, Stage, save

    other = Plan("gpt", "dgx-a100", "import", (Stage((0,), (0,)),), Objective("x", 0.0),
                 parallel=ParallelConfig(),
                 meta={"imported_from": {"model": "gpt:hidden=64,layers=2,heads=8,"
                                                  "vocab=100,seq=128"}})
    save(other, tmp_path / "b.json")
    assert run_cli(["plan", "gpt:hidden=64,layers=4,heads=8,vocab=100", "--cluster",
                    "dgx-a100,nodes=1", "--baseline", str(tmp_path / "b.json")]) == 2
    assert "a baseline must be of the same model" in capsys.readouterr().err


def test_known_unmodelled_arguments_agree_with_the_pinned_megatron_core() -> None:
    """The names that are megatron-core TransformerConfig fields (the arguments Megatron-LM
    copies into it by name) exist in the pinned release; none is also read or ignored."""
    import dataclasses

    from shardplan.importers import megatron as mg

    core = pytest.importorskip("megatron.core.transformer.transformer_config")
    fields = {f.name for f in dataclasses.fields(core.TransformerConfig)}
    for name in ("--mtp-loss-scaling-factor", "--cp-comm-type",
                 "--hierarchical-context-parallel-sizes", "--moe-layer-recompute",
                 "--moe-pad-expert-input-to-capacity", "--moe-shared-expert-overlap",
                 "--distribute-saved-activations"):
        assert name in mg.KNOWN_UNMODELLED, name
        assert name[2:].replace("-", "_") in fields, name
    # the mixture-of-experts arguments read (issue 47) are TransformerConfig fields too
    for name in ("--moe-router-topk", "--moe-ffn-hidden-size", "--moe-grouped-gemm",
                 "--moe-token-dispatcher-type", "--moe-layer-freq", "--multi-latent-attention",
                 "--mtp-num-layers", "--window-size", "--window-attn-skip-freq",
                 "--moe-expert-capacity-factor", "--moe-router-load-balancing-type",
                 "--moe-shared-expert-intermediate-size", "--moe-router-score-function",
                 "--moe-router-num-groups", "--moe-router-group-topk", "--softmax-type",
                 "--moe-router-topk-scaling-factor", "--moe-router-pre-softmax",
                 "--qk-layernorm", "--activation-func-clamp-value",
                 "--pipeline-model-parallel-layout",
                 "--expert-model-parallel-size", "--expert-tensor-parallel-size",
                 "--recompute-modules", "--moe-router-force-load-balancing"):
        assert name in mg._READ_SWITCHES | mg._READ_VALUES | mg._READ_LISTS, name
        assert name[2:].replace("-", "_") in fields, name
    tables = mg._READ_SWITCHES | mg._READ_VALUES | mg._READ_LISTS | mg.IGNORED_FLAGS | \
        mg.IGNORED_VALUES
    assert not (mg.KNOWN_UNMODELLED & tables)
