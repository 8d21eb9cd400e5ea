"""Exports fed to the other tools: their own code where it installs on CPU from PyPI
(DeepSpeed's PipelineModule partitioning and config, megatron-core's TransformerConfig),
otherwise the names, types and constraints they document, written here as data
(torchtitan's config fields, Megatron-LM's command-line arguments)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.export import FORMATS, ExportOptions, export
from shardplan.ir import Graph, Objective, Plan, Stage
from shardplan.topology import build
from tests.helpers import hand_plan, run_cli

# tok_emb, pos_emb | blocks.i: ln1, attn, proj, the residual add (module "blocks.i": a
# node inside the block where no module starts), mlp, add | ln_f, head
_BLOCK = ("ln1", "attn", "attn.proj", "", "mlp", "")
_MODULES = (["tok_emb", "pos_emb"]
            + [f"blocks.{i}" + (f".{m}" if m else "") for i in range(4) for m in _BLOCK]
            + ["ln_f", "head"])
_OPS = (["embedding", "embedding"]
        + ["layer_norm", "scaled_dot_product_attention", "linear", "add", "linear", "add"] * 4
        + ["layer_norm", "linear"])
_SEQ = 16


def _graph() -> Graph:
    n = len(_MODULES)
    return Graph.from_arrays(name="gpt", fwd_flops=np.full(n, 1e9), src=np.arange(n - 1),
                             dst=np.arange(1, n), output_bytes=np.full(n, 4096),
                             param_bytes=np.full(n, 1024), names=[f"n{i}" for i in range(n)],
                             ops=_OPS, modules=_MODULES, batch_size=4,
                             meta={"input_shapes": [[4, _SEQ]], "input_dtypes": ["int64"]})


def _plan(cuts: list[int], replicas: int = 1, **execution: object) -> Plan:
    return hand_plan(cuts, len(_MODULES), replicas, **execution)


# node 2 + 6 b + 3 is the residual add of block b: the cut the 4-layer transformer's
# uniform plan makes, where no module starts (a StopIteration traceback before)
_INSIDE = 2 + 6 * 2 + 3


# ------------------------------------------------------------------ a stage inside a module
@pytest.mark.parametrize("fmt", ["torch", "torchtitan", "megatron", "deepspeed"])
def test_a_stage_starting_inside_a_module_moves_or_is_refused(
        fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardplan.ir import save

    g, topo = _graph(), build("flat", num_devices=2)
    files = [tmp_path / f for f in ("plan.json", "graph.json", "topo.json")]
    for obj, f in zip((_plan([_INSIDE]), g, topo), files, strict=True):
        save(obj, f)
    out = tmp_path / "out"
    assert run_cli(["export", *map(str, files), "--to", fmt, "-o", str(out)]) in (0, 2)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if fmt == "torch":
        # the add is one node past blocks.2.attn.proj's start, two before blocks.2.mlp's
        assert err == ("shardplan: note: torch splits at module starts: nodes 'n16' move "
                       "from pipeline stage 0 to 1\n")
        assert json.loads(out.read_text())["split_spec"] == {"blocks.2.attn.proj": "BEGINNING"}
    else:  # the nearest layer start: blocks.2 (3 nodes back; blocks.3 is 3 ahead: a tie)
        assert err == (f"shardplan: note: {fmt} splits at layer boundaries: nodes 'n14', "
                       "'n15', 'n16' move from pipeline stage 0 to 1\n")
        if fmt == "deepspeed":  # embeddings, blocks.0, 1 | blocks.2, 3, ln_f, head: uniform
            assert json.loads(out.read_text())["parts"] == [0, 4, 8]
    assert run_cli(["export", *map(str, files), "--to", fmt, "--exact-split", "-o",
                    str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"shardplan: error: {fmt} splits at ")
    assert "at node 'n17' (blocks.2)" in err


def test_too_few_layers_for_the_stages_is_refused() -> None:
    n = len(_MODULES)
    stages = tuple(Stage((v,), (v,)) for v in range(10)) + (Stage(tuple(range(10, n)), (10,)),)
    plan = Plan("gpt", "flat", "hand", stages, Objective("x", 0.0))
    with pytest.raises(ShardplanError, match="too few of them for the plan's 11 stages"):
        export(plan, _graph(), build("flat", num_devices=11), "megatron")


# ------------------------------------------------------------------ interleaved plans
def test_interleaved_plan_is_one_rank_per_stage() -> None:
    """2 stages on 2 devices under interleaved 1F1B: two ranks, one stage each (the
    simulator's 1 rank running both left the second device out: torch's 'Pair is not
    connected')."""
    from shardplan.ir.schedule import Schedule

    g, topo = _graph(), build("flat", num_devices=2)
    plan = _plan([2 + 6 * 2], microbatches=4, schedule="interleaved-1f1b")
    out = export(plan, g, topo, "torch")
    data = json.loads(out.text)
    assert (data["num_ranks"], data["stage_rank"]) == (2, [0, 1])
    sch = Schedule.from_text(data["schedule_csv"])
    assert sch.num_ranks == 2 and sch.stage_rank == (0, 1)
    assert any("2 ranks of one stage each" in n for n in out.notes)
    mg = json.loads(export(plan, g, topo, "megatron").text)
    assert mg["pipeline_model_parallel_size"] == 2 and mg["virtual_stages_per_rank"] == 1


# ------------------------------------------------------------------ Megatron
# Megatron-LM's arguments (megatron/training/arguments.py) that the export writes: name ->
# type. megatron-core ships without megatron.training, so they are written here as data.
_MEGATRON_ARGS = {"--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int,
                  "--pipeline-model-parallel-layout": str, "--num-layers": int,
                  "--micro-batch-size": int, "--global-batch-size": int}


def _megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for name, kind in _MEGATRON_ARGS.items():
        p.add_argument(name, type=kind)
    return p


@pytest.mark.parametrize("cuts, replicas, layout", [
    ([2 + 6 * 2], 2, "Ett|ttL"),
    ([2 + 6], 1, "Et|tttL"),
    ([2 + 6 * 1, 2 + 6 * 3], 1, "Et|tt|tL"),
])
def test_megatron_arguments_parse_and_megatron_core_accepts(
        cuts: list[int], replicas: int, layout: str) -> None:
    mg = json.loads(export(_plan(cuts, replicas=replicas, microbatches=4), _graph(),
                           build("flat", num_devices=6), "megatron").text)
    args = _megatron_parser().parse_args(shlex.split(shlex.join(mg["args"])))
    assert args.pipeline_model_parallel_layout == layout
    assert args.pipeline_model_parallel_size == len(cuts) + 1
    assert args.num_layers == 4 and args.tensor_model_parallel_size == 1
    # global batch = micro-batch x micro-batches x data-parallel ranks: 4 samples / replicas
    assert args.micro_batch_size == 4 // replicas
    assert args.global_batch_size == 4 * 4
    core = pytest.importorskip("megatron.core.transformer.transformer_config")
    torch = pytest.importorskip("torch")
    conf = core.TransformerConfig(
        pipeline_dtype=torch.float32, num_layers=args.num_layers, hidden_size=64,
        num_attention_heads=4,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        pipeline_model_parallel_layout=args.pipeline_model_parallel_layout)
    conf.pipeline_model_parallel_layout.validate_layer_layout(args.num_layers, 0)


def test_megatron_core_rejects_a_wrong_layout() -> None:
    """The check above would notice a wrong layout: megatron-core refuses a layout whose
    layer count is not the model's."""
    core = pytest.importorskip("megatron.core.transformer.transformer_config")
    torch = pytest.importorskip("torch")
    with pytest.raises(AssertionError, match="must match num_layers 4"):
        core.TransformerConfig(pipeline_dtype=torch.float32, num_layers=4, hidden_size=64,
                               num_attention_heads=4, pipeline_model_parallel_size=2,
                               pipeline_model_parallel_layout="Et|ttL")


# ------------------------------------------------------------------ DeepSpeed
def _deepspeed_parts(method: str, num_layers: int, num_stages: int) -> list[int]:
    """DeepSpeed's own PipelineModule._partition_layers on a stand-in module (a real
    PipelineModule needs a process group of num_stages ranks)."""
    pipe = pytest.importorskip("deepspeed.runtime.pipe.module")
    stub = types.SimpleNamespace(
        num_stages=num_stages, global_rank=1, loss_fn=None, parts=None,
        _topo=types.SimpleNamespace(get_coord=lambda rank: types.SimpleNamespace(pipe=0)),
        _layer_specs=[object()] * num_layers, _set_bounds=lambda start, stop: None)
    pipe.PipelineModule._partition_layers(stub, method=method)
    return list(stub.parts)


def test_deepspeed_reads_the_export(monkeypatch: pytest.MonkeyPatch) -> None:
    g, topo = _graph(), build("flat", num_devices=4)
    ds = json.loads(export(_plan([2 + 6 * 2], replicas=2, microbatches=4), g, topo,
                           "deepspeed").text)
    assert _deepspeed_parts(ds["partition_method"], len(ds["layers"]), ds["num_stages"]) \
        == ds["parts"] == [0, 4, 8]
    cfg = pytest.importorskip("deepspeed.runtime.config")
    mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: 2,
                                get_data_parallel_rank=lambda: 0,
                                get_model_parallel_world_size=lambda: 1,
                                get_model_parallel_rank=lambda: 0,
                                get_pipeline_model_parallel_world_size=lambda: 2,
                                get_sequence_parallel_world_size=lambda: 1)
    monkeypatch.setattr(cfg.dist, "get_rank", lambda *a, **k: 0)  # no process group here
    conf = cfg.DeepSpeedConfig(ds["ds_config"], mpu=mpu)
    # DeepSpeed checks train_batch_size = micro-batch x accumulation x data-parallel ranks
    assert (conf.train_batch_size, conf.train_micro_batch_size_per_gpu,
            conf.gradient_accumulation_steps) == (2 * 4 * 2, 2, 4)


def test_deepspeed_rejects_what_the_export_refuses() -> None:
    """DeepSpeed raises on boundaries written as a partition method (what the export wrote
    before); the export refuses such a plan in one line instead."""
    with pytest.raises(NotImplementedError):
        _deepspeed_parts("parts", 8, 2)
    with pytest.raises(ShardplanError, match="not by boundaries"):
        export(_plan([2 + 6]), _graph(), build("flat", num_devices=2), "deepspeed")


# ------------------------------------------------------------------ torchtitan
# Current torchtitan (``--module M --config F``): the Trainer.Config fields the recipe
# sets, with their types (torchtitan/config/parallelism.py, training.py), and the names that
# no longer exist. Written as data: torchtitan does not install on CPU from PyPI in its
# current form.
# torchtitan 0.3.0's ParallelismConfig and TrainingConfig fields the recipe sets
# (tests/export/test_torchtitan_config.py parses it with torchtitan itself)
_TT_PARALLELISM = {"pipeline_parallel_degree": int, "pipeline_parallel_schedule": str,
                   "pipeline_parallel_schedule_csv": str,
                   "pipeline_parallel_microbatch_size": int,
                   "module_fqns_per_model_part": list,
                   "pipeline_parallel_layers_per_stage": type(None),
                   "data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                   "tensor_parallel_degree": int, "context_parallel_degree": int}
_TT_TRAINING = {"local_batch_size": int, "global_batch_size": int, "disable_cuda_graphs": bool}
# what an earlier export wrote and no torchtitan release has
_TT_GONE = ("num_pp_microbatches", "num_tokens_per", "pipeline_parallel_module_fqns")
_TORCH_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                    "ZBVZeroBubble", "DualPipeV")


def _fake_torchtitan(monkeypatch: pytest.MonkeyPatch) -> type:
    """A torchtitan whose Trainer.Config holds slots dataclasses with exactly the
    documented fields: setting any other attribute raises AttributeError."""
    def config(name: str, fields: dict[str, type]) -> type:
        return dataclasses.make_dataclass(
            name, [(f, object, dataclasses.field(default=None)) for f in fields],
            slots=True)

    par, tr = config("ParallelismConfig", _TT_PARALLELISM), config("TrainingConfig",
                                                                   _TT_TRAINING)

    @dataclasses.dataclass(slots=True)
    class Config:
        parallelism: object = dataclasses.field(default_factory=par)
        training: object = dataclasses.field(default_factory=tr)

    trainer = types.ModuleType("torchtitan.trainer")
    trainer.Trainer = types.SimpleNamespace(Config=Config)  # type: ignore[attr-defined]
    base = types.ModuleType("my_recipes")
    base.my_model = Config  # type: ignore[attr-defined]
    for name, mod in (("torchtitan", types.ModuleType("torchtitan")),
                      ("torchtitan.trainer", trainer), ("my_recipes", base)):
        monkeypatch.setitem(sys.modules, name, mod)
    return Config


def test_torchtitan_recipe_sets_the_documented_fields(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardplan.ir import save

    g, topo = _graph(), build("flat", num_devices=4)
    plan = _plan([2 + 6 * 2], replicas=2, microbatches=4, schedule="gpipe")
    files = [tmp_path / f for f in ("plan.json", "graph.json", "topo.json")]
    for obj, f in zip((plan, g, topo), files, strict=True):
        save(obj, f)
    out = tmp_path / "recipes" / "tt_plan.py"
    out.parent.mkdir()
    assert run_cli(["export", *map(str, files), "--to", "torchtitan", "--torchtitan-base",
                    "my_recipes:my_model", "-o", str(out)]) == 0
    _fake_torchtitan(monkeypatch)
    monkeypatch.syspath_prepend(str(out.parent))
    monkeypatch.chdir(tmp_path)  # torchtitan runs elsewhere than the recipe's folder
    monkeypatch.delitem(sys.modules, "tt_plan", raising=False)
    import importlib

    conf = importlib.import_module("tt_plan").shardplan_plan()
    par, tr = conf.parallelism, conf.training
    for obj, fields in ((par, _TT_PARALLELISM), (tr, _TT_TRAINING)):
        for name, kind in fields.items():
            assert isinstance(getattr(obj, name), kind), name
    assert par.pipeline_parallel_schedule in _TORCH_SCHEDULES
    assert (par.pipeline_parallel_degree, par.data_parallel_replicate_degree,
            par.pipeline_parallel_microbatch_size) == (2, 2, 2)
    assert par.module_fqns_per_model_part == [
        ["tok_emb", "pos_emb", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "ln_f", "head"]]
    # 2 samples per replica and micro-batch (4 over 2 replicas) x 4 micro-batches
    assert (tr.local_batch_size, tr.global_batch_size) == (2 * 4, 2 * 4 * 2)
    assert tr.disable_cuda_graphs
    csv = Path(par.pipeline_parallel_schedule_csv)
    assert csv.is_absolute() and csv.read_text().count("\n") == 2  # one row per rank
    # the flags: documented --section.option names only, values of their types
    flags = shlex.split((out.parent / "tt_plan.py.flags").read_text())
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--module")
    parser.add_argument("--config")
    parser.add_argument("--parallelism.module_fqns_per_model_part", nargs="+")
    parser.add_argument("--training.disable_cuda_graphs", action="store_true")
    for section, fields in (("parallelism", _TT_PARALLELISM), ("training", _TT_TRAINING)):
        for name, kind in fields.items():
            if kind in (int, str):
                parser.add_argument(f"--{section}.{name}", type=kind)
    ns = vars(parser.parse_args(flags))
    assert Path(ns["parallelism.pipeline_parallel_schedule_csv"]) == csv
    assert ns["training.global_batch_size"] == tr.global_batch_size
    assert (ns["module"], ns["config"]) == ("my_recipes", "my_model")
    assert [p.split(",") for p in ns["parallelism.module_fqns_per_model_part"]] == \
        par.module_fqns_per_model_part
    text = out.read_text() + " ".join(flags)
    assert not any(gone in text for gone in _TT_GONE)


def test_torchtitan_02_keeps_the_toml() -> None:
    import tomllib

    out = export(_plan([2 + 6 * 2], microbatches=4), _graph(), build("flat", num_devices=2),
                 "torchtitan", options=ExportOptions(torchtitan_version="0.2",
                                                     schedule_csv="/abs/s.csv"))
    conf = tomllib.loads(out.text)
    assert conf["parallelism"]["pipeline_parallel_schedule_csv"] == "/abs/s.csv"
    assert conf["training"]["local_batch_size"] == 4 * 4
    with pytest.raises(ShardplanError, match="unknown torchtitan version"):
        ExportOptions(torchtitan_version="9")


# ------------------------------------------------------------------ every family
def _family_plans() -> dict[str, Plan]:
    import shardplan

    g = _graph()
    t2, t4 = build("flat", num_devices=2), build("flat", num_devices=4)
    plans = {a: shardplan.partition(g, t2, algorithm=a, stages=2, replicas=1, seed=0)
             for a in ("parmesan", "pipedream", "uniform", "params", "metis")}
    plans["parmesan-interleaved"] = plans["parmesan"].with_settings(
        plans["parmesan"].settings.override(schedule="interleaved-1f1b")[0])
    plans["heuristic"] = shardplan.partition(g, t2, algorithm="heuristic", seed=0)
    plans["brute-force"] = shardplan.partition(g, t2, algorithm="brute-force", seed=0)
    plans["parmesan-replicated"] = shardplan.partition(g, t4, algorithm="parmesan", stages=2,
                                                       replicas=2, seed=0)
    # the families that split layers: strategies (data parallelism as a strategy, PaSE in
    # the simulator's price) and a hybrid (Parmesan's stages, each split by PaSE)
    from shardplan import registry
    from shardplan.strategy import hybrid_plan

    plans["data-parallel-strategy"] = registry.run("strategy", "data-parallel", g, t2,
                                                   cutoff=1).plan
    plans["pase"] = registry.run("strategy", "pase", g, t2, cutoff=1,
                                 cost_model="default").plan
    plans["hybrid"] = hybrid_plan(plans["parmesan-replicated"], g, t4,
                                  options={"cutoff": 1, "cost_model": "default"})
    return plans


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "chrome-trace"])
def test_every_family_exports_or_is_refused_in_one_line(fmt: str) -> None:
    g = _graph()
    for family, plan in _family_plans().items():
        topo = build("flat", num_devices=max(d for s in plan.stages for d in s.devices) + 1)
        try:
            out = export(plan, g, topo, fmt)
        except ShardplanError as exc:
            assert "\n" not in str(exc), family
            if plan.strategy is not None:
                assert "strategy plan" in str(exc), family
            continue
        assert plan.strategy is None, family
        if fmt == "megatron":
            data = json.loads(out.text)
            args = _megatron_parser().parse_args(data["args"])
            assert args.pipeline_model_parallel_layout.count("t") == 4, family
        elif fmt == "deepspeed":
            data = json.loads(out.text)
            assert data["partition_method"] in ("uniform", "parameters") \
                or data["partition_method"].startswith("type:"), family
            assert _deepspeed_parts(data["partition_method"], len(data["layers"]),
                                    data["num_stages"]) == data["parts"], family
        elif fmt == "torch":
            data = json.loads(out.text)
            assert len(data["split_spec"]) == data["num_stages"] - 1, family
            assert data["num_ranks"] == len({d for s in plan.stages for d in s.devices}) \
                // len(plan.stages[0].devices), family
