"""The LLM plan kind's memory model against torch's own accounting (MemTracker) of the same
run: the tiny Llama, its captured graph, one device and TP 2 (issue 36, item 4)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.cost import llm_costs  # noqa: E402
from shardplan.ir import ExecutionSettings, ParallelConfig  # noqa: E402
from shardplan.runtime import TrainConfig, llm_memory  # noqa: E402
from shardplan.topology import build  # noqa: E402

MODEL = "llama3:debug,seq=16"


@pytest.mark.parametrize("tp", [1, 2])
def test_predicted_peak_within_ten_percent_of_memtracker(tp: int) -> None:
    par = ParallelConfig(tp=tp)
    cfg = TrainConfig(model=MODEL, steps=2, kind="llm", parallel=par, microbatches=4,
                      microbatch_size=4, optimizer="adam", lr=1e-3)
    measured = llm_memory(cfg)
    graph = capture_spec(MODEL, batch_size=4, seq_len=16)
    pred = llm_costs(graph, build("flat", num_devices=2), par,
                     ExecutionSettings(microbatch_size=4, microbatches=4,
                                       optimizer="adam")).memory
    for m in measured:
        # parameters and optimizer state exactly (Adam's 4-byte step counts aside)
        assert pred["params"][0] == m["parameters"]
        assert 0 <= m["optimizer"] - pred["optimizer"][0] <= 4 * 64
        assert pred["buffers"][0] == m["buffers"]
        # the whole peak within 10%
        assert pred["total"][0] == pytest.approx(m["total"], rel=0.10)
    if tp == 1:  # unsplit, the activations themselves within 10% too
        assert pred["activations"][0] == pytest.approx(measured[0]["activations"], rel=0.10)
