"""A census of bad, careless and unusual inputs on the LLM commands (issue 46: nothing silent).

Run: ``.venv/bin/python benchmarks/bad_inputs_llm.py [-j JOBS] [--only TEXT] [-o FILE]``;
writes ``benchmarks/results/bad_inputs_llm.md``.

Each input is one command line of ``shardplan import megatron``, ``import torchtitan`` (its
TOML or flags file written to a temporary folder first), ``plan`` (LLM specs: ``llama3:8B``,
``gpt:hidden=..``, ``mixtral:debug``, ``deepseek_v3:..``; ``--time-limit 2``), ``simulate`` or
``export --to megatron|torchtitan|torch|deepspeed|chrome-trace``, run in its own process with a
timeout, and its outcome is given one verdict:

- ``error``: exit 2 and exactly one line on stderr (besides ``shardplan: note:`` lines)
  starting ``shardplan: error:``;
- ``note``: exit 0 with the expected ``shardplan: note:`` text;
- ``ok``: exit 0 (a valid but unusual input that should succeed);
- ``traceback``: a Python traceback on stderr, whatever the exit status;
- ``hang``: still running at the timeout (the process group is killed);
- ``wrong-exit``: any other exit status, or other lines on stderr.

Every input carries the verdict it should get and, where the message should name what the
user wrote (the flag, key or spec), a text the error or note must contain. The report counts,
per category, the inputs tried and each verdict, and lists every input whose verdict (or
message) differs from the expected one. The inputs of ``tests/cli/test_bad_inputs_llm.py``
(``CASES``: each an error with its message) are run here too, so the test and the census share
one table.

What it measures is the command line's answer to users' mistakes, not speed: a census run
takes about ten minutes on two cores (``-j 2`` halves it; most inputs are answered before any
capture or search).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardplan.ir import write_atomic  # noqa: E402
from tests.cli.test_bad_inputs_llm import _M as _TEST_M  # noqa: E402
from tests.cli.test_bad_inputs_llm import CASES as TEST_CASES  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
VERDICTS = ("error", "note", "ok", "traceback", "hang", "wrong-exit")


@dataclass(frozen=True)
class Input:
    """One command line and the answer it should get.

    ``argv`` may hold ``{fx}`` (the folder of the fixtures: ``dense/``, ``moe/``, ``tt/``,
    ``v100/``, each an import's ``graph.json``, ``topology.json``, ``plan.json``) and
    ``{tmp}`` (this input's own folder, where ``files`` are written first)."""

    category: str
    name: str
    argv: tuple[str, ...]
    expect: str  # error | note | ok
    contains: str = ""
    files: tuple[tuple[str, str | bytes], ...] = ()


@dataclass
class Outcome:
    case: Input
    verdict: str
    rc: int | None
    seconds: float
    line: str  # the error line, the expected note, or the first line of stderr
    message_ok: bool = True
    stderr: str = field(default="", repr=False)

    @property
    def differs(self) -> bool:
        return self.verdict != self.case.expect or not self.message_ok


# ---------------------------------------------------------------------------------------------
# the inputs

_M = ("--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 256 "
       "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 ")
_A100 = "dgx-a100,nodes=1"
_H100 = "dgx-h100,nodes=1"
_V100 = "dgx2-v100,nodes=1"
_EXP = ("--num-experts 8 --moe-router-topk 2 --swiglu --moe-token-dispatcher-type alltoall ")


def _mg(extra: str, cluster: str | None = _A100, *, base: str = _M, out: bool = False
        ) -> tuple[str, ...]:
    argv = ["import", "megatron", "--args", base + extra]
    argv += ["--cluster", cluster] if cluster else []
    return tuple(argv + (["-o", "{tmp}/run"] if out else ["--json"]))


def _tt_toml(parallelism: str = "", training: str = "local_batch_size = 2\nseq_len = 256",
             model: str = 'name = "llama3"\nflavor = "8B"', extra: str = "") -> str:
    return (f"[model]\n{model}\n[training]\n{training}\n[parallelism]\n{parallelism}\n"
            f"{extra}")


class _Titan(TypedDict):
    argv: tuple[str, ...]
    files: tuple[tuple[str, str | bytes], ...]


def _tt(text: str | bytes, cluster: str | None = _A100, *, name: str = "run.toml",
        args: Sequence[str] = ()) -> _Titan:
    """``import torchtitan`` of ``text`` written to ``{tmp}/name`` (``Input(..., **_tt())``)."""
    argv = ["import", "torchtitan", f"{{tmp}}/{name}", "--json", *args]
    argv += ["--cluster", cluster] if cluster else []
    return {"argv": tuple(argv), "files": ((name, text),)}


def _plan(model: str, *extra: str, cluster: str = _A100, limit: str = "2") -> tuple[str, ...]:
    """``plan`` with a short time limit (the inputs expected to fail are refused before the
    search; those expected to succeed take ``limit="20"``: a limit shorter than the capture
    leaves the search no time) and one worker."""
    return ("plan", model, "--cluster", cluster, "--time-limit", limit, "--top", "1",
            "--workers", "1", *extra)


def _files(fx: str) -> tuple[str, str, str]:
    return (f"{{fx}}/{fx}/plan.json", f"{{fx}}/{fx}/graph.json", f"{{fx}}/{fx}/topology.json")


def _sim(fx: str, *extra: str) -> tuple[str, ...]:
    return ("simulate", *_files(fx), "--json", *extra)


def _ex(fx: str, to: str, *extra: str, out: str = "{tmp}/out") -> tuple[str, ...]:
    return ("export", *_files(fx), "--to", to, "-o", out, *extra)


#: The tests' inputs (all errors with their message), by category.
_TEST_CATEGORY = {
    "10^9 layers": "sizes", "10^12 global batch": "sizes", "too many micro-batches": "sizes",
    "hidden beyond any model": "sizes", "a misspelled flag": "unknown names",
    "an unknown flag": "unknown names", "full recompute without a method": "conflicting flags",
    "fp8 on A100": "precision vs hardware", "bf16 on V100": "precision vs hardware",
    "gpu_memory=1e30": "sizes", "flops=1e30": "sizes",
    "plan: seq= against --seq-len": "conflicting flags", "plan: layers=10^9": "sizes",
    "plan: --global-batch 10^12": "sizes", "plan: --memory-limit 1e30": "sizes",
    "topology --memory-bytes 1e30": "sizes", "an unknown --transformer-impl": "unknown names",
    "a partition method DeepSpeed is not read for": "unknown names",
    "embedding and loss counted, not dividing": "conflicting flags",
    "both uneven-split styles": "conflicting flags",
    "a spec's seq= beyond any context": "sizes", "zero GB200 racks": "sizes",
    "a custom GPU without its figures": "malformed files",
}


def _from_tests() -> list[Input]:
    return [Input(_TEST_CATEGORY.get(name, "from the tests"), f"(test) {name}",
                  tuple(argv), "error", message)
            for name, (argv, message) in sorted(TEST_CASES.items())]


def _sizes() -> list[Input]:
    c = "sizes"
    out = [
        Input(c, "--num-layers 0", _mg("--num-layers 0"), "error", "--num-layers"),
        Input(c, "--num-layers -4", _mg("--num-layers -4"), "error", "--num-layers"),
        Input(c, "--num-layers 1.5", _mg("--num-layers 1.5"), "error", "--num-layers"),
        Input(c, "--num-layers nan", _mg("--num-layers nan"), "error", "--num-layers"),
        Input(c, "--num-layers inf", _mg("--num-layers inf"), "error", "--num-layers"),
        Input(c, "--hidden-size 0", _mg("--hidden-size 0"), "error", "--hidden-size"),
        Input(c, "--hidden-size 1e3", _mg("--hidden-size 1e3"), "error", "--hidden-size"),
        Input(c, "--hidden-size 500 over 8 heads", _mg("--hidden-size 500"), "error",
              "--hidden-size 500 is not a multiple of --num-attention-heads 8"),
        Input(c, "--num-attention-heads 0", _mg("--num-attention-heads 0"), "error",
              "--num-attention-heads"),
        Input(c, "--num-attention-heads 10^6", _mg("--num-attention-heads 1000000"), "error",
              "--num-attention-heads"),
        Input(c, "--seq-length 0", _mg("--seq-length 0"), "error", "--seq-length"),
        Input(c, "--seq-length 10^9", _mg("--seq-length 1000000000"), "error",
              "--seq-length"),
        Input(c, "--vocab-size 0", _mg("--vocab-size 0"), "error", "--vocab-size"),
        Input(c, "--vocab-size 10^9", _mg("--vocab-size 1000000000"), "error",
              "--vocab-size"),
        Input(c, "--micro-batch-size 0", _mg("--micro-batch-size 0"), "error",
              "--micro-batch-size"),
        Input(c, "--micro-batch-size 3 into 8", _mg("--micro-batch-size 3"), "error",
              "micro-batch 3"),
        Input(c, "--global-batch-size 0", _mg("--global-batch-size 0"), "error",
              "--global-batch-size"),
        Input(c, "--global-batch-size -8", _mg("--global-batch-size -8"), "error",
              "--global-batch-size"),
        Input(c, "--ffn-hidden-size 0", _mg("--ffn-hidden-size 0"), "error",
              "--ffn-hidden-size"),
        Input(c, "--ffn-hidden-size 10^8", _mg("--ffn-hidden-size 100000000"), "error",
              "--ffn-hidden-size"),
        Input(c, "--kv-channels 0", _mg("--kv-channels 0"), "error", "--kv-channels"),
        Input(c, "--num-query-groups 0", _mg("--group-query-attention --num-query-groups 0"),
              "error", "--num-query-groups"),
        Input(c, "--num-query-groups 3 of 8 heads",
              _mg("--group-query-attention --num-query-groups 3"), "error",
              "--num-query-groups 3"),
        Input(c, "--tensor-model-parallel-size 0", _mg("--tensor-model-parallel-size 0"),
              "error", "--tensor-model-parallel-size"),
        Input(c, "--tensor-model-parallel-size 10^5",
              _mg("--tensor-model-parallel-size 100000"), "error",
              "--tensor-model-parallel-size"),
        Input(c, "--tensor-model-parallel-size 3 (8 heads)",
              _mg("--tensor-model-parallel-size 3", "dgx-a100,nodes=1,gpus=3"), "error",
              "3"),
        Input(c, "--pipeline-model-parallel-size 0", _mg("--pipeline-model-parallel-size 0"),
              "error", "--pipeline-model-parallel-size"),
        Input(c, "--pipeline-model-parallel-size 16 of 8 layers",
              _mg("--pipeline-model-parallel-size 16", "dgx-a100,nodes=2"), "error", "16"),
        Input(c, "--context-parallel-size 0", _mg("--context-parallel-size 0"), "error",
              "--context-parallel-size"),
        Input(c, "--num-layers-per-virtual-pipeline-stage 0",
              _mg("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 0"),
              "error", "--num-layers-per-virtual-pipeline-stage"),
        Input(c, "--data-parallel-size 0", _mg("--data-parallel-size 0", None), "error",
              "--data-parallel-size"),
        Input(c, "--data-parallel-size 10^6", _mg("--data-parallel-size 1000000", None),
              "error", "--data-parallel-size"),
        Input(c, "--gpus 0", _mg("", _A100) + ("--gpus", "0"), "error", "--gpus"),
        Input(c, "--gpus 9 of 8", _mg("", _A100) + ("--gpus", "9"), "error", "9"),
        Input(c, "cluster nodes=0", _mg("", "dgx-a100,nodes=0"), "error", "nodes"),
        Input(c, "cluster nodes=-1", _mg("", "dgx-a100,nodes=-1"), "error", "nodes"),
        Input(c, "cluster nodes=1.5", _mg("", "dgx-a100,nodes=1.5"), "error", "nodes"),
        Input(c, "cluster gpu_memory=0", _mg("", "dgx-a100,nodes=1,gpu_memory=0"), "error",
              "gpu_memory"),
        Input(c, "cluster gpu_memory=-1", _mg("", "dgx-a100,nodes=1,gpu_memory=-1"), "error",
              "gpu_memory"),
        Input(c, "cluster nic_gbps=0", _mg("", "dgx-a100,nodes=1,nic_gbps=0"), "error",
              "nic_gbps"),
        Input(c, "cluster nic_gbps=1e30", _mg("", "dgx-a100,nodes=1,nic_gbps=1e30"), "error",
              "nic_gbps"),
        # torchtitan
        Input(c, "torchtitan seq_len = 0", **_tt(_tt_toml(training="seq_len = 0")),
              expect="error", contains="seq_len"),
        Input(c, "torchtitan seq_len = 10^9",
              **_tt(_tt_toml(training="seq_len = 1000000000")), expect="error",
              contains="seq_len"),
        Input(c, "torchtitan seq_len = 256.0", **_tt(_tt_toml(training="seq_len = 256.0")),
              expect="error", contains="seq_len"),
        Input(c, "torchtitan local_batch_size = 0",
              **_tt(_tt_toml(training="local_batch_size = 0\nseq_len = 256")),
              expect="error", contains="local_batch_size"),
        Input(c, "torchtitan global_batch_size = 10^12",
              **_tt(_tt_toml(training="local_batch_size = 1\nseq_len = 256\n"
                                      "global_batch_size = 1000000000000")),
              expect="error", contains="global_batch_size"),
        Input(c, "torchtitan tensor_parallel_degree = 0",
              **_tt(_tt_toml("tensor_parallel_degree = 0")), expect="error",
              contains="tensor_parallel_degree"),
        Input(c, "torchtitan tensor_parallel_degree = 10^5",
              **_tt(_tt_toml("tensor_parallel_degree = 100000")), expect="error",
              contains="tensor_parallel_degree"),
        Input(c, "torchtitan data_parallel_shard_degree = 0",
              **_tt(_tt_toml("data_parallel_shard_degree = 0")), expect="error",
              contains="data_parallel_shard_degree"),
        Input(c, "torchtitan data_parallel_shard_degree = -2",
              **_tt(_tt_toml("data_parallel_shard_degree = -2")), expect="error",
              contains="data_parallel_shard_degree"),
        Input(c, "torchtitan pipeline_parallel_microbatch_size = 0",
              **_tt(_tt_toml("pipeline_parallel_degree = 2\n"
                             "pipeline_parallel_microbatch_size = 0")),
              expect="error", contains="pipeline_parallel_microbatch_size"),
        Input(c, "torchtitan degrees above the cluster",
              **_tt(_tt_toml("data_parallel_shard_degree = 4\ntensor_parallel_degree = 4")),
              expect="error", contains="16"),
        # plan
        Input(c, "plan gpt hidden=0", _plan("gpt:hidden=0,layers=2,heads=2,vocab=100"),
              "error", "option hidden"),
        Input(c, "plan gpt layers=0", _plan("gpt:hidden=64,layers=0,heads=2,vocab=100"),
              "error", "option layers"),
        Input(c, "plan gpt heads=0", _plan("gpt:hidden=64,layers=2,heads=0,vocab=100"),
              "error", "option heads"),
        Input(c, "plan gpt hidden=-64", _plan("gpt:hidden=-64,layers=2,heads=2,vocab=100"),
              "error", "option hidden"),
        Input(c, "plan gpt hidden=64.5", _plan("gpt:hidden=64.5,layers=2,heads=2,vocab=100"),
              "error", "option hidden"),
        Input(c, "plan gpt hidden=10^7", _plan("gpt:hidden=10000000,layers=2,heads=2"),
              "error", "hidden="),
        Input(c, "plan gpt vocab=10^9", _plan("gpt:hidden=64,layers=2,heads=2,vocab=1000000000"),
              "error", "vocab="),
        Input(c, "plan gpt heads not dividing hidden",
              _plan("gpt:hidden=64,layers=2,heads=3,vocab=100"), "error", "heads"),
        Input(c, "plan llama3:8B,n_layers=0", _plan("llama3:8B,n_layers=0"), "error",
              "n_layers"),
        Input(c, "plan llama3:8B,n_layers=10^5", _plan("llama3:8B,n_layers=100000"), "error",
              "n_layers"),
        Input(c, "plan llama3:8B,dim=10^9", _plan("llama3:8B,dim=1000000000"), "error",
              "dim"),
        Input(c, "plan llama3:8B,seq=0", _plan("llama3:8B,seq=0"), "error", "option seq"),
        Input(c, "plan llama3:debug --seq-len 0", _plan("llama3:debug", "--seq-len", "0"),
              "error", "--seq-len"),
        Input(c, "plan llama3:debug --seq-len 10^9",
              _plan("llama3:debug", "--seq-len", "1000000000"), "error", "--seq-len"),
        Input(c, "plan --global-batch 0", _plan("llama3:debug", "--global-batch", "0"),
              "error", "--global-batch"),
        Input(c, "plan --global-batch -8", _plan("llama3:debug", "--global-batch", "-8"),
              "error", "--global-batch"),
        Input(c, "plan --microbatches 0", _plan("llama3:debug", "--microbatches", "0"),
              "error", "--microbatches"),
        Input(c, "plan --microbatches 10^6", _plan("llama3:debug", "--microbatches", "1000000"),
              "error", "--microbatches"),
        Input(c, "plan --virtual-stages 0", _plan("llama3:debug", "--virtual-stages", "0"),
              "error", "--virtual-stages"),
        Input(c, "plan --virtual-stages 10^6",
              _plan("llama3:debug", "--virtual-stages", "1000000"), "error",
              "--virtual-stages"),
        Input(c, "plan --time-limit 0", _plan("llama3:debug") + ("--time-limit", "0"),
              "error", "--time-limit"),
        Input(c, "plan --time-limit -1", _plan("llama3:debug") + ("--time-limit", "-1"),
              "error", "--time-limit"),
        Input(c, "plan --time-limit nan", _plan("llama3:debug") + ("--time-limit", "nan"),
              "error", "--time-limit"),
        Input(c, "plan --top 0", _plan("llama3:debug") + ("--top", "0"), "error", "--top"),
        Input(c, "plan --workers 0", _plan("llama3:debug") + ("--workers", "0"), "error",
              "--workers"),
        Input(c, "plan --gpus 0", _plan("llama3:debug", "--gpus", "0"), "error", "--gpus"),
        Input(c, "plan --memory-limit 0", _plan("llama3:debug", "--memory-limit", "0"),
              "error", "--memory-limit"),
        Input(c, "plan --memory-limit -1GiB", _plan("llama3:debug", "--memory-limit", "-1GiB"),
              "error", "--memory-limit"),
        Input(c, "plan --memory-limit 16XB", _plan("llama3:debug", "--memory-limit", "16XB"),
              "error", "--memory-limit"),
        Input(c, "plan mixtral:debug,num_experts=0", _plan("mixtral:debug,num_experts=0"),
              "error", "num_experts"),
        Input(c, "plan mixtral:debug,num_experts=10^9",
              _plan("mixtral:debug,num_experts=1000000000"), "error", "num_experts"),
        Input(c, "plan deepseek_v3:671B,n_layers=0", _plan("deepseek_v3:671B,n_layers=0"),
              "error", "n_layers"),
        Input(c, "simulate --microbatches 0", _sim("dense", "--microbatches", "0"), "error",
              "--microbatches"),
        Input(c, "simulate --microbatches 10^6", _sim("dense", "--microbatches", "1000000"),
              "error", "--microbatches"),
        Input(c, "simulate --global-batch 10^12", _sim("dense", "--global-batch",
                                                       "1000000000000"), "error",
              "--global-batch"),
        Input(c, "simulate --microbatch-size 0", _sim("dense", "--microbatch-size", "0"),
              "error", "--microbatch-size"),
        Input(c, "simulate --efficiency 0", _sim("dense", "--efficiency", "0"), "error",
              "--efficiency"),
        Input(c, "simulate --efficiency 7", _sim("dense", "--efficiency", "7"), "error",
              "--efficiency"),
        Input(c, "simulate --recompute-every 0", _sim("dense", "--recompute", "full",
                                                      "--recompute-every", "0"),
              "error", "--recompute-every"),
    ]
    return out


def _unknown_names() -> list[Input]:
    c = "unknown names"
    toml = _tt_toml
    return [
        Input(c, "--recompute-granularity foo", _mg("--recompute-granularity foo"), "error",
              "--recompute-granularity"),
        Input(c, "--position-embedding-type foo", _mg("--position-embedding-type foo"),
              "error", "--position-embedding-type"),
        Input(c, "--normalization BatchNorm", _mg("--normalization BatchNorm"), "error",
              "--normalization"),
        Input(c, "--tokenizer-type Nonsense", _mg("--tokenizer-type Nonsense"), "error",
              "--tokenizer-type 'Nonsense'"),
        Input(c, "--moe-token-dispatcher-type foo", _mg(_EXP + "--moe-token-dispatcher-type foo"),
              "error", "--moe-token-dispatcher-type"),
        Input(c, "--moe-router-score-function foo",
              _mg(_EXP + "--moe-router-score-function foo"), "error",
              "--moe-router-score-function"),
        Input(c, "--moe-router-load-balancing-type foo",
              _mg(_EXP + "--moe-router-load-balancing-type foo"), "error",
              "--moe-router-load-balancing-type"),
        Input(c, "a flag with one dash", _mg("-num-layers 8"), "error", "'8 -num-layers 8'"),
        Input(c, "a bare value", _mg("8"), "error", "'8 8'"),
        Input(c, "torchtitan flavor debugmodel of llama3",
              **_tt(toml(model='name = "llama3"\nflavor = "debugmodel"')), expect="error",
              contains="debugmodel"),
        Input(c, "torchtitan model llama5", **_tt(toml(model='name = "llama5"\nflavor = "8B"')),
              expect="error", contains="llama5"),
        Input(c, "torchtitan flavor 9B", **_tt(toml(model='name = "llama3"\nflavor = "9B"')),
              expect="error", contains="9B"),
        Input(c, "torchtitan schedule Foo",
              **_tt(toml('pipeline_parallel_degree = 2\npipeline_parallel_schedule = "Foo"')),
              expect="error", contains="Foo"),
        Input(c, "torchtitan mixed_precision_param float16x",
              **_tt(toml(training='seq_len = 256\nmixed_precision_param = "float16x"')),
              expect="error", contains="float16x"),
        Input(c, "torchtitan optimizer SGD", **_tt(toml(extra='[optimizer]\nname = "SGD"')),
              expect="error", contains="SGD"),
        Input(c, "torchtitan activation_checkpoint mode partial",
              **_tt(toml(extra='[activation_checkpoint]\nmode = "partial"')), expect="error",
              contains="partial"),
        Input(c, "torchtitan selective_ac_option abc",
              **_tt(toml(extra='[activation_checkpoint]\nmode = "selective"\n'
                               'selective_ac_option = "abc"')), expect="error",
              contains="abc"),
        Input(c, "torchtitan recipe --config foo",
              **_tt("--module llama3 --config foo_8b\n--training.seq_len 256\n",
                    name="run.flags"), expect="error", contains="foo_8b"),
        Input(c, "plan llama9:8B", _plan("llama9:8B"), "error", "llama9"),
        Input(c, "plan llama3:9B", _plan("llama3:9B"), "error", "9B"),
        Input(c, "plan llama3:8B,foo=1", _plan("llama3:8B,foo=1"), "error", "foo"),
        Input(c, "plan gpt:hidden=64,foo=2", _plan("gpt:hidden=64,layers=2,heads=2,foo=2"),
              "error", "foo"),
        Input(c, "plan mixtral:9x9B", _plan("mixtral:9x9B"), "error", "9x9B"),
        Input(c, "plan deepseek_v3:foo=1", _plan("deepseek_v3:debug,foo=1"), "error", "foo"),
        Input(c, "plan --cluster dgx-z100", _plan("llama3:debug", cluster="dgx-z100,nodes=1"),
              "error", "dgx-z100"),
        Input(c, "plan --cluster dgx-a100,foo=1",
              _plan("llama3:debug", cluster="dgx-a100,nodes=1,foo=1"), "error", "foo"),
        Input(c, "plan --families llm,foo", _plan("llama3:debug", "--families", "llm,foo"),
              "error", "foo"),
        Input(c, "plan --target foo", _plan("llama3:debug", "--target", "foo"), "error",
              "foo"),
        Input(c, "plan --stack foo", _plan("llama3:debug", "--stack", "foo"), "error", "foo"),
        Input(c, "export --to foo", _ex("dense", "foo"), "error", "foo"),
        Input(c, "export --torchtitan-version 0.9",
              _ex("dense", "torchtitan", "--torchtitan-version", "0.9"), "error", "0.9"),
        Input(c, "export --torchtitan-base nonsense",
              _ex("dense", "torchtitan", "--torchtitan-base", "nonsense"), "error",
              "nonsense"),
        Input(c, "simulate --schedule foo", _sim("dense", "--schedule", "foo"), "error",
              "foo"),
    ]


def _precision() -> list[Input]:
    c = "precision vs hardware"
    return [
        Input(c, "plan --precision fp8 on A100", _plan("llama3:debug", "--precision", "fp8"),
              "error", "fp8"),
        Input(c, "plan --precision bf16 on V100",
              _plan("llama3:debug", "--precision", "bf16", cluster=_V100), "error", "bf16"),
        Input(c, "plan --precision fp16 on V100",
              _plan("llama3:debug", "--precision", "fp16", "--families", "llm",
                    cluster=_V100, limit="20"), "ok"),
        Input(c, "plan --precision fp8 on H100",
              _plan("llama3:debug", "--precision", "fp8", "--families", "llm",
                    cluster=_H100, limit="20"), "ok"),
        Input(c, "simulate --precision fp8 on A100", _sim("dense", "--precision", "fp8"),
              "error", "fp8"),
        Input(c, "simulate --precision bf16 on V100", _sim("v100", "--precision", "bf16"),
              "error", "bf16"),
        Input(c, "export --precision fp8 on A100",
              _ex("dense", "megatron", "--precision", "fp8"), "error", "fp8"),
        Input(c, "megatron --fp16 --bf16", _mg("--fp16 --bf16"), "error", "--bf16"),
        Input(c, "megatron --fp8-format hybrid without --bf16 on H100",
              _mg("--fp8-format hybrid", _H100), "ok"),
        Input(c, "megatron --fp8-format foo on H100", _mg("--bf16 --fp8-format foo", _H100),
              "error", "--fp8-format"),
        Input(c, "megatron --fp16 on V100", _mg("--fp16 --global-batch-size 16", _V100), "ok"),
        Input(c, "torchtitan float8 converter on A100",
              **_tt(_tt_toml(model='name = "llama3"\nflavor = "8B"\nconverters = ["float8"]')),
              expect="error", contains="fp8"),
        Input(c, "torchtitan bfloat16 on V100", **_tt(_tt_toml(), _V100), expect="error",
              contains="bf16"),
        Input(c, "torchtitan float32 on V100",
              **_tt(_tt_toml(training='local_batch_size = 2\nseq_len = 256\n'
                                      'mixed_precision_param = "float32"'), _V100),
              expect="ok"),
        Input(c, "a custom GPU without fp8 and --precision fp8",
              _plan("llama3:debug", "--precision", "fp8",
                    cluster="custom,nodes=1,gpus_per_node=8,flops=1e15,fp32_flops=6e13,"
                            "memory_bandwidth=3e12,gpu_memory=80GiB,nvlink_bandwidth=3e11,"
                            "nic_gbps=200"),
              "error", "fp8"),
    ]


def _exports() -> list[Input]:
    c = "exports' degrees"
    out = [Input(c, f"{fx} plan to {to}", _ex(fx, to), "ok")
           for fx, to in (("dense", "megatron"), ("dense", "torch"), ("dense", "deepspeed"),
                          ("dense", "chrome-trace"), ("moe", "megatron"), ("moe", "torch"),
                          ("moe", "chrome-trace"), ("tt", "megatron"), ("tt", "torch"),
                          ("tt", "chrome-trace"))]
    out += [
        Input(c, "dense plan to torchtitan (notes)", _ex("dense", "torchtitan"), "note",
              "AdamW"),
        Input(c, "moe plan to torchtitan (EP outside dp_shard)", _ex("moe", "torchtitan"),
              "error", "EP 2"),
        Input(c, "moe plan to deepspeed", _ex("moe", "deepspeed"), "error", "EP 2"),
        Input(c, "torchtitan plan to torchtitan", _ex("tt", "torchtitan"), "error",
              "every 2"),
        Input(c, "torchtitan plan to torchtitan 0.2",
              _ex("tt", "torchtitan", "--torchtitan-version", "0.2"), "ok"),
        Input(c, "export --virtual-stages 3 on PP 2 of 8 layers",
              _ex("dense", "megatron", "--virtual-stages", "3"), "error", "--virtual-stages 3"),
        Input(c, "export --virtual-stages 0", _ex("dense", "megatron", "--virtual-stages", "0"),
              "error", "--virtual-stages"),
        Input(c, "export --microbatches 0", _ex("dense", "megatron", "--microbatches", "0"),
              "error", "--microbatches"),
        Input(c, "export --global-batch 7 over DP 2",
              _ex("dense", "megatron", "--global-batch", "7"), "error", "7"),
        Input(c, "export --microbatch-size 3 into 8",
              _ex("dense", "megatron", "--microbatch-size", "3"), "error", "3"),
        Input(c, "export --microbatches 10^6",
              _ex("dense", "megatron", "--microbatches", "1000000"), "error",
              "--microbatches"),
        Input(c, "export deepspeed with selective recompute",
              _ex("dense", "deepspeed", "--recompute", "selective"), "error", "selective"),
        Input(c, "export deepspeed with fp8 on A100",
              _ex("dense", "deepspeed", "--precision", "fp8"), "error", "fp8"),
        Input(c, "export deepspeed with interleaving",
              _ex("dense", "deepspeed", "--virtual-stages", "2"), "error", "--virtual-stages 2"),
        Input(c, "export torchtitan --schedule gpipe on PP 2",
              _ex("dense", "torchtitan", "--schedule", "gpipe"), "ok"),
        Input(c, "export --exact-split megatron", _ex("dense", "megatron", "--exact-split"),
              "ok"),
        Input(c, "export a dense plan with the moe graph",
              ("export", "{fx}/dense/plan.json", "{fx}/moe/graph.json",
               "{fx}/dense/topology.json", "--to", "megatron", "-o", "{tmp}/out"), "error",
              "node"),
        Input(c, "export a moe plan with the dense graph",
              ("export", "{fx}/moe/plan.json", "{fx}/dense/graph.json",
               "{fx}/moe/topology.json", "--to", "megatron", "-o", "{tmp}/out"), "error",
              "node"),
        Input(c, "export on a 2-device topology",
              ("export", "{fx}/dense/plan.json", "{fx}/dense/graph.json",
               "{fx}/flat2.json", "--to", "megatron", "-o", "{tmp}/out"), "error", "device"),
        Input(c, "export an 8-GPU plan on 16 GPUs",
              ("export", "{fx}/dense/plan.json", "{fx}/dense/graph.json",
               "{fx}/a100x2.json", "--to", "megatron", "-o", "{tmp}/out"), "note", "8 of the 16"),
        Input(c, "simulate an 8-GPU plan on a 2-device topology",
              ("simulate", "{fx}/dense/plan.json", "{fx}/dense/graph.json",
               "{fx}/flat2.json", "--json"), "error", "device"),
        Input(c, "simulate a moe plan with the dense graph",
              ("simulate", "{fx}/moe/plan.json", "{fx}/dense/graph.json",
               "{fx}/moe/topology.json", "--json"), "error", "node"),
        Input(c, "simulate --virtual-stages 3 on PP 2",
              _sim("dense", "--virtual-stages", "3"), "error", "--virtual-stages 3"),
        Input(c, "simulate --global-batch 7 over DP 2", _sim("dense", "--global-batch", "7"),
              "error", "7"),
        Input(c, "simulate a moe plan", _sim("moe"), "ok"),
        Input(c, "simulate a torchtitan plan", _sim("tt"), "ok"),
    ]
    return out


def _baseline() -> list[Input]:
    c = "baseline mismatch"
    gpt = "gpt:hidden=256,layers=4,heads=8,vocab=32000,seq=256"
    return [
        Input(c, "a baseline of another model", _plan("llama3:debug", "--baseline",
                                                      "{fx}/dense/plan.json"),
              "error", "same model"),
        Input(c, "a baseline of another sequence",
              _plan("gpt:hidden=256,layers=4,heads=8,vocab=32000,seq=512", "--baseline",
                    "{fx}/dense/plan.json"), "error", "same model"),
        Input(c, "a baseline that does not exist",
              _plan(gpt, "--baseline", "{tmp}/nothing.json"), "error", "nothing.json"),
        Input(c, "a baseline that is a graph",
              _plan(gpt, "--baseline", "{fx}/dense/graph.json"), "error", "graph.json"),
        Input(c, "a baseline that is empty", _plan(gpt, "--baseline", "{tmp}/empty.json"),
              "error", "empty.json", files=(("empty.json", ""),)),
        Input(c, "a baseline that is a folder", _plan(gpt, "--baseline", "{fx}/dense"),
              "error", "dense"),
        Input(c, "a baseline of the same model on another cluster",
              _plan(gpt, "--baseline", "{fx}/dense/plan.json", "--families", "llm",
                    cluster="dgx-a100,nodes=2", limit="20"), "note", "baseline"),
        Input(c, "a baseline of the same model on V100",
              _plan(gpt, "--baseline", "{fx}/dense/plan.json", cluster=_V100), "error",
              "bf16"),
        Input(c, "a baseline of the same model", _plan(gpt, "--baseline",
                                                       "{fx}/dense/plan.json",
                                                       "--families", "llm",
                                                       limit="20"), "ok"),
    ]


def _malformed() -> list[Input]:
    c = "malformed files"
    j = '{"format": "shardplan.plan/1"'
    return [
        Input(c, "torchtitan empty file", **_tt(""), expect="error", contains="model"),
        Input(c, "torchtitan not TOML", **_tt("[model\nname = "), expect="error",
              contains="run.toml"),
        Input(c, "torchtitan binary bytes", **_tt(b"\x00\xff\xfe\x00garbage"), expect="error",
              contains="run.toml"),
        Input(c, "torchtitan latin-1 text", **_tt('[model]\nname = "llam\xe43"\n'.encode(
            "latin-1")), expect="error", contains="run.toml"),
        Input(c, "torchtitan [model] without flavor",
              **_tt(_tt_toml(model='name = "llama3"')), expect="error", contains="flavor"),
        Input(c, "torchtitan model = value", **_tt('model = "llama3"\n'), expect="error",
              contains="model"),
        Input(c, "torchtitan [parallelism] as a value",
              **_tt('parallelism = 3\n[model]\nname = "llama3"\nflavor = "8B"\n'),
              expect="error", contains="parallelism"),
        Input(c, "torchtitan degree as a string",
              **_tt(_tt_toml('tensor_parallel_degree = "2"')), expect="error",
              contains="tensor_parallel_degree"),
        Input(c, "torchtitan degree as a bool",
              **_tt(_tt_toml("tensor_parallel_degree = true")), expect="error",
              contains="tensor_parallel_degree"),
        Input(c, "torchtitan shard degree as a string",
              **_tt(_tt_toml('data_parallel_shard_degree = "-1"')), expect="error",
              contains="data_parallel_shard_degree"),
        Input(c, "torchtitan global_batch_size as a string",
              **_tt(_tt_toml(training='local_batch_size = 2\nseq_len = 256\n'
                                      'global_batch_size = "16"')),
              expect="error", contains="global_batch_size"),
        Input(c, "torchtitan flavor as a number",
              **_tt(_tt_toml(model='name = "llama3"\nflavor = 8')), expect="error",
              contains="8"),
        Input(c, "torchtitan converters as a number",
              **_tt(_tt_toml(model='name = "llama3"\nflavor = "8B"\nconverters = 3')),
              expect="error", contains="converters"),
        Input(c, "torchtitan enable_async_tensor_parallel as a string",
              **_tt(_tt_toml('tensor_parallel_degree = 2\n'
                             'enable_async_tensor_parallel = "no"')),
              expect="error", contains="enable_async_tensor_parallel"),
        Input(c, "torchtitan module_fqns_per_model_part garbage",
              **_tt(_tt_toml('pipeline_parallel_degree = 2\n'
                             'module_fqns_per_model_part = "x"')), expect="error",
              contains="module_fqns_per_model_part"),
        Input(c, "torchtitan flags with an open quote",
              **_tt("--model.name 'llama3\n", name="run.flags"), expect="error",
              contains="quot"),
        Input(c, "torchtitan flags without a section",
              **_tt("--seq_len 256\n", name="run.flags"), expect="error",
              contains="--seq_len"),
        Input(c, "torchtitan flags: a bare value",
              **_tt("--model.name llama3 --model.flavor 8B 256\n", name="run.flags"),
              expect="error", contains="256"),
        Input(c, "torchtitan file does not exist",
              ("import", "torchtitan", "{tmp}/missing.toml", "--cluster", _A100, "--json"),
              "error", "missing.toml"),
        Input(c, "torchtitan file is a folder",
              ("import", "torchtitan", "{tmp}", "--cluster", _A100, "--json"), "error", ""),
        Input(c, "torchtitan /dev/null", ("import", "torchtitan", "/dev/null", "--cluster",
                                          _A100, "--json"), "error", "model"),
        Input(c, "megatron --args ''", ("import", "megatron", "--args", "", "--cluster", _A100,
                                        "--json"), "error", "--num-layers"),
        Input(c, "megatron --args with an open quote",
              _mg("--tokenizer-model 'x"), "error", "quot"),
        Input(c, "megatron flag without its value", _mg("--hidden-size"), "error",
              "--hidden-size"),
        Input(c, "megatron a value twice", _mg("--num-layers 4"), "ok"),
        Input(c, "simulate a truncated plan", ("simulate", "{tmp}/p.json",
                                               "{fx}/dense/graph.json",
                                               "{fx}/dense/topology.json"), "error",
              "p.json", files=(("p.json", j),)),
        Input(c, "simulate a graph as the plan", ("simulate", "{fx}/dense/graph.json",
                                                  "{fx}/dense/graph.json",
                                                  "{fx}/dense/topology.json"), "error",
              "graph.json"),
        Input(c, "simulate plan and graph swapped", ("simulate", "{fx}/dense/graph.json",
                                                     "{fx}/dense/plan.json",
                                                     "{fx}/dense/topology.json"), "error",
              "graph.json"),
        Input(c, "simulate a plan with tp=0", ("simulate", "{tmp}/p.json",
                                               "{fx}/dense/graph.json",
                                               "{fx}/dense/topology.json"), "error", "tp",
              files=(("p.json", "@dense:parallel.tp=0"),)),
        Input(c, "simulate a plan with tp='2'", ("simulate", "{tmp}/p.json",
                                                 "{fx}/dense/graph.json",
                                                 "{fx}/dense/topology.json"), "error", "tp",
              files=(("p.json", '@dense:parallel.tp="2"'),)),
        Input(c, "simulate a plan with tp=3", ("simulate", "{tmp}/p.json",
                                               "{fx}/dense/graph.json",
                                               "{fx}/dense/topology.json"), "error", "",
              files=(("p.json", "@dense:parallel.tp=3"),)),
        Input(c, "simulate a plan with parallel a list", ("simulate", "{tmp}/p.json",
                                                          "{fx}/dense/graph.json",
                                                          "{fx}/dense/topology.json"),
              "error", "parallel", files=(("p.json", "@dense:parallel=[]"),)),
        Input(c, "simulate a plan with micro-batch 0", ("simulate", "{tmp}/p.json",
                                                        "{fx}/dense/graph.json",
                                                        "{fx}/dense/topology.json"), "error",
              "microbatch", files=(("p.json", "@dense:execution.microbatch_size=0"),)),
        Input(c, "simulate a plan with precision fp4", ("simulate", "{tmp}/p.json",
                                                        "{fx}/dense/graph.json",
                                                        "{fx}/dense/topology.json"), "error",
              "fp4", files=(("p.json", '@dense:execution.precision="fp4"'),)),
        Input(c, "simulate a plan with stage_layers not summing", (
            "simulate", "{tmp}/p.json", "{fx}/dense/graph.json", "{fx}/dense/topology.json"),
            "error", "stage_layers", files=(("p.json", "@dense:parallel.stage_layers=[1,1]"),)),
        Input(c, "export a plan with ep=3", ("export", "{tmp}/p.json", "{fx}/moe/graph.json",
                                             "{fx}/moe/topology.json", "--to", "megatron",
                                             "-o", "{tmp}/out"), "error", "",
              files=(("p.json", "@moe:parallel.ep=3"),)),
        Input(c, "export a plan whose graph has no nodes",
              ("export", "{fx}/dense/plan.json", "{tmp}/g.json", "{fx}/dense/topology.json",
               "--to", "megatron", "-o", "{tmp}/out"), "error", "node",
              files=(("g.json", '{"format": "shardplan.graph/1", "name": "g", "batch_size": 1,'
                                ' "nodes": [], "edges": []}'),)),
        Input(c, "export a topology file as the graph",
              ("export", "{fx}/dense/plan.json", "{fx}/dense/topology.json",
               "{fx}/dense/topology.json", "--to", "megatron", "-o", "{tmp}/out"), "error",
              "topology.json"),
        Input(c, "plan --cluster a plan file", _plan("llama3:debug",
                                                     cluster="{fx}/dense/plan.json"),
              "error", "plan.json"),
        Input(c, "plan --cluster an empty spec", _plan("llama3:debug", cluster=""), "error",
              "topology kind ''"),
        Input(c, "plan --cluster ',,,'", _plan("llama3:debug", cluster=",,,"), "error",
              "',,,'"),
        Input(c, "plan a spec with a trailing comma", _plan("llama3:debug,", "--families", "llm",
                                                            limit="20"), "ok"),
        Input(c, "plan a spec with an empty key", _plan("llama3:debug,=4"), "error", "=4"),
        Input(c, "plan a spec key without value", _plan("gpt:hidden,layers=2"), "error",
              "hidden"),
    ]


def _overwriting() -> list[Input]:
    c = "overwriting inputs"
    return [
        Input(c, "export -o its plan", _ex("dense", "megatron", out="{fx}/dense/plan.json"),
              "error", "plan.json"),
        Input(c, "export -o its graph", _ex("dense", "torch", out="{fx}/dense/graph.json"),
              "error", "graph.json"),
        Input(c, "export -o its topology",
              _ex("dense", "chrome-trace", out="{fx}/dense/topology.json"), "error",
              "topology.json"),
        Input(c, "export -o a folder", _ex("dense", "megatron", out="{fx}/dense"), "error",
              "dense"),
        Input(c, "export -o into a missing folder",
              _ex("dense", "megatron", out="{tmp}/no/such/out.json"), "ok"),
        Input(c, "export -o /dev/null", _ex("dense", "megatron", out="/dev/null"), "ok"),
        Input(c, "simulate -o its plan", _sim("dense", "-o", "{fx}/dense/plan.json"), "error",
              "plan.json"),
        Input(c, "import torchtitan -o its own file's folder",
              ("import", "torchtitan", "{tmp}/run.toml", "--cluster", _A100, "-o", "{tmp}"),
              "ok", files=(("run.toml", _tt_toml()),)),
        Input(c, "import torchtitan -o the TOML file",
              ("import", "torchtitan", "{tmp}/run.toml", "--cluster", _A100, "-o",
               "{tmp}/run.toml"), "error", "run.toml", files=(("run.toml", _tt_toml()),)),
        Input(c, "import megatron -o a file", _mg("", out=False)[:-1] + ("-o", "{tmp}/f"),
              "error", "f", files=(("f", "x"),)),
        Input(c, "plan -o its --baseline",
              ("plan", "gpt:hidden=256,layers=4,heads=8,vocab=32000,seq=256", "--cluster",
               _A100, "--time-limit", "2", "--workers", "1", "--families", "llm",
               "--baseline", "{tmp}/b.json", "-o", "{tmp}/b.json"), "error", "b.json",
              files=(("b.json", "@dense:"),)),
        Input(c, "plan -o its graph file", ("plan", "{tmp}/g.json", "--cluster", _A100,
                                            "--time-limit", "2", "--workers", "1",
                                            "-o", "{tmp}/g.json"), "error", "g.json",
              files=(("g.json", "@dense-graph"),)),
        Input(c, "plan --report over -o", _plan("llama3:debug", "--families", "llm", "-o",
                                                "{tmp}/x.json", "--report", "{tmp}/x.json",
                                                limit="20"),
              "error", "x.json"),
    ]


def _conflicting() -> list[Input]:
    c = "conflicting flags"
    return [
        Input(c, "--gpus against gpus=", _mg("", "dgx-a100,nodes=1,gpus=4") + ("--gpus", "2"),
              "error", "--gpus"),
        Input(c, "plan --gpus against gpus=", _plan("llama3:debug", "--gpus", "2",
                                                    cluster="dgx-a100,nodes=1,gpus=4"),
              "error", "--gpus"),
        Input(c, "--gpus 3 of 2 nodes", _mg("", "dgx-a100,nodes=2") + ("--gpus", "12"),
              "error", "12"),
        Input(c, "--world size against the cluster", _mg("--data-parallel-size 4"), "error",
              "4"),
        Input(c, "two virtual-stage arguments",
              _mg("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
                  "--num-virtual-stages-per-pipeline-rank 2"), "error", "virtual"),
        Input(c, "a layout beside --decoder-first-pipeline-num-layers",
              _mg("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                  "'Ettt|tttttL' --decoder-first-pipeline-num-layers 3"), "error",
              "--pipeline-model-parallel-layout"),
        Input(c, "a layout not placing the layers",
              _mg("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                  "'Ettt|ttL'"), "error", "--pipeline-model-parallel-layout"),
        Input(c, "selective recompute with a method",
              _mg("--recompute-granularity selective --recompute-method uniform"), "note",
              "--recompute-method"),
        Input(c, "selective recompute with a layer count",
              _mg("--recompute-granularity selective --recompute-num-layers 2"), "error",
              "--recompute-num-layers"),
        Input(c, "--recompute-num-layers above the layers",
              _mg("--recompute-granularity full --recompute-method uniform "
                  "--recompute-num-layers 99"), "note", "--recompute-num-layers"),
        Input(c, "interleaving without a pipeline",
              _mg("--num-layers-per-virtual-pipeline-stage 2"), "error", "pipeline"),
        Input(c, "--sequence-parallel at TP 1", _mg("--sequence-parallel"), "note",
              "--sequence-parallel"),
        Input(c, "--use-distributed-optimizer twice", _mg("--use-distributed-optimizer "
                                                          "--use-distributed-optimizer"), "ok"),
        Input(c, "torchtitan global_batch_size not a multiple",
              **_tt(_tt_toml(training="local_batch_size = 2\nseq_len = 256\n"
                                      "global_batch_size = 7")), expect="error",
              contains="global_batch_size 7"),
        Input(c, "torchtitan tokens not whole sequences",
              **_tt(_tt_toml(training="seq_len = 256\n"
                                      "num_tokens_per_microbatch_per_dp_rank = 300")),
              expect="error", contains="300"),
        Input(c, "torchtitan microbatch size not dividing local",
              **_tt(_tt_toml("pipeline_parallel_degree = 2\n"
                             "pipeline_parallel_microbatch_size = 3")),
              expect="error", contains="pipeline_parallel_microbatch_size 3"),
        Input(c, "torchtitan mixed_precision_reduce odd",
              **_tt(_tt_toml(training='local_batch_size = 2\nseq_len = 256\n'
                                      'mixed_precision_param = "bfloat16"\n'
                                      'mixed_precision_reduce = "float16"')),
              expect="error", contains="float16"),
        Input(c, "torchtitan looped schedule with one stage per rank",
              **_tt(_tt_toml("pipeline_parallel_degree = 2\n"
                             'pipeline_parallel_schedule = "Interleaved1F1B"\n'
                             "pipeline_parallel_layers_per_stage = 16")),
              expect="error", contains="stage"),
        Input(c, "torchtitan flags and TOML mixed",
              **_tt("--model.name llama3\n[model]\nflavor = '8B'\n", name="run.flags"),
              expect="error", contains=""),
        Input(c, "plan --microbatches not dividing the batch",
              _plan("llama3:debug", "--global-batch", "8", "--microbatches", "3", limit="20"),
              "error", "--microbatches"),
        Input(c, "plan --microbatch-size (a simulate flag)",
              _plan("llama3:debug", "--global-batch", "8", "--microbatch-size", "4",
                    "--microbatches", "4"), "error", "--microbatch-size"),
        Input(c, "plan --steps without --run", _plan("llama3:debug", "--steps", "3", limit="20"),
              "error", "--steps"),
        Input(c, "plan --failures flag without --failures",
              _plan("llama3:debug", "--checkpoint-interval", "30"), "error",
              "--checkpoint-interval"),
        Input(c, "simulate --checkpoint-interval without --failures",
              _sim("dense", "--checkpoint-interval", "30"), "error", "--checkpoint-interval"),
        Input(c, "simulate --failures without --checkpoint-interval",
              _sim("dense", "--failures", "llama3"), "error", "--checkpoint-interval"),
        Input(c, "simulate --failures -1", _sim("dense", "--failures", "-1",
                                                "--checkpoint-interval", "30"),
              "error", "--failures"),
        Input(c, "simulate --schedule gpipe with --virtual-stages 2",
              _sim("dense", "--schedule", "gpipe", "--virtual-stages", "2"), "error",
              "--virtual-stages"),
        Input(c, "export --recompute-every without full recompute",
              _ex("dense", "megatron", "--recompute-every", "2"), "error",
              "--recompute-every 2"),
        Input(c, "simulate --recompute-every without full recompute",
              _sim("dense", "--recompute-every", "3"), "error", "--recompute-every 3"),
        Input(c, "export --recompute-every with --recompute full",
              _ex("dense", "megatron", "--recompute", "full", "--recompute-every", "2"),
              "note", "every block"),
        Input(c, "plan --memory-limit above the devices' memory",
              _plan("llama3:debug", "--families", "llm", "--memory-limit", "1TiB",
                    limit="20"), "note", "--memory-limit"),
        Input(c, "plan --seq-len equal to seq=", _plan("llama3:debug,seq=128", "--seq-len",
                                                       "128", "--families", "llm",
                                                       limit="20"), "ok"),
    ]


def _moe() -> list[Input]:
    c = "MoE arguments"
    e = _EXP
    return [
        Input(c, "--num-experts 6 over EP 4", _mg("--num-experts 6 --moe-router-topk 2 --swiglu "
                                                  "--expert-model-parallel-size 4"), "error",
              "--num-experts 6 is not a multiple of --expert-model-parallel-size 4"),
        Input(c, "EP without experts", _mg("--expert-model-parallel-size 2"), "error",
              "--expert-model-parallel-size 2 needs a mixture of experts"),
        Input(c, "--num-experts 0 with EP", _mg("--num-experts 0 "
                                                "--expert-model-parallel-size 2"),
              "error", "--expert-model-parallel-size 2 needs"),
        Input(c, "--num-experts -1", _mg("--num-experts -1"), "error", "--num-experts"),
        Input(c, "--num-experts 10^9", _mg("--num-experts 1000000000"), "error",
              "--num-experts"),
        Input(c, "--num-experts 1.5", _mg("--num-experts 1.5"), "error", "--num-experts"),
        Input(c, "--moe-router-topk 0", _mg(e + "--moe-router-topk 0"), "error",
              "--moe-router-topk"),
        Input(c, "--moe-router-topk 9 of 8 experts", _mg(e + "--moe-router-topk 9"), "error",
              "--moe-router-topk 9 is above --num-experts 8"),
        Input(c, "--moe-router-topk without experts", _mg("--moe-router-topk 2"), "note",
              "--moe-router-topk"),
        Input(c, "--moe-ffn-hidden-size 0", _mg(e + "--moe-ffn-hidden-size 0"), "error",
              "--moe-ffn-hidden-size"),
        Input(c, "--moe-ffn-hidden-size 10^8", _mg(e + "--moe-ffn-hidden-size 100000000"),
              "error", "--moe-ffn-hidden-size"),
        Input(c, "--expert-tensor-parallel-size 3", _mg(e + "--expert-model-parallel-size 2 "
                                                        "--expert-tensor-parallel-size 3"),
              "error", "--expert-tensor-parallel-size"),
        Input(c, "--expert-model-parallel-size 0", _mg(e + "--expert-model-parallel-size 0"),
              "error", "--expert-model-parallel-size"),
        Input(c, "--expert-model-parallel-size 16 on 8 GPUs",
              _mg(e + "--num-experts 16 --expert-model-parallel-size 16"), "error",
              "1 x 16"),
        Input(c, "--expert-model-parallel-size 3 (8 not a multiple)",
              _mg(e + "--expert-model-parallel-size 3", "dgx-a100,nodes=1,gpus=6"), "error",
              "--expert-model-parallel-size 3"),
        Input(c, "etp x ep not dividing a rank's devices",
              _mg(e + "--tensor-model-parallel-size 2 --expert-model-parallel-size 8 "
                      "--expert-tensor-parallel-size 2"), "error", "--expert"),
        Input(c, "--moe-router-num-groups 3 of 8 experts",
              _mg(e + "--moe-router-num-groups 3 --moe-router-group-topk 1"), "error",
              "--moe-router-num-groups 3 does not divide --num-experts 8"),
        Input(c, "--moe-router-group-topk without groups",
              _mg(e + "--moe-router-group-topk 2"), "error", "--moe-router-group-topk"),
        Input(c, "--moe-router-group-topk above the groups",
              _mg(e + "--moe-router-num-groups 2 --moe-router-group-topk 3"), "error",
              "--moe-router-group-topk 3 is above --moe-router-num-groups 2"),
        Input(c, "expert bias without sigmoid", _mg(e + "--moe-router-enable-expert-bias"),
              "error", "--moe-router-enable-expert-bias"),
        Input(c, "capacity factor with sinkhorn",
              _mg(e + "--moe-router-load-balancing-type sinkhorn "
                      "--moe-expert-capacity-factor 1.0"), "error",
              "--moe-expert-capacity-factor"),
        Input(c, "DeepEP without flex", _mg(e + "--moe-enable-deepep"), "error",
              "--moe-enable-deepep"),
        Input(c, "top-1 softmax without pre-softmax", _mg(e + "--moe-router-topk 1"),
              "error", "--moe-router-pre-softmax"),
        Input(c, "--moe-layer-freq garbage", _mg(e + "--moe-layer-freq '([0]*'"), "error",
              "--moe-layer-freq"),
        Input(c, "--moe-layer-freq dense after moe", _mg(e + "--moe-layer-freq "
                                                         "'[1,1,1,1,1,1,1,0]'"), "error",
              "--moe-layer-freq"),
        Input(c, "--moe-layer-freq of the wrong length",
              _mg(e + "--moe-layer-freq '[0,1,1]'"), "error", "--moe-layer-freq"),
        Input(c, "--moe-layer-freq 0", _mg(e + "--moe-layer-freq 0"), "error",
              "--moe-layer-freq"),
        Input(c, "--moe-layer-freq __import__", _mg(e + "--moe-layer-freq "
                                                    "\"__import__('os').system('true')\""),
              "error", "--moe-layer-freq"),
        Input(c, "--moe-layer-freq 2 (every other)", _mg(e + "--moe-layer-freq 2"), "error",
              "--moe-layer-freq"),
        Input(c, "--moe-expert-capacity-factor -1 (dropless)",
              _mg(e + "--moe-expert-capacity-factor -1"), "ok"),
        Input(c, "--moe-expert-capacity-factor abc",
              _mg(e + "--moe-expert-capacity-factor abc"), "error",
              "--moe-expert-capacity-factor"),
        Input(c, "--moe-token-dispatcher-type flex", _mg(e + "--moe-token-dispatcher-type flex"),
              "note", "flex"),
        Input(c, "--moe-router-topk-scaling-factor 0",
              _mg(e + "--moe-router-topk-scaling-factor 0"), "ok"),
        Input(c, "--multi-latent-attention --kv-lora-rank 0",
              _mg(e + "--multi-latent-attention --kv-lora-rank 0"), "error",
              "--kv-lora-rank"),
        Input(c, "an MoE run on 8 GPUs, imported", _mg(e + "--expert-model-parallel-size 4",
                                                       out=True), "ok"),
        Input(c, "torchtitan expert_parallel_degree 3",
              **_tt(_tt_toml("expert_parallel_degree = 3",
                             model='name = "qwen3"\nflavor = "debugmodel_moe"')),
              expect="error", contains="expert parallelism 3"),
        Input(c, "torchtitan expert_parallel_degree 0",
              **_tt(_tt_toml("expert_parallel_degree = 0",
                             model='name = "qwen3"\nflavor = "debugmodel_moe"')),
              expect="error", contains="expert_parallel_degree"),
        Input(c, "torchtitan expert_parallel_degree 16 on 8 GPUs",
              **_tt(_tt_toml("expert_parallel_degree = 16",
                             model='name = "qwen3"\nflavor = "debugmodel_moe"')),
              expect="error", contains="expert parallelism 16"),
        Input(c, "torchtitan expert_parallel_degree on a dense model",
              **_tt(_tt_toml("expert_parallel_degree = 2")), expect="note",
              contains="expert_parallel_degree"),
        Input(c, "torchtitan expert_tensor_parallel_degree 4 under EP",
              **_tt(_tt_toml("tensor_parallel_degree = 2\nexpert_parallel_degree = 2\n"
                             "expert_tensor_parallel_degree = 4",
                             model='name = "qwen3"\nflavor = "debugmodel_moe"')),
              expect="error", contains="expert_tensor_parallel_degree"),
        Input(c, "torchtitan qwen3 debugmodel_moe with EP 4",
              **_tt(_tt_toml("expert_parallel_degree = 4",
                             model='name = "qwen3"\nflavor = "debugmodel_moe"')),
              expect="ok"),
        Input(c, "plan mixtral:debug,top_k=0", _plan("mixtral:debug,top_k=0"), "error",
              "top_k"),
        Input(c, "plan mixtral:debug,top_k=5 of 4 experts", _plan("mixtral:debug,top_k=5"),
              "error", "top_k"),
        Input(c, "plan deepseek_v3:debug,n_groups=3 of 8 experts",
              _plan("deepseek_v3:debug,n_groups=3"), "error", "n_groups"),
        Input(c, "plan deepseek_v3:debug,topk_groups=5",
              _plan("deepseek_v3:debug,topk_groups=5"), "error", "topk_groups"),
        Input(c, "plan deepseek_v3:debug,first_k_dense=99",
              _plan("deepseek_v3:debug,first_k_dense=99"), "error", "first_k_dense"),
        Input(c, "plan mixtral:debug,moe_dim=0", _plan("mixtral:debug,moe_dim=0"), "error",
              "moe_dim"),
        Input(c, "plan mixtral:debug (unusual: tiny)", _plan("mixtral:debug", "--families",
                                                             "llm", limit="20"), "ok"),
        Input(c, "plan deepseek_v3:debug on 1 GPU",
              _plan("deepseek_v3:debug", "--families", "llm", "--gpus", "1", limit="20"), "ok"),
    ]


def _unusual_ok() -> list[Input]:
    c = "valid but unusual"
    return [
        Input(c, "megatron --flag=value forms", _mg("--num-layers=8 --hidden-size=512"), "ok"),
        Input(c, "megatron arguments over several lines",
              ("import", "megatron", "--args", _M.replace(" --", " \\\n  --"), "--cluster",
               _A100, "--json"), "ok"),
        Input(c, "megatron --cpu-offloading (note)", _mg("--cpu-offloading"), "note",
              "--cpu-offloading"),
        Input(c, "megatron 2 of 8 GPUs", _mg("", _A100) + ("--gpus", "2"), "ok"),
        Input(c, "torchtitan flags with =", **_tt("--model.name=llama3 --model.flavor=8B\n"
                                                  "--training.seq_len=256\n"
                                                  "--training.local_batch_size=2\n",
                                                  name="run.flags"), expect="ok"),
        Input(c, "torchtitan unknown section (note)",
              **_tt(_tt_toml(extra="[frobnicate]\nx = 1")), expect="note", contains="frobnicate"),
        Input(c, "torchtitan unknown training key (note)",
              **_tt(_tt_toml(training="local_batch_size = 2\nseq_len = 256\nfrob = 1")),
              expect="note", contains="training.frob"),
        Input(c, "torchtitan TOML with a BOM",
              **_tt(b"\xef\xbb\xbf" + _tt_toml().encode()), expect="ok"),
        Input(c, "torchtitan CRLF line ends", **_tt(_tt_toml().replace("\n", "\r\n")),
              expect="ok"),
        Input(c, "plan llama3:debug on 1 GPU", _plan("llama3:debug", "--gpus", "1",
                                                     "--families", "llm", limit="20"), "ok"),
        Input(c, "plan a spec with blanks after commas",
              _plan("gpt:hidden=64, layers=2, heads=2, vocab=100", "--families", "llm",
                    limit="20"), "ok"),
        Input(c, "plan llama3:8B,n_layers=2 --target megatron",
              _plan("llama3:8B,n_layers=2,seq=256", "--families", "llm", "--target",
                    "megatron", limit="30"), "ok"),
        Input(c, "export chrome-trace -o a .json in a fresh folder",
              _ex("tt", "chrome-trace", out="{tmp}/new/trace.json"), "ok"),
    ]


def _time_limits() -> list[Input]:
    c = "time limits"
    return [
        Input(c, "plan llama3:8B --time-limit 2 on worker processes",
              ("plan", "llama3:8B", "--cluster", _H100, "--time-limit", "2", "--top", "2"),
              "error", "time limit"),
        Input(c, "plan llama3:8B --time-limit 1 on 2 workers",
              ("plan", "llama3:8B", "--cluster", _H100, "--time-limit", "1", "--workers",
               "2"), "error", "time limit"),
        Input(c, "plan mixtral:8x7B --time-limit 2 on worker processes",
              ("plan", "mixtral:8x7B", "--cluster", _H100, "--time-limit", "2"), "error",
              "time limit"),
        Input(c, "plan llama3:debug --time-limit 2 in one process",
              _plan("llama3:debug", "--families", "llm"), "error", "time limit"),
        Input(c, "plan llama3:debug --time-limit 20", _plan("llama3:debug", "--families",
                                                            "llm", limit="20"), "ok"),
    ]


#: Inputs known to differ, and why (the cause is outside the command line, importers and
#: exports: named here so the report says whose it is).
KNOWN: dict[str, str] = {}


def inputs() -> list[Input]:
    """Every input of the census, by category."""
    return (_from_tests() + _sizes() + _unknown_names() + _precision() + _exports() +
            _baseline() + _malformed() + _overwriting() + _conflicting() + _moe() +
            _time_limits() + _unusual_ok())


# ---------------------------------------------------------------------------------------------
# running them


def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                PYTHONHASHSEED="0", HF_HUB_OFFLINE="1")


def _run(argv: Sequence[str], cwd: str, timeout: float) -> tuple[int | None, str, float]:
    """Exit status (None on timeout), stderr and seconds of one command in its own process
    group (killed whole on timeout)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([_python(), "-m", "shardplan", *argv], cwd=cwd, env=_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        rc = None
    return rc, err.decode("utf-8", "replace"), time.monotonic() - t0


def _fixtures(fx: Path, timeout: float) -> None:
    """The plans the simulate and export inputs read: a dense Megatron run (TP 2 x PP 2 x DP
    2), an MoE one (DP 8 x EP 2), a torchtitan one (TP 2 x FSDP 4), a fp16 run on V100, and
    two topologies (2 flat devices, two DGX A100)."""
    (fx / "tt.toml").write_text(_tt_toml("data_parallel_shard_degree = -1\n"
                                         "tensor_parallel_degree = 2"))
    small = _M.replace("--num-layers 8 --hidden-size 512", "--num-layers 4 --hidden-size 256")
    small = small.replace("--global-batch-size 8", "--global-batch-size 16")
    commands = {
        "dense": ["import", "megatron", "--args", small + "--tensor-model-parallel-size 2 "
                  "--pipeline-model-parallel-size 2 --bf16", "--cluster", _A100],
        "moe": ["import", "megatron", "--args", small + "--num-experts 4 --moe-router-topk 2 "
                "--expert-model-parallel-size 2 --swiglu --bf16 "
                "--moe-token-dispatcher-type alltoall", "--cluster", _A100],
        "tt": ["import", "torchtitan", str(fx / "tt.toml"), "--cluster", _A100],
        "v100": ["import", "megatron", "--args", small + "--fp16", "--cluster", _V100],
    }
    for name, argv in commands.items():
        rc, err, _ = _run([*argv, "-o", str(fx / name)], str(fx), timeout)
        if rc != 0:
            raise SystemExit(f"fixture {name} failed ({rc}):\n{err}")
    for name, argv in {"flat2.json": ["topology", "flat", "--devices", "2"],
                       "a100x2.json": ["topology", "dgx-a100,nodes=2"]}.items():
        rc, err, _ = _run([*argv, "-o", str(fx / name)], str(fx), timeout)
        if rc != 0:
            raise SystemExit(f"fixture {name} failed ({rc}):\n{err}")


def _edited(fx: Path, recipe: str) -> str:
    """``@FIXTURE:dotted.key=JSON`` -> that fixture's plan.json with one value replaced
    (``@FIXTURE:`` alone: the plan unchanged; ``@FIXTURE-graph``: its graph)."""
    import json

    head, _, edit = recipe[1:].partition(":")
    if head.endswith("-graph"):
        return (fx / head[:-6] / "graph.json").read_text()
    data = json.loads((fx / head / "plan.json").read_text())
    if edit:
        key, _, value = edit.partition("=")
        *path, last = key.split(".")
        node = data
        for k in path:
            node = node.setdefault(k, {})
        node[last] = json.loads(value)
    return json.dumps(data)


def _fill(text: str, fx: Path, tmp: Path) -> str:
    return text.replace("{fx}", str(fx)).replace("{tmp}", str(tmp))


def classify(case: Input, rc: int | None, err: str) -> tuple[str, str, bool]:
    """(verdict, the line that decided it, whether the message holds ``case.contains``)."""
    if rc is None:
        return "hang", "", True
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if "Traceback (most recent call last)" in err:
        last = next((ln for ln in reversed(lines) if not ln.startswith(" ")), "")
        return "traceback", last, True
    notes = [ln for ln in lines if ln.startswith("shardplan: note: ")]
    other = [ln for ln in lines if not ln.startswith("shardplan: note: ")]
    if rc == 2 and len(other) == 1 and other[0].startswith("shardplan: error: "):
        return "error", other[0], case.expect != "error" or case.contains in other[0]
    if rc == 0 and not other:
        hit = next((ln for ln in notes if case.contains and case.contains in ln), None)
        if case.expect == "note":
            return ("note", hit, True) if hit else ("ok", notes[0] if notes else "", True)
        return ("note" if notes and case.expect == "error" else "ok",
                notes[0] if notes else "", True)
    return "wrong-exit", f"exit {rc}: " + " / ".join(other[:3])[:300], True


def run_one(case: Input, fx: Path, timeout: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="bad-llm-") as tmp_name:
        tmp = Path(tmp_name)
        for name, content in case.files:
            if isinstance(content, str) and content.startswith("@"):
                content = _edited(fx, content)
            (tmp / name).write_bytes(content if isinstance(content, bytes) else
                                     content.encode())
        argv = [_fill(a, fx, tmp) for a in case.argv]
        rc, err, secs = _run(argv, str(tmp), timeout)
        err = err.replace(str(tmp), "{tmp}").replace(str(fx), "{fx}")
    verdict, line, message_ok = classify(case, rc, err)
    return Outcome(case, verdict, rc, secs, line, message_ok, err)


# ---------------------------------------------------------------------------------------------
# the report


def _cell(text: str, width: int = 220) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[:width - 3] + "..."


def _command(case: Input) -> str:
    """The command line, Megatron's common arguments written ``$M`` (the census's) and ``$T``
    (the test's), as said under the table."""
    return shlex.join(case.argv).replace(_M, "$M ").replace(_TEST_M, "$T ")


def summary(outcomes: Sequence[Outcome]) -> list[str]:
    """The table of inputs tried and verdicts per category (markdown)."""
    cats: dict[str, Counter[str]] = {}
    differs: Counter[str] = Counter()
    for o in outcomes:
        cats.setdefault(o.case.category, Counter())[o.verdict] += 1
        differs[o.case.category] += o.differs
    head = ["category", "tried", *VERDICTS, "as expected", "differs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    total: Counter[str] = Counter()
    for cat, counts in cats.items():
        tried = sum(counts.values())
        row = [cat, str(tried), *(str(counts[v]) for v in VERDICTS),
               str(tried - differs[cat]), str(differs[cat])]
        lines.append("| " + " | ".join(row) + " |")
        total.update(counts)
    n, d = len(outcomes), sum(differs.values())
    lines.append("| **total** | **" + "** | **".join(
        [str(n), *(str(total[v]) for v in VERDICTS), str(n - d), str(d)]) + "** |")
    return lines


def report(outcomes: Sequence[Outcome], seconds: float, jobs: int, timeout: float) -> str:
    lines = ["# Bad inputs on the LLM commands (issue 46)", "",
             "Written by `python benchmarks/bad_inputs_llm.py` (do not edit by hand; run it "
             "again to regenerate: `.venv/bin/python benchmarks/bad_inputs_llm.py "
             "[-j JOBS]`). Each input is a `shardplan` command line run in its own process "
             f"(timeout {timeout:g} s; `plan` with `--time-limit 2`, or 20 s where it "
             "should succeed, and one worker unless the input is about workers); its "
             "verdict: `error` "
             "(exit 2, one line `shardplan: error: ...` besides notes), `note` (exit 0 with "
             "the expected note), `ok` (exit 0), `traceback`, `hang` (timeout), `wrong-exit` "
             "(another exit status or other lines on stderr). An input *differs* when its "
             "verdict is not the expected one, or its message does not name what the user "
             "wrote (the text expected in it). The inputs marked (test) are "
             "`tests/cli/test_bad_inputs_llm.py`'s `CASES`.", "",
             f"{len(outcomes)} inputs in {seconds:.0f} s ({jobs} at a time, load average "
             f"{os.getloadavg()[0]:.1f} at the end).", "", "## Verdicts by category", ""]
    lines += summary(outcomes)
    bad = [o for o in outcomes if o.differs]
    lines += ["", "## Inputs whose verdict differs from the expected one", ""]
    if not bad:
        lines.append("None.")
    else:
        lines += ["| category | input | expected | got | what it said | known cause |",
                  "|---|---|---|---|---|---|"]
        for o in bad:
            got = o.verdict if o.verdict != o.case.expect else \
                f"{o.verdict}, without `{o.case.contains}`"
            lines.append(f"| {o.case.category} | {_cell(o.case.name, 80)} | "
                         f"{o.case.expect} | {got} | {_cell(o.line)} | "
                         f"{KNOWN.get(o.case.name, '')} |")
    lines += ["", "## Every input", "",
              f"`$M` stands for Megatron's common arguments `{_M.strip()}` and `$T` for the "
              f"test's `{_TEST_M.strip()}` (an input's own arguments follow them; a later "
              "value of the same argument counts), `{fx}` for "
              "the fixtures' folder (`dense/`, `moe/`, `tt/`, `v100/`: imports of a TP 2 x PP 2 "
              "x DP 2 GPT, a DP 8 x EP 2 mixture, a torchtitan TP 2 x FSDP 4 Llama 3 8B, an "
              "fp16 run on V100), `{tmp}` for the input's own folder.", "",
              "| category | input | command | expected | verdict | seconds | what it said |",
              "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.case.category} | {_cell(o.case.name, 80)} | "
                     f"`{_cell(_command(o.case), 160)}` | {o.case.expect} | {o.verdict} | "
                     f"{o.seconds:.1f} | {_cell(o.line)} |")
    return "\n".join(lines) + "\n"


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default=str(RESULTS / "bad_inputs_llm.md"),
                    help="the markdown report (default: benchmarks/results/bad_inputs_llm.md)")
    ap.add_argument("-j", "--jobs", type=int, default=1,
                    help="inputs run at once (default 1: the machine is shared)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a hang")
    ap.add_argument("--only", default=None,
                    help="run only the inputs whose category or name contains this text "
                         "(the report then covers those only)")
    ap.add_argument("--list", action="store_true", help="list the inputs and exit")
    args = ap.parse_args(None if argv is None else list(argv))
    cases = inputs()
    if args.only:
        cases = [c for c in cases if args.only in c.category or args.only in c.name]
    if args.list:
        for c in cases:
            print(f"{c.category:22s} {c.expect:5s} {c.name}")
        print(f"{len(cases)} inputs")
        return
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bad-llm-fx-") as fx_name:
        fx = Path(fx_name)
        _fixtures(fx, 4 * args.timeout)  # a capture each: generous on a loaded machine
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = []
            for o in pool.map(lambda c: run_one(c, fx, args.timeout), cases):
                outcomes.append(o)
                mark = "  " if not o.differs else "!!"
                print(f"{mark} {o.case.category:22s} {o.verdict:10s} {o.seconds:5.1f} s  "
                      f"{o.case.name}" + (f"\n     {o.line[:200]}" if o.differs else ""),
                      flush=True)
    seconds = time.monotonic() - t0
    print()
    print("\n".join(summary(outcomes)))
    write_atomic(args.out, report(outcomes, seconds, args.jobs, args.timeout))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
