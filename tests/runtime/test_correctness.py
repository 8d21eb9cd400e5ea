"""The runtime trains exactly like one process (issues #8, #22): losses of every step (to 1e-6)
and final parameters (to 1e-5) equal single-process training with the same seed, data and
micro-batching, for every schedule, with tied weights on one rank or on two, one or two stages
per rank, replicas, and micro-batches of one sample.

One launch of 2 processes runs the fast subset (process start-up costs seconds); the full
matrix (every schedule x model x layout, on 2 and 4 processes) is marked slow.
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
BATCH, SEQ, STEPS = 4, 8, 3
LOSS_RTOL, PARAM_RTOL = 1e-6, 1e-5


def _graph(key: str, _cache: dict = {}) -> object:  # noqa: B006 - a per-session cache
    if key not in _cache:
        _cache[key] = capture_spec(MODELS[key], batch_size=BATCH, seq_len=SEQ)
    return _cache[key]


def _reference(cfg: TrainConfig) -> object:
    """Single-process training of the unsplit model with the pipeline's micro-batching (in
    equal parts when the processes split it evenly; whole otherwise)."""
    even = cfg.microbatch_size % cfg.parts == 0
    return run_single(TrainConfig(
        kind="single", model=cfg.model, steps=cfg.steps, microbatch_size=cfg.microbatch_size,
        microbatches=cfg.microbatches, replicas=cfg.parts if even else 1, seq_len=cfg.seq_len,
        optimizer=cfg.optimizer, lr=cfg.lr, seed=cfg.seed, return_params=True))


def check_equal(cfg: TrainConfig, got: object, ref: object) -> None:
    import torch

    label = (f"{cfg.kind} {cfg.model.split(',')[0]} {cfg.schedule} stages={len(cfg.stages)} "
             f"ranks={len(cfg.rank_devices)} replicas={cfg.replicas} "
             f"mbs={cfg.microbatch_size}")
    assert len(got.losses) == len(ref.losses) == cfg.steps
    for a, b in zip(got.losses, ref.losses, strict=True):
        assert abs(a - b) <= LOSS_RTOL * abs(b), (label, got.losses, ref.losses)
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
            assert diff <= PARAM_RTOL * float(want.norm()) + 1e-12, (label, name, diff)
    # Adam divides by the gradient's own size: entries whose exact gradient is zero (the
    # attention key bias) move by rounding noise, so Adam is held to the whole model's norm.
    assert num ** 0.5 <= PARAM_RTOL * den ** 0.5, (label, num ** 0.5, den ** 0.5)


def pipeline(key: str, stages: int, replicas: int, schedule: str, *, optimizer: str,
             microbatches: int = 4, microbatch_size: int | None = None,
             virtual_stages: int = 2, recompute: bool = False) -> TrainConfig:
    plan = contiguous_plan(_graph(key), stages, replicas)
    return config_for_plan(
        plan, _graph(key), model=MODELS[key], steps=STEPS, schedule=schedule,
        microbatches=microbatches, microbatch_size=microbatch_size or 2 * replicas,
        virtual_stages=virtual_stages, optimizer=optimizer, recompute=recompute,
        lr=0.5 if optimizer == "sgd" else 1e-3, return_params=True)


def _run(cfgs: list[TrainConfig], world: int) -> None:
    assert {c.world_size for c in cfgs if c.kind != "single"} == {world}
    for cfg, got in zip(cfgs, train_many(cfgs), strict=True):
        check_equal(cfg, got, _reference(cfg))


def test_two_process_subset(tmp_path) -> None:
    """Every schedule; tied weights across two ranks and on one rank (two stages per rank);
    replicas; a micro-batch of one sample; the data-parallel baselines, also on a micro-batch
    the processes do not divide. The same launch runs
    the fast dropout check (test_dropout.py) and a pipeline resume (test_checkpoint.py):
    each launch costs seconds of imports."""
    from test_checkpoint import check_resume, pipeline_resume_configs
    from test_dropout import GPT2, check_dropout, dropout_configs

    cfgs = [
        pipeline("gpt2", 2, 1, "1f1b", optimizer="sgd"),  # tied: ranks 0 and 1
        pipeline("gpt2", 2, 2, "interleaved-1f1b", optimizer="sgd"),  # tied: on one rank
        pipeline("gpt2", 4, 1, "interleaved-1f1b", optimizer="adam"),  # 2 stages per rank
        pipeline("gpt2", 2, 1, "gpipe", optimizer="adam", microbatch_size=1),
        pipeline("mlp", 1, 2, "gpipe", optimizer="adam"),
        pipeline("transformer", 2, 1, "1f1b", optimizer="sgd", microbatch_size=1),
        pipeline("gpt2", 2, 1, "1f1b", optimizer="sgd", recompute=True),  # as planned
    ]
    assert cfgs[-1].recompute
    base = dict(steps=STEPS, microbatch_size=4, microbatches=2, nproc=2, return_params=True,
                seq_len=SEQ)
    cfgs.append(TrainConfig(kind="ddp", model=MODELS["mlp"], **base))
    cfgs.append(TrainConfig(kind="fsdp", model=MODELS["transformer"], **base))
    # Three samples on two processes: parts of 2 and 1 weighted by their samples.
    cfgs.append(TrainConfig(kind="ddp", model=MODELS["mlp"], **{**base, "microbatch_size": 3}))
    drop = dropout_configs(capture_spec(GPT2, batch_size=4, seq_len=8))
    resume = pipeline_resume_configs(tmp_path)
    results = train_many(cfgs + drop + resume)
    for cfg, got in zip(cfgs, results[:len(cfgs)], strict=True):
        check_equal(cfg, got, _reference(cfg))
    check_dropout(drop, results[len(cfgs):len(cfgs) + len(drop)])
    check_resume(results[len(cfgs) + len(drop):])


def _matrix(world: int) -> list[TrainConfig]:
    """Every schedule x model x optimizer, on ``world`` pipeline ranks and on one pipeline
    rank replicated ``world`` times; interleaved runs two stages per rank."""
    cfgs = []
    for key in MODELS:
        for schedule in ("gpipe", "1f1b", "interleaved-1f1b"):
            per_rank = 2 if schedule == "interleaved-1f1b" else 1
            for ranks in sorted({world, 1}):
                stages = ranks * per_rank
                if stages > _graph(key).num_nodes:
                    continue
                for opt in ("sgd", "adam"):
                    cfgs.append(pipeline(key, stages, world // ranks, schedule, optimizer=opt))
    return cfgs


@pytest.mark.slow
def test_two_process_matrix() -> None:
    _run(_matrix(2), 2)


@pytest.mark.slow
def test_four_process_matrix() -> None:
    cfgs = _matrix(4)
    cfgs += [pipeline("gpt2", 2, 2, "1f1b", optimizer="sgd", microbatch_size=2),
             pipeline("gpt2", 4, 2, "interleaved-1f1b", optimizer="adam")]
    _run(cfgs, 4)
