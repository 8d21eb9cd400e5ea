"""Iteration spaces of captured operators: the pure mapping (no torch) and one real capture."""

from __future__ import annotations

import pytest

from shardplan.capture._spaces import op_spaces
from shardplan.strategy import Space, build_tables, solve


def test_linear_relu_softmax_chain_maps_tensor_dims() -> None:
    ops = ["linear", "relu", "softmax", "weird_op"]
    out = [(8, 32), (8, 32), (8, 32), (8, 32)]
    ins = [[(8, 16), (32, 16)], [(8, 32)], [(8, 32)], [(8, 32)]]
    args = [[None, None], [None], [None, 1, False], [None]]
    uses = [(0, 1, (8, 32)), (1, 2, (8, 32)), (2, 3, (8, 32))]
    sp = op_spaces(ops, out, ins, uses, args, 8)
    lin = Space.from_dict(sp[0])
    assert lin.kind == "gemm" and lin.dims == ("d0", "n", "k") and lin.sizes == (8, 32, 16)
    assert sp[1]["inputs"] == {"0": [["d0"], ["d1"]]}
    assert sp[2]["kind"] == "softmax" and sp[2]["axis"] == "d1"
    assert sp[3] is None  # unknown op: the planner gives it a batch-only space


def test_conv_space_is_the_notes_domain() -> None:
    sp = op_spaces(["conv2d"], [(4, 16, 30, 30)], [[(4, 3, 32, 32), (16, 3, 3, 3)]], [],
                   [[None, None]], 4)[0]
    s = Space.from_dict(sp)
    assert s.dims == ("b", "c", "h", "w", "r", "s", "o")
    assert s.sizes == (4, 3, 30, 30, 3, 3, 16) and set(s.fixed) == {"h", "w"}


@pytest.mark.torch
def test_captured_mlp_has_spaces_and_solves() -> None:
    from shardplan.capture import capture_spec

    g = capture_spec("mlp", batch_size=8)
    assert g.spaces is not None
    kinds = [s["kind"] for s in g.spaces if s is not None]
    assert "gemm" in kinds
    tables = build_tables(g, 4)
    res = solve(tables)
    assert res.status == "optimal"
    assert res.value == pytest.approx(tables.evaluate(res.choice))
