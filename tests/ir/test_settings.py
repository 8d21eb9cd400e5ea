"""Execution settings: validation, JSON round trip inside plans, overrides, legacy plans."""

from __future__ import annotations

import pytest

from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, Plan, Stage


def _plan(**kw) -> Plan:
    return Plan("g", "t", "hand", (Stage((0,), (0,)), Stage((1,), (1,))), Objective("x", 0.0),
                **kw)


def test_defaults_and_derived() -> None:
    s = ExecutionSettings()
    assert (s.microbatches, s.schedule, s.optimizer, s.overlap) == (8, "1f1b", "adam", True)
    assert s.global_batch is None and s.stages_per_rank == 1 and s.efficiency_or_peak == 1.0
    g = Graph.from_arrays(name="g", batch_size=4, fwd_flops=[1.0, 2.0], src=[0], dst=[1])
    r = s.resolve(g)
    assert r.microbatch_size == 4 and r.global_batch == 32
    assert ExecutionSettings(microbatch_size=2).batch_scale(g) == 0.5
    assert ExecutionSettings(schedule="interleaved-1f1b").stages_per_rank == 2


@pytest.mark.parametrize("kw", [
    {"microbatches": 0}, {"microbatch_size": -1}, {"schedule": "zb"}, {"optimizer": "lion"},
    {"efficiency": 0.0}, {"efficiency": 1.5}, {"recompute": 1}, {"profile_flops": -1.0},
    {"schedule": "interleaved-1f1b", "virtual_stages": 1}, {"microbatches": True},
])
def test_invalid_settings_are_one_line_errors(kw) -> None:
    with pytest.raises(ShardplanError) as err:
        ExecutionSettings(**kw)
    assert "\n" not in str(err.value)


def test_plan_round_trip_keeps_settings() -> None:
    s = ExecutionSettings(microbatch_size=6, microbatches=4, schedule="gpipe", recompute=True,
                          efficiency=0.5, optimizer="sgd", overlap=False)
    p = _plan(execution=s)
    d = p.to_dict()
    assert d["execution"]["global_batch"] == 24
    back = Plan.from_dict(d)
    assert back.settings == s and back.execution == s
    assert Plan.from_dict(back.to_dict()).to_dict() == d


def test_legacy_plan_loads_defaults_and_its_options() -> None:
    d = _plan().to_dict()
    assert "execution" not in d
    d["options"] = {"efficiency": 0.25, "microbatches": 3, "schedule": "gpipe", "stages": 2}
    s = Plan.from_dict(d).settings
    assert (s.efficiency, s.microbatches, s.schedule, s.optimizer) == (0.25, 3, "gpipe", "adam")


def test_bad_execution_field_is_an_invalid_file() -> None:
    d = _plan().to_dict()
    d["execution"] = {"microbatches": -2}
    with pytest.raises(InvalidFileError, match="execution"):
        Plan.from_dict(d)
    d["execution"] = {"microbatch_size": 4, "microbatches": 2, "global_batch": 10}
    with pytest.raises(InvalidFileError, match="global_batch"):
        Plan.from_dict(d)
    d["execution"] = {"microbatches": 4, "global_batch": 16, "future_key": 1}
    assert Plan.from_dict(d).settings.microbatch_size == 4


def test_override_reports_what_changed() -> None:
    s = ExecutionSettings(microbatches=8, efficiency=0.5)
    new, notes = s.override(microbatches=4, efficiency=0.5, schedule=None)
    assert new.microbatches == 4 and new.efficiency == 0.5
    assert notes == ["microbatches 4 overrides the plan's 8"]
    new, notes = s.override(global_batch=32, microbatches=4)
    assert (new.microbatch_size, new.global_batch) == (8, 32)
    with pytest.raises(ShardplanError, match="multiple"):
        s.override(global_batch=30)
    with pytest.raises(ShardplanError, match="unknown execution setting"):
        s.override(efficency=0.5)


def test_graph_at_batch_size_scales_per_sample_columns() -> None:
    g = Graph.from_arrays(name="g", batch_size=4, fwd_flops=[4.0, 8.0], src=[0], dst=[1],
                          output_bytes=[40, 4], param_bytes=[12, 0],
                          fwd_seconds=[1.0, float("nan")])
    h = g.at_batch_size(8)
    assert h.batch_size == 8 and h.fwd_flops.tolist() == [8.0, 16.0]
    assert h.bwd_flops.tolist() == [16.0, 32.0] and h.output_bytes.tolist() == [80, 8]
    assert h.edge_bytes.tolist() == [80] and h.param_bytes.tolist() == [12, 0]
    assert h.fwd_seconds[0] == 2.0 and h.names == g.names
    assert g.at_batch_size(4) is g
    with pytest.raises(InvalidFileError):
        g.at_batch_size(0)


def test_training_settings_and_their_derived_fields() -> None:
    s = ExecutionSettings()
    assert (s.precision, s.recompute, s.gradient_sync) == ("fp32", "none", "end")
    assert not s.mixed_precision and s.param_dtype_bytes == 4 and not s.recompute_full
    assert (s.sequence_parallel, s.tp_comm_overlap) == (False, False)
    for p, width in (("bf16", 2), ("fp16", 2), ("fp8", 2)):
        t = ExecutionSettings(precision=p)
        assert t.mixed_precision and t.param_dtype_bytes == width
    assert ExecutionSettings(recompute="full").recompute_full
    assert not ExecutionSettings(recompute="selective").recompute_full
    # booleans (callers and plans of the two-valued setting) become full / none
    assert ExecutionSettings(recompute=True).recompute == "full"
    assert ExecutionSettings(recompute=False).recompute == "none"
    z = ExecutionSettings(gradient_sync="zero1", sequence_parallel=True, tp_comm_overlap=True)
    back = Plan.from_dict(_plan(execution=z).to_dict()).settings
    assert back == z
    assert s.shard_unit == "block"
    ds = ExecutionSettings(gradient_sync="sharded", shard_unit="module")
    assert Plan.from_dict(_plan(execution=ds).to_dict()).settings.shard_unit == "module"
    # fp32 gradient reduction round-trips; plans written before it reduce at "param"
    assert s.grad_reduce == "param"
    fp32 = ExecutionSettings(precision="bf16", grad_reduce="fp32")
    assert Plan.from_dict(_plan(execution=fp32).to_dict()).settings == fp32
    old = _plan(execution=ExecutionSettings()).to_dict()
    del old["execution"]["grad_reduce"]
    assert Plan.from_dict(old).settings.grad_reduce == "param"


@pytest.mark.parametrize("kw", [{"precision": "int8"}, {"recompute": "some"},
                                {"gradient_sync": "zero2"}, {"sequence_parallel": 1},
                                {"tp_comm_overlap": "yes"}, {"shard_unit": "layer"},
                                {"grad_reduce": "bf16"}])
def test_bad_training_settings(kw) -> None:
    with pytest.raises(ShardplanError) as err:
        ExecutionSettings(**kw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("old, precision", [
    ({"mixed_precision": True, "param_dtype_bytes": 2}, "fp16"),
    ({"mixed_precision": True}, "fp16"),
    ({"mixed_precision": True, "param_dtype_bytes": 1}, "fp8"),
    ({"mixed_precision": False, "param_dtype_bytes": 2}, "fp32"),
    ({"recompute": True}, "fp32"),
])
def test_older_plans_load(old, precision) -> None:
    d = _plan(execution=ExecutionSettings()).to_dict()
    d["execution"] = {"microbatches": 4, **old}
    s = Plan.from_dict(d).settings
    assert s.precision == precision
    assert s.recompute == ("full" if old.get("recompute") else "none")
    # legacy options of plans without an execution field
    d = _plan().to_dict()
    d["options"] = {"recompute": True}
    assert Plan.from_dict(d).settings.recompute == "full"


def test_written_plans_keep_the_old_fields_for_old_readers() -> None:
    d = ExecutionSettings(precision="bf16").to_dict()
    assert d["precision"] == "bf16" and d["mixed_precision"] is True
    assert d["param_dtype_bytes"] == 2
    assert ExecutionSettings.from_dict(d).precision == "bf16"  # precision wins


def test_legacy_precision_values_are_checked() -> None:
    d = _plan().to_dict()
    d["execution"] = {"mixed_precision": True, "param_dtype_bytes": 3}
    with pytest.raises(InvalidFileError, match="param_dtype_bytes 3"):
        Plan.from_dict(d)


def test_override_of_the_training_settings() -> None:
    s = ExecutionSettings()
    new, notes = s.override(precision="bf16", recompute="selective", gradient_sync="zero1")
    assert (new.precision, new.recompute, new.gradient_sync) == ("bf16", "selective", "zero1")
    assert "precision bf16 overrides the plan's fp32" in notes
    new, _ = s.override(recompute=True, mixed_precision=True)
    assert (new.recompute, new.precision) == ("full", "fp16")
