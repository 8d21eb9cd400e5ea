"""pipeline_split against a brute force over the splits both Megatron-LM and torchtitan can
express (shardplan.ir.parallel)."""

import itertools

import pytest

from shardplan.ir.parallel import balanced_stage_layers, pipeline_split


def _brute(layers: int, pp: int, vp: int) -> set[tuple[int, ...] | None]:
    """Every expressible split: even; embedding and loss counted; lighter first and last
    ranks (equal), the middle ranks equal, every rank's blocks even over its virtual
    stages; and, when none of those exists, the pipeline layout dealing embedding, blocks
    and loss evenly (the last stage may hold the loss alone)."""
    stages = pp * vp
    out: set[tuple[int, ...] | None] = set()
    if layers < stages:
        return out
    if layers % stages == 0:
        return {None}
    if (layers + 2) % stages == 0:
        s = balanced_stage_layers(layers, stages, embedding=True, loss=True)
        if s is not None and min(s) > 0:
            out.add(s)
    if pp >= 3:
        for end, k in itertools.product(range(vp, layers + 1, vp), range(vp, layers + 1, vp)):
            if end <= k and 2 * end + (pp - 2) * k == layers:
                ranks = [end] + [k] * (pp - 2) + [end]
                out.add(tuple(ranks[j % pp] // vp for j in range(stages)))
    if not out:
        q, r = divmod(layers + 2, stages)
        dealt = [q + (1 if i < r else 0) for i in range(stages)]
        dealt[0] -= 1
        dealt[-1] -= 1
        if min(dealt[:-1]) >= 1 and dealt[-1] >= 0:
            out.add(tuple(dealt))
    return out


@pytest.mark.parametrize("pp", range(1, 9))
@pytest.mark.parametrize("vp", range(1, 5))
def test_pipeline_split_finds_an_expressible_split_exactly_when_one_exists(pp, vp):
    for layers in range(1, 70):
        ok, split = pipeline_split(layers, pp, vp)
        allowed = _brute(layers, pp, vp)
        assert ok == bool(allowed), (layers, pp, vp)
        if ok:
            assert split in allowed
            if split is not None:
                assert sum(split) == layers and min(split[:-1]) >= 1 and split[-1] >= 0
                if split != balanced_stage_layers(layers, pp * vp, embedding=True, loss=True):
                    for r in range(pp):  # first / last ranks: a rank's stages are even
                        assert len({split[j] for j in range(r, pp * vp, pp)}) == 1
                    # and the busiest rank holds as little as such a split allows
                    best = min(max(sum(s[j] for j in range(r, pp * vp, pp))
                                   for r in range(pp)) for s in allowed if s is not None)
                    assert max(sum(split[j] for j in range(r, pp * vp, pp))
                               for r in range(pp)) <= best or any(
                        s == balanced_stage_layers(layers, pp * vp, embedding=True, loss=True)
                        for s in allowed)
