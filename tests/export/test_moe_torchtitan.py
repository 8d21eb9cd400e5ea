"""Issue 47: torchtitan's mixtures of experts both ways. Its MoE flavors are the zoo's models
(the same parameter count as torchtitan 0.3.0 builds them, on the meta device); the export
of an MoE plan (the 0.3.0 recipe module and its flags on torchtitan's own MoE recipes) goes
through torchtitan's ``ConfigManager``, and shardplan's importer reads the plan back from the
flags and from torchtitan 0.2's TOML."""

from __future__ import annotations

import importlib
import shlex
import sys
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardplan.errors import ShardplanError
from shardplan.export import ExportOptions, export
from shardplan.export._torchtitan import _MOE
from shardplan.importers._moe import MOE_FLAVORS, moe_model
from shardplan.importers._run import ModelDims, RunConfig, execution_of
from shardplan.importers._torchtitan_moe import TORCHTITAN_MOE, moe_dims
from shardplan.importers.torchtitan import run_of_torchtitan, torchtitan_options
from shardplan.ir import Graph, ParallelConfig
from shardplan.topology import build
from tests.export.test_torchtitan_config import _StandIn
from tests.helpers import plan_of_run

_MODULES = {"deepseek_v3": "torchtitan.models.deepseek_v3", "qwen3": "torchtitan.models.qwen3",
            "gpt_oss": "torchtitan.models.gpt_oss"}


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
        models = {k: importlib.import_module(v) for k, v in _MODULES.items()}
        yield types.SimpleNamespace(ConfigManager=config.ConfigManager,
                                    ParallelDims=dims.ParallelDims, models=models)
    finally:
        sys.meta_path.remove(finder)


def test_the_export_names_torchtitans_flavors_as_the_importer_does() -> None:
    """The export's table (zoo spec -> torchtitan's model and flavor) is the importer's
    (torchtitan's flavor -> zoo spec), read backwards."""
    specs = {k: moe_dims(*k, 64).spec.removesuffix(",seq=64") for k in TORCHTITAN_MOE}
    assert {v: k for k, v in specs.items()} == {s: (n, f) for s, (n, f, _) in _MOE.items()}
    exact = sorted(k for k, (_, over) in TORCHTITAN_MOE.items() if not over)
    assert exact == [("deepseek_v3", "671B"), ("gpt_oss", "120b"), ("qwen3", "235B-A22B"),
                     ("qwen3", "30B-A3B")]
    with pytest.raises(ShardplanError, match="no mixture-of-experts flavor '7B'"):
        moe_dims("qwen3", "7B", 64)
    with pytest.raises(ShardplanError, match="kimi_k2_7 has no model in shardplan's zoo"):
        moe_dims("kimi_k2_7", "1T", 64)
    assert moe_dims("llama3", "8B", 64) is None


@pytest.mark.parametrize("key", sorted(TORCHTITAN_MOE))
def test_torchtitans_flavors_are_the_zoos_models(key: tuple[str, str],
                                                 titan: types.SimpleNamespace) -> None:
    """torchtitan's model of each flavor, built on the meta device, has the parameters of
    the zoo model the importer names (the zoo's count from its dimensions)."""
    torch = pytest.importorskip("torch")
    from shardplan.workload.moe import config_of, parameter_count

    name, flavor = key
    spec = titan.models[name].model_registry(flavor)
    with torch.device("meta"):
        model = spec.model.build()
    theirs = sum(p.numel() for p in model.parameters())
    ours = moe_dims(name, flavor, 64)
    assert ours is not None and ours.moe is not None
    cfg, _ = config_of(ours.moe.flavor, dict(ours.moe.overrides))
    assert parameter_count(cfg) == theirs


_GPUS = 8
#: name -> (torchtitan model, flavor, degrees, micro-batch, global batch, settings)
PLANS: dict[str, tuple[str, str, dict[str, Any], int, int, dict[str, Any]]] = {
    "dsv3-16b-ep": ("deepseek_v3", "16B", {"dp_shard": 8, "ep": 8}, 1, 16,
                    {"gradient_sync": "sharded", "recompute": "op"}),
    # EP borrows the TP ranks: ETP 1
    "qwen3-tp-ep": ("qwen3", "30B-A3B", {"tp": 2, "dp_shard": 4, "ep": 8, "etp": 1}, 2, 16,
                    {"gradient_sync": "sharded", "recompute": "full",
                     "sequence_parallel": True}),
    "gpt-oss-pp-ep": ("gpt_oss", "20b", {"pp": 2, "dp_shard": 4, "ep": 4}, 1, 16,
                      {"gradient_sync": "sharded", "recompute": "full"}),
    # no EP: the experts split over the TP ranks (ETP = TP)
    "dsv3-16b-tp": ("deepseek_v3", "16B", {"tp": 2, "dp_shard": 4}, 1, 8,
                    {"gradient_sync": "sharded", "sequence_parallel": True}),
}
_TORCHTITAN_MOE_SETTINGS = {"moe_dispatcher": "alltoall", "moe_capacity_factor": None,
                            "moe_grouped_gemm": True}


def _graph(model: ModelDims) -> Graph:
    from tests.export.test_moe_megatron import graph_of

    return graph_of(model)


def layout(name: str, **changes: Any) -> tuple[RunConfig, Any, Graph]:
    tt, flavor, degrees, micro, glob, settings = PLANS[name]
    model = moe_dims(tt, flavor, 4096)
    assert model is not None
    par = ParallelConfig(**degrees)
    run = RunConfig(model=model, num_gpus=_GPUS, parallel=par, micro_batch_size=micro,
                    global_batch=glob, source="test",
                    execution=execution_of(par, micro_batch_size=micro, global_batch=glob,
                                           stack="torchtitan", precision="bf16",
                                           grad_reduce="fp32", optimizer="adamw",
                                           moe={**_TORCHTITAN_MOE_SETTINGS, **changes},
                                           **settings))
    graph = _graph(model)
    return run, plan_of_run(run, graph.num_nodes), graph


@pytest.mark.parametrize("name", sorted(PLANS))
def test_torchtitan_030_parses_the_moe_recipe_and_flags(
        name: str, titan: types.SimpleNamespace, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run, plan, graph = layout(name)
    par = run.parallel
    module = f"shardplan_moe_{name.replace('-', '_')}"
    out = export(plan, graph, build("flat", num_devices=_GPUS, device="h100"), "torchtitan",
                 options=ExportOptions(output_name=f"{module}.py"))
    assert out.notes == ()
    (tmp_path / f"{module}.py").write_text(out.text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    config = titan.ConfigManager().parse_args(["--module", module, "--config", "shardplan_plan"])
    p = config.parallelism
    assert (p.expert_parallel_degree, p.tensor_parallel_degree, p.data_parallel_shard_degree,
            p.pipeline_parallel_degree) == (par.ep, par.tp, par.dp_shard, par.pp)
    assert (config.model_spec.name, config.model_spec.flavor) == PLANS[name][:2]
    assert config.training.global_batch_size == run.global_batch
    dims = titan.ParallelDims.from_config(p, _GPUS)
    # torchtitan's sparse mesh (pp, dp_replicate, efsdp, ep): efsdp x ep = dp_shard x cp x tp
    assert (dims.dp_shard * dims.cp * dims.tp) % dims.ep == 0
    flags = shlex.split(out.beside[".flags"])
    assert flags[:4] == ["--module", PLANS[name][0], "--config",
                         _MOE[run.model.spec.removesuffix(",seq=4096")][2]]
    on_own = titan.ConfigManager().parse_args(flags)
    assert on_own.parallelism == p and on_own.training == config.training
    back = run_of_torchtitan(torchtitan_options(out.beside[".flags"]), num_gpus=_GPUS)
    assert back.model.spec == run.model.spec
    assert back.parallel == par
    assert (back.micro_batch_size, back.global_batch) == (run.micro_batch_size,
                                                          run.global_batch)
    assert {k: back.execution[k] for k in _TORCHTITAN_MOE_SETTINGS} == \
        _TORCHTITAN_MOE_SETTINGS


@pytest.mark.parametrize("name", ["dsv3-16b-ep", "qwen3-tp-ep"])
def test_torchtitan_02_toml_of_an_moe_plan(name: str) -> None:
    run, plan, graph = layout(name)
    out = export(plan, graph, build("flat", num_devices=_GPUS), "torchtitan",
                 options=ExportOptions(torchtitan_version="0.2"))
    toml = tomllib.loads(out.text)
    assert toml["model"] == {"name": PLANS[name][0], "flavor": PLANS[name][1]}
    assert (toml["parallelism"]["expert_parallel_degree"],
            toml["parallelism"]["expert_tensor_parallel_degree"]) == (run.parallel.ep, 1)
    back = run_of_torchtitan(torchtitan_options(out.text), num_gpus=_GPUS)
    assert back.parallel == run.parallel and back.model.spec == run.model.spec


def test_torchtitan_02_expert_tp_equal_to_tp() -> None:
    """torchtitan 0.2's other expert grid: EP over FSDP and CP only, the experts split over
    the TP ranks (ETP = TP, the plan's unset etp); 0.3.0 has no such grid."""
    model = moe_model(MOE_FLAVORS["qwen3_moe:30B-A3B"], 4096)
    par = ParallelConfig(tp=2, dp_shard=4, ep=4)
    run = RunConfig(model=model, num_gpus=8, parallel=par, micro_batch_size=1, global_batch=4,
                    execution=execution_of(par, micro_batch_size=1, global_batch=4,
                                           precision="bf16", sequence_parallel=True,
                                           gradient_sync="sharded", stack="torchtitan",
                                           moe=_TORCHTITAN_MOE_SETTINGS))
    graph = _graph(model)
    plan = plan_of_run(run, graph.num_nodes)
    topo = build("flat", num_devices=8)
    out = export(plan, graph, topo, "torchtitan", options=ExportOptions(torchtitan_version="0.2"))
    assert tomllib.loads(out.text)["parallelism"]["expert_tensor_parallel_degree"] == 2
    assert run_of_torchtitan(torchtitan_options(out.text), num_gpus=8).parallel == par
    with pytest.raises(ShardplanError, match=r"^torchtitan 0.3.0 splits the experts by tensor "
                                             r"parallelism under EP never: the plan's ETP 2 "
                                             r"with EP 4 cannot be written \(torchtitan 0.2 "
                                             r"can with ETP = TP\)$"):
        export(plan, graph, topo, "torchtitan")


@pytest.mark.parametrize(("degrees", "changes", "version", "reason"), [
    ({"dp_shard": 8, "ep": 8}, {"moe_capacity_factor": 1.25}, "current",
     r"torchtitan's experts drop no token: the plan's capacity factor 1.25"),
    ({"tp": 2, "dp_shard": 4, "ep": 1, "etp": 1}, {}, "current",
     r"splits the experts over the TP ranks without expert parallelism: the plan's ETP 1 "
     r"with TP 2"),
    ({"dp": 2, "dp_shard": 4, "ep": 8}, {}, "current",
     r"builds expert parallelism inside dp_shard x cp x tp = 4: the plan's EP 8"),
    ({"tp": 4, "dp_shard": 2, "ep": 2, "etp": 1}, {}, "0.2",
     r"inside dp_shard x cp x tp = 8 and over all of cp x tp = 4: the plan's EP 2"),
])
def test_moe_plans_torchtitan_cannot_run_are_refused(degrees: dict, changes: dict,
                                                     version: str, reason: str) -> None:
    model = moe_model(MOE_FLAVORS["qwen3_moe:30B-A3B"], 4096)
    par = ParallelConfig(**degrees)
    run = RunConfig(model=model, num_gpus=8, parallel=par, micro_batch_size=1, global_batch=8,
                    execution=execution_of(par, micro_batch_size=1, global_batch=8,
                                           precision="bf16", sequence_parallel=par.tp > 1,
                                           stack="torchtitan",
                                           moe={**_TORCHTITAN_MOE_SETTINGS, **changes}))
    graph = _graph(model)
    with pytest.raises(ShardplanError, match=reason) as exc:
        export(plan_of_run(run, graph.num_nodes), graph, build("flat", num_devices=8),
               "torchtitan", options=ExportOptions(torchtitan_version=version))
    assert "\n" not in str(exc.value)


def test_megatrons_settings_are_written_as_torchtitan_runs_them() -> None:
    run, plan, graph = layout("dsv3-16b-ep", moe_dispatcher="allgather",
                              moe_grouped_gemm=False)
    out = export(plan, graph, build("flat", num_devices=_GPUS), "torchtitan")
    assert out.notes == (
        "torchtitan dispatches tokens to their experts by all-to-all: the plan's allgather "
        "is written as all-to-all",
        "torchtitan runs the experts as grouped GEMMs: the plan's per-expert GEMMs are "
        "written as grouped ones")
    assert "--training.disable_cuda_graphs" in out.beside[".flags"]


def test_torchtitan_import_of_moe_recipes_and_their_grid() -> None:
    """0.3.0's recipes set the flavor, batch and EP (deepseek_v3_671b: EP 2, Interleaved1F1B);
    a dense model's EP is torchtitan's no-op; torchtitan's EP must fit its borrowed ranks."""
    run = run_of_torchtitan(torchtitan_options(
        "--module deepseek_v3 --config deepseek_v3_671b --parallelism.pipeline_parallel_degree 4"),
        num_gpus=16)
    assert run.model.spec == "deepseek_v3:671B,seq=4096"
    assert (run.parallel.ep, run.parallel.etp, run.parallel.vp) == (2, None, 2)
    dense = run_of_torchtitan(torchtitan_options(
        "--module llama3 --config llama3_8b --parallelism.expert_parallel_degree 4"),
        num_gpus=8)
    assert dense.parallel.ep == 1
    assert "expert_parallel_degree 4 has no effect on a dense model (torchtitan ignores it)" \
        in dense.notes
    with pytest.raises(ShardplanError, match="inside dp_shard x cp x tp = 8 ranks"):
        run_of_torchtitan(torchtitan_options(
            "--module qwen3 --config qwen3_30b_a3b --parallelism.expert_parallel_degree 16 "
            "--parallelism.data_parallel_replicate_degree 2"), num_gpus=16)
    with pytest.raises(ShardplanError, match="is 1 or the tensor parallel degree 2, got 4"):
        run_of_torchtitan({"model": {"name": "qwen3", "flavor": "30B-A3B"},
                           "parallelism": {"tensor_parallel_degree": 2,
                                           "expert_parallel_degree": 2,
                                           "expert_tensor_parallel_degree": 4}}, num_gpus=8)
