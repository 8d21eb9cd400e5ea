"""The LLM plan kind's memory model against torch's own accounting (MemTracker) of the same
run: the tiny Llama, its captured graph, one device and TP 2 (issue 36, item 4); the debug
Mixtral under EP 2 and TP 2 x EP 2 (issue 47 item 5; its prediction is issue 47 item 2)."""

from __future__ import annotations

import functools

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.cost import llm_costs  # noqa: E402
from shardplan.ir import ExecutionSettings, ParallelConfig  # noqa: E402
from shardplan.runtime import TrainConfig, llm_memory, train_many  # noqa: E402
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


# ---------------------------------------------------------------- mixture of experts
MOE = "mixtral:debug,seq=16"  # 2 MoE blocks of 4 experts, each 3 x 64 x 96 weights
MOE_LAYOUTS = {"EP 2": ParallelConfig(dp=2, ep=2), "TP 2 x EP 2": ParallelConfig(tp=2, ep=2,
                                                                                  etp=1)}
#: parameters tensor parallelism splits (attention, embedding, head) and those of the experts
_TP_SPLIT = ("attention.w", "tok_embeddings.", "output.")


@functools.cache
def moe_measured() -> dict[str, list[dict[str, int]]]:
    """MemTracker's peak by category of every rank of the second of two steps of the debug
    Mixtral under each of :data:`MOE_LAYOUTS` (one launch of 2 processes, once per test
    process)."""
    cfgs = [TrainConfig(model=MOE, steps=2, kind="llm", parallel=par, microbatches=4,
                        microbatch_size=4, optimizer="adam", lr=1e-3, measure_memory=True)
            for par in MOE_LAYOUTS.values()]
    return {name: list(r.memory) for name, r in zip(MOE_LAYOUTS, train_many(cfgs),
                                                     strict=True)}


def moe_rank_bytes(par: ParallelConfig) -> tuple[int, int]:
    """Bytes of the parameters one rank holds (the tensor-parallel ones split by ``tp``, the
    routed experts by ``ep * etp``, the rest whole) and their tensor count."""
    from shardplan.workload.zoo import build_model

    model, _, _ = build_model(MOE, batch_size=1)
    total = 0
    params = dict(model.named_parameters())
    for name, p in params.items():
        share = par.ep * par.expert_tp if ".moe.experts." in name else \
            par.tp if any(s in name for s in _TP_SPLIT) else 1
        total += 4 * p.numel() // share
    return total, len(params)


@functools.cache
def moe_graph() -> object:
    return capture_spec(MOE, batch_size=4, seq_len=16)


def moe_prediction(par: ParallelConfig) -> dict[str, object]:
    """The cost model's memory of the debug Mixtral under ``par``, as the dense tests ask."""
    return llm_costs(moe_graph(), build("flat", num_devices=2), par,
                     ExecutionSettings(microbatch_size=4, microbatches=4,
                                       optimizer="adam")).memory


@pytest.mark.parametrize("layout", list(MOE_LAYOUTS))
def test_moe_memory_by_category(layout: str) -> None:
    """Under expert parallelism every rank holds its slice of the experts and the rest as
    the dense layout holds it: parameters and Adam's state exactly that, the model's buffers
    as the cost model predicts them, the categories adding up."""
    par = MOE_LAYOUTS[layout]
    mine, tensors = moe_rank_bytes(par)
    pred = moe_prediction(par)
    for m in moe_measured()[layout]:
        assert m["parameters"] == mine
        assert m["optimizer"] == 2 * mine + 4 * tensors  # two moments, one step count each
        assert pred["buffers"][0] == m["buffers"]
        assert 0 < m["gradients"] <= 2 * mine
        assert sum(v for k, v in m.items() if k != "total") == m["total"]


@pytest.mark.parametrize("layout", list(MOE_LAYOUTS))
def test_moe_predicted_peak_within_ten_percent_of_memtracker(layout: str) -> None:
    """The cost model's memory of an expert-parallel layout against MemTracker's, as the
    dense layouts are held above: parameters and optimizer state exactly, the peak within
    10%."""
    pred = moe_prediction(MOE_LAYOUTS[layout])
    for m in moe_measured()[layout]:
        assert pred["params"][0] == m["parameters"]
        assert 0 <= m["optimizer"] - pred["optimizer"][0] <= 4 * 64
        assert pred["total"][0] == pytest.approx(m["total"], rel=0.10)
