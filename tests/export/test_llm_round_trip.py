"""Issue 46: every export of an LLM plan carries every degree and setting, or refuses in one
line naming the one its format cannot hold. Each target's output is read back (with the
target's own parser where it is pinned: DeepSpeed's config, shardplan's importers for the
Megatron-LM arguments and torchtitan flags they were written for) and compared with the
plan, over every layout kind."""

from __future__ import annotations

import json
import types
from typing import Any

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.export import ExportOptions, export
from shardplan.importers._run import ModelDims, RunConfig, execution_of, flavor_dims
from shardplan.importers.megatron import parse_megatron
from shardplan.importers.torchtitan import run_of_torchtitan, torchtitan_options
from shardplan.ir import Graph, ParallelConfig, Plan
from shardplan.topology import build
from tests.helpers import plan_of_run

_GPUS = 16
_MODEL: ModelDims = flavor_dims("llama3", "8B", 1024)  # 32 layers, 32 heads, 8 KV heads
_MODEL_ARGS = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
               "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 "
               "--swiglu --seq-length 1024 --padded-vocab-size 128256 ")

#: name -> (degrees, micro-batch per rank, global batch, settings)
LAYOUTS: dict[str, tuple[dict[str, Any], int, int, dict[str, Any]]] = {
    "dp": ({"dp": 16}, 1, 32, {"precision": "bf16"}),
    "tp-dp": ({"tp": 2, "dp": 8}, 2, 64, {"precision": "bf16", "sequence_parallel": True}),
    "tp-pp-dp": ({"tp": 2, "pp": 2, "dp": 4}, 1, 32, {"precision": "bf16",
                                                      "recompute": "full"}),
    "tp-cp-pp": ({"tp": 2, "cp": 2, "pp": 2, "dp": 2}, 1, 16, {"precision": "bf16"}),
    "interleaved": ({"tp": 2, "pp": 2, "vp": 2, "dp": 4}, 1, 32, {"precision": "fp16",
                                                                  "gradient_sync": "zero1"}),
    # DeepSpeed's uniform split of the 35 layers (embedding, 32 blocks, norm, head)
    "deepspeed-uniform": ({"tp": 2, "pp": 2, "dp": 4, "stage_layers": (17, 15)}, 1, 32,
                          {"precision": "bf16", "recompute": "full"}),
    "uneven": ({"pp": 4, "dp": 4, "stage_layers": (7, 9, 9, 7)}, 1, 32,
               {"precision": "bf16"}),
    "fsdp": ({"dp_shard": 16}, 1, 32, {"precision": "bf16", "gradient_sync": "sharded"}),
    "hsdp": ({"dp": 2, "dp_shard": 8}, 1, 32, {"precision": "bf16",
                                               "gradient_sync": "sharded"}),
    "tp-fsdp-selective": ({"tp": 2, "dp_shard": 8}, 1, 16, {
        "precision": "bf16", "gradient_sync": "sharded", "recompute": "selective"}),
    "fp8-pp": ({"pp": 2, "dp": 8}, 1, 32, {"precision": "fp8"}),
}


def _graph() -> Graph:
    modules = ["tok_embeddings"] + [f"layers.{i}" for i in range(_MODEL.num_layers)] + \
        ["norm", "output"]
    n = len(modules)
    return Graph.from_arrays(name="llm", fwd_flops=np.full(n, 1e9), src=np.arange(n - 1),
                             dst=np.arange(1, n), names=[f"n{i}" for i in range(n)],
                             ops=["linear"] * n, modules=modules, batch_size=1,
                             param_bytes=np.full(n, 1024), output_bytes=np.full(n, 4096),
                             meta={"input_shapes": [[1, 1024]], "input_dtypes": ["int64"]})


def _run(name: str) -> RunConfig:
    degrees, micro, glob, settings = LAYOUTS[name]
    par = ParallelConfig(**degrees)
    return RunConfig(model=_MODEL, num_gpus=_GPUS, parallel=par, micro_batch_size=micro,
                     global_batch=glob, source="test",
                     execution=execution_of(par, micro_batch_size=micro, global_batch=glob,
                                            **settings))


def _plan(run: RunConfig, graph: Graph) -> Plan:
    """The run laid out by hand (:func:`tests.helpers.plan_of_run`)."""
    return plan_of_run(run, graph.num_nodes)


def _want(run: RunConfig) -> dict[str, Any]:
    par = run.parallel
    return {"tp": par.tp, "pp": par.pp, "vp": par.vp, "dp": par.dp, "dp_shard": par.dp_shard,
            "cp": par.cp, "micro": run.micro_batch_size, "count": run.microbatches,
            "precision": run.execution["precision"], "recompute": run.execution["recompute"]}


def _of_run(run: RunConfig) -> dict[str, Any]:
    return _want(run)


def _of_record(d: dict[str, Any]) -> dict[str, Any]:
    return {"tp": d["tensor_parallel"], "pp": d["pipeline_parallel"], "vp": d["virtual_stages"],
            "dp": d["data_parallel_replicate"], "dp_shard": d["data_parallel_shard"],
            "cp": d["context_parallel"], "micro": d.get("micro_batch_size_per_rank",
                                                         d.get("micro_batch_size")),
            "count": d["microbatches"], "precision": d["precision"],
            "recompute": d["recompute"]}


def _deepspeed_config(ds: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    cfg = pytest.importorskip("deepspeed.runtime.config")
    dp, tp, pp = ds["data_parallel"], ds["tensor_parallel"], ds["pipeline_parallel"]
    mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: dp,
                                get_data_parallel_rank=lambda: 0,
                                get_model_parallel_world_size=lambda: tp,
                                get_model_parallel_rank=lambda: 0,
                                get_pipeline_model_parallel_world_size=lambda: pp,
                                get_sequence_parallel_world_size=lambda: 1)
    monkeypatch.setattr(cfg.dist, "get_rank", lambda *a, **k: 0)  # no process group here
    return cfg.DeepSpeedConfig(ds["ds_config"], mpu=mpu)


#: (target, layout) -> the word the refusal names: what the format cannot hold
REFUSED = {
    ("megatron", "hsdp"): "HSDP",
    ("torchtitan", "interleaved"): "fp16",
    ("deepspeed", "tp-cp-pp"): "CP 2",
    ("deepspeed", "interleaved"): "VP 2",
    ("deepspeed", "hsdp"): "HSDP",
    ("deepspeed", "uneven"): "not uniform",
    ("deepspeed", "tp-pp-dp"): "not uniform",
    ("deepspeed", "fp8-pp"): "fp8",
    ("deepspeed", "tp-fsdp-selective"): "selective",
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("target", ["torch", "torchtitan", "megatron", "deepspeed",
                                    "chrome-trace"])
def test_every_export_carries_every_degree_or_refuses(
        target: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(layout)
    graph = _graph()
    plan = _plan(run, graph)
    topo = build("flat", num_devices=_GPUS, device="h100")
    if (target, layout) in REFUSED:
        with pytest.raises(ShardplanError, match=REFUSED[target, layout]) as exc:
            export(plan, graph, topo, target)
        assert "\n" not in str(exc.value)
        return
    out = export(plan, graph, topo, target)
    want = _want(run)
    if target == "megatron":
        again = parse_megatron(_MODEL_ARGS + json.loads(out.text)["args_text"],
                               num_gpus=_GPUS)
        got = _of_run(again)
    elif target == "torchtitan":
        # the flags beside the recipe module (torchtitan 0.3.0), and the 0.2 TOML
        again = run_of_torchtitan(torchtitan_options(out.beside[".flags"]), num_gpus=_GPUS)
        got = _of_run(again)
        per = run.parallel.layers_per_stage(_MODEL.num_layers)
        assert again.parallel.layers_per_stage(_MODEL.num_layers) == per  # the same split
        if run.parallel.tp == 1 or run.execution["sequence_parallel"]:
            toml = export(plan, graph, topo, target,
                          options=ExportOptions(torchtitan_version="0.2")).text
            assert _of_run(run_of_torchtitan(torchtitan_options(toml), num_gpus=_GPUS)) == want
        if want["precision"] == "fp8":  # the recipe module sets Float8: no flag does
            assert "converters=[\n            Float8LinearConverter.Config(" in out.text
            assert any("no flag for the model's converters" in n for n in out.notes)
            got["precision"] = "fp8"
        if want["recompute"] == "selective":  # torchtitan's nearest policy, said in a note
            assert any("per-op policy" in n for n in out.notes)
            got["recompute"] = "selective"
    elif target == "torch":
        data = json.loads(out.text)
        got = _of_record(data)
        assert data["data_parallel"] == run.parallel.data_parallel
        assert data["num_ranks"] == run.parallel.pp
        assert data["stage_rank"] == [j % run.parallel.pp for j in range(data["num_stages"])]
        assert int(np.prod(data["mesh"]["shape"])) == _GPUS
        from shardplan.ir.schedule import Schedule

        sch = Schedule.from_text(data["schedule_csv"])
        assert (sch.num_ranks, sch.num_microbatches) == (run.parallel.pp, run.microbatches)
    elif target == "deepspeed":
        data = json.loads(out.text)
        got = _of_record(data)
        conf = _deepspeed_config(data, monkeypatch)
        assert (conf.train_batch_size, conf.train_micro_batch_size_per_gpu,
                conf.gradient_accumulation_steps) == (
            run.global_batch, run.micro_batch_size, run.microbatches)
        assert conf.bfloat16_config.enabled == (want["precision"] == "bf16")
        assert conf.float16_config.enabled == (want["precision"] == "fp16")
        assert conf.zero_optimization_stage == (
            3 if run.parallel.dp_shard > 1 else
            1 if run.execution["gradient_sync"] == "zero1" else 0)
        assert conf.tensor_parallel_config.autotp_size == (
            run.parallel.tp if run.parallel.tp > 1 else 0)
        assert data["num_stages"] == run.parallel.pp
        assert data["activation_checkpoint_interval"] == (
            1 if want["recompute"] == "full" else 0)
    else:
        got = _of_record(json.loads(out.text)["otherData"])
    assert got == want


def test_torch_export_of_tp_pp_dp_writes_the_data_parallel_ranks() -> None:
    """The finding: TP 2 x PP 2 x DP 2 was written as data_parallel 4 (every device of a
    pipeline rank counted as a replica)."""
    par = ParallelConfig(tp=2, pp=2, dp=2)
    run = RunConfig(model=_MODEL, num_gpus=8, parallel=par, micro_batch_size=1,
                    global_batch=16, execution=execution_of(par, micro_batch_size=1,
                                                            global_batch=16))
    graph = _graph()
    data = json.loads(export(_plan(run, graph), graph, build("flat", num_devices=8),
                             "torch").text)
    assert (data["data_parallel"], data["tensor_parallel"], data["pipeline_parallel"]) == \
        (2, 2, 2)
