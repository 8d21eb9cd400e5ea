"""Dropout (issue #22): the same seed gives the same losses, and a pipeline equals one process
running the same stage modules, the random state set per step, chunk and stage in both.

The fast suite checks 1F1B and replicated interleaved 1F1B with dropout inside the one launch of
``test_correctness.py``; this is the same check for every schedule, marked slow."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, contiguous_plan, train_many  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess, pytest.mark.slow]

# GPT-2's default dropout: 0.1 on embeddings, attention and residuals.
GPT2 = "transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64"


def staged_single(cfg: TrainConfig, **changes: object) -> object:
    """One process running the pipeline's stage modules one after another."""
    fields = dict(
        kind="single", model=cfg.model, steps=cfg.steps, microbatch_size=cfg.microbatch_size,
        microbatches=cfg.microbatches, replicas=cfg.replicas, seq_len=cfg.seq_len,
        optimizer=cfg.optimizer, lr=cfg.lr, seed=cfg.seed, stages=cfg.stages,
        graph_nodes=cfg.graph_nodes, order=cfg.order, export_batch=cfg.export_batch)
    return run_single(TrainConfig(**{**fields, **changes}))


def dropout_configs(graph: object) -> list[TrainConfig]:
    common = dict(model=GPT2, steps=3, microbatches=4, optimizer="sgd", lr=0.5)
    one_f = config_for_plan(contiguous_plan(graph, 2, 1), graph, schedule="1f1b",
                            microbatch_size=2, **common)
    inter = config_for_plan(contiguous_plan(graph, 2, 2), graph, schedule="interleaved-1f1b",
                            microbatch_size=2, **common)
    return [one_f, one_f, inter]


def check_dropout(cfgs: list[TrainConfig], results: list[object]) -> None:
    """Runs 0 and 1 are the same config; every run equals its staged single process."""
    a, b = results[0], results[1]
    assert a.losses == b.losses  # same seed: exactly the same
    for cfg, got in zip(cfgs[1:], results[1:], strict=True):
        want = staged_single(cfg)
        assert got.losses == pytest.approx(want.losses, rel=1e-6, abs=0), cfg.schedule
    assert staged_single(cfgs[0], seed=1).losses != a.losses  # other masks and data
    plain = run_single(TrainConfig(kind="single", model=GPT2 + ",resid_pdrop=0,embd_pdrop=0,"
                                   "attn_pdrop=0", steps=3, microbatches=4, microbatch_size=2,
                                   seq_len=8, optimizer="sgd", lr=0.5))
    assert plain.losses != pytest.approx(a.losses, rel=1e-6)  # dropout is on


def test_dropout_every_schedule() -> None:
    graph = capture_spec(GPT2, batch_size=4, seq_len=8)
    cfgs = dropout_configs(graph)
    cfgs += [config_for_plan(contiguous_plan(graph, 2, 1), graph, model=GPT2, steps=3,
                             schedule="gpipe", microbatches=4, microbatch_size=2,
                             optimizer="adam"),
             config_for_plan(contiguous_plan(graph, 4, 1), graph, model=GPT2, steps=3,
                             schedule="interleaved-1f1b", microbatches=4, microbatch_size=1,
                             optimizer="adam")]
    check_dropout(cfgs, train_many(cfgs))
