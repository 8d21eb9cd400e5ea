"""Micro-batches of one sample for every family of the model zoo that trains (issue #22): the
runtime exports with a dynamic batch dimension and matches the graph (captured at another
batch size) against that program, so a 2-stage pipeline at micro-batch size 1 trains and
equals one process running the same stages. Transformer and GPT-2 at micro-batch 1 are in the
fast suite (test_correctness.py); this is the whole list, marked slow."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, contiguous_plan, train_many  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess, pytest.mark.slow]

ZOO = [
    ("mlp", {}),
    ("transformer,num_layers=2,d_model=32,num_heads=2,vocab_size=64", {"seq_len": 8}),
    ("transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64", {"seq_len": 8}),
    ("transformers:bert-tiny,vocab_size=64", {"seq_len": 8}),
    # Train-mode BatchNorm needs more than one value per channel: at 64 pixels the last
    # feature maps are 2 x 2.
    ("torchvision:resnet18", {"image_size": 64}),
    ("torchvision:mobilenet_v2", {"image_size": 64}),
]


def test_microbatch_of_one_sample_for_every_zoo_family() -> None:
    cfgs = []
    for spec, sizes in ZOO:
        graph = capture_spec(spec, batch_size=4, **sizes)
        cfgs.append(config_for_plan(contiguous_plan(graph, 2, 1), graph, model=spec, steps=2,
                                    schedule="1f1b", microbatches=2, microbatch_size=1,
                                    optimizer="sgd", lr=0.1))
    for cfg, got in zip(cfgs, train_many(cfgs), strict=True):
        assert (cfg.microbatch_size, cfg.chunk_size) == (1, 1)
        want = run_single(TrainConfig(
            kind="single", model=cfg.model, steps=cfg.steps, microbatch_size=1,
            microbatches=cfg.microbatches, seq_len=cfg.seq_len, image_size=cfg.image_size,
            optimizer=cfg.optimizer, lr=cfg.lr, stages=cfg.stages,
            graph_nodes=cfg.graph_nodes, order=cfg.order, export_batch=cfg.export_batch))
        assert got.losses == pytest.approx(want.losses, rel=1e-6, abs=0), cfg.model
