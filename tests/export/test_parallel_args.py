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
from shardplan.export._common import _num_layers
from shardplan.export._parallel import megatron_parallel, torchtitan_parallel
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
def test_megatron_bf16_gradients_reduced_in_bf16_say_so(precision: str) -> None:
    """Megatron-LM turns on fp32 gradient accumulation with --bf16: a plan that reduces half
    precision gradients writes --grad-reduce-in-bf16, which the importer reads back; FSDP
    under DeepSpeed's module unit and fp16 write nothing."""
    from shardplan.importers.megatron import parse_megatron

    args, _, notes = _megatron(_plan(ParallelConfig(dp=2), precision=precision))
    assert "--grad-reduce-in-bf16" in args and notes == ()
    assert "--accumulate-allreduce-grads-in-fp32" not in args
    text = " ".join(["--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                     "--max-position-embeddings 32 --micro-batch-size 1 --global-batch-size 2 "
                     "--vocab-size 128"]
                    + [a for a in args if a not in ("--optimizer", "adam")])
    assert parse_megatron(text, num_gpus=2).execution["grad_reduce"] == "param"
    args, _, notes = _megatron(_plan(ParallelConfig(dp=2), precision=precision,
                                     grad_reduce="fp32"))
    assert "--grad-reduce-in-bf16" not in args and notes == ()
    args, _, notes = _megatron(_plan(ParallelConfig(dp_shard=2), precision=precision,
                                     shard_unit="module"))
    assert notes == () and "--grad-reduce-in-bf16" not in args
    args, _, notes = _megatron(_plan(ParallelConfig(dp=2), precision="fp16"))
    assert notes == () and "--accumulate-allreduce-grads-in-fp32" not in args
    assert "--grad-reduce-in-bf16" not in args


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
    with pytest.raises(ShardplanError, match=r"^the plan's stages hold \[3, 2, 2, 3\] layers: "
                                             r"DeepSpeed's pipeline engine balances them"):
        _megatron(_plan(uneven, stack="megatron-deepspeed"))
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


@pytest.mark.parametrize("stack", ["megatron-core", "megatron"])
def test_megatron_layout_of_uneven_virtual_stages(stack: str) -> None:
    """A rank's virtual stages uneven, or middle ranks unequal: Megatron-Core's
    --pipeline-model-parallel-layout, which sets the virtual stages (Megatron-LM refuses it
    beside --num-virtual-stages-per-pipeline-rank); the importer reads the same split."""
    from shardplan.importers.megatron import parse_megatron

    for par, layout in ((ParallelConfig(pp=2, vp=2, stage_layers=(3, 2, 2, 3)),
                         "Et*3|(tt|)*2t*3L"),
                        (ParallelConfig(pp=4, stage_layers=(2, 3, 4, 3)), "Ett|t*3|t*4|t*3L")):
        args, _, notes = _megatron(_plan(par, microbatches=4, stack=stack))
        head = args[:args.index("--micro-batch-size")]
        assert head[:6] == ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size",
                            str(par.pp), "--pipeline-model-parallel-layout", layout]
        assert "--num-virtual-stages-per-pipeline-rank" not in args and notes == ()
        back = parse_megatron(f"--num-layers {sum(par.stage_layers or ())} --hidden-size 64 "
                              f"--num-attention-heads 4 --seq-length 32 --vocab-size 100 "
                              f"{shlex.join(args)}",
                              num_gpus=par.pp)
        assert back.parallel == par


# ------------------------------------------------------------------------------ torchtitan
def _titan(plan: Plan, graph: Graph | None = None, version: str = "current"):
    """(main text, the flags beside it or None, notes) of the torchtitan export."""
    exp = torchtitan_parallel(plan, graph or _graph(), None, plan.settings,  # type: ignore
                              None, ExportOptions(torchtitan_version=version,
                                                  output_name="tt.py"))
    return exp.text, exp.beside.get(".flags"), exp.notes


def test_torchtitan_flags_of_an_interleaved_pipeline() -> None:
    par = ParallelConfig(tp=2, pp=2, dp=2, dp_shard=2, cp=2, vp=2)
    plan = _plan(par, model="llama3:8B,seq=4096", microbatch_size=8, microbatches=4,
                 schedule="1f1b", precision="bf16", recompute="selective",
                 tp_comm_overlap=True, optimizer="adamw", grad_reduce="fp32")
    text, flags, notes = _titan(plan, _graph(16))
    assert text.startswith('"""shardplan export of plan \'llm\' on \'cluster\': ' +
                           par.label() + " (torchtitan 0.3.0).")
    assert "--module tt --config shardplan_plan" in text
    assert shlex.split(flags) == [
        "--module", "llama3", "--config", "llama3_8b",  # torchtitan's own recipe
        "--parallelism.data_parallel_replicate_degree", "2",
        "--parallelism.data_parallel_shard_degree", "2",
        "--parallelism.tensor_parallel_degree", "2",
        "--parallelism.context_parallel_degree", "2",
        "--parallelism.pipeline_parallel_degree", "2",
        "--parallelism.no-enable-sequence-parallel",
        # virtual stages run the interleaved schedule whatever the settings said
        "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
        "--parallelism.pipeline_parallel_microbatch_size", "2",
        # 16 blocks in 4 even stages: torchtitan's weights of the embedding and output 0
        "--parallelism.pipeline_parallel_layers_per_stage", "4",
        "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
        "--parallelism.pipeline_parallel_last_stage_less_layers", "0",
        "--training.local_batch_size", "8", "--training.global_batch_size", "32",
        "--training.seq_len", "4096",
        "--training.mixed_precision_param", "bfloat16",
        "--training.mixed_precision_reduce", "float32",
        "--training.disable_cuda_graphs",  # torchtitan 0.3.0 refuses CUDA graphs with PP
        "--compile.enable", "--compile.enable_async_tensor_parallel",  # async TP compiles
        "activation_checkpoint:selective"]
    # the recipe module sets the same, option by option
    for line in ("config.parallelism.pipeline_parallel_layers_per_stage = 4",
                 'config.parallelism.pipeline_parallel_schedule = "Interleaved1F1B"',
                 "config.parallelism.enable_sequence_parallel = False",
                 "config.training.disable_cuda_graphs = True",
                 "config.compile.enable_async_tensor_parallel = True",
                 "config.activation_checkpoint = SelectiveAC.Config()",
                 'model_spec = model_registry(\n        "8B",\n    )'):
        assert line in text, line
    compile(text, "tt.py", "exec")  # valid Python
    # Megatron-LM's attention-only selective has no torchtitan counterpart: said so
    assert notes == ("torchtitan has no attention-only recomputation (Megatron-LM's "
                     "selective): written as its per-op policy (selective_ac_option op)",)


@pytest.mark.parametrize("precision, grad_reduce, note", [
    ("bf16", "fp32", False), ("bf16", "param", True), ("fp32", "param", False),
    ("fp8", "param", True), ("fp8", "fp32", False)])
def test_torchtitan_reduce_dtype(precision: str, grad_reduce: str, note: bool) -> None:
    """FSDP's reduce_dtype is float32 in torchtitan (its only choice): a plan reducing in
    half precision gets a note."""
    plan = _plan(ParallelConfig(dp_shard=4), microbatch_size=4, precision=precision,
                 grad_reduce=grad_reduce)
    _, flags, notes = _titan(plan, _graph(4))
    got = shlex.split(flags)
    assert got[got.index("--training.mixed_precision_reduce") + 1] == "float32"
    assert any("reduces FSDP gradients in float32" in n for n in notes) == note
    plan = _plan(ParallelConfig(dp=4), microbatch_size=4, precision=precision,
                 grad_reduce=grad_reduce)
    assert not any("reduces FSDP" in n for n in _titan(plan, _graph(4))[2])


def test_torchtitan_refuses_fp16_and_what_its_versions_lack() -> None:
    with pytest.raises(ShardplanError, match=r"^torchtitan's mixed_precision_param is "
                                             r"bfloat16 or float32: the plan's fp16 cannot be "
                                             r"written$"):
        _titan(_plan(ParallelConfig(dp=2), precision="fp16"))
    tp = _plan(ParallelConfig(tp=2, dp=2), microbatch_size=2, sequence_parallel=False)
    with pytest.raises(ShardplanError, match=r"^torchtitan 0.2 shards the norms' activations"):
        _titan(tp, version="0.2")
    assert "--parallelism.no-enable-sequence-parallel" in _titan(tp)[1]
    every = _plan(ParallelConfig(dp_shard=2), recompute="full", recompute_every=2)
    with pytest.raises(ShardplanError, match=r"^torchtitan 0.3.0 checkpoints every block or "
                                             r"per op: .* every 2-th block"):
        _titan(every, _graph(4))


def test_torchtitan_toml_without_a_pipeline() -> None:
    par = ParallelConfig(tp=2, dp=4)
    plan = _plan(par, microbatch_size=8, microbatches=3, precision="fp8", recompute="full",
                 sequence_parallel=True, optimizer="momentum")
    text, flags, notes = _titan(plan, _graph(4, seq=128), version="0.2")
    lines = text.split("\n")
    assert flags is None
    assert lines[0] == ("# shardplan export of plan 'llm' on 'cluster': " + par.label() +
                        " (torchtitan 0.2)")
    assert tomllib.loads(text) == {
        "model": {"converters": ["quantize.linear.float8"]},  # torchtitan 0.2.2's name
        "training": {"local_batch_size": 2, "global_batch_size": 24, "seq_len": 128,
                     "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32"},
        "parallelism": {"data_parallel_replicate_degree": 4, "data_parallel_shard_degree": 1,
                        "tensor_parallel_degree": 2, "context_parallel_degree": 1,
                        "pipeline_parallel_degree": 1,
                        "enable_async_tensor_parallel": False},
        "activation_checkpoint": {"mode": "full"},
        "optimizer": {"name": "AdamW"}}
    assert "enable_async_tensor_parallel = false" in lines
    assert notes == ("torchtitan's recipes train with AdamW: the plan's momentum is written "
                     "as AdamW",)


@pytest.mark.parametrize("schedule, name", [("gpipe", "GPipe"), ("1f1b", "1F1B"),
                                            ("interleaved-1f1b", "Interleaved1F1B")])
def test_torchtitan_pipeline_schedules(schedule: str, name: str) -> None:
    plan = _plan(ParallelConfig(pp=2, vp=2 if schedule == "interleaved-1f1b" else 1),
                 microbatch_size=2, microbatches=4, schedule=schedule, optimizer="adam")
    text, _, _ = _titan(plan, version="0.2")
    got = tomllib.loads(text)
    assert got["parallelism"]["pipeline_parallel_schedule"] == name
    assert got["parallelism"]["pipeline_parallel_microbatch_size"] == 2
    assert got["training"]["local_batch_size"] == 8 and got["training"]["global_batch_size"] == 8
    assert got["optimizer"] == {"name": "Adam"} and "seq_len" not in got["training"]
    assert got["activation_checkpoint"] == {"mode": "none"}
    _, flags, _ = _titan(plan)
    assert f"--parallelism.pipeline_parallel_schedule {name}" in flags
    assert flags.startswith("--module MODULE --config FUNCTION")  # no recipe of its model


def test_torchtitan_split_as_it_counts_layers() -> None:
    """torchtitan counts the embedding and the output as a layer each: a plan's split is
    written as its layers per stage and first / last weights, or as module names."""
    even = ParallelConfig(pp=2, vp=2, stage_layers=(3, 3, 3, 3))
    par = tomllib.loads(_titan(_plan(even, microbatches=4), _graph(1), version="0.2")[0])[
        "parallelism"]
    # (12 + 0 + 0) / 3: 4 stages, two per rank
    assert (par["pipeline_parallel_layers_per_stage"],
            par["pipeline_parallel_first_stage_less_layers"],
            par["pipeline_parallel_last_stage_less_layers"]) == (3, 0, 0)
    # torchtitan's own split of 14 = 12 + 1 + 1 over 4: 4 - 1, 4, 3, 3 - 1
    own = ParallelConfig(pp=2, vp=2, stage_layers=(3, 4, 3, 2))
    par = tomllib.loads(_titan(_plan(own, microbatches=4), _graph(12), version="0.2")[0])[
        "parallelism"]
    assert (par["pipeline_parallel_layers_per_stage"],
            par["pipeline_parallel_first_stage_less_layers"],
            par["pipeline_parallel_last_stage_less_layers"]) == (4, 1, 1)
    blocks = _graph(12)
    par = tomllib.loads(_titan(_plan(ParallelConfig(pp=2, vp=3), microbatches=4), blocks,
                               version="0.2")[0])["parallelism"]
    assert par["pipeline_parallel_layers_per_stage"] == 2
    # no weights give 3, 3, 2, 4: every stage's modules, torchtitan 0.2's head "output"
    odd = _plan(ParallelConfig(pp=2, vp=2, stage_layers=(3, 3, 2, 4)), microbatches=4)
    parts = tomllib.loads(_titan(odd, version="0.2")[0])["parallelism"][
        "module_fqns_per_model_part"]
    assert parts[0] == ["tok_embeddings", "layers.0", "layers.1", "layers.2"]
    assert parts[3] == ["layers.8", "layers.9", "layers.10", "layers.11", "norm", "output"]
    flags = shlex.split(_titan(odd)[1])  # 0.3.0: its head is lm_head, one argument a part
    i = flags.index("--parallelism.module_fqns_per_model_part")
    assert flags[i + 1:i + 5] == ["tok_embeddings,layers.0,layers.1,layers.2",
                                  "layers.3,layers.4,layers.5", "layers.6,layers.7",
                                  "layers.8,layers.9,layers.10,layers.11,norm,lm_head"]
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
    assert _num_layers(_plan(ParallelConfig(pp=2, vp=2)), g) == want
    text, _, _ = _titan(_plan(ParallelConfig(pp=2, vp=2), microbatches=4), g, version="0.2")
    par = tomllib.loads(text)["parallelism"]
    if "module_fqns_per_model_part" in par:
        got = sum(p.count(f"layers.{i}") for p in par["module_fqns_per_model_part"]
                  for i in range(want))
    else:
        from shardplan.ir.parallel import torchtitan_stage_layers

        lps = par["pipeline_parallel_layers_per_stage"]
        first = par["pipeline_parallel_first_stage_less_layers"]
        last = par["pipeline_parallel_last_stage_less_layers"]
        stages = -(-(want + first + last) // lps)
        assert stages == 4
        got = sum(torchtitan_stage_layers(want, stages, first_less=first, last_less=last))
    assert got == want


# ------------------------------------------------------------------ the rest of the text
def test_the_exports_name_their_format_and_are_indented() -> None:
    plan = _plan(ParallelConfig(dp=2), optimizer="adamw")
    exp = megatron_parallel(plan, _graph(), None, plan.settings, None,  # type: ignore[arg-type]
                            ExportOptions())
    assert exp.format == "megatron"
    assert exp.text == json.dumps(json.loads(exp.text), indent=2) + "\n"
    for version in ("0.2", "current"):
        got = torchtitan_parallel(plan, _graph(), None, plan.settings, None,  # type: ignore
                                  ExportOptions(torchtitan_version=version))
        assert got.format == "torchtitan"
        assert all("set BASE" in n for n in got.notes)  # a model without a recipe
        other = _plan(ParallelConfig(dp=2), optimizer="sgd")
        got = torchtitan_parallel(other, _graph(), None, other.settings, None,  # type: ignore
                                  ExportOptions(torchtitan_version=version))
        assert any("train with AdamW: the plan's sgd is written as AdamW" in n
                   for n in got.notes)


def test_torchtitan_refuses_a_micro_batch_the_replicas_cannot_share() -> None:
    with pytest.raises(ShardplanError, match=r"^torchtitan gives every data-parallel rank "
                                             r"whole samples, and the micro-batch of 3 does "
                                             r"not split over 2 ranks$"):
        _titan(_plan(ParallelConfig(dp=2), microbatch_size=3))


def test_torchtitan_fp8_is_the_recipe_modules_converters() -> None:
    plan = _plan(ParallelConfig(dp=2), model="llama3:8B,seq=4096", precision="fp8",
                 optimizer="adamw")
    text, flags, notes = _titan(plan)
    assert "from torchtitan.components.quantization import Float8LinearConverter" in text
    assert 'filter_fqns=["lm_head"]' in text
    assert shlex.split(flags)[:6] == ["--module", "llama3", "--config", "llama3_8b",
                                      "--parallelism.data_parallel_replicate_degree", "2"]
    assert notes == ("torchtitan has no flag for the model's converters: llama3_8b trains "
                     "without Float8 and the plan in fp8; the recipe module sets them, "
                     "tt.py.flags cannot",)
    # no tensor parallelism: nothing said about sequence parallelism
    assert "sequence" not in flags
    bf16 = _plan(ParallelConfig(dp=2), model="llama3:405B,seq=8192", precision="bf16",
                 optimizer="adamw")
    text, flags, notes = _titan(bf16)
    assert "Float8" not in text and "--config llama3_405b" in flags
    assert notes == ("torchtitan has no flag for the model's converters: llama3_405b trains "
                     "in Float8 and the plan in bf16; the recipe module sets them, "
                     "tt.py.flags cannot",)


@pytest.mark.parametrize("every", [1, 2, 3])
def test_recomputing_every_kth_block(every: int) -> None:
    """torchtitan's layer-period checkpointing: written as its selective option K for
    torchtitan; Megatron-LM checkpoints every block instead, and says so when K > 1."""
    plan = _plan(ParallelConfig(dp_shard=2), recompute="full", recompute_every=every)
    text, _, notes = _titan(plan, _graph(4), version="0.2")
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


# ------------------------------------------------------------------ megatron-core's own checks
_CORE_FIELDS = {  # Megatron-LM argument -> megatron-core TransformerConfig field
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", int),
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", int),
    "--num-virtual-stages-per-pipeline-rank": ("virtual_pipeline_model_parallel_size", int),
    "--context-parallel-size": ("context_parallel_size", int),
    "--decoder-first-pipeline-num-layers": ("num_layers_in_first_pipeline_stage", int),
    "--decoder-last-pipeline-num-layers": ("num_layers_in_last_pipeline_stage", int),
    "--recompute-granularity": ("recompute_granularity", str),
    "--recompute-method": ("recompute_method", str),
    "--recompute-num-layers": ("recompute_num_layers", int),
    "--fp8-format": ("fp8", str)}
_CORE_SWITCHES = {"--sequence-parallel": "sequence_parallel",
                  "--account-for-embedding-in-pipeline-split":
                      "account_for_embedding_in_pipeline_split",
                  "--account-for-loss-in-pipeline-split": "account_for_loss_in_pipeline_split"}


@pytest.mark.parametrize("par, extra", [
    (ParallelConfig(tp=2, pp=4, vp=2, stage_layers=(1,) + (2,) * 6 + (1,)), {}),
    (ParallelConfig(pp=5, stage_layers=(5, 7, 7, 7, 5)), {"recompute": "full"}),
    (ParallelConfig(tp=2, cp=2, dp=2), {"sequence_parallel": True, "precision": "fp8"}),
    (ParallelConfig(tp=4, pp=2, vp=2), {"recompute": "selective", "sequence_parallel": True}),
])
def test_megatron_exports_of_llm_plans_pass_megatron_cores_config_checks(par, extra) -> None:
    """The arguments an LLM plan exports build a megatron-core TransformerConfig, whose
    __post_init__ runs Megatron's own consistency checks (uneven splits, virtual stages,
    recompute, sequence parallelism, fp8)."""
    core = pytest.importorskip("megatron.core.transformer.transformer_config")
    torch = pytest.importorskip("torch")
    plan = _plan(par, microbatches=2 * par.pp, **extra)
    args, _, _ = _megatron(plan)
    kw: dict = {}
    for i, a in enumerate(args):
        if a in _CORE_FIELDS:
            name, kind = _CORE_FIELDS[a]
            kw[name] = kind(args[i + 1])
        elif a in _CORE_SWITCHES:
            kw[_CORE_SWITCHES[a]] = True
    layers = sum(par.stage_layers) if par.stage_layers else 8 * par.pp * par.vp
    conf = core.TransformerConfig(
        num_layers=layers, hidden_size=64, num_attention_heads=8,
        pipeline_dtype=torch.bfloat16, bf16=True, params_dtype=torch.bfloat16, **kw)
    assert conf.tensor_model_parallel_size == par.tp
    assert conf.pipeline_model_parallel_size == par.pp
    assert (conf.virtual_pipeline_model_parallel_size or 1) == par.vp
