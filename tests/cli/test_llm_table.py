"""The LLM rows of ``shardplan plan``'s table in the user's terms (issue 45, item 3): plain
numbers, model FLOPs as Megatron-LM counts them, MFU against the bf16 (or fp8) peak."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

from shardplan.cli._llm_table import llm_fields, llm_table_rows, model_flops_per_token, plain
from shardplan.ir import ExecutionSettings, Graph, Objective, ParallelConfig, Plan, Stage
from shardplan.topology import build_spec


@pytest.mark.parametrize(("x", "text"), [
    (0.000123456, "0.0001235"), (1.5, "1.500"), (12345.6, "12,346"), (6.02e23, None),
    (math.inf, "-"), (0.0, "0")])
def test_plain_numbers_have_no_exponent(x: float, text: str | None) -> None:
    out = plain(x)
    assert "e" not in out.lower()
    if text is not None:
        assert out == text


def test_model_flops_as_megatron_counts_them() -> None:
    # Megatron-LM (Narayanan et al. 2021): 72 B s l h^2 (1 + s / 6h + V / 12 l h) per
    # iteration, for a GPT whose layers are 12 h^2 (no biases counted) with a tied head
    h, layers, vocab, seq = 1024, 24, 51200, 2048
    meta = {"hidden": h, "layers": layers, "vocab": vocab, "seq": seq, "tied": True,
            "parameters": layers * 12 * h * h + vocab * h, "family": "llama"}
    megatron = 72 * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (12 * layers * h))
    assert model_flops_per_token(meta) * seq == pytest.approx(megatron)
    # an untied embedding is a lookup: not counted
    untied = {**meta, "tied": False, "parameters": meta["parameters"] + vocab * h}
    assert model_flops_per_token(untied) == pytest.approx(model_flops_per_token(meta))
    assert model_flops_per_token({}) == 0.0


@dataclass
class _Row:
    plan: dict[str, Any]
    iteration_seconds: float
    peak_memory_bytes: float
    search_seconds: float = 1.25
    fits: bool = True


def _row(precision: str, seconds: float = 2.0) -> _Row:
    par = ParallelConfig(tp=2, pp=2, dp=2, vp=2)
    settings = ExecutionSettings(precision=precision, microbatch_size=2 * 2, microbatches=8,
                                 recompute="selective", sequence_parallel=True)
    plan = Plan("g", "t", "llm", (Stage((0,), (0,)),), Objective("x", seconds),
                parallel=par).with_settings(settings)
    return _Row(plan.to_dict(), seconds, 40 * 2**30)


def test_fields_of_an_llm_row() -> None:
    graph = Graph.from_dict({"format": "shardplan.graph/1", "name": "g", "batch_size": 1,
                             "nodes": [{"id": 0, "name": "a", "op": "linear"}], "edges": [],
                             "transformer": {
                                 "hidden": 4096, "layers": 32, "vocab": 128256,
                                 "seq": 8192, "tied": False, "parameters": 8030261248,
                                 "family": "llama"}})
    topology = build_spec("dgx-h100")
    f = llm_fields(_row("bf16"), graph, topology, global_batch=32)
    assert f is not None
    assert (f["tp"], f["pp"], f["dp"], f["vp"], f["cp"], f["fsdp"]) == (2, 2, 2, 2, 1, 1)
    assert (f["micro_batch"], f["microbatches"]) == (2, 8)
    assert (f["recompute"], f["sequence_parallel"], f["gpus"]) == ("selective", True, 8)
    tokens = 32 * 8192
    assert f["tokens_per_second_per_gpu"] == pytest.approx(tokens / 2.0 / 8)
    per_token = model_flops_per_token(graph.meta["transformer"])
    assert f["mfu"] == pytest.approx(per_token * tokens / 2.0 / (8 * 989e12))
    fp8 = llm_fields(_row("fp8"), graph, topology, global_batch=32)
    assert fp8 is not None and fp8["mfu"] == pytest.approx(f["mfu"] * 989 / 1979)  # fp8 peak
    assert f["device_memory_bytes"] == 40 * 2**30
    cells = llm_table_rows([(1, _row("bf16"), f)])[0]
    assert cells[:6] == ["1", "2 x 2 x 2 x VP 2", "2 x 8", "bf16", "selective", "yes"]
    assert cells[6] == "2.000" and cells[9] == "40.0" and cells[10] == "1.2"
    # a plan without a parallel layout is no LLM row
    plain_row = _Row(Plan("g", "t", "x", (Stage((0,), (0,)),), Objective("x", 1.0)).to_dict(),
                     1.0, 1.0)
    assert llm_fields(plain_row, graph, topology, global_batch=32) is None


def test_a_mixture_counts_the_parameters_a_token_uses() -> None:
    """MFU of a mixture of experts is over its active parameters (Mixtral 8x7B: 12.9 B of
    46.7 B), not all of them: counting every expert put MFU above 100%."""
    from shardplan.cli._llm_table import model_flops_per_token

    t = {"hidden": 4096, "layers": 32, "vocab": 32000, "seq": 4096, "tied": False,
         "parameters": 46_702_792_704, "active_parameters": 12_879_925_248}
    want = 6.0 * (12_879_925_248 - 32000 * 4096) + 12.0 * 32 * 4096 * 4096
    assert model_flops_per_token(t) == want
    dense = dict(t)
    del dense["active_parameters"]
    assert model_flops_per_token(dense) > 3 * want
