"""What the runtime needs from capture (issue #22): the graph records its input shapes, the
batch dimension can be exported as dynamic, and ``graph_ops`` lists exactly the graph's
operators for a program."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from shardplan.capture import build_model, capture_spec  # noqa: E402
from shardplan.workload.program import export_model, graph_ops  # noqa: E402

pytestmark = pytest.mark.torch

GPT2 = "transformers:gpt2,n_layer=1,n_embd=32,n_head=2,vocab_size=64"


@pytest.mark.parametrize("spec,kw,shapes,dtypes", [
    ("mlp", {}, [[3, 767]], ["float32"]),
    (GPT2, {"seq_len": 5}, [[3, 5]], ["int64"]),
    ("torchvision:resnet18", {"image_size": 32}, [[3, 3, 32, 32]], ["float32"]),
])
def test_graph_records_input_shapes(spec, kw, shapes, dtypes) -> None:
    graph = capture_spec(spec, batch_size=3, **kw)
    assert graph.meta["input_shapes"] == shapes
    assert graph.meta["input_dtypes"] == dtypes


def test_graph_ops_are_the_graphs_nodes() -> None:
    graph = capture_spec(GPT2, batch_size=2, seq_len=4)
    model, inputs, name = build_model(GPT2, batch_size=2, seq_len=4)
    model.train()
    ops = graph_ops(export_model(model, inputs, name=name))
    assert ops == list(zip(graph.names, graph.ops, graph.modules, strict=True))


def test_dynamic_batch_export() -> None:
    model, inputs, name = build_model(GPT2, batch_size=4, seq_len=4)
    ep = export_model(model, inputs, name=name, dynamic_batch=True)
    (ph,) = [n for n in ep.graph_module.graph.nodes
             if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
    assert isinstance(ph.meta["val"].shape[0], torch.SymInt)
    static = export_model(model, inputs, name=name)
    (ph,) = [n for n in static.graph_module.graph.nodes
             if n.op == "placeholder" and n.name in static.graph_signature.user_inputs]
    assert ph.meta["val"].shape[0] == 4
