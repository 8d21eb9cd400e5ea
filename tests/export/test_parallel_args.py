"""The exact arguments an LLM plan's export hands the other tool (issue 38): the Megatron-LM
command line a user pastes, the torchtitan flags and TOML it reads. The round trips of
``test_parallel.py`` check that the tools' importers read the same run back; these check the
text itself, flag by flag, where an importer would forgive a difference (a redundant
``--num-virtual-stages-per-pipeline-rank 1``, a first pipeline rank set apart with the same
layers as the others)."""

from __future__ import annotations

import json
import shlex
import tomllib

import numpy as np
import pytest

from shardplan.errors import ShardplanError
from shardplan.export import ExportOptions
from shardplan.export._parallel import _num_layers, megatron_parallel, torchtitan_parallel
from shardplan.ir import ExecutionSettings, Graph, Objective, ParallelConfig, Plan, Stage


def _graph(num_layers: int = 8, *, seq: int | None = None) -> Graph:
    modules = ["tok_embeddings"] + [f"layers.{i}.attention" for i in range(num_layers)] + [
        "output"]
    n = len(modules)
    meta = {} if seq is None else {"input_shapes": [[4, seq]], "input_dtypes": ["torch.int64"]}
    return Graph.from_arrays(name="llm", fwd_flops=np.ones(n), src=np.arange(n - 1),
                             dst=np.arange(1, n), names=[f"n{i}" for i in range(n)],
                             ops=["linear"] * n, modules=modules, meta=meta)


def _plan(par: ParallelConfig, execution: dict | None = None, model: str | None = None,
          **settings: object) -> Plan:
    meta: dict = {}
    if execution is not None or model is not None:
        meta["imported_from"] = {"tool": "test", **({"model": model} if model else {}),
                                 "execution": execution or {}}
    # Megatron-Core with Transformer Engine, what Megatron-LM runs by default (stack
    # "megatron", its own modules, adds --transformer-impl local: tested on its own)
    s = ExecutionSettings(**{"microbatch_size": par.data_parallel, "microbatches": 4,
                             "stack": "megatron-core", **settings})
    return Plan("llm", "cluster", "hand", (Stage((0,), (0,)),), Objective("x", 0.0),
                execution=s, parallel=par, meta=meta)


def _megatron(plan: Plan) -> tuple[list[str], dict, tuple[str, ...]]:
    exp = megatron_parallel(plan, _graph(), None, plan.settings, None,  # type: ignore[arg-type]
                            ExportOptions())
    out = json.loads(exp.text)
    assert out["args_text"] == shlex.join(out["args"])
    return out["args"], out, exp.notes


def _tail(args: list[str]) -> list[str]:
    """The arguments after the batch sizes."""
    return args[args.index("--global-batch-size") + 2:]


# ---------------------------------------------------------------------------- Megatron-LM
def test_megatron_arguments_of_a_full_layout() -> None:
    par = ParallelConfig(tp=2, pp=2, dp=2, cp=2, vp=2)
    plan = _plan(par, microbatch_size=4, microbatches=3, precision="bf16",
                 sequence_parallel=True, recompute="selective", gradient_sync="zero1",
                 tp_comm_overlap=True, optimizer="adamw", grad_reduce="fp32")
    args, out, notes = _megatron(plan)
    assert args == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                    "--num-virtual-stages-per-pipeline-rank", "2",
                    "--context-parallel-size", "2",
                    "--micro-batch-size", "2", "--global-batch-size", "12",
                    "--bf16", "--sequence-parallel", "--recompute-granularity", "selective",
                    "--use-distributed-optimizer", "--tp-comm-overlap", "--optimizer", "adam"]
    assert notes == ()
    assert {k: out[k] for k in ("format", "to", "graph", "world_size",
                                "tensor_model_parallel_size", "pipeline_model_parallel_size",
                                "context_parallel_size", "data_parallel_size",
                                "virtual_stages_per_rank", "micro_batch_size",
                                "global_batch_size")} == {
        "format": "shardplan.export/1", "to": "megatron", "graph": "llm", "world_size": 16,
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
        "context_parallel_size": 2, "data_parallel_size": 2, "virtual_stages_per_rank": 2,
        "micro_batch_size": 2, "global_batch_size": 12}
    assert out["parallel"] == par.to_dict()


def test_megatron_arguments_of_plain_data_parallelism() -> None:
    """Nothing beyond the degrees, the batch and the optimizer: no virtual stages, no context
    parallelism, fp32, no recompute, the end-of-step all-reduce."""
    args, out, _ = _megatron(_plan(ParallelConfig(dp=4), microbatch_size=8, microbatches=2))
    assert args == ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
                    "--micro-batch-size", "2", "--global-batch-size", "16",
                    "--optimizer", "adam"]
    assert out["world_size"] == 4 and out["global_batch_size"] == 16


@pytest.mark.parametrize("settings, tail", [
    ({"precision": "fp16"}, ["--fp16"]),
    ({"precision": "fp16", "grad_reduce": "fp32"},
     ["--fp16", "--accumulate-allreduce-grads-in-fp32"]),
    ({"precision": "fp8", "grad_reduce": "fp32"}, ["--bf16", "--fp8-format", "hybrid"]),
    ({"recompute": "full"}, ["--recompute-granularity", "full", "--recompute-method",
                             "uniform", "--recompute-num-layers", "1"]),
    ({"gradient_sync": "bucketed"}, ["--overlap-grad-reduce"]),
    ({"gradient_sync": "sharded"}, ["--use-torch-fsdp2"]),
    ({"sequence_parallel": True}, []),  # without tensor parallelism: nothing to say
    ({"optimizer": "sgd"}, []),
])
def test_megatron_settings_arguments(settings: dict, tail: list[str]) -> None:
    args, _, notes = _megatron(_plan(ParallelConfig(dp=2), **settings))
    want = ["--optimizer", "sgd" if settings.get("optimizer") == "sgd" else "adam"]
    assert _tail(args) == tail + want
    assert notes == ()


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_megatron_bf16_gradients_are_reduced_in_fp32(precision: str) -> None:
    """Megatron-LM turns on fp32 gradient accumulation with --bf16: a plan that reduces half
    precision gradients is written as it runs there, and says so; DeepSpeed keeps its own."""
    args, _, notes = _megatron(_plan(ParallelConfig(dp=2), precision=precision))
    assert "--accumulate-allreduce-grads-in-fp32" not in args
    assert notes == ("Megatron-LM accumulates and reduces bf16 gradients in fp32: the plan's "
                     "half-precision gradient reduction is written as fp32",)
    _, _, notes = _megatron(_plan(ParallelConfig(dp_shard=2), precision=precision,
                                  shard_unit="module"))
    assert notes == ()
    args, _, notes = _megatron(_plan(ParallelConfig(dp=2), precision="fp16"))
    assert notes == () and "--accumulate-allreduce-grads-in-fp32" not in args


def test_megatron_fully_sharded_data_parallelism() -> None:
    args, out, _ = _megatron(_plan(ParallelConfig(dp_shard=4), microbatch_size=4))
    assert _tail(args) == ["--use-torch-fsdp2", "--optimizer", "adam"]
    assert out["data_parallel_size"] == 4 and out["micro_batch_size"] == 1
    with pytest.raises(ShardplanError, match=r"^the plan shards over 2 and replicates over 2 "
                                             r"ranks \(HSDP\), which shardplan does not write "
                                             r"as Megatron-LM arguments$"):
        _megatron(_plan(ParallelConfig(dp=2, dp_shard=2)))


def test_megatron_takes_what_the_importer_recorded() -> None:
    """Settings the plan's execution does not set come from the imported run's record."""
    rec = {"gradient_sync": "zero1"}
    args, _, _ = _megatron(_plan(ParallelConfig(dp=2), execution=rec))
    assert _tail(args) == ["--use-distributed-optimizer", "--optimizer", "adam"]
    # the plan's own sync wins over the record when it is not the default
    args, _, _ = _megatron(_plan(ParallelConfig(dp=2), execution=rec,
                                 gradient_sync="bucketed"))
    assert _tail(args) == ["--overlap-grad-reduce", "--optimizer", "adam"]


def test_megatron_writes_other_optimizers_as_sgd_and_says_so() -> None:
    args, _, notes = _megatron(_plan(ParallelConfig(dp=2), optimizer="momentum"))
    assert _tail(args) == ["--optimizer", "sgd"]
    assert notes == ("Megatron-LM's optimizers are adam and sgd: momentum written as sgd",)


@pytest.mark.parametrize("pp, vp, layers, extra", [
    (4, 2, (3, 2, 2, 4, 3, 2, 2, 4), ["--decoder-first-pipeline-num-layers", "6",
                                      "--decoder-last-pipeline-num-layers", "8"]),
    (3, 1, (5, 4, 4), ["--decoder-first-pipeline-num-layers", "5"]),
    (3, 1, (4, 4, 6), ["--decoder-last-pipeline-num-layers", "6"]),
    (2, 1, (3, 5), ["--decoder-first-pipeline-num-layers", "3",
                    "--decoder-last-pipeline-num-layers", "5"]),
    (2, 2, (4, 4, 4, 4), []),       # even: nothing set apart
    (2, 1, (4, 4), []),
])
def test_megatron_first_and_last_pipeline_ranks(pp: int, vp: int, layers: tuple,
                                                extra: list[str]) -> None:
    par = ParallelConfig(pp=pp, vp=vp, stage_layers=layers)
    args, _, _ = _megatron(_plan(par, microbatches=2 * pp))
    head = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", str(pp)]
    if vp > 1:
        head += ["--num-virtual-stages-per-pipeline-rank", str(vp)]
    assert args[:args.index("--micro-batch-size")] == head + extra


def test_megatron_stacks_as_arguments() -> None:
    """Megatron's own modules are --transformer-impl local; Megatron-DeepSpeed's ZeRO-1 and
    the split it balances with the embeddings are its own arguments."""
    args, _, _ = _megatron(_plan(ParallelConfig(dp=4), stack="megatron"))
    assert args[args.index("--transformer-impl") + 1] == "local"
    par = ParallelConfig(pp=3, dp=2, stage_layers=(2, 3, 2))
    args, _, _ = _megatron(_plan(par, stack="megatron-deepspeed", gradient_sync="zero1",
                                 microbatches=6))
    assert "--transformer-impl" not in args
    assert args[args.index("--deepspeed") + 1:args.index("--deepspeed") + 3] == \
        ["--zero-stage", "1"]
    assert args[args.index("--pp-partition-method") + 1] == "type:transformer|embedding"
    with pytest.raises(ShardplanError, match="DeepSpeed's pipeline engine balances"):
        _megatron(_plan(ParallelConfig(pp=2, stage_layers=(2, 5)),
                        stack="megatron-deepspeed"))
    args, _, _ = _megatron(_plan(ParallelConfig(pp=2, vp=2, stage_layers=(1, 2, 2, 1)),
                                 microbatches=4))
    assert "--account-for-embedding-in-pipeline-split" in args
    assert "--account-for-loss-in-pipeline-split" in args


def test_megatron_refusals_are_one_line() -> None:
    uneven = ParallelConfig(pp=2, vp=2, stage_layers=(3, 2, 2, 3))
    with pytest.raises(ShardplanError, match=r"^the plan's virtual stages hold \[3, 2, 2, 3\] "
                                             r"layers: a pipeline rank's virtual stages are "
                                             r"not even, which no argument expresses$"):
        _megatron(_plan(uneven))
    with pytest.raises(ShardplanError, match=r"^megatron gives every data-parallel rank whole "
                                             r"samples, and the micro-batch of 3 does not "
                                             r"split over 2 ranks$"):
        _megatron(_plan(ParallelConfig(dp=2), microbatch_size=3))
    with pytest.raises(ShardplanError, match=r"^megatron runs 1F1B \(interleaved with virtual "
                                             r"stages\), not gpipe$"):
        _megatron(_plan(ParallelConfig(pp=2), schedule="gpipe"))
    # one pipeline rank: the schedule is no pipeline's
    args, _, _ = _megatron(_plan(ParallelConfig(dp=2), schedule="gpipe"))
    assert "--pipeline-model-parallel-size" in args


# ------------------------------------------------------------------------------ torchtitan
def _titan(plan: Plan, graph: Graph | None = None, version: str = "current"):
    exp = torchtitan_parallel(plan, graph or _graph(), None, plan.settings,  # type: ignore
                              None, ExportOptions(torchtitan_version=version))
    return exp.text, exp.notes


def test_torchtitan_flags_of_an_interleaved_pipeline() -> None:
    par = ParallelConfig(tp=2, pp=2, dp=2, dp_shard=2, cp=2, vp=2)
    plan = _plan(par, model="llama3:8B,seq=4096", microbatch_size=8, microbatches=4,
                 schedule="1f1b", precision="bf16", recompute="selective",
                 tp_comm_overlap=True, optimizer="adamw")
    text, notes = _titan(plan, _graph(16))
    title, flags = text.split("\n")[:2]
    assert title == ("# shardplan export of plan 'llm' on 'cluster': " + par.label())
    assert shlex.split(flags) == [
        "--model.name", "llama3", "--model.flavor", "8B",
        "--training.local_batch_size", "8", "--training.global_batch_size", "32",
        "--training.mixed_precision_param", "bfloat16",
        "--training.mixed_precision_reduce", "bfloat16",  # FSDP's reduce_dtype: the plan's
        "--training.seq_len", "4096",
        "--parallelism.data_parallel_replicate_degree", "2",
        "--parallelism.data_parallel_shard_degree", "2",
        "--parallelism.tensor_parallel_degree", "2",
        "--parallelism.context_parallel_degree", "2",
        "--parallelism.pipeline_parallel_degree", "2",
        # virtual stages run the interleaved schedule whatever the settings said
        "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
        "--parallelism.pipeline_parallel_microbatch_size", "2",
        "--parallelism.pipeline_parallel_layers_per_stage", "4",   # 16 blocks, 4 stages
        "--parallelism.enable_async_tensor_parallel",
        "--parallelism.no-enable_sequence_parallel",
        "--activation_checkpoint.mode", "selective",
        "--activation_checkpoint.selective_ac_option", "op",
        "--optimizer.name", "AdamW"]
    assert text.endswith("\n") and text.count("\n") == 2
    # Megatron-LM's attention-only selective has no torchtitan counterpart: said so
    assert notes == ("torchtitan has no attention-only recomputation (Megatron-LM's "
                     "selective): written as its per-op policy (selective_ac_option op)",)


@pytest.mark.parametrize("precision, grad_reduce, want", [
    ("bf16", "fp32", "float32"), ("fp16", "param", "float16"), ("fp32", "param", "float32"),
    ("fp8", "param", "bfloat16"), ("fp8", "fp32", "float32")])
def test_torchtitan_reduce_dtype(precision: str, grad_reduce: str, want: str) -> None:
    """FSDP's reduce_dtype is written for a sharded plan, and only for one."""
    plan = _plan(ParallelConfig(dp_shard=4), microbatch_size=4, precision=precision,
                 grad_reduce=grad_reduce)
    flags = shlex.split(_titan(plan, _graph(4))[0].split("\n")[1])
    assert flags[flags.index("--training.mixed_precision_reduce") + 1] == want
    plan = _plan(ParallelConfig(dp=4), microbatch_size=4, precision=precision,
                 grad_reduce=grad_reduce)
    assert "--training.mixed_precision_reduce" not in _titan(plan, _graph(4))[0]


def test_torchtitan_toml_without_a_pipeline() -> None:
    par = ParallelConfig(tp=2, dp=4)
    plan = _plan(par, microbatch_size=8, microbatches=3, precision="fp8", recompute="full",
                 sequence_parallel=True, optimizer="momentum")
    text, notes = _titan(plan, _graph(4, seq=128), version="0.2")
    lines = text.split("\n")
    assert lines[0] == "# shardplan export of plan 'llm' on 'cluster': " + par.label()
    assert tomllib.loads(text) == {
        "model": {"converters": ["float8"]},
        "training": {"local_batch_size": 2, "global_batch_size": 24,
                     "mixed_precision_param": "bfloat16", "seq_len": 128},
        "parallelism": {"data_parallel_replicate_degree": 4, "data_parallel_shard_degree": 1,
                        "tensor_parallel_degree": 2, "context_parallel_degree": 1,
                        "pipeline_parallel_degree": 1,
                        "enable_async_tensor_parallel": False},
        "activation_checkpoint": {"mode": "full"},
        "optimizer": {"name": "AdamW"}}
    assert "enable_async_tensor_parallel = false" in lines
    assert notes == ("torchtitan's optimizers are AdamW and Adam: momentum written as AdamW",)
    # the same as flags: booleans as --x / --no-x, lists as one flag and its items
    flags = shlex.split(_titan(plan, _graph(4, seq=128))[0].split("\n")[1])
    assert flags[:2] == ["--model.converters", "float8"]
    assert "--parallelism.no-enable_async_tensor_parallel" in flags
    assert "--parallelism.enable_sequence_parallel" not in flags
    assert "--parallelism.no-enable_sequence_parallel" not in flags


@pytest.mark.parametrize("schedule, name", [("gpipe", "GPipe"), ("1f1b", "1F1B"),
                                            ("interleaved-1f1b", "Interleaved1F1B")])
def test_torchtitan_pipeline_schedules(schedule: str, name: str) -> None:
    plan = _plan(ParallelConfig(pp=2), microbatch_size=2, microbatches=4, schedule=schedule,
                 optimizer="adam")
    text, _ = _titan(plan, version="0.2")
    got = tomllib.loads(text)
    assert got["parallelism"]["pipeline_parallel_schedule"] == name
    assert got["parallelism"]["pipeline_parallel_microbatch_size"] == 2
    assert "pipeline_parallel_layers_per_stage" not in got["parallelism"]
    assert got["training"]["local_batch_size"] == 8 and got["training"]["global_batch_size"] == 8
    assert got["optimizer"] == {"name": "Adam"} and "seq_len" not in got["training"]
    assert got["activation_checkpoint"] == {"mode": "none"}


def test_torchtitan_layers_per_stage_from_the_plan_or_the_graph() -> None:
    even = ParallelConfig(pp=2, vp=2, stage_layers=(3, 3, 3, 3))
    text, _ = _titan(_plan(even, microbatches=4), _graph(1), version="0.2")
    assert tomllib.loads(text)["parallelism"]["pipeline_parallel_layers_per_stage"] == 3
    blocks = _graph(12)
    text, _ = _titan(_plan(ParallelConfig(pp=2, vp=3), microbatches=4), blocks, version="0.2")
    assert tomllib.loads(text)["parallelism"]["pipeline_parallel_layers_per_stage"] == 2
    with pytest.raises(ShardplanError, match=r"^the plan's virtual stages hold \[3, 3, 2, 4\] "
                                             r"layers: uneven stages go to torchtitan as module "
                                             r"names, which this export of the degrees does "
                                             r"not write$"):
        _titan(_plan(ParallelConfig(pp=2, vp=2, stage_layers=(3, 3, 2, 4)), microbatches=4))
    flat = Graph.from_arrays(name="g", fwd_flops=np.ones(3), src=np.arange(2),
                             dst=np.arange(1, 3), names=["a", "b", "c"], ops=["linear"] * 3,
                             modules=["emb", "mlp.fc", ""])
    with pytest.raises(ShardplanError, match=r"^torchtitan counts pipeline stages in layers, "
                                             r"and the graph has no numbered block list"):
        _titan(_plan(ParallelConfig(pp=2, vp=2), microbatches=4), flat)


@pytest.mark.parametrize("modules, want", [
    (["model.layers.0.attn", "model.layers.5.mlp", "lm_head"], 6),
    (["transformer.h.2", "transformer.h.10.attn"], 11),
    (["blocks.3", "blocks.7.ff"], 8),
    (["layers.1.x", "mylayers.9.x", "layers.4"], 5),   # "mylayers" is not a block list
])
def test_torchtitan_counts_the_numbered_blocks(modules: list[str], want: int) -> None:
    n = len(modules)
    g = Graph.from_arrays(name="g", fwd_flops=np.ones(n), src=np.arange(n - 1),
                          dst=np.arange(1, n), names=[f"n{i}" for i in range(n)],
                          ops=["linear"] * n, modules=modules)
    # 2 x 2 virtual stages: the layers per stage are the blocks counted, divided by 4
    text, _ = _titan(_plan(ParallelConfig(pp=2, vp=2), microbatches=4), g, version="0.2")
    assert _num_layers(_plan(ParallelConfig(pp=2, vp=2)), g) == want
    assert tomllib.loads(text)["parallelism"]["pipeline_parallel_layers_per_stage"] == want // 4


# ------------------------------------------------------------------ the rest of the text
def test_the_exports_name_their_format_and_are_indented() -> None:
    plan = _plan(ParallelConfig(dp=2))
    exp = megatron_parallel(plan, _graph(), None, plan.settings, None,  # type: ignore[arg-type]
                            ExportOptions())
    assert exp.format == "megatron"
    assert exp.text == json.dumps(json.loads(exp.text), indent=2) + "\n"
    for version in ("0.2", "current"):
        got = torchtitan_parallel(plan, _graph(), None, plan.settings, None,  # type: ignore
                                  ExportOptions(torchtitan_version=version))
        assert got.format == "torchtitan" and got.notes == ()
        other = _plan(ParallelConfig(dp=2), optimizer="sgd")
        got = torchtitan_parallel(other, _graph(), None, other.settings, None,  # type: ignore
                                  ExportOptions(torchtitan_version=version))
        assert got.notes == ("torchtitan's optimizers are AdamW and Adam: sgd written as "
                             "AdamW",)


def test_torchtitan_refuses_a_micro_batch_the_replicas_cannot_share() -> None:
    with pytest.raises(ShardplanError, match=r"^torchtitan gives every data-parallel rank "
                                             r"whole samples, and the micro-batch of 3 does "
                                             r"not split over 2 ranks$"):
        _titan(_plan(ParallelConfig(dp=2), microbatch_size=3))
    with pytest.raises(ShardplanError, match=r"virtual stages hold \[3, 3, 3, 5\] layers"):
        _titan(_plan(ParallelConfig(pp=2, vp=2, stage_layers=(3, 3, 3, 5)), microbatches=4))


def test_torchtitan_flags_of_fp8_keep_the_model_section_whole() -> None:
    plan = _plan(ParallelConfig(dp=2), model="llama3:8B,seq=4096", precision="fp8",
                 optimizer="adam")
    text, notes = _titan(plan)
    flags = shlex.split(text.split("\n")[1])
    assert flags[:6] == ["--model.name", "llama3", "--model.flavor", "8B",
                         "--model.converters", "float8"]
    assert flags[6:8] == ["--training.local_batch_size", "1"]
    assert flags[-2:] == ["--optimizer.name", "Adam"] and notes == ()
    # no tensor parallelism: nothing said about sequence parallelism
    assert not any("sequence_parallel" in f for f in flags)


@pytest.mark.parametrize("every", [1, 2, 3])
def test_recomputing_every_kth_block(every: int) -> None:
    """torchtitan's layer-period checkpointing: written as its selective option K for
    torchtitan; Megatron-LM checkpoints every block instead, and says so when K > 1."""
    plan = _plan(ParallelConfig(dp_shard=2), recompute="full", recompute_every=every)
    text, notes = _titan(plan, _graph(4), version="0.2")
    ac = tomllib.loads(text)["activation_checkpoint"]
    assert ac == ({"mode": "full"} if every == 1 else
                  {"mode": "selective", "selective_ac_option": str(every)})
    assert notes == ()
    args, _, notes = _megatron(plan)
    assert args[args.index("--recompute-granularity"):][:6] == [
        "--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1"]
    assert notes == (() if every == 1 else (
        f"Megatron-LM checkpoints the first layers of each stage, not every {every}-th "
        f"block: written as every block",))
    # only full recomputation has a period
    _, _, notes = _megatron(_plan(ParallelConfig(dp=2), recompute="selective",
                                  recompute_every=2))
    assert notes == ()


def test_per_op_recompute_and_deepspeed_pipelines_in_megatron_arguments() -> None:
    _, _, notes = _megatron(_plan(ParallelConfig(dp=2), recompute="op"))
    assert notes == ("Megatron-LM has no per-op checkpointing policy (torchtitan's op): "
                     "written as its selective recomputation",)
    with pytest.raises(ShardplanError, match=r"^the plan gathers module by module \(DeepSpeed "
                                             r"ZeRO-3\) under pipeline parallelism, which "
                                             r"DeepSpeed does not run$"):
        _megatron(_plan(ParallelConfig(pp=2, dp_shard=2), shard_unit="module"))
