"""Checkpoint and resume: a run killed after a checkpoint resumes to the same losses and final
parameters as the uninterrupted run; the dead rank stops the run with a clear error."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.runtime import (  # noqa: E402
    config_for_plan,
    contiguous_plan,
    load_checkpoint_into,
    train_many,
)

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

SPEC = ("transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64,resid_pdrop=0,"
        "embd_pdrop=0,attn_pdrop=0")


@pytest.mark.slow
def test_kill_after_checkpoint_then_resume(tmp_path) -> None:
    import torch

    from shardplan.runtime._data import build

    graph = capture_spec(SPEC, batch_size=8, seq_len=8)
    plan = contiguous_plan(graph, 2, 1)
    common = dict(model=SPEC, steps=5, schedule="1f1b", microbatches=2, batch_size=8,
                  seq_len=8, checkpoint_every=2, return_params=True, timeout=60.0)
    killed = str(tmp_path / "killed")
    # Rank 1 dies (SIGKILL) as it starts step index 3: after the checkpoint of 2 steps, before
    # the one of 4 steps.
    doomed = config_for_plan(plan, graph, checkpoint_dir=killed, fault=(1, 3), **common)
    t0 = time.monotonic()
    with pytest.raises(ShardplanError, match=r"rank 1 was killed by signal 9"):
        train_many([doomed])
    assert time.monotonic() - t0 < 60.0  # well within the process-group timeout
    with open(os.path.join(killed, "latest"), encoding="utf-8") as fh:
        assert fh.read().strip() == "step-00000002"
    assert not [n for n in os.listdir(killed) if n.startswith(".tmp")]

    resumed = config_for_plan(plan, graph, checkpoint_dir=killed, resume=True, **common)
    straight = config_for_plan(plan, graph, checkpoint_dir=str(tmp_path / "straight"),
                               **common)
    got, want = train_many([resumed, straight])
    assert got.start_step == 2 and want.start_step == 0
    assert got.losses == want.losses[2:]
    assert set(got.params) == set(want.params)
    for name in want.params:
        assert torch.equal(got.params[name][0], want.params[name][0]), name

    # The checkpoint loads into the unsplit model, tied weights included.
    model, _, _ = build(SPEC, batch_size=2, seq_len=8)
    assert load_checkpoint_into(killed, model) == 5
    for name, p in model.named_parameters(remove_duplicate=False):
        assert torch.equal(p.detach(), want.params[name][0]), name
    assert model.lm_head.weight is model.transformer.wte.weight
