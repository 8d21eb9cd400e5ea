"""Module-level capture: atomic instances, folding, strongly connected merges, hops."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from shardplan.capture import capture, capture_spec  # noqa: E402
from shardplan.capture._export import OpCapture, TensorUse, ops_to_graph  # noqa: E402
from shardplan.capture._module import fold_modules  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402

pytestmark = pytest.mark.torch


def totals_match(op_graph, mod_graph) -> None:
    assert mod_graph.fwd_flops.sum() == op_graph.fwd_flops.sum()
    assert mod_graph.bwd_flops.sum() == op_graph.bwd_flops.sum()
    assert mod_graph.param_bytes.sum() == op_graph.param_bytes.sum()
    assert mod_graph.param_tensors.sum() == op_graph.param_tensors.sum()
    assert mod_graph.weight.sum() == op_graph.weight.sum()
    assert bool(np.all(mod_graph.src < mod_graph.dst))
    assert len(mod_graph.meta["edge_hops"]) == mod_graph.num_edges


@pytest.mark.parametrize(("spec", "atomic", "instances"), [
    ("mlp", "Linear", ["fc1", "fc2", "fc3"]),
    ("transformer", "DecoderBlock", [f"blocks.{i}" for i in range(4)]),
    ("torchvision:resnet18", "BasicBlock,Linear",
     [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)] + ["fc"]),
    ("transformers:bert-tiny", "BertLayer", ["bert.encoder.layer.0", "bert.encoder.layer.1"]),
])
def test_one_node_per_instance(spec: str, atomic: str, instances: list[str]) -> None:
    op_graph = capture_spec(spec, batch_size=2, seq_len=16)
    graph = capture_spec(spec, batch_size=2, seq_len=16, granularity="module", atomic=atomic)
    assert list(graph.names) == instances  # a chain: topological order is program order
    totals_match(op_graph, graph)
    assert graph.meta["merged_instances"] == 0
    assert graph.meta["op_nodes"] == op_graph.num_nodes
    assert sum(e["num_ops"] for e in graph.node_extra) == op_graph.num_nodes
    assert graph.num_edges == len(instances) - 1  # consecutive blocks, nothing skips one


def test_mlp_module_graph_by_hand() -> None:
    graph = capture_spec("mlp", batch_size=4, granularity="module", atomic=["Linear"])
    assert graph.ops == ("Linear", "Linear", "Linear")
    assert graph.param_bytes.tolist() == [(767 * 1024 + 1024) * 4, (1024 * 1024 + 1024) * 4,
                                          (1024 * 10 + 10) * 4]
    assert graph.param_tensors.tolist() == [2, 2, 2]  # a weight and a bias each
    assert graph.edge_bytes.tolist() == [4 * 1024 * 4, 4 * 1024 * 4]
    assert graph.meta["edge_hops"] == [1, 1]  # one ReLU between consecutive layers
    assert graph.output_bytes.tolist() == [4 * 1024 * 4, 4 * 1024 * 4, 4 * 10 * 4]
    # The ReLUs fold downstream, the final softmax upstream.
    assert [e["folded_ops"] for e in graph.node_extra] == [0, 1, 2]


def test_transformer_linear_level_is_a_dag_with_residual_edges() -> None:
    op_graph = capture_spec("transformer,num_layers=2", batch_size=2, seq_len=16)
    graph = capture_spec("transformer,num_layers=2", batch_size=2, seq_len=16,
                         granularity="module", atomic="Linear")
    assert graph.num_nodes == 2 * 4 + 1
    totals_match(op_graph, graph)
    assert graph.num_edges > graph.num_nodes - 1  # residual connections skip layers


def test_module_called_twice_is_merged() -> None:
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)
            self.c = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.a(torch.relu(self.b(self.a(x)))))

    model = Twice()
    op_graph = capture(model, torch.randn(3, 8))
    graph = capture(model, torch.randn(3, 8), granularity="module", atomic="Linear")
    assert graph.num_nodes == 2 and graph.meta["merged_instances"] == 1
    assert graph.ops == ("merged", "Linear")
    assert graph.node_extra[0]["members"] == ["a", "b"]
    assert graph.names == ("a+b", "c")
    totals_match(op_graph, graph)
    # The second call of a reads no new parameters: a's weight is counted once.
    assert graph.param_bytes.sum() == 3 * (64 + 8) * 4


def test_outermost_atomic_instance_wins() -> None:
    graph = capture_spec("transformer,num_layers=2", batch_size=2, seq_len=8,
                         granularity="module", atomic="DecoderBlock,Linear")
    assert list(graph.names) == ["blocks.0", "blocks.1", "head"]
    assert set(graph.ops) == {"DecoderBlock", "Linear"}


def test_dotted_type_names_are_accepted() -> None:
    graph = capture_spec("mlp", batch_size=2, granularity="module",
                         atomic="torch.nn.modules.linear.Linear")
    assert graph.num_nodes == 3


def test_unknown_atomic_type() -> None:
    with pytest.raises(ShardplanError, match=r"'Conv2d' is not in the model \(its module "
                                             r"types: Linear, MLP, ReLU, Softmax\)"):
        capture_spec("mlp", batch_size=2, granularity="module", atomic="Conv2d")


# ---------------------------------------------------------------- folding on synthetic graphs
@st.composite
def synthetic(draw):
    """A random DAG of ops (edges i < j) with atomic instances on disjoint index ranges."""
    n = draw(st.integers(2, 25))
    edges = sorted({(i, j) for i, j in draw(st.lists(
        st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n)) if i < j})
    cuts = sorted(draw(st.sets(st.integers(0, n), min_size=2, max_size=10)))
    ranges = [(cuts[r], cuts[r + 1]) for r in range(len(cuts) - 1)]
    atomic_ranges = [rg for rg in ranges if draw(st.booleans())] or [ranges[0]]
    flops = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    return n, edges, atomic_ranges, flops


@settings(max_examples=150, deadline=None)
@given(synthetic())
# Ops 0 -> 3 touch no atomic instance: they must fold as one piece, not one op into each.
@example((5, [(0, 3), (1, 4), (2, 4)], [(2, 3), (4, 5)], [0, 0, 0, 0, 0]))
def test_folding_contiguous_instances_never_merges(case) -> None:
    n, edges, atomic_ranges, flops = case
    cap = OpCapture()
    owner = {i: k for k, (lo, hi) in enumerate(atomic_ranges) for i in range(lo, hi)}
    for i in range(n):
        stack = [("", "Root")]
        if i in owner:
            stack.append((f"blk{owner[i]}", "Block"))
        stack.append((f"op{i}", "Leaf"))
        cap.names.append(f"n{i}")
        cap.ops.append("op")
        cap.modules.append(stack[-1][0])
        cap.stacks.append(tuple(stack))
        cap.fwd_flops.append(flops[i])
        cap.bwd_flops.append(2 * flops[i])
        cap.param_bytes.append(4 * flops[i])
        cap.param_count.append(flops[i])
        cap.param_tensors.append(1 if flops[i] else 0)
        cap.output_bytes.append(10 + i)
        cap.shared_params.append([])
    cap.uses = [TensorUse(i, (), 10 + i, j) for i, j in edges]
    cap.outputs = [(n - 1, (), 10 + n - 1)]
    op_graph = ops_to_graph(cap, name="t", batch_size=1)
    graph = fold_modules(cap, op_graph, ["Block"])
    instances = sorted({k for k in owner.values()})
    assert graph.num_nodes == len(instances)
    assert graph.meta["merged_instances"] == 0
    totals_match(op_graph, graph)
    assert graph.num_edges <= len(edges)
    assert sum(e["num_ops"] for e in graph.node_extra) == n


def test_gnn_graph_convolutions_are_the_vertices() -> None:
    """Paper 000's Figure 2: with GraphConv atomic, the module graph is the two chains of
    convolutions joining in the third (readout and classifier fold into it), and every node
    lists its operators in program order: all of the operator graph's, once."""
    op_graph = capture_spec("gnn", batch_size=2)
    graph = capture_spec("gnn", batch_size=2, granularity="module", atomic="GraphConv")
    assert graph.names == ("chain_a.0", "chain_a.1", "chain_b.0", "chain_b.1", "combine")
    assert set(zip(graph.src.tolist(), graph.dst.tolist(), strict=True)) == {
        (0, 1), (1, 4), (2, 3), (3, 4)}
    totals_match(op_graph, graph)
    rows = [row for e in graph.node_extra for row in e["ops"]]
    assert sorted(r[0] for r in rows) == list(range(op_graph.num_nodes))
    for i, name, op, module in rows:
        assert (name, op, module) == (op_graph.names[i], op_graph.ops[i], op_graph.modules[i])
    for e in graph.node_extra:
        assert [r[0] for r in e["ops"]] == sorted(r[0] for r in e["ops"])
        assert len(e["ops"]) == e["num_ops"]
    combine = {r[2] for r in graph.node_extra[4]["ops"]}
    assert {"cat", "mean", "linear", "index_add"} <= combine
