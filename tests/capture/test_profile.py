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
    # No claim on which operators take longest: one preempted timing on a shared machine
    # (a relu read 0.55 ms in CI) makes any such ordering flaky.
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
    # a forward and a backward per operator, and the loss's (shardplan.capture._loss)
    assert len(made) == 2 * graph.num_nodes + 2
    assert bool(np.all(graph.fwd_seconds > 0))


def test_profile_times_the_runtime_loss_on_the_output_node() -> None:
    """The loss a run computes is no operator of the model; ``--profile`` measures it (the
    runtime's loss: nll on the MLP's probabilities, cross-entropy on logits) and names the
    node producing the output, which the cost model charges (``split_work``)."""
    from shardplan.cost import loss_charge, split_work

    mlp = capture_spec("mlp", batch_size=16, profile=True)
    info = mlp.meta["loss"]
    assert info["function"] == "nll" and info["output"] == mlp.names[-1] == "softmax"
    assert info["batch_size"] == 16 and info["fwd_seconds"] > 0 and info["bwd_seconds"] > 0
    tfm = capture_spec("transformer,num_layers=1,vocab_size=512", batch_size=2, seq_len=16,
                       profile=True)
    info = tfm.meta["loss"]
    assert info["function"] == "cross_entropy"
    node = tfm.names.index(info["output"])
    assert tfm.ops[node] == "linear" and not np.any(tfm.src == node)  # the head: a sink
    again = type(tfm).from_dict(tfm.to_dict())  # kept through the file
    assert loss_charge(again) == (node, info["fwd_seconds"], info["bwd_seconds"])
    fm, _, bm, _ = split_work(again)
    assert fm[node] == pytest.approx(tfm.fwd_seconds[node] + info["fwd_seconds"])
    assert bm[node] == pytest.approx(tfm.bwd_seconds[node] + info["bwd_seconds"])
    assert "loss" not in capture_spec("mlp", batch_size=16).meta  # measured only


def test_profile_loss_of_a_module_level_graph_is_charged_to_the_holding_node() -> None:
    from shardplan.cost import loss_charge

    graph = capture_spec("transformer,num_layers=1,vocab_size=512", batch_size=2, seq_len=16,
                         profile=True, granularity="module", atomic="Linear")
    node, f, b = loss_charge(graph)
    ops = [op[1] for op in graph.node_extra[node]["ops"]]
    assert graph.meta["loss"]["output"] in ops and f > 0 and b > 0


def test_profile_sums_to_the_whole_model_step() -> None:
    """Operators timed one at a time are scaled, per pass, to the whole model's forward and
    backward timed as a training step runs them; the factors are recorded."""
    graph = capture_spec("mlp", batch_size=16, profile=True)
    scale = graph.meta["profile_scale"]
    assert scale["model_fwd_seconds"] > 0 and scale["model_bwd_seconds"] > 0
    assert graph.fwd_seconds.sum() == pytest.approx(scale["model_fwd_seconds"], rel=1e-9)
    assert graph.bwd_seconds.sum() == pytest.approx(scale["model_bwd_seconds"], rel=1e-9)
    assert scale["fwd"] > 0 and scale["bwd"] > 0
    again = type(graph).from_dict(graph.to_dict())
    assert again.meta["profile_scale"] == scale


def test_scale_to_model_keeps_proportions_and_leaves_empty_passes() -> None:
    from shardplan.capture._profile import scale_to_model

    fwd, bwd, rec = scale_to_model([1.0, 3.0], [0.0, 0.0], 8.0, 5.0)
    assert fwd == pytest.approx([2.0, 6.0]) and bwd == [0.0, 0.0]
    assert rec == {"fwd": 2.0, "bwd": 1.0, "model_fwd_seconds": 8.0, "model_bwd_seconds": 5.0}
    fwd, _, rec = scale_to_model([1.0, 3.0], [1.0], 0.0, 2.0)
    assert fwd == [1.0, 3.0] and rec["fwd"] == 1.0 and rec["bwd"] == 2.0


def test_model_step_restores_the_model() -> None:
    """Timing the whole model's step leaves its buffers, gradients and the random state as
    they were, and times a backward only where an output carries a gradient."""
    from shardplan.capture import build_model
    from shardplan.capture._profile import model_step_seconds

    model, inputs, _ = build_model("torchvision:resnet18", batch_size=2, image_size=32)
    model.train()
    before = model.bn1.running_mean.clone()
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    state = torch.random.get_rng_state()
    fwd, bwd = model_step_seconds(model, inputs, repeats=1)
    assert fwd > 0 and bwd > 0
    assert torch.equal(model.bn1.running_mean, before)
    assert torch.equal(model.fc.weight.grad, torch.ones_like(model.fc.weight))
    assert model.conv1.weight.grad is None
    assert torch.equal(torch.random.get_rng_state(), state)
    for p in model.parameters():
        p.requires_grad_(False)
    assert model_step_seconds(model, inputs, repeats=1)[1] == 0.0
