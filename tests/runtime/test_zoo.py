"""Micro-batches of one sample for every family of the model zoo that trains (issue #22): the
runtime exports with a dynamic batch dimension and matches the graph (captured at another
batch size) against that program, so a 2-stage pipeline at micro-batch size 1 trains and
equals one process running the same stages; a data-parallel strategy plan made at batch 4
runs its batch split of 2 as 1 and equals one process (MobileNetV2's
in-place ReLU6 included).
Transformer and GPT-2 at micro-batch 1 are in the fast suite (test_correctness.py,
test_strategy_run.py); this is the whole list, marked slow."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan import registry  # noqa: E402
from shardplan.capture import capture_spec  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, contiguous_plan, train_many  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402
from shardplan.topology import flat  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess, pytest.mark.slow]

ZOO = [
    ("mlp", {}),
    ("transformer,num_layers=2,d_model=32,num_heads=2,vocab_size=64", {"seq_len": 8}),
    ("transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64", {"seq_len": 8}),
    ("transformers:bert-tiny,vocab_size=64", {"seq_len": 8}),
    ("gnn", {}),
    # Train-mode BatchNorm needs more than one value per channel: at 64 pixels the last
    # feature maps are 2 x 2.
    ("torchvision:resnet18", {"image_size": 64}),
    ("torchvision:mobilenet_v2", {"image_size": 64}),
]


def _single(cfg: TrainConfig, **stages: object) -> object:
    return run_single(TrainConfig(
        kind="single", model=cfg.model, steps=cfg.steps, microbatch_size=1,
        microbatches=cfg.microbatches, seq_len=cfg.seq_len, image_size=cfg.image_size,
        optimizer=cfg.optimizer, lr=cfg.lr, **stages))


def test_microbatch_of_one_sample_for_every_zoo_family() -> None:
    cfgs, kinds = [], []
    for spec, sizes in ZOO:
        graph = capture_spec(spec, batch_size=4, **sizes)
        common = dict(model=spec, steps=2, microbatches=2, microbatch_size=1, optimizer="sgd",
                      lr=0.1)
        cfgs.append(config_for_plan(contiguous_plan(graph, 2, 1), graph, schedule="1f1b",
                                    **common))
        kinds.append("pipeline")
        plan = registry.run("strategy", "data-parallel", graph, flat(2), devices=2,
                            cutoff=1).plan
        cfgs.append(config_for_plan(plan, graph, **common))
        kinds.append("strategy")
    for cfg, kind, got in zip(cfgs, kinds, train_many(cfgs), strict=True):
        assert cfg.kind == kind and (cfg.microbatch_size, cfg.chunk_size) == (1, 1)
        if kind == "pipeline":
            want = _single(cfg, stages=cfg.stages, graph_nodes=cfg.graph_nodes,
                           order=cfg.order, export_batch=cfg.export_batch)
        else:
            assert any(s.batch_cut for s in cfg.shardings)
            want = _single(cfg)
        assert got.losses == pytest.approx(want.losses, rel=1e-6, abs=0), (kind, cfg.model)
