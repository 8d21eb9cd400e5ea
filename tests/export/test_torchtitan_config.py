"""Issue 45: ``export --to torchtitan`` of LLM plans, fed to torchtitan 0.3.0's own config code.

The recipe module and its flags go through torchtitan's ``ConfigManager.parse_args`` (its
tyro command line and the ``Trainer.Config`` checks: CUDA graphs with a pipeline, the
micro-batch dividing the local batch, async TP needing compile, ...), its ``ParallelDims``
(the degrees against the world size) and its pipeline splitting (``_get_pipeline_metadata``,
``_generate_llm_fqn_per_model_part``: virtual stages per rank, the embedding and output
counted as layers), on CPU without a process group. torchtitan is pinned in
requirements-nodeps.txt without its run-time dependencies: its modules import ``datasets``
(data loading) and ``torch.utils.tensorboard`` (logging) at the top, which are stand-ins
here; nothing of them runs while a config is parsed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import shlex
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardplan.export import ExportOptions, export
from shardplan.importers._run import RunConfig, execution_of, flavor_dims
from shardplan.importers.torchtitan import run_of_torchtitan, torchtitan_options
from shardplan.ir import Graph, ParallelConfig, Plan
from shardplan.topology import build
from tests.helpers import plan_of_run

_STANDINS = ("datasets", "torch.utils.tensorboard")


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for what torchtitan imports only to load data and log."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if any(name == s or name.startswith(s + ".") for s in _STANDINS):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)

        def attribute(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

        module.__getattr__ = attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@pytest.fixture(scope="module")
def titan() -> Iterator[types.SimpleNamespace]:
    pytest.importorskip("tyro")
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed")
    finder = _StandIn()
    sys.meta_path.insert(0, finder)
    try:
        config = importlib.import_module("torchtitan.config")
        dims = importlib.import_module("torchtitan.distributed.parallel_dims")
        pipe = importlib.import_module("torchtitan.distributed.pipeline_parallel")
        ac = importlib.import_module("torchtitan.distributed.activation_checkpoint")
        llama3 = importlib.import_module("torchtitan.models.llama3")
        yield types.SimpleNamespace(ConfigManager=config.ConfigManager,
                                    ParallelDims=dims.ParallelDims, pipe=pipe, ac=ac,
                                    llama3=llama3)
    finally:
        sys.meta_path.remove(finder)


_GPUS = 16
#: name -> (flavor, sequence, degrees, micro-batch per rank, global batch, settings)
PLANS: dict[str, tuple[str, int, dict[str, Any], int, int, dict[str, Any]]] = {
    "fsdp": ("8B", 8192, {"dp_shard": 16}, 1, 32,
             {"precision": "bf16", "gradient_sync": "sharded", "recompute": "op"}),
    "fsdp-tp": ("70B", 8192, {"tp": 8, "dp_shard": 2}, 2, 32,
                {"precision": "bf16", "gradient_sync": "sharded", "recompute": "full",
                 "sequence_parallel": True, "tp_comm_overlap": True}),
    "tp-pp-interleaved": ("70B", 4096, {"tp": 2, "pp": 4, "vp": 2, "dp": 2}, 1, 32,
                          {"precision": "bf16", "recompute": "full"}),
    # Llama 3.1 405B's 126 blocks on 8 ranks as torchtitan splits them
    "pp-uneven": ("405B", 8192, {"pp": 8, "dp": 2,
                                 "stage_layers": (15, 16, 16, 16, 16, 16, 16, 15)}, 1, 32,
                  {"precision": "bf16", "recompute": "full"}),
    # a split torchtitan's weights cannot make: written as module names
    "pp-by-names": ("8B", 8192, {"pp": 4, "dp_shard": 4, "stage_layers": (9, 7, 9, 7)}, 1, 32,
                    {"precision": "fp32", "gradient_sync": "sharded"}),
    "cp": ("8B", 32768, {"cp": 4, "dp_shard": 4}, 1, 8,
           {"precision": "bf16", "gradient_sync": "sharded", "recompute": "full"}),
}


def _layout(name: str) -> tuple[RunConfig, Plan, Graph]:
    flavor, seq, degrees, micro, glob, settings = PLANS[name]
    model = flavor_dims("llama3", flavor, seq)
    par = ParallelConfig(**degrees)
    run = RunConfig(model=model, num_gpus=_GPUS, parallel=par, micro_batch_size=micro,
                    global_batch=glob, source="test",
                    execution=execution_of(par, micro_batch_size=micro, global_batch=glob,
                                           stack="torchtitan", **settings))
    modules = ["tok_embeddings"] + [f"layers.{i}" for i in range(model.num_layers)] + \
        ["norm", "output"]
    n = len(modules)
    graph = Graph.from_arrays(name="llm", fwd_flops=np.full(n, 1e9), src=np.arange(n - 1),
                              dst=np.arange(1, n), names=[f"n{i}" for i in range(n)],
                              ops=["linear"] * n, modules=modules, batch_size=1,
                              param_bytes=np.full(n, 1024), output_bytes=np.full(n, 4096),
                              meta={"input_shapes": [[1, seq]], "input_dtypes": ["int64"]})
    plan = plan_of_run(run, n)
    return run, plan, graph


def _parse(titan: types.SimpleNamespace, args: list[str]) -> Any:
    return titan.ConfigManager().parse_args(args)


def _stage_layers(titan: types.SimpleNamespace, config: Any, world: int) -> tuple[int, ...]:
    """Blocks per virtual stage as torchtitan's pipeline code splits the model."""
    par = config.parallelism
    dims = titan.ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                              dp_shard=par.data_parallel_shard_degree,
                              cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                              pp=par.pipeline_parallel_degree, ep=1, world_size=world)
    parts = par.module_fqns_per_model_part
    if parts is None:
        stages, layers, first, last = titan.pipe._get_pipeline_metadata(
            dims, par, config.model_spec.model)
        parts = titan.pipe._generate_llm_fqn_per_model_part(stages, layers, first, last)
    assert len(parts) % par.pipeline_parallel_degree == 0
    return tuple(sum(m.startswith("layers.") for m in part) for part in parts)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_torchtitan_030_parses_the_recipe_and_flags(
        name: str, titan: types.SimpleNamespace, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run, plan, graph = _layout(name)
    par = run.parallel
    module = f"shardplan_tt_{name.replace('-', '_')}"
    out = export(plan, graph, build("flat", num_devices=_GPUS, device="h100"), "torchtitan",
                 options=ExportOptions(output_name=f"{module}.py"))
    (tmp_path / f"{module}.py").write_text(out.text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    config = _parse(titan, ["--module", module, "--config", "shardplan_plan"])

    p, t = config.parallelism, config.training
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree,
            p.tensor_parallel_degree, p.context_parallel_degree,
            p.pipeline_parallel_degree) == (par.dp, par.dp_shard, par.tp, par.cp, par.pp)
    assert config.model_spec.flavor == PLANS[name][0]
    assert t.seq_len == run.model.seq_len
    assert t.global_batch_size == run.global_batch
    count = run.microbatches
    if par.pp > 1:
        assert p.pipeline_parallel_microbatch_size == run.micro_batch_size
        assert t.local_batch_size == run.micro_batch_size * count
        assert p.pipeline_parallel_schedule == ("Interleaved1F1B" if par.vp > 1 else "1F1B")
        assert t.disable_cuda_graphs
        assert _stage_layers(titan, config, _GPUS) == par.layers_per_stage(run.model.num_layers)
    else:
        assert t.local_batch_size == run.micro_batch_size
    precision = run.execution["precision"]
    assert t.mixed_precision_param == {"bf16": "bfloat16", "fp32": "float32"}[precision]
    want_ac = {"none": type(None), "full": titan.ac.FullAC.Config,
               "op": titan.ac.SelectiveAC.Config}[run.execution["recompute"]]
    assert type(config.activation_checkpoint) is want_ac
    assert config.compile.enable_async_tensor_parallel == run.execution["tp_comm_overlap"]
    if par.tp > 1:
        assert p.enable_sequence_parallel == run.execution["sequence_parallel"]

    flags = shlex.split(out.beside[".flags"])
    assert flags[:2] == ["--module", "llama3"]
    # the flags on the recipe module change nothing: they are its settings
    again = _parse(titan, ["--module", module, "--config", "shardplan_plan", *flags[4:]])
    assert again.parallelism == p and again.training == t
    assert again.activation_checkpoint == config.activation_checkpoint
    if flags[3] != "llama3_405b":  # its Float8 converters need a GPU of compute 8.9
        on_own = _parse(titan, flags)
        assert on_own.parallelism == p and on_own.training == t
        assert on_own.activation_checkpoint == config.activation_checkpoint
        assert on_own.compile.enable_async_tensor_parallel == \
            config.compile.enable_async_tensor_parallel

    # and shardplan's importer reads the flags back to the plan's layout
    back = run_of_torchtitan(torchtitan_options(out.beside[".flags"]), num_gpus=_GPUS)
    assert back.parallel.layers_per_stage(run.model.num_layers) == \
        par.layers_per_stage(run.model.num_layers)
    assert (back.parallel.tp, back.parallel.pp, back.parallel.vp, back.parallel.dp,
            back.parallel.dp_shard, back.parallel.cp) == (
        par.tp, par.pp, par.vp, par.dp, par.dp_shard, par.cp)
    assert (back.micro_batch_size, back.global_batch) == (run.micro_batch_size, run.global_batch)


@pytest.mark.parametrize(("flags", "why"), [
    (["--training.mixed_precision_param", "float16"], "float16"),
    (["--parallelism.pipeline_parallel_degree", "2"], "disable_cuda_graphs"),
    (["--parallelism.enable_async_tensor_parallel"], "enable_async_tensor_parallel"),
    (["--training.num_tokens_per_train_step", "8192"], "num_tokens_per_train_step"),
])
def test_torchtitan_030_refuses_what_the_old_export_wrote(
        flags: list[str], why: str, titan: types.SimpleNamespace,
        capsys: pytest.CaptureFixture[str]) -> None:
    """What the 0.2-era export (and the first recipe) wrote: torchtitan 0.3.0 rejects it, so
    the checks above are not vacuous."""
    with pytest.raises(SystemExit):
        _parse(titan, ["--module", "llama3", "--config", "llama3_8b", *flags])
    printed = capsys.readouterr()
    assert why.replace("_", "-") in (printed.err + printed.out).replace("_", "-")


def test_the_405b_run_on_512_h100_round_trips(titan: types.SimpleNamespace,
                                              tmp_path: Path) -> None:
    """torchtitan's own 405B layout (FSDP 8 x TP 8 x PP 8, Interleaved1F1B) imported, exported
    and split again by torchtitan's code: 7, 8 x 14, 7 blocks."""
    data = Path(__file__).parents[1] / "importers" / "data" / "llama3_405b_512gpu.flags"
    run = run_of_torchtitan(torchtitan_options(data.read_text()), num_gpus=512)
    assert run.parallel.stage_layers == (7,) + (8,) * 14 + (7,)
    found = __import__("shardplan.export._torchtitan", fromlist=["split_options"])
    opts = found.split_options(run.parallel.stage_layers, 126)
    assert opts == {"pipeline_parallel_layers_per_stage": 8,
                    "pipeline_parallel_first_stage_less_layers": 1,
                    "pipeline_parallel_last_stage_less_layers": 1}
    model = titan.llama3.model_registry("405B").model
    dims = titan.ParallelDims(dp_replicate=1, dp_shard=8, cp=1, tp=8, pp=8, ep=1,
                              world_size=512)
    par = type("P", (), {"pipeline_parallel_schedule": "Interleaved1F1B",
                         **{k.removeprefix(""): v for k, v in opts.items()}})()
    stages, layers, first, last = titan.pipe._get_pipeline_metadata(dims, par, model)
    parts = titan.pipe._generate_llm_fqn_per_model_part(stages, layers, first, last)
    assert tuple(sum(m.startswith("layers.") for m in p) for p in parts) == \
        run.parallel.stage_layers


def test_a_pipeline_plans_recipe_on_a_base_recipe(titan: types.SimpleNamespace,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline plan (no ``parallel`` layout): the recipe module starts from the user's
    recipe (``--torchtitan-base``) and sets the split by module names, the schedule CSV and
    the batch; torchtitan 0.3.0 parses it and the flags to the same options."""
    from dataclasses import replace

    _, llm, graph = _layout("pp-uneven")
    plan = replace(llm, parallel=None)
    out = export(plan, graph, build("flat", num_devices=_GPUS, device="h100"), "torchtitan",
                 options=ExportOptions(
                     output_name="pipe_plan.py", schedule_csv=str(tmp_path / "s.csv"),
                     torchtitan_base="torchtitan.models.llama3.config_registry:llama3_70b"))
    (tmp_path / "pipe_plan.py").write_text(out.text)
    (tmp_path / "s.csv").write_text(out.beside[".schedule.csv"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    config = _parse(titan, ["--module", "pipe_plan", "--config", "shardplan_plan"])
    flags = _parse(titan, shlex.split(out.beside[".flags"]))
    assert flags.parallelism == config.parallelism and flags.training == config.training
    p = config.parallelism
    assert len(p.module_fqns_per_model_part) == len(plan.stages)
    assert p.pipeline_parallel_schedule_csv.endswith("s.csv")
    assert config.training.disable_cuda_graphs
    assert config.training.local_batch_size % p.pipeline_parallel_microbatch_size == 0
