"""The PaSE benchmark graphs: sizes from the cost-model note, spaces consistent with edges."""

from __future__ import annotations

import pytest

from shardplan.generate import BENCHMARKS, generate
from shardplan.strategy import Space, configurations


@pytest.mark.parametrize("kind", sorted(BENCHMARKS))
def test_spaces_describe_every_edge(kind: str) -> None:
    g = generate(kind)
    spaces = [Space.from_dict(s) for s in g.spaces]
    for u, v in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        groups = spaces[v].inputs[str(u)]
        assert len(groups) == len(spaces[u].output)  # same tensor rank on both sides
    for s in spaces:
        assert configurations(s, 8, 1).shape[0] >= 1
        assert Space.from_dict(s.to_dict()) == s


def test_sizes_follow_the_note() -> None:
    a = generate("alexnet")
    assert a.num_nodes == 13 and a.batch_size == 128
    fc = [Space.from_dict(s) for s in a.spaces if s["kind"] == "gemm" and s["dims"][1][0] == "n"]
    assert [sp.sizes for sp in fc] == [(128, 4096, 9216), (128, 4096, 4096), (128, 1024, 4096)]
    inc = generate("inception-v3")
    assert sum(op == "conv2d" for op in inc.ops) == 94  # torchvision's Inception3, no aux
    assert sum(op == "batch_norm" for op in inc.ops) == 94
    r = generate("rnnlm")
    assert r.ops == ("embedding", "lstm", "linear", "cross_entropy") and r.batch_size == 64
    t = generate("transformer")
    assert sum(n.endswith(".norm") for n in t.names) == 6 * 2 + 6 * 3
    assert t.meta["pase_cutoff"] == 1 and a.meta["pase_cutoff"] == 4
