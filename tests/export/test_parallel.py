"""An LLM plan exported to Megatron-LM and torchtitan imports back to the same run."""

from __future__ import annotations

import csv
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.export import Export, ExportOptions, export
from shardplan.export._parallel import megatron_parallel
from shardplan.importers._run import RunConfig
from shardplan.importers.megatron import megatron_args_of_row, parse_megatron
from shardplan.importers.torchtitan import run_of_torchtitan, torchtitan_options
from shardplan.ir import Graph, Objective, ParallelConfig, Plan, Stage
from shardplan.topology import build

RUNS = Path(__file__).resolve().parents[3] / "shared" / "gpu-runs"
ROWS = [row for f in sorted(RUNS.glob("*.csv")) for row in csv.DictReader(f.open())]
DATA = Path(__file__).resolve().parents[1] / "importers" / "data"


def _titan_text(out: Export) -> str:
    """What ``import torchtitan`` reads of an export: the 0.2 TOML, or the flags beside
    torchtitan 0.3.0's recipe module."""
    return out.beside.get(".flags", out.text)


def _graph(num_layers: int) -> Graph:
    modules = ["tok_embeddings"] + [f"layers.{i}" for i in range(num_layers)] + ["output"]
    n = len(modules)
    return Graph.from_arrays(name="llm", fwd_flops=np.ones(n), src=np.arange(n - 1),
                             dst=np.arange(1, n), names=[f"n{i}" for i in range(n)],
                             ops=["linear"] * n, modules=modules)


def _plan(run: RunConfig) -> tuple[Plan, Graph]:
    """The run's LLM plan laid out by hand: blocks by ``layers_per_stage``, the embedding
    with the first virtual stage and the head with the last."""
    par = run.parallel
    graph = _graph(run.model.num_layers)
    per = par.layers_per_stage(run.model.num_layers)
    width = par.devices_per_rank
    stages, start = [], 0
    for j, n in enumerate(per):
        nodes = list(range(start + 1, start + 1 + n))
        if j == 0:
            nodes.insert(0, 0)
        if j == len(per) - 1:
            nodes.append(graph.num_nodes - 1)
        r = j % par.pp
        stages.append(Stage(tuple(nodes), tuple(range(r * width, (r + 1) * width))))
        start += n
    settings, _ = run.settings()
    meta = {"imported_from": {"tool": run.source, "model": run.model.spec,
                              "execution": dict(run.execution)}}
    return Plan("llm", "cluster", "import", tuple(stages), Objective("x", 0.0),
                execution=settings, parallel=par, meta=meta), graph


def _model_args(row_args: str) -> str:
    """The model's own arguments (a plan does not carry them)."""
    keep = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
            "--max-position-embeddings", "--vocab-size")
    tokens = row_args.split()
    return " ".join(f"{t} {tokens[i + 1]}" for i, t in enumerate(tokens) if t in keep)


def _same_run(a: RunConfig, b: RunConfig) -> None:
    assert a.parallel == b.parallel
    assert a.micro_batch_size == b.micro_batch_size and a.global_batch == b.global_batch
    assert a.execution == b.execution


SHAPED = [row for row in ROWS if row["layers"].strip() and int(row.get("ep") or 1) == 1]


@pytest.mark.skipif(not SHAPED, reason="no gpu-runs CSV beside the repository")
@pytest.mark.parametrize("row", SHAPED, ids=[r["id"] for r in SHAPED])
def test_published_rows_round_trip_through_megatron(row: dict) -> None:
    args = megatron_args_of_row(row)
    run = parse_megatron(args, num_gpus=int(row["gpus"]))
    plan, graph = _plan(run)
    out = json.loads(megatron_parallel(plan, graph, None, plan.settings,  # type: ignore[arg-type]
                                       None, ExportOptions()).text)
    assert out["world_size"] == int(row["gpus"])
    again = parse_megatron(_model_args(args) + " " + out["args_text"], num_gpus=int(row["gpus"]))
    _same_run(run, again)


MEGATRON = ("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
            "--vocab-size 51200 ")


@pytest.mark.parametrize("extra", [
    "--micro-batch-size 2 --global-batch-size 64 --tensor-model-parallel-size 2 "
    "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --bf16 "
    "--sequence-parallel --use-distributed-optimizer --tp-comm-overlap "
    "--recompute-granularity selective --context-parallel-size 2",
    "--micro-batch-size 1 --global-batch-size 16 --pipeline-model-parallel-size 4 "
    "--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 5 --fp16 "
    "--overlap-grad-reduce --optimizer sgd",
    "--micro-batch-size 4 --global-batch-size 64 --use-torch-fsdp2 --bf16 --fp8-format hybrid "
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
    "--micro-batch-size 2 --global-batch-size 64 --deepspeed --zero-stage 3 --fp16 "
    "--checkpoint-activations",
])
def test_megatron_round_trip(extra: str) -> None:
    run = parse_megatron(MEGATRON + extra, num_gpus=16)
    plan, graph = _plan(run)
    out = export(plan, graph, build("flat", num_devices=16), "megatron")
    again = parse_megatron(MEGATRON + json.loads(out.text)["args_text"], num_gpus=16)
    _same_run(run, again)


def test_megatron_refuses_what_it_cannot_say() -> None:
    run = parse_megatron(MEGATRON + "--micro-batch-size 1 --pipeline-model-parallel-size 4 "
                         "--decoder-first-pipeline-num-layers 3", num_gpus=4)
    plan, graph = _plan(run)
    odd = Plan(plan.graph, plan.topology, plan.algorithm, plan.stages, plan.objective,
               execution=plan.execution, meta=plan.meta,
               parallel=ParallelConfig(pp=4, stage_layers=(3, 9, 7, 5)))
    # middle ranks set apart from each other: only Megatron-Core's layout says so (issue 47)
    args = json.loads(export(odd, graph, build("flat", num_devices=4), "megatron").text)["args"]
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*3|t*9|t*7|t*5L"
    # DeepSpeed gathers module by module (ZeRO-3) only without pipeline parallelism
    z3 = parse_megatron(MEGATRON + "--micro-batch-size 1 --deepspeed --zero-stage 3",
                        num_gpus=4)
    plan, graph = _plan(z3)
    piped = Plan(plan.graph, plan.topology, plan.algorithm, plan.stages, plan.objective,
                 execution=plan.execution, meta=plan.meta,
                 parallel=ParallelConfig(pp=2, dp_shard=2))
    with pytest.raises(ShardplanError, match="DeepSpeed does not run"):
        export(piped, graph, build("flat", num_devices=4), "megatron")
    assert "--deepspeed --zero-stage 3" in json.loads(
        export(plan, graph, build("flat", num_devices=4), "megatron").text)["args_text"]


HYBRID = """
[model]
name = "llama3"
flavor = "70B"
[training]
local_batch_size = 8
global_batch_size = 128
seq_len = 8192
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
pipeline_parallel_degree = 4
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_microbatch_size = 2
pipeline_parallel_layers_per_stage = 7
enable_async_tensor_parallel = true
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


@pytest.mark.parametrize("version", ["0.2", "current"])
@pytest.mark.parametrize("text", [HYBRID, (DATA / "llama3_8b.toml").read_text(),
                                  HYBRID.replace("pipeline_parallel_degree = 4",
                                                 "pipeline_parallel_degree = 1")])
def test_torchtitan_round_trip(text: str, version: str) -> None:
    run = run_of_torchtitan(torchtitan_options(text), num_gpus=128)
    plan, graph = _plan(run)
    out = export(plan, graph, build("flat", num_devices=128), "torchtitan",
                 options=ExportOptions(torchtitan_version=version))
    if version == "0.2":
        assert tomllib.loads(out.text)["parallelism"]["tensor_parallel_degree"] == run.parallel.tp
    again = run_of_torchtitan(torchtitan_options(_titan_text(out)), num_gpus=128)
    _same_run(run, again)
    assert again.model == run.model


def test_recompute_policies_without_a_counterpart_are_written_with_a_note() -> None:
    """torchtitan's per-op policy has no Megatron-LM counterpart (its selective is the
    nearest) and Megatron-LM's attention-only selective none in torchtitan (op is)."""
    even = HYBRID.replace("pipeline_parallel_layers_per_stage = 7",  # 80 / 5: 16 even stages
                          "pipeline_parallel_layers_per_stage = 5\n"
                          "pipeline_parallel_first_stage_less_layers = 0\n"
                          "pipeline_parallel_last_stage_less_layers = 0")
    titan = run_of_torchtitan(torchtitan_options(
        even.replace("data_parallel_replicate_degree = 2", "data_parallel_replicate_degree = 1")
    ), num_gpus=64)
    assert titan.execution["recompute"] == "op"
    plan, graph = _plan(titan)
    out = export(plan, graph, build("flat", num_devices=64), "megatron")
    assert "--recompute-granularity selective" in json.loads(out.text)["args_text"]
    assert any("per-op" in n for n in out.notes)
    meg = parse_megatron(MEGATRON + "--micro-batch-size 1 --recompute-granularity selective",
                         num_gpus=4)
    plan, graph = _plan(meg)
    out = export(plan, graph, build("flat", num_devices=4), "torchtitan",
                 options=ExportOptions(torchtitan_version="0.2"))
    ac = tomllib.loads(out.text)["activation_checkpoint"]
    assert ac == {"mode": "selective", "selective_ac_option": "op"}
    assert any("attention-only" in n for n in out.notes)


def _random_megatron(seed: int) -> tuple[str, int]:
    """A consistent Megatron-LM run drawn at random (seeded), and its GPUs."""
    rng = np.random.default_rng(seed)
    tp, pp, cp = (int(rng.choice(c)) for c in ((1, 2, 4), (1, 2, 3), (1, 2)))
    dp = int(rng.choice((1, 2, 3)))
    vp = int(rng.choice((1, 2))) if pp > 1 else 1
    micro = int(rng.choice((1, 2)))
    layers = pp * vp * int(rng.choice((1, 2)))
    args = [f"--num-layers {layers} --hidden-size 64 --num-attention-heads 8 --seq-length 64",
            "--vocab-size 500", f"--tensor-model-parallel-size {tp}",
            f"--pipeline-model-parallel-size {pp}", f"--context-parallel-size {cp}",
            f"--micro-batch-size {micro}",
            f"--global-batch-size {micro * dp * int(rng.choice((1, 4)))}",
            str(rng.choice(["", "--fp16", "--bf16", "--bf16 --fp8-format e4m3"])),
            str(rng.choice(["", "--recompute-granularity selective",
                            "--recompute-granularity full --recompute-method uniform "
                            "--recompute-num-layers 1"])),
            str(rng.choice(["", "--use-distributed-optimizer", "--overlap-grad-reduce",
                            "--use-torch-fsdp2"]))]
    if vp > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank {vp}")
    if tp > 1 and rng.random() < 0.5:
        args.append("--sequence-parallel --tp-comm-overlap")
    return " ".join(args), tp * pp * cp * dp


@pytest.mark.parametrize("seed", range(25))
def test_random_megatron_runs_round_trip(seed: int) -> None:
    text, gpus = _random_megatron(seed)
    run = parse_megatron(text, num_gpus=gpus)
    plan, graph = _plan(run)
    out = json.loads(export(plan, graph, build("flat", num_devices=gpus), "megatron").text)
    again = parse_megatron(_model_args(text) + " " + out["args_text"], num_gpus=gpus)
    _same_run(run, again)


def _random_torchtitan(seed: int) -> tuple[str, int]:
    """A consistent torchtitan run drawn at random (seeded), as TOML, and its GPUs."""
    rng = np.random.default_rng(1000 + seed)
    rep, shard, tp, pp, cp = (int(rng.choice(c)) for c in
                              ((1, 2), (1, 2, 4), (1, 2, 8), (1, 2, 4), (1, 2)))
    local = int(rng.choice((2, 4)))
    schedule = str(rng.choice(["1F1B", "GPipe", "Interleaved1F1B"]))
    lines = ["[model]", 'name = "llama3"', 'flavor = "8B"', "[training]",
             f"local_batch_size = {local}",
             f"global_batch_size = {local * rep * shard * int(rng.choice((1, 2)))}",
             "seq_len = 4096",
             f'mixed_precision_param = "{rng.choice(["bfloat16", "float32"])}"',
             "[parallelism]", f"data_parallel_replicate_degree = {rep}",
             f"data_parallel_shard_degree = {shard}", f"tensor_parallel_degree = {tp}",
             f"pipeline_parallel_degree = {pp}", f'pipeline_parallel_schedule = "{schedule}"',
             f"pipeline_parallel_microbatch_size = {int(rng.choice((1, 2)))}",
             f"context_parallel_degree = {cp}",
             f"enable_async_tensor_parallel = {str(bool(rng.random() < 0.5)).lower()}",
             "[activation_checkpoint]", f'mode = "{rng.choice(["none", "full", "selective"])}"',
             'selective_ac_option = "op"']
    return "\n".join(lines) + "\n", rep * shard * tp * pp * cp


@pytest.mark.parametrize("version", ["0.2", "current"])
@pytest.mark.parametrize("seed", range(12))
def test_random_torchtitan_runs_round_trip(seed: int, version: str) -> None:
    text, gpus = _random_torchtitan(seed)
    run = run_of_torchtitan(torchtitan_options(text), num_gpus=gpus)
    plan, graph = _plan(run)
    out = export(plan, graph, build("flat", num_devices=gpus), "torchtitan",
                 options=ExportOptions(torchtitan_version=version))
    again = run_of_torchtitan(torchtitan_options(_titan_text(out)), num_gpus=gpus)
    _same_run(run, again)
    assert again.model == run.model
