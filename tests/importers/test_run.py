"""RunConfig: the checks every imported run passes, model specs, settings."""

from __future__ import annotations

import pytest

from shardplan.errors import ShardplanError
from shardplan.importers._run import (
    ModelDims,
    RunConfig,
    execution_of,
    flavor_dims,
    uneven_stage_layers,
)
from shardplan.ir import ExecutionSettings, ParallelConfig

GPT = ModelDims(family="gpt", hidden=64, num_layers=8, num_heads=8, num_kv_heads=8, ffn=256,
                vocab=1024, seq_len=128)


def _run(parallel: ParallelConfig, micro: int = 1, glob: int = 8, **kw: object) -> RunConfig:
    return RunConfig(model=GPT, parallel=parallel, micro_batch_size=micro, global_batch=glob,
                     execution=execution_of(parallel, micro_batch_size=micro,
                                            global_batch=glob), **kw)  # type: ignore[arg-type]


def test_specs() -> None:
    assert GPT.spec == "gpt:hidden=64,layers=8,heads=8,vocab=1024,seq=128"
    wide = ModelDims(family="gpt", hidden=64, num_layers=8, num_heads=8, num_kv_heads=8,
                     ffn=100, vocab=1024, seq_len=128)
    assert wide.spec == "gpt:hidden=64,layers=8,heads=8,ffn=100,vocab=1024,seq=128"
    assert flavor_dims("llama3", "70b", 4096).spec == "llama3:70B,seq=4096"
    d = flavor_dims("llama3", "405B", 8192)
    assert (d.hidden, d.num_layers, d.num_heads, d.num_kv_heads, d.ffn) == (
        16384, 126, 128, 8, 53248)
    with pytest.raises(ShardplanError, match="choose from 7B, 13B, 70B"):
        flavor_dims("llama2", "8B", 10)
    with pytest.raises(ShardplanError, match="query groups"):
        ModelDims(family="llama", hidden=64, num_layers=2, num_heads=8, num_kv_heads=3,
                  ffn=10, vocab=10, seq_len=10)


def test_checks() -> None:
    run = _run(ParallelConfig(tp=2, pp=2, dp=2), micro=2, glob=16, num_gpus=8)
    assert run.microbatches == 4 and run.execution["microbatch_size"] == 4
    with pytest.raises(ShardplanError, match="cluster has 16"):
        _run(ParallelConfig(tp=2, pp=2, dp=2), num_gpus=16)
    with pytest.raises(ShardplanError, match="does not divide the 8 attention heads"):
        _run(ParallelConfig(tp=3))
    with pytest.raises(ShardplanError, match="8 layers do not divide evenly over pp x vp = 3"):
        _run(ParallelConfig(pp=3))
    with pytest.raises(ShardplanError, match="add up to 7"):
        _run(ParallelConfig(pp=2, stage_layers=(3, 4)))
    assert _run(ParallelConfig(pp=3, stage_layers=(2, 3, 3))).parallel.pp == 3
    with pytest.raises(ShardplanError, match="global batch 9"):
        _run(ParallelConfig(dp=2), glob=9)
    with pytest.raises(ShardplanError, match="unknown precision"):
        RunConfig(model=GPT, parallel=ParallelConfig(), micro_batch_size=1, global_batch=1,
                  execution={"precision": "fp4"})


def test_uneven_stage_layers() -> None:
    assert uneven_stage_layers(10, 3, 1, 2, None) == (2, 4, 4)
    assert uneven_stage_layers(10, 3, 1, None, 2) == (4, 4, 2)
    assert uneven_stage_layers(12, 2, 2, 4, None) == (2, 4, 2, 4)
    assert uneven_stage_layers(12, 2, 1, None, None) is None
    assert uneven_stage_layers(12, 2, 1, 6, None) is None  # even after all
    with pytest.raises(ShardplanError, match="virtual stages"):
        uneven_stage_layers(12, 2, 2, 3, None)


def test_settings_of_a_run() -> None:
    par = ParallelConfig(pp=2, vp=2)
    ex = execution_of(par, micro_batch_size=1, global_batch=8, precision="bf16",
                      recompute="selective")
    run = RunConfig(model=GPT, parallel=par, micro_batch_size=1, global_batch=8, execution=ex)
    settings, notes = run.settings()
    assert isinstance(settings, ExecutionSettings)
    assert settings.schedule == "interleaved-1f1b" and settings.virtual_stages == 2
    assert settings.microbatches == 8 and settings.mixed_precision
    names = set(ExecutionSettings.__dataclass_fields__)
    if "precision" in names:  # the training settings of issue 36 are fields
        assert settings.precision == "bf16" and settings.recompute == "selective"  # type: ignore[attr-defined]
        assert notes == []
    else:
        assert settings.recompute is True and "precision" in notes[0]
