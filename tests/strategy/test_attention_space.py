"""Attention as one operator with an iteration space (b, h, q, k, d): capture writes it, PaSE
reads it and may split heads or batch, never the sequence or head dimension."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.capture._spaces import op_spaces
from shardplan.errors import InvalidFileError
from shardplan.ir import Graph
from shardplan.strategy import Space, build_tables, solve
from shardplan.strategy._cost_pase import layer_cost, pase_units
from shardplan.strategy.spaces import configurations

B, H, S, D = 2, 8, 16, 32


def _attention_graph() -> Graph:
    """Three (b, h, s, d) producers (query, key, value) read by one attention operator."""
    shape = (B, H, S, D)
    ops = ["transpose", "transpose", "transpose", "scaled_dot_product_attention"]
    spaces = op_spaces(ops, [shape] * 4, [[shape]] * 3 + [[shape, shape, shape]],
                       [(0, 3, shape), (1, 3, shape), (2, 3, shape)],
                       [[None, 1, 2]] * 3 + [[None, None, None]], B)
    words = B * H * S * D
    return Graph.from_arrays(
        name="attention", batch_size=B, fwd_flops=[0, 0, 0, 4 * B * H * S * S * D],
        bwd_flops=[0, 0, 0, 10 * B * H * S * S * D], src=[0, 1, 2], dst=[3, 3, 3],
        edge_bytes=[4 * words] * 3, output_bytes=[4 * words] * 4,
        ops=ops, names=["q", "k", "v", "sdpa"], spaces=spaces)


def test_capture_writes_the_attention_space() -> None:
    sp = _attention_graph().spaces[3]
    assert sp["kind"] == "attention"
    assert sp["dims"] == [["b", B], ["h", H], ["q", S], ["k", S], ["d", D]]
    assert sorted(sp["fixed"]) == ["d", "k", "q"] and sp["batch"] == ["b", "h"]
    assert sp["output"] == [["b"], ["h"], ["q"], ["d"]]
    # query, key and value map their batch and heads onto the operator's
    assert sp["inputs"] == {str(j): [["b"], ["h"], [], []] for j in range(3)}


def test_cross_attention_keeps_both_lengths() -> None:
    q, kv = (B, H, 5, D), (B, H, 9, D)
    sp = op_spaces(["scaled_dot_product_attention"], [q], [[q, kv, kv]], [],
                   [[None, None, None]], B)[0]
    assert sp["dims"] == [["b", B], ["h", H], ["q", 5], ["k", 9], ["d", D]]


def test_pase_configurations_split_heads_and_batch_only() -> None:
    space = Space.from_dict(_attention_graph().spaces[3])
    configs = configurations(space, 8, cutoff=1)
    rows = {tuple(r) for r in configs.tolist()}
    assert (1, 8, 1, 1, 1) in rows and (2, 4, 1, 1, 1) in rows and (2, 1, 1, 1, 1) in rows
    assert (configs[:, 2:] == 1).all()  # q, k and d never split


def test_a_heads_split_divides_the_work_with_no_communication() -> None:
    space = Space.from_dict(_attention_graph().spaces[3])
    cost = layer_cost(space, np.array([[1, 1, 1, 1, 1], [1, 4, 1, 1, 1], [2, 2, 1, 1, 1]]),
                      pase_units())
    assert cost[0] == pytest.approx(7 * B * H * S * S * D)  # 2 forward + 5 backward products
    assert cost[1] == pytest.approx(cost[0] / 4) and cost[2] == pytest.approx(cost[0] / 4)
    # a hand-written space that splits the head dimension pays for the partial products
    free = Space.from_dict({**_attention_graph().spaces[3], "fixed": []})
    split_d = layer_cost(free, np.array([[1, 1, 1, 1, 4]]), pase_units())
    assert split_d[0] > cost[0] / 4


def test_pase_splits_the_heads_of_the_attention_node() -> None:
    tables = build_tables(_attention_graph(), 8, cutoff=1)
    assert tables is not None
    res = solve(tables)
    assert res.status == "optimal"
    factors = tables.strategy(res.choice)["3"]
    assert factors[2:] == (1, 1, 1)
    assert factors[0] * factors[1] == 8  # every device works: batch 2 alone cannot use 8
    assert factors[1] > 1  # so the heads are split


def test_malformed_attention_space_is_rejected() -> None:
    bad = {**_attention_graph().spaces[3], "dims": [["h", 8], ["b", 2], ["q", 16],
                                                    ["k", 16], ["d", 32]]}
    with pytest.raises(InvalidFileError, match="attention space has dims"):
        Space.from_dict(bad)
