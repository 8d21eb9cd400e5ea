"""Operator-level capture of real models: FLOPs and parameters add up, the graph is valid."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardplan.capture import (  # noqa: E402
    build_model,
    capture,
    capture_spec,
    flop_mapping,
    reference_flops,
)
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir import Graph  # noqa: E402

pytestmark = pytest.mark.torch

# Small members of each family, batch 2: a few seconds each.
SMALL = ["mlp", "transformer", "torchvision:resnet18", "transformers:bert-tiny",
         "transformers:gpt2,n_layer=2"]


@pytest.fixture(scope="module")
def captured() -> dict[str, tuple[Graph, tuple[int, int], int]]:
    """Graph, eager reference FLOPs and parameter bytes of every SMALL model."""
    out = {}
    for spec in SMALL:
        graph = capture_spec(spec, batch_size=2, seq_len=32)
        model, inputs, _ = build_model(spec, batch_size=2, seq_len=32)
        model.train()
        ref = reference_flops(model, inputs)
        pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        out[spec] = (graph, ref, pbytes)
    return out


def check_valid(graph: Graph) -> None:
    assert graph.num_nodes > 0
    assert graph.num_edges > 0
    assert bool(np.all(graph.src < graph.dst)), "ids must be in topological order"
    again = Graph.from_dict(graph.to_dict())
    assert again.names == graph.names
    assert np.array_equal(again.fwd_flops, graph.fwd_flops)
    assert np.array_equal(again.edge_bytes, graph.edge_bytes)
    assert bool(np.all(graph.edge_bytes > 0))


@pytest.mark.parametrize("spec", SMALL)
def test_forward_flops_equal_flop_counter(captured, spec: str) -> None:
    graph, (fwd, _), _ = captured[spec]
    assert int(graph.fwd_flops.sum()) == fwd
    assert fwd > 0


@pytest.mark.parametrize("spec", SMALL)
def test_backward_flops_match_eager_backward(captured, spec: str) -> None:
    # Measured: equal to the eager backward count for every model of the zoo we tried.
    graph, (_, bwd), _ = captured[spec]
    assert graph.bwd_flops.sum() == pytest.approx(bwd, rel=1e-9)
    assert 1.5 < graph.bwd_flops.sum() / graph.fwd_flops.sum() < 2.5


@pytest.mark.parametrize("spec", SMALL)
def test_parameter_bytes_add_up(captured, spec: str) -> None:
    graph, _, pbytes = captured[spec]
    assert int(graph.param_bytes.sum()) == pbytes
    assert graph.weight.sum() == pytest.approx(pbytes / 4)  # float32 parameter counts


@pytest.mark.parametrize("spec", SMALL)
def test_parameter_tensors_add_up(captured, spec: str) -> None:
    """Every parameter tensor the optimizer steps is owned by exactly one node (a tied
    weight by the first reader), and only parameter-holding nodes own any."""
    graph, _, _ = captured[spec]
    model, _, _ = build_model(spec, batch_size=2, seq_len=32)
    assert graph.param_tensors is not None
    assert int(graph.param_tensors.sum()) == len(list(model.parameters()))
    assert np.array_equal(graph.param_tensors > 0, graph.param_bytes > 0)


@pytest.mark.parametrize("spec", SMALL)
def test_graph_is_valid(captured, spec: str) -> None:
    graph, _, _ = captured[spec]
    check_valid(graph)
    assert graph.batch_size == 2
    assert graph.meta["model"] == spec
    assert graph.meta["granularity"] == "op" and graph.meta["mode"] == "train"
    assert "flop_fallbacks" not in graph.meta


def test_node_fields(captured) -> None:
    graph, _, _ = captured["torchvision:resnet18"]
    first = graph.node(0)
    assert (first.op, first.module, first.name) == ("conv2d", "conv1", "conv2d")
    assert first.param_bytes == 64 * 3 * 7 * 7 * 4 and first.param_tensors == 1  # no bias
    assert first.output_bytes == 2 * 64 * 112 * 112 * 4
    assert first.weight == 64 * 3 * 7 * 7
    assert first.fwd_flops == 2 * (2 * 64 * 112 * 112) * (3 * 7 * 7)
    # The stem convolution's input needs no gradient: backward is the weight gradient only.
    assert first.bwd_flops == first.fwd_flops
    edge = graph.out_edges(0)
    assert graph.edge_bytes[edge].tolist() == [first.output_bytes]
    assert "fc" in graph.modules and "layer4.1.conv2" in graph.modules


def test_tied_weights_counted_once(captured) -> None:
    graph, _, pbytes = captured["transformers:gpt2,n_layer=2"]
    shared = [(i, e["shared_params"]) for i, e in enumerate(graph.node_extra or ())
              if "shared_params" in e]
    assert [s for _, s in shared] == [["lm_head.weight"]]
    i = shared[0][0]
    assert graph.ops[i] == "linear" and graph.param_bytes[i] == 0
    wte = graph.modules.index("transformer.wte")
    assert graph.param_bytes[wte] == 50257 * 768 * 4


def test_attention_flops_counted_on_cpu() -> None:
    # Eval mode dispatches to CPU flash attention, which FlopCounterMode counts as 0 without
    # our mapping.
    graph = capture_spec("transformer,num_layers=1", batch_size=2, seq_len=64, mode="eval")
    sdpa = [i for i, op in enumerate(graph.ops) if op == "scaled_dot_product_attention"]
    assert len(sdpa) == 1
    d, s = 256, 64
    assert graph.fwd_flops[sdpa[0]] == 2 * (2 * 2 * s * s * d)  # QK^T and AV
    assert graph.bwd_flops[sdpa[0]] == 5 * (2 * 2 * s * s * d)
    model, inputs, _ = build_model("transformer,num_layers=1", batch_size=2, seq_len=64)
    model.eval()
    fwd, bwd = reference_flops(model, inputs)
    assert int(graph.fwd_flops.sum()) == fwd
    assert int(graph.bwd_flops.sum()) == bwd
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in flop_mapping()


def test_capture_user_model_restores_mode_and_infers_batch() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5),
                                torch.nn.Linear(8, 2))
    model.eval()
    graph = capture(model, torch.randn(5, 4))
    assert not model.training
    assert graph.batch_size == 5 and graph.name == "Sequential"
    assert graph.ops == ("linear", "dropout", "linear")
    assert graph.modules == ("0", "1", "2")
    assert int(graph.param_bytes.sum()) == (4 * 8 + 8 + 8 * 2 + 2) * 4


def test_frozen_parameters_get_no_weight_gradient() -> None:
    model = torch.nn.Sequential(*(torch.nn.Linear(16, 16, bias=False) for _ in range(3)))
    model[0].requires_grad_(False)
    graph = capture(model, torch.randn(4, 16))
    fwd = 2 * 4 * 16 * 16
    assert graph.fwd_flops.tolist() == [fwd] * 3
    # Layer 0 is frozen and its input is data: no gradient at all. Layer 1 needs its weight
    # gradient only; layer 2 its weight and input gradients.
    assert graph.bwd_flops.tolist() == [0, fwd, 2 * fwd]


def test_inplace_and_multi_output_ops() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b, c = self.lin(x).split(2, dim=1)
            f = c + 1
            f.mul_(2)
            return torch.cat([torch.relu(a) * b, f], dim=1)

    graph = capture(Net(), torch.randn(3, 6))
    assert "getitem" not in graph.ops
    split = graph.ops.index("split")
    assert graph.output_bytes[split] == 3 * 6 * 4
    # The split's three outputs feed three ops: each edge carries the bytes of what it reads.
    outs = {graph.ops[int(graph.dst[e])]: int(graph.edge_bytes[e])
            for e in graph.out_edges(split)}
    assert outs == {"relu": 3 * 2 * 4, "mul": 3 * 2 * 4, "add": 3 * 2 * 4}
    # The in-place multiply is what the concatenation reads.
    cat = graph.ops.index("cat")
    assert sorted(graph.ops[int(p)] for p in graph.predecessors(cat)) == ["mul", "mul_"]
    check_valid(graph)


def test_flop_fallback_is_counted() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from shardplan.capture._flops import count_op_flops

    def needs_values(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        n = int(x.sum().item()) + 3  # data-dependent: impossible on fake or meta tensors
        return x[:n] @ w

    x, w = torch.zeros(4, 5), torch.zeros(5, 2)
    res = count_op_flops(needs_values, (x, w), {}, lambda t: t is w, FakeTensorMode())
    assert res.method == "real"
    assert res.fwd == 2 * 3 * 5 * 2
    assert res.bwd == 2 * 3 * 5 * 2  # weight gradient only
    res = count_op_flops(torch.ops.aten.mm.default, (x, w), {}, lambda t: True,
                         FakeTensorMode())
    assert (res.method, res.fwd, res.bwd, res.requires_grad) == ("fake", 80, 160, True)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"granularity": "layer"}, "unknown granularity"),
    ({"mode": "test"}, "unknown mode"),
    ({"atomic": "Linear"}, "needs --granularity module"),
    ({"granularity": "module"}, "needs --atomic"),
])
def test_bad_options(kwargs, match: str) -> None:
    with pytest.raises(ShardplanError, match=match):
        capture(torch.nn.Linear(2, 2), torch.randn(1, 2), **kwargs)


def test_not_a_module_or_not_exportable() -> None:
    with pytest.raises(ShardplanError, match="must be a torch.nn.Module"):
        capture(lambda x: x, torch.randn(2))

    class Dynamic(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent control flow
                return x * 2
            return x

    with pytest.raises(ShardplanError, match="torch.export could not trace"):
        capture(Dynamic(), torch.randn(3))


def test_batchnorm_train_mode_batch_one_is_a_user_error() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with pytest.raises(ShardplanError):
        capture(model, torch.randn(1, 4))
    graph = capture(model, torch.randn(1, 4), mode="eval")
    assert graph.meta["mode"] == "eval"


def test_no_grad_region_is_counted() -> None:
    # torch.export wraps a no_grad block into a higher-order op with a subgraph.
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                y = self.a(x)
            return self.b(y)

    model, x = Net(), torch.randn(4, 8)
    graph = capture(model, x)
    assert graph.ops == ("wrap_with_set_grad_enabled", "linear")
    assert "flop_fallbacks" not in graph.meta
    assert (int(graph.fwd_flops.sum()), int(graph.bwd_flops.sum())) == reference_flops(model, x)
    assert graph.bwd_flops.tolist() == [0, 2 * 4 * 8 * 8]
