"""A debug-size mixture of experts trains for real with expert parallelism (issue 47 item 5):
Mixtral's and DeepSeek-V3's debug flavors under EP 2 alone and with TP 2, ETP 2, PP 2, FSDP 2,
sequence parallelism and recomputation train like one process.

Losses of every step (to 1e-6 relative) and final parameters (to 1e-5 of the model's norm)
equal single-process training of the unsplit model on the same data and micro-batches, and
every copy of a parameter agrees (:func:`tests.runtime.test_llm.check_equal`). Mixtral runs
with the zoo's capacity factor 1.0, so experts drop tokens: the run keeps exactly the choices
one process running each micro-batch whole keeps, although no rank sees that micro-batch
whole; one run is dropless. The expert weights come back whole from their DTensor slices.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir import ParallelConfig  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, train_many  # noqa: E402
from tests.runtime.test_llm import check_equal, llm_plan, reference  # noqa: E402

pytestmark = [pytest.mark.torch]

MIXTRAL = "mixtral:debug,seq=16"  # dim 64, 2 MoE blocks of 4 experts (top 2, width 96)
# dim 64, a dense block then 2 MoE blocks of 8 experts (top 2 within 1 of 2 groups, width
# 32) beside a shared expert; latent attention, sigmoid router
DEEPSEEK = "deepseek_v3:debug,seq=16"


def moe_config(model: str, parallel: ParallelConfig, **kw: object) -> TrainConfig:
    fields: dict[str, object] = dict(model=model, steps=3, kind="llm", parallel=parallel,
                                     microbatches=2, microbatch_size=4, optimizer="adam",
                                     lr=1e-3, return_params=True)
    fields.update(kw)
    return TrainConfig(**fields)  # type: ignore[arg-type]


def test_plans_refuse_experts_the_layout_cannot_split() -> None:
    """The experts and their width, as capture records them, checked before any process
    starts."""
    plan, graph = llm_plan(ParallelConfig(dp=4, ep=4))
    dims = {"family": "mixtral", "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 256,
            "experts": 6, "moe_ffn": 96}
    with pytest.raises(ShardplanError, match="expert parallelism 4 does not divide the 6"):
        config_for_plan(plan, graph.replace(meta={**graph.meta, "transformer": dims}), steps=1)
    plan, graph = llm_plan(ParallelConfig(dp=4, ep=2, etp=2))
    dims.update(experts=8, moe_ffn=95)
    with pytest.raises(ShardplanError, match="expert tensor parallelism 2 does not divide an "
                                             "expert's hidden width \\(95\\)"):
        config_for_plan(plan, graph.replace(meta={**graph.meta, "transformer": dims}), steps=1)
    dims.update(moe_ffn=96)
    assert config_for_plan(plan, graph.replace(meta={**graph.meta, "transformer": dims}),
                           steps=1).parallel.ep == 2


def test_train_says_which_moe_settings_it_does_not_read(tmp_path) -> None:
    """``shardplan train`` of an MoE plan asking for the ``allgather`` dispatcher or a
    capacity factor of its own notes that the run dispatches by all-to-all with the model's
    capacity; a dense plan's settings say nothing."""
    import argparse

    from shardplan.ir import save
    from shardplan.runtime._args import add_arguments, config_from_args
    from shardplan.topology import flat

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def notes(experts: bool, **settings: object) -> tuple[str, ...]:
        plan, graph = llm_plan(ParallelConfig(dp=2, ep=2), microbatches=2, microbatch_size=4,
                               **settings)
        if experts:
            graph = graph.replace(meta={**graph.meta, "model": MIXTRAL,
                                        "transformer": {"experts": 4, "moe_ffn": 96}})
        files = [str(tmp_path / f) for f in ("p.json", "g.json", "t.json")]
        for obj, path in zip((plan, graph, flat(2)), files, strict=True):
            save(obj, path)
        return config_from_args(parser.parse_args([*files, "--steps", "1"])).notes

    said = notes(True, moe_dispatcher="allgather", moe_capacity_factor=1.25)
    assert "the plan dispatches tokens by allgather; the runtime runs the alltoall " \
           "dispatcher" in said
    assert "the plan's moe_capacity_factor is not read: the experts' capacity is the " \
           "model's capacity_factor" in said
    assert not any("alltoall" in n or "capacity" in n for n in notes(True))
    assert not any("alltoall" in n for n in notes(False, moe_dispatcher="allgather"))


@pytest.mark.multiprocess
def test_expert_parallel_two_processes() -> None:
    """One launch of 2 processes: Mixtral EP 2 (over 2 data-parallel ranks, with capacity),
    the same dropless with recomputation, TP 2 (its experts split by width: ETP 2),
    TP 2 x EP 2 with ETP 1 and FSDP 2 x EP 2; DeepSeek-V3 EP 2, and TP 2 x EP 2 x ETP 1
    with sequence parallelism."""
    cfgs = [moe_config(MIXTRAL, ParallelConfig(dp=2, ep=2)),
            moe_config(MIXTRAL + ",capacity_factor=none", ParallelConfig(dp=2, ep=2),
                       recompute=True),
            moe_config(MIXTRAL, ParallelConfig(tp=2)),
            moe_config(MIXTRAL, ParallelConfig(tp=2, ep=2, etp=1)),
            moe_config(MIXTRAL, ParallelConfig(dp_shard=2, ep=2)),
            moe_config(DEEPSEEK, ParallelConfig(dp=2, ep=2)),
            moe_config(DEEPSEEK, ParallelConfig(tp=2, ep=2, etp=1), sequence_parallel=True)]
    results = train_many(cfgs)
    for cfg, got in zip(cfgs, results, strict=True):
        check_equal(cfg, got, reference(cfg))
    # the capacity dropped tokens (the equality above is about which ones)
    assert results[0].losses[0] != pytest.approx(results[1].losses[0], rel=1e-4)


@pytest.mark.multiprocess
def test_expert_parallel_four_processes() -> None:
    """One launch of 4 processes: Mixtral EP 2 x ETP 2 beside DP 2 x TP 2, EP 2 x PP 2
    (1F1B) beside DP 2, EP 2 over 4 data-parallel ranks (2 expert data-parallel replicas,
    their expert gradients all-reduced); DeepSeek-V3 EP 2 x PP 2 beside TP 2 (GPipe, the
    dense first block and one MoE block on the first pipeline rank)."""
    cfgs = [moe_config(MIXTRAL, ParallelConfig(tp=2, dp=2, ep=2)),
            moe_config(MIXTRAL, ParallelConfig(pp=2, dp=2, ep=2), schedule="1f1b"),
            moe_config(MIXTRAL, ParallelConfig(dp=4, ep=2)),
            moe_config(DEEPSEEK, ParallelConfig(pp=2, tp=2, ep=2, etp=1), schedule="gpipe")]
    for cfg, got in zip(cfgs, train_many(cfgs), strict=True):
        check_equal(cfg, got, reference(cfg))
