"""The inputs ``benchmarks/bad_inputs_llm.py`` found answered wrongly (issue 46): a traceback,
a silent acceptance, a flag that said it overrode and changed nothing, a message naming an
internal name. Each now one line ``shardplan: error: ...`` naming what the user wrote, or a
note, or accepted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from shardplan.importers.megatron import parse_megatron
from shardplan.ir import Graph, save
from shardplan.topology import build
from tests.helpers import plan_of_run, run_cli

_TOML = """[model]
name = "llama3"
flavor = "8B"
{model}
[training]
local_batch_size = 2
seq_len = 256
[parallelism]
{parallelism}
{extra}
"""


def _toml(tmp_path: Path, model: str = "", parallelism: str = "", extra: str = "",
          *, raw: bytes | None = None) -> str:
    path = tmp_path / "run.toml"
    path.write_bytes(raw if raw is not None else
                     _TOML.format(model=model, parallelism=parallelism, extra=extra).encode())
    return str(path)


def _titan(path: str) -> list[str]:
    return ["import", "torchtitan", path, "--cluster", "dgx-a100,nodes=1", "--json"]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("shardplan: note:")]
    assert len(lines) == 1 and lines[0].startswith("shardplan: error: "), err
    assert "Traceback" not in err
    return lines[0]


# --- import torchtitan ---------------------------------------------------------------------

@pytest.mark.parametrize(("value", "shown"), [("0", "0"), ("-2", "-2"), ('"-1"', "'-1'")])
def test_the_shard_degree_is_named_as_written(value: str, shown: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _toml(tmp_path, parallelism=f"data_parallel_shard_degree = {value}")
    assert run_cli(_titan(path)) == 2
    line = _one_line(capsys)  # was "[parallelism] s must be ..."
    assert f"[parallelism] data_parallel_shard_degree must be an integer >= 1, got {shown}" \
        in line


def test_converters_not_a_list_is_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_titan(_toml(tmp_path, model="converters = 3"))) == 2  # was a TypeError
    assert "[model] converters is a list of names" in _one_line(capsys)


@pytest.mark.parametrize("key", ["enable_async_tensor_parallel", "enable_sequence_parallel"])
def test_a_switch_must_be_true_or_false(key: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = _toml(tmp_path, parallelism=f'tensor_parallel_degree = 2\n{key} = "no"')
    assert run_cli(_titan(path)) == 2  # "no" was read as true
    assert f"[parallelism] {key} is true or false, got 'no'" in _one_line(capsys)


def test_the_optimizer_is_named_as_written(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_titan(_toml(tmp_path, extra='[optimizer]\nname = "SGD"'))) == 2
    assert "[optimizer] name 'SGD' is not one shardplan models" in _one_line(capsys)


def test_a_byte_order_mark_is_skipped(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    text = _TOML.format(model="", parallelism="tensor_parallel_degree = 2", extra="")
    assert run_cli(_titan(_toml(tmp_path, raw=b"\xef\xbb\xbf" + text.encode()))) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["tp"] == 2


# --- import megatron -----------------------------------------------------------------------

_M = ("--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 256 "
      "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 ")


def _mg(extra: str) -> list[str]:
    return ["import", "megatron", "--args", _M + extra, "--json"]


def test_an_unknown_tokenizer_type_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_mg("--tokenizer-type Nonsense")) == 2  # was accepted silently
    assert "--tokenizer-type 'Nonsense' is not one of Megatron-LM's" in _one_line(capsys)
    assert run_cli(_mg("--tokenizer-type GPT2BPETokenizer")) == 0


def test_selective_recompute_takes_no_layer_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_mg("--recompute-granularity selective --recompute-num-layers 2")) == 2
    assert "selective takes no --recompute-num-layers" in _one_line(capsys)
    assert run_cli(_mg("--recompute-granularity selective --recompute-method uniform")) == 0
    assert "--recompute-method does nothing under --recompute-granularity selective" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), [
    ("--hidden-size 500", "--hidden-size 500 is not a multiple of --num-attention-heads 8"),
    ("--group-query-attention --num-query-groups 3",
     "--num-attention-heads 8 is not a multiple of --num-query-groups 3")])
def test_model_dimensions_are_named_by_their_arguments(
        extra: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_mg(extra)) == 2  # was "hidden size 500 ... the 8 attention heads"
    assert message in _one_line(capsys)


_E = "--num-experts 8 --moe-router-topk 2 --swiglu --moe-token-dispatcher-type alltoall "


@pytest.mark.parametrize(("extra", "message"), [
    ("--num-experts 6 --moe-router-topk 2 --swiglu --expert-model-parallel-size 4",
     "--num-experts 6 is not a multiple of --expert-model-parallel-size 4"),
    ("--expert-model-parallel-size 2",
     "--expert-model-parallel-size 2 needs a mixture of experts: give --num-experts"),
    (_E + "--moe-router-topk 9", "--moe-router-topk 9 is above --num-experts 8"),
    (_E + "--moe-router-num-groups 3 --moe-router-group-topk 1",
     "--moe-router-num-groups 3 does not divide --num-experts 8"),
    (_E + "--moe-router-num-groups 2 --moe-router-group-topk 3",
     "--moe-router-group-topk 3 is above --moe-router-num-groups 2")])
def test_expert_arguments_are_named(extra: str, message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Were "expert parallelism 4 does not divide the 6 experts", "9 experts per token
    exceed the 8 experts", "group-limited routing does not fit: ...": the values, not the
    arguments that gave them."""
    assert run_cli(_mg(extra)) == 2
    assert message in _one_line(capsys)


def test_extra_values_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_mg("-num-layers 8")) == 2  # one dash: values of the flag before it
    assert "--global-batch-size takes one value, got 3: '8 -num-layers 8'" in \
        _one_line(capsys)


# --- plan ----------------------------------------------------------------------------------

def test_a_spec_s_expert_count_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["plan", "mixtral:debug,num_experts=1000000000", "--cluster",
                    "dgx-a100,nodes=1"]) == 2  # was captured, then searched
    assert "num_experts=1,000,000,000 is above" in _one_line(capsys)


def test_steps_without_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["plan", "llama3:debug", "--cluster", "dgx-a100,nodes=1",
                    "--steps", "3"]) == 2  # was ignored after the whole search
    assert "--steps 3 counts the steps of --run" in _one_line(capsys)


def test_two_outputs_on_one_file_are_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x.json")
    assert run_cli(["plan", "llama3:debug", "--cluster", "dgx-a100,nodes=1", "-o", out,
                    "--report", out]) == 2  # the report replaced the plan, silently
    assert f"-o and --report both write {out}" in _one_line(capsys)


# --- simulate and export of an LLM plan ----------------------------------------------------

@pytest.fixture
def llm_files(tmp_path: Path) -> list[str]:
    """A TP 2 x PP 2 x DP 2 bf16 plan on one DGX A100, its graph (a chain with the blocks'
    module names) and topology."""
    run = parse_megatron(_M.replace("--global-batch-size 8", "--global-batch-size 16") +
                         "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                         "--bf16", num_gpus=8)
    modules = ["embedding"] + [f"layers.{i}" for i in range(8)] + ["norm", "output"]
    n = len(modules)
    graph = Graph.from_arrays(name="gpt", fwd_flops=np.ones(n), src=np.arange(n - 1),
                              dst=np.arange(1, n), names=[f"n{i}" for i in range(n)],
                              ops=["linear"] * n, modules=modules)
    files = []
    for name, obj in (("plan", plan_of_run(run, n)), ("graph", graph),
                      ("topology", build("dgx-a100", nodes=1))):
        save(obj, tmp_path / f"{name}.json")
        files.append(str(tmp_path / f"{name}.json"))
    return files


def _export(files: list[str], tmp_path: Path, *extra: str) -> list[str]:
    return ["export", *files, "--to", "megatron", "-o", str(tmp_path / "out.json"), *extra]


def test_export_checks_precision_against_the_devices(
        llm_files: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_export(llm_files, tmp_path, "--precision", "fp8")) == 2  # was written
    assert "precision fp8 needs fp8 tensor cores" in _one_line(capsys)
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("command", ["simulate", "export"])
def test_virtual_stages_cannot_change_an_llm_layout(
        command: str, llm_files: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = (_export(llm_files, tmp_path, "--virtual-stages", "3") if command == "export" else
            ["simulate", *llm_files, "--virtual-stages", "3"])
    assert run_cli(argv) == 2  # was a note "overrides the plan's 1", and nothing changed
    assert "--virtual-stages 3: an LLM plan's virtual stages are its layout" in \
        _one_line(capsys)


def test_recompute_every_needs_full_recompute(
        llm_files: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["simulate", *llm_files, "--recompute-every", "2"]) == 2
    assert "--recompute-every 2 thins full recompute" in _one_line(capsys)
    assert run_cli(_export(llm_files, tmp_path, "--recompute", "full",
                           "--recompute-every", "2")) == 0


def test_efficiency_above_one_names_the_flag(llm_files: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["simulate", *llm_files, "--efficiency", "7"]) == 2
    assert "argument --efficiency: a fraction in (0, 1], got '7'" in _one_line(capsys)


def test_torchtitan_base_must_be_module_function(
        llm_files: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", *llm_files, "--to", "torchtitan", "-o", str(tmp_path / "t.py"),
            "--torchtitan-base", "nonsense"]
    assert run_cli(argv) == 2  # was written into the recipe
    assert "--torchtitan-base: expected MODULE:FUNCTION" in _one_line(capsys)


def test_outputs_to_a_device_may_repeat(llm_files: list[str]) -> None:
    assert run_cli(["simulate", *llm_files, "-o", os.devnull, "--schedule-out",
                    os.devnull]) == 0


# --- worker pools stopped at a time limit --------------------------------------------------

def test_terminating_a_pool_keeps_its_cancelled_items() -> None:
    """The pool's thread looks an item up by the id it took from its queue: removing a
    cancelled item (as _terminate did) was a KeyError traceback in that thread when a plan's
    time limit stopped the search. The items stay, each with a future that can still take
    the pool's error (a cancelled one raised InvalidStateError there)."""
    import threading
    from concurrent.futures import Future
    from types import SimpleNamespace

    from shardplan._workers import _terminate

    items = {}
    for k in range(4):
        future: Future[None] = Future()
        if k:
            future.cancel()
        items[k] = SimpleNamespace(future=future)
    pool = SimpleNamespace(_pending_work_items=items, _processes={},
                           _shutdown_lock=threading.Lock(), shutdown=lambda **kw: None)
    _terminate(pool)  # type: ignore[arg-type]
    assert sorted(items) == [0, 1, 2, 3]
    for item in items.values():
        item.future.set_exception(RuntimeError("the pool broke"))  # no InvalidStateError


def test_a_forked_worker_terminated_early_exits_quietly(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A worker forked before its initializer reset SIGTERM ran the command's handler and
    printed a traceback; now it exits 143 without one."""
    import importlib
    import signal

    cli_main = importlib.import_module("shardplan.cli.main")

    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(cli_main, "_MAIN_PID", [os.getpid() + 1])
    monkeypatch.setattr(cli_main.os, "_exit", fake_exit)
    with pytest.raises(SystemExit):
        cli_main._on_sigterm(signal.SIGTERM, None)
    assert codes == [128 + signal.SIGTERM]
