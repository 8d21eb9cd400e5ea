"""Dropout (issue #22): the same seed gives the same losses, and a pipeline equals one process
running the same stage modules, the random state set per step, chunk and stage in both."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, contiguous_plan, train_many  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

# GPT-2's default dropout: 0.1 on embeddings, attention and residuals.
GPT2 = "transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64"


def _staged_single(cfg: TrainConfig) -> object:
    return run_single(TrainConfig(
        kind="single", model=cfg.model, steps=cfg.steps, microbatch_size=cfg.microbatch_size,
        microbatches=cfg.microbatches, replicas=cfg.replicas, seq_len=cfg.seq_len,
        optimizer=cfg.optimizer, lr=cfg.lr, seed=cfg.seed, stages=cfg.stages,
        graph_nodes=cfg.graph_nodes, order=cfg.order, export_batch=cfg.export_batch))


def test_dropout_repeats_and_equals_single() -> None:
    graph = capture_spec(GPT2, batch_size=4, seq_len=8)
    common = dict(model=GPT2, steps=3, microbatches=4, optimizer="sgd", lr=0.5)
    one_f = config_for_plan(contiguous_plan(graph, 2, 1), graph, schedule="1f1b",
                            microbatch_size=2, **common)
    inter = config_for_plan(contiguous_plan(graph, 2, 2), graph, schedule="interleaved-1f1b",
                            microbatch_size=2, **common)
    cfgs = [one_f, one_f, replace(one_f, seed=1), inter]
    a, b, c, d = train_many(cfgs)
    assert a.losses == b.losses  # same seed: exactly the same
    assert c.losses != a.losses  # another seed: other masks and data
    for cfg, got in ((one_f, a), (replace(one_f, seed=1), c), (inter, d)):
        want = _staged_single(cfg)
        assert got.losses == pytest.approx(want.losses, rel=1e-6, abs=0), cfg.schedule
    # Dropout is on: without it the losses differ.
    plain = run_single(TrainConfig(kind="single", model=GPT2 + ",resid_pdrop=0,embd_pdrop=0,"
                                   "attn_pdrop=0", steps=3, microbatches=4, microbatch_size=2,
                                   seq_len=8, optimizer="sgd", lr=0.5))
    assert plain.losses != pytest.approx(a.losses, rel=1e-6)
