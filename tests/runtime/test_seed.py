"""The runtime's per-forward seeding: the random state :func:`torch.manual_seed` leaves, at a
fraction of its cost where no accelerator is present."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shardplan.runtime import _worker  # noqa: E402

pytestmark = [pytest.mark.torch]


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_seed_random_leaves_manual_seeds_state(seed: int) -> None:
    _worker.seed_random(seed)
    ours = (torch.rand(6), torch.randn(3), torch.randint(0, 1000, (4,)))
    torch.manual_seed(seed)
    theirs = (torch.rand(6), torch.randn(3), torch.randint(0, 1000, (4,)))
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_seed_random_skips_the_lazy_accelerator_seeding_on_a_cpu(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(torch, "manual_seed", lambda s: calls.append(s))
    _worker.seed_random(5)
    assert calls == []
    a = torch.rand(3)
    torch.default_generator.manual_seed(5)
    assert torch.equal(a, torch.rand(3))


def test_seed_random_seeds_every_device_where_an_accelerator_is(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch, "manual_seed", lambda s: calls.append(s))
    _worker.seed_random(11)
    assert calls == [11]


def test_stage_forward_seeds_per_step_chunk_and_stage(monkeypatch) -> None:
    seen: list[int] = []
    monkeypatch.setattr(_worker, "seed_random", seen.append)
    stage = _worker._StageModule(torch.nn.Identity(), position=1, seed=3,
                                 chunk_of_call=[0, 2], recompute=False)
    stage.start(4)
    x = torch.ones(2)
    assert torch.equal(stage(x), x) and torch.equal(stage(x), x) and torch.equal(stage(x), x)
    mix = _worker.mix_seed
    assert seen == [mix(3, 4, 0, 1), mix(3, 4, 2, 1), mix(3, 4, 0, 1)]
