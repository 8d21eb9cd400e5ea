"""The runtime's data: targets a model can learn, so a run's loss falls (issue 45's demo)."""

import torch

from shardplan.workload import batch_for_step
from shardplan.workload._data import learnable_target


def test_token_targets_are_a_fixed_permutation_of_the_tokens():
    (x,), y = batch_for_step((torch.zeros(2, 16, dtype=torch.long),), 101, batch_size=4,
                             seed=3, step=5)
    assert torch.equal(y, (x * 31 + 7) % 101)
    assert len(set(((torch.arange(101) * 31 + 7) % 101).tolist())) == 101  # a permutation


def test_float_targets_come_from_one_teacher_every_step():
    ex = (torch.zeros(2, 8),)
    (x1,), y1 = batch_for_step(ex, 5, batch_size=64, seed=0, step=0)
    (x2,), y2 = batch_for_step(ex, 5, batch_size=64, seed=0, step=1)
    assert not torch.equal(x1, x2)
    both = torch.cat([x1, x2])
    assert torch.equal(torch.cat([y1, y2]), learnable_target([both], 5, seed=0))
    assert len(set(y1.tolist())) > 1


def test_a_model_learns_them():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(60):
        (x,), y = batch_for_step((torch.zeros(2, 8),), 5, batch_size=64, seed=0, step=step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10
