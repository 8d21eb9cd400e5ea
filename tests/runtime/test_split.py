"""Splitting the exported program at a plan's boundaries (in-process, no process group)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.capture._export import export_model  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir import Objective, Plan, Stage  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, contiguous_plan  # noqa: E402
from shardplan.runtime._data import build  # noqa: E402
from shardplan.runtime._split import (  # noqa: E402
    probe_requires_grad,
    split_program,
    stage_order,
    tied_groups,
)

pytestmark = pytest.mark.torch

GPT2 = ("transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64,resid_pdrop=0,"
        "embd_pdrop=0,attn_pdrop=0")
TRANSFORMER = "transformer,num_layers=2,d_model=32,num_heads=2,vocab_size=64"


def _split(spec: str, cuts: int, *, batch: int = 2):
    model, inputs, name = build(spec, batch_size=batch, seq_len=8)
    ep = export_model(model, inputs, name=name)
    ops = [n.name for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    parts = [ops[i * len(ops) // cuts:(i + 1) * len(ops) // cuts] for i in range(cuts)]
    return model, inputs, split_program(model, ep, parts)


def _chain(stages, inputs):
    values = tuple(inputs)
    for st in stages:
        out = st.module(*values)
        values = out if isinstance(out, tuple) else (out,)
    assert len(values) == 1
    return values[0]


@pytest.mark.parametrize("spec,cuts", [("mlp", 3), (TRANSFORMER, 4), (GPT2, 3)])
def test_stages_compose_to_the_model(spec: str, cuts: int) -> None:
    model, inputs, stages = _split(spec, cuts)
    assert [s.index for s in stages] == list(range(cuts))
    out = _chain(stages, inputs)
    torch.testing.assert_close(out, model(*inputs), rtol=0, atol=0)
    # Gradients through the chain equal the model's, parameter by parameter.
    out.sum().backward()
    chained = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(*inputs).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(chained[n], p.grad, rtol=1e-6, atol=1e-7)


def test_stage_state_dicts_use_the_model_names_and_share_tensors() -> None:
    model, _, stages = _split(TRANSFORMER, 2)
    names = set()
    for st in stages:
        for key, t in st.module.state_dict().items():
            assert t.data_ptr() == model.state_dict()[key].data_ptr()
            names.add(key)
    own = {n for n, _ in model.named_parameters()}
    assert names == own


def test_values_skipping_a_stage_pass_through_it() -> None:
    # The token ids feed the embedding in stage 0 only; the residual stream crosses every cut.
    _, _, stages = _split(TRANSFORMER, 4)
    for a, b in zip(stages, stages[1:], strict=False):
        assert a.outputs == b.inputs
    assert stages[0].inputs == ("ids",)


def test_gpt2_tied_weights_are_found_and_requires_grad_probed() -> None:
    model, inputs, stages = _split(GPT2, 3)
    groups = tied_groups(stages, model)
    assert len(groups) == 1
    holders = [s.index for s in stages if set(groups[0]) & set(s.param_names)]
    assert holders == [0, 2]
    grads = probe_requires_grad(stages, inputs)
    assert grads[0] == (False,)  # token ids
    assert any(grads[1]) and not all(grads[1])  # activations, and a boolean mask


def test_bad_names_and_cycles_are_user_errors() -> None:
    model, inputs, name = build("mlp", batch_size=2, seq_len=8)
    ep = export_model(model, inputs, name=name)
    with pytest.raises(ShardplanError, match="not an operator"):
        split_program(model, ep, [["nonexistent"]])
    ops = [n.name for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    # Stage 0 holds the first and last operators, stage 1 the middle: a cycle.
    with pytest.raises(ShardplanError, match="cycle"):
        split_program(model, ep, [[ops[0], ops[-1]], ops[1:-1]])
    assert stage_order(3, {(2, 0), (0, 1)}) == [2, 0, 1]


def test_stage_order_follows_data_not_plan_index() -> None:
    model, inputs, name = build("mlp", batch_size=2, seq_len=8)
    ep = export_model(model, inputs, name=name)
    ops = [n.name for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    stages = split_program(model, ep, [ops[3:], ops[:3]])
    assert [s.plan_stage for s in stages] == [1, 0]
    torch.testing.assert_close(_chain(stages, inputs), model(*inputs), rtol=0, atol=0)


def test_config_validation() -> None:
    graph = capture_spec("mlp", batch_size=8)
    plan = contiguous_plan(graph, 2, 2)
    cfg = config_for_plan(plan, graph, model="mlp", steps=1, microbatches=2)
    assert (cfg.world_size, cfg.replicas, cfg.microbatch_size) == (4, 2, 2)
    assert cfg.devices == ((0, 2), (1, 3))
    with pytest.raises(ShardplanError, match="not divisible"):
        config_for_plan(plan, graph, model="mlp", steps=1, microbatches=3)
    uneven = Plan(graph="mlp", topology="", algorithm="x", objective=Objective("n", 0.0),
                  stages=(Stage((0, 1, 2), (0,)), Stage((3, 4, 5), (1, 2))))
    with pytest.raises(ShardplanError, match="same number of replicas"):
        config_for_plan(uneven, graph, model="mlp", steps=1)
    with pytest.raises(ShardplanError, match="--checkpoint-dir"):
        TrainConfig(kind="single", model="mlp", steps=1, resume=True)
    with pytest.raises(ShardplanError, match="schedule"):
        TrainConfig(kind="single", model="mlp", steps=1, schedule="zigzag")


def test_single_run_is_a_function_of_the_seed() -> None:
    cfg = TrainConfig(kind="single", model="mlp", steps=4, batch_size=16, microbatches=2,
                      lr=1e-2, optimizer="sgd")
    from shardplan.runtime import train

    a, b = train(cfg), train(cfg)
    assert a.losses == b.losses and len(a.losses) == 4
    other = TrainConfig(kind="single", model="mlp", steps=4, batch_size=16, microbatches=2,
                        lr=1e-2, optimizer="sgd", seed=1)
    assert train(other).losses != a.losses
