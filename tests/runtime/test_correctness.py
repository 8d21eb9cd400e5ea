"""The runtime trains exactly like one process: losses of every step and final parameters
equal single-process training with the same seed, data and micro-batching (issue #8).

One launch of 2 processes runs the whole 2-process matrix (process start-up costs seconds);
the 4-process matrix is marked slow.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, contiguous_plan, train_many  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

MODELS = {
    "mlp": "mlp",
    "transformer": "transformer,num_layers=2,d_model=32,num_heads=2,vocab_size=64",
    "gpt2": ("transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64,resid_pdrop=0,"
             "embd_pdrop=0,attn_pdrop=0"),
}
BATCH, SEQ, STEPS = 8, 8, 3
RTOL = 1e-5


def _graphs() -> dict[str, object]:
    return {k: capture_spec(spec, batch_size=BATCH, seq_len=SEQ) for k, spec in MODELS.items()}


def _reference(cfg: TrainConfig) -> object:
    """Single-process training with the pipeline's micro-batching (R x M chunks)."""
    return run_single(TrainConfig(
        kind="single", model=cfg.model, steps=cfg.steps, batch_size=cfg.batch_size,
        seq_len=cfg.seq_len, microbatches=cfg.replicas * cfg.microbatches,
        optimizer=cfg.optimizer, lr=cfg.lr, seed=cfg.seed, return_params=True))


def _check(cfg: TrainConfig, got: object, ref: object) -> None:
    import torch

    label = f"{cfg.kind} {cfg.model.split(',')[0]} {cfg.schedule} stages={len(cfg.stages)}"
    assert len(got.losses) == len(ref.losses) == cfg.steps
    for a, b in zip(got.losses, ref.losses, strict=True):
        assert abs(a - b) <= RTOL * abs(b), (label, got.losses, ref.losses)
    assert set(got.params) == set(ref.params), label
    num = den = 0.0
    for name, (want,) in ref.params.items():
        copies = got.params[name]
        for t in copies[1:]:  # replicas and tied copies stay identical
            assert torch.equal(t, copies[0]), (label, name)
        diff = float((copies[0] - want).norm())
        num += diff ** 2
        den += float(want.norm()) ** 2
        if cfg.optimizer == "sgd":
            assert diff <= RTOL * float(want.norm()) + 1e-12, (label, name, diff)
    # Adam divides by the gradient's own size: entries whose exact gradient is zero (the
    # attention key bias) move by rounding noise, so Adam is held to the whole model's norm.
    assert num ** 0.5 <= RTOL * den ** 0.5, (label, num ** 0.5, den ** 0.5)


def _matrix(layouts: list[tuple[int, int]], graphs: dict[str, object]) -> list[TrainConfig]:
    cfgs = []
    for key, spec in MODELS.items():
        for stages, replicas in layouts:
            for schedule in ("gpipe", "1f1b"):
                opt = "adam" if schedule == "gpipe" else "sgd"
                plan = contiguous_plan(graphs[key], stages, replicas)
                cfgs.append(config_for_plan(
                    plan, graphs[key], model=spec, steps=STEPS, schedule=schedule,
                    microbatches=max(2, stages), batch_size=BATCH, seq_len=SEQ, optimizer=opt,
                    lr=1e-2 if opt == "sgd" else 1e-3, return_params=True))
    return cfgs


def test_two_process_matrix() -> None:
    graphs = _graphs()
    cfgs = _matrix([(2, 1), (1, 2)], graphs)
    base = dict(steps=STEPS, batch_size=BATCH, seq_len=SEQ, microbatches=2, nproc=2,
                return_params=True)
    cfgs.append(TrainConfig(kind="ddp", model=MODELS["mlp"], **base))
    cfgs.append(TrainConfig(kind="fsdp", model=MODELS["transformer"], **base))
    results = train_many(cfgs)
    assert len(results) == len(cfgs)
    for cfg, got in zip(cfgs, results, strict=True):
        _check(cfg, got, _reference(cfg))


@pytest.mark.slow
def test_four_process_matrix() -> None:
    graphs = _graphs()
    cfgs = _matrix([(4, 1), (2, 2)], graphs)
    results = train_many(cfgs)
    for cfg, got in zip(cfgs, results, strict=True):
        _check(cfg, got, _reference(cfg))


@pytest.mark.slow
def test_interleaved_two_ranks_four_stages() -> None:
    graphs = _graphs()
    cfgs = []
    for key in ("mlp", "gpt2"):
        plan = contiguous_plan(graphs[key], 4, 1)
        cfgs.append(config_for_plan(plan, graphs[key], model=MODELS[key], steps=2,
                                    schedule="interleaved-1f1b", microbatches=2,
                                    batch_size=BATCH, seq_len=SEQ, return_params=True))
    assert cfgs[0].world_size == 2
    for cfg, got in zip(cfgs, train_many(cfgs), strict=True):
        _check(cfg, got, _reference(cfg))
