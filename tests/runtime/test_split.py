"""Splitting the exported program at a plan's boundaries (in-process, no process group)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir import Objective, Plan, Stage  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, contiguous_plan  # noqa: E402
from shardplan.runtime._split import (  # noqa: E402
    match_graph,
    probe,
    split_program,
    tied_groups,
)
from shardplan.workload import build  # noqa: E402
from shardplan.workload.program import export_model  # noqa: E402

pytestmark = pytest.mark.torch

GPT2 = ("transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64,resid_pdrop=0,"
        "embd_pdrop=0,attn_pdrop=0")
TRANSFORMER = "transformer,num_layers=2,d_model=32,num_heads=2,vocab_size=64"


def _split(spec: str, cuts: int, *, batch: int = 2, dynamic: bool = False, run_batch=None):
    model, inputs, name = build(spec, batch_size=batch, seq_len=8)
    ep = export_model(model, inputs, name=name, dynamic_batch=dynamic)
    ops = [n.name for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    parts = [ops[i * len(ops) // cuts:(i + 1) * len(ops) // cuts] for i in range(cuts)]
    return model, inputs, split_program(model, ep, parts, list(range(cuts)), batch=run_batch)


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
    before = [b.clone() for b in model.buffers()]
    probes = probe(stages, inputs, model)
    grads = [tuple(v.requires_grad for v in ins) for ins, _ in probes]
    assert grads[0] == (False,)  # token ids
    assert any(grads[1]) and not all(grads[1])  # activations, and a boolean mask
    assert all(torch.equal(a, b) for a, b in zip(before, model.buffers(), strict=True))


@pytest.mark.parametrize("spec", ["mlp", GPT2, "torchvision:resnet18"])
def test_dynamic_batch_program_runs_at_any_batch(spec: str) -> None:
    # Exported at batch 4 with a dynamic batch dimension, cut in 3, run at batch 1 and 3:
    # equal to the model itself (sizes crossing a cut become constants of the run's batch).
    # Train mode throughout: BatchNorm normalises with the batch's own statistics.
    for run in (1, 3):
        model, inputs, stages = _split(spec, 3, batch=4, dynamic=True, run_batch=run)
        x = tuple(t[:run] for t in inputs)
        torch.testing.assert_close(_chain(stages, x), model(*x), rtol=1e-6, atol=1e-6)


def test_graph_matches_the_dynamic_program_by_alignment() -> None:
    from shardplan.workload.program import graph_ops

    graph = capture_spec(GPT2, batch_size=4, seq_len=8)
    model, inputs, name = build(GPT2, batch_size=4, seq_len=8)
    program = graph_ops(export_model(model, inputs, name=name, dynamic_batch=True))
    nodes = list(zip(graph.names, graph.ops, graph.modules, strict=True))
    names = match_graph(nodes, program)
    prog = {n: (op, mod) for n, op, mod in program}
    assert len(names) >= 0.9 * len(nodes)
    assert all(prog[names[g]] == (op, mod) for g, op, mod in nodes if g in names)
    other = graph_ops(export_model(*build("mlp", batch_size=4, seq_len=8)[:2], name="mlp"))
    with pytest.raises(ShardplanError, match="does not match"):
        match_graph(nodes, other)


def test_bad_names_and_cycles_are_user_errors() -> None:
    model, inputs, name = build("mlp", batch_size=2, seq_len=8)
    ep = export_model(model, inputs, name=name)
    with pytest.raises(ShardplanError, match="not an operator"):
        split_program(model, ep, [["nonexistent"]], [0])
    ops = [n.name for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    # Stage 0 holds the first and last operators, stage 1 the middle: data flows back.
    with pytest.raises(ShardplanError, match="does not match"):
        split_program(model, ep, [[ops[0], ops[-1]], ops[1:-1]], [0, 1])


def test_stages_run_in_the_given_pipeline_order() -> None:
    model, inputs, name = build("mlp", batch_size=2, seq_len=8)
    ep = export_model(model, inputs, name=name)
    ops = [n.name for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    with pytest.raises(ShardplanError, match="does not match"):
        split_program(model, ep, [ops[3:], ops[:3]], [0, 1])
    stages = split_program(model, ep, [ops[3:], ops[:3]], [1, 0])
    assert [s.plan_stage for s in stages] == [1, 0]
    torch.testing.assert_close(_chain(stages, inputs), model(*inputs), rtol=0, atol=0)


def test_config_validation() -> None:
    graph = capture_spec("mlp", batch_size=8)
    plan = contiguous_plan(graph, 2, 2)
    cfg = config_for_plan(plan, graph, model="mlp", steps=1, microbatches=2)
    assert (cfg.world_size, cfg.replicas, cfg.microbatch_size, cfg.global_batch) == (4, 2, 8, 16)
    assert cfg.rank_devices == ((0, 2), (1, 3)) and cfg.order == (0, 1)
    assert cfg.actions[1][0] == "1F0"
    with pytest.raises(ShardplanError, match="not divisible"):
        config_for_plan(plan, graph, model="mlp", steps=1, microbatch_size=3)
    uneven = Plan(graph="mlp", topology="", algorithm="x", objective=Objective("n", 0.0),
                  stages=(Stage((0, 1, 2), (0,)), Stage((3, 4, 5), (1, 2))))
    with pytest.raises(ShardplanError, match="same number of replicas"):
        config_for_plan(uneven, graph, model="mlp", steps=1)
    with pytest.raises(ShardplanError, match="--checkpoint-dir"):
        TrainConfig(kind="single", model="mlp", steps=1, resume=True)
    with pytest.raises(ShardplanError, match="schedule"):
        TrainConfig(kind="single", model="mlp", steps=1, schedule="zigzag")


def test_single_run_is_a_function_of_the_seed() -> None:
    cfg = TrainConfig(kind="single", model="mlp", steps=4, microbatch_size=8, microbatches=2,
                      lr=1e-2, optimizer="sgd")
    from shardplan.runtime import train

    a, b = train(cfg), train(cfg)
    assert a.losses == b.losses and len(a.losses) == 4
    other = TrainConfig(kind="single", model="mlp", steps=4, microbatch_size=8, microbatches=2,
                        lr=1e-2, optimizer="sgd", seed=1)
    assert train(other).losses != a.losses
