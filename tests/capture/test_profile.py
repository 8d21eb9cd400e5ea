"""``--profile``: measured seconds per node."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402

pytestmark = pytest.mark.torch


def test_profile_mlp_fills_positive_seconds() -> None:
    graph = capture_spec("mlp", batch_size=16, profile=True)
    assert graph.fwd_seconds is not None and graph.bwd_seconds is not None
    assert bool(np.all(graph.fwd_seconds > 0))
    assert bool(np.all(graph.bwd_seconds > 0))  # every op of the MLP is behind a parameter
    linear = [i for i, op in enumerate(graph.ops) if op == "linear"]
    assert graph.fwd_seconds[linear].sum() > graph.fwd_seconds.sum() / 2
    again = type(graph).from_dict(graph.to_dict())
    assert np.array_equal(again.fwd_seconds, graph.fwd_seconds)


def test_profile_module_level_sums_seconds() -> None:
    graph = capture_spec("transformer,num_layers=1", batch_size=2, seq_len=16, profile=True,
                         granularity="module", atomic="Linear")
    assert bool(np.all(graph.fwd_seconds > 0))
    assert bool(np.all(graph.bwd_seconds > 0))


def test_profile_times_the_backward_behind_a_getitem() -> None:
    """Operators fed through nodes that are not operators (the getitem of a split, ...)
    still carry the gradient: attention's backward was profiled as 0 s because its q, k, v
    come out of an unbind."""
    graph = capture_spec("transformer,num_layers=1", batch_size=2, seq_len=16, profile=True)
    attn = [i for i, op in enumerate(graph.ops) if "attention" in op]
    assert attn and bool(np.all(graph.bwd_seconds[attn] > 0))
    # only operators fed by data alone (the positions' arange) have no backward
    zero = [graph.ops[i] for i in np.flatnonzero(graph.bwd_seconds == 0)]
    assert zero and set(zero) <= {"arange", "embedding"}, zero


def test_profile_does_not_touch_model_buffers() -> None:
    from shardplan.capture import build_model, capture

    model, inputs, _ = build_model("torchvision:resnet18", batch_size=2, image_size=32)
    before = model.bn1.running_mean.clone()
    graph = capture(model, inputs, profile=True)
    assert torch.equal(model.bn1.running_mean, before)
    # Ops fed only by data and buffers (the stem convolution's input, buffer updates) have
    # no backward; the others do.
    assert graph.bwd_seconds[graph.ops.index("linear")] > 0


def test_profile_times_with_the_benchmark_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Operators are timed by torch.utils.benchmark.Timer (CUDA synchronised), not a bare
    perf_counter: every forward and backward measurement goes through it."""
    from shardplan.capture import _profile

    made = []
    real = _profile.benchmark.Timer

    def spy(*args, **kwargs):
        made.append(kwargs.get("stmt"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_profile.benchmark, "Timer", spy)
    graph = capture_spec("mlp", batch_size=4, profile=True)
    assert len(made) == 2 * graph.num_nodes  # a forward and a backward per operator
    assert bool(np.all(graph.fwd_seconds > 0))
