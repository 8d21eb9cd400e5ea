"""Operators the DTensor runner rewrites (torch, no processes): in-place ATen operators run
out of place when the tensor they modify is a fresh result nothing else reads (MobileNet's
``ReLU6(inplace=True)``), and keep their in-place form otherwise."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shardplan.runtime._dtensor import _NO_BACKWARD_RULE, _op_name, _out_of_place  # noqa: E402

pytestmark = pytest.mark.torch


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = torch.nn.ReLU6(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.clone()
        z.add_(1.0)  # a fresh tensor read by nothing else: out of place
        w = self.lin(z)
        flat = w.view(-1)
        torch.relu_(flat)  # a view of w, which is read below: stays in place
        return self.act(self.lin(w))


def test_in_place_operators_run_out_of_place_when_alone() -> None:
    program = torch.export.export(_Net().train(), (torch.randn(2, 4),)).module()
    seen = {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        target, new = _out_of_place(node, node.target, name)
        seen[name] = (new, target)
    assert "hardtanh_" in seen and "add_" in seen, sorted(seen)
    new, target = seen["hardtanh_"]
    assert new == "hardtanh" and target is torch.ops.aten.hardtanh.default
    assert new in _NO_BACKWARD_RULE
    assert seen["add_"] == ("add", torch.ops.aten.add.Tensor)
    assert seen["relu_"][0] == "relu_"
