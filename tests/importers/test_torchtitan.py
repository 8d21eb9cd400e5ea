"""torchtitan import: a v0.2 TOML file and the same run as current flags, batches, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardplan.errors import ShardplanError
from shardplan.importers.torchtitan import (
    parse_torchtitan_flags,
    parse_torchtitan_toml,
    run_of_torchtitan,
    torchtitan_options,
)
from shardplan.ir import ParallelConfig

DATA = Path(__file__).parent / "data"


def _run(text: str, gpus: int | None = 64):  # noqa: ANN202 - RunConfig
    return run_of_torchtitan(torchtitan_options(text), num_gpus=gpus)


def test_llama3_8b_toml_and_its_flags_give_the_same_run() -> None:
    toml = run_of_torchtitan(torchtitan_options((DATA / "llama3_8b.toml").read_text()),
                             num_gpus=64, cluster="dgx-h100,nodes=8")
    flags = run_of_torchtitan(torchtitan_options((DATA / "llama3_8b.flags").read_text()),
                              num_gpus=64, cluster="dgx-h100,nodes=8")
    assert toml == flags
    assert toml.model.spec == "llama3:8B,seq=8192"
    assert toml.parallel == ParallelConfig(dp_shard=64)
    assert toml.micro_batch_size == 1 and toml.global_batch == 64
    assert toml.execution["recompute"] == "op"  # per-op, not Megatron's selective
    assert toml.execution["gradient_sync"] == "sharded"
    assert toml.execution["precision"] == "bf16" and toml.execution["optimizer"] == "adamw"
    assert toml.notes == ()


HYBRID = """
[model]
name = "llama3"
flavor = "70B"
converters = ["float8"]
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
context_parallel_degree = 2
enable_async_tensor_parallel = true
[activation_checkpoint]
mode = "full"
"""


def test_every_degree_and_the_batch() -> None:
    run = _run(HYBRID, gpus=256)
    # torchtitan's split: 80 blocks + embedding + output = 82 layers over 8 virtual stages
    assert run.parallel == ParallelConfig(dp=2, dp_shard=2, tp=8, pp=4, cp=2, vp=2,
                                          stage_layers=(10, 11, 10, 10, 10, 10, 10, 9))
    # 8 local samples in micro-batches of 2; 128 = 8 x 4 data-parallel ranks x 4 steps
    assert run.micro_batch_size == 2 and run.microbatches == 16
    ex = run.execution
    assert ex["schedule"] == "interleaved-1f1b" and ex["virtual_stages"] == 2
    assert ex["precision"] == "fp8" and ex["recompute"] == "full"
    assert ex["tp_comm_overlap"] and ex["sequence_parallel"]
    flags = parse_torchtitan_flags(
        "--model.name llama3 --model.flavor 70B --model.converters float8 "
        "--training.local_batch_size 8 --training.global_batch_size 128 "
        "--training.seq_len 8192 --parallelism.data_parallel_replicate_degree 2 "
        "--parallelism.tensor_parallel_degree 8 --parallelism.pipeline_parallel_degree 4 "
        "--parallelism.pipeline-parallel-schedule Interleaved1F1B "
        "--parallelism.pipeline_parallel_microbatch_size=2 "
        "--parallelism.context_parallel_degree 2 --parallelism.enable_async_tensor_parallel "
        "--activation_checkpoint.mode full")
    assert run_of_torchtitan(flags, num_gpus=256) == run


def _with(text: str, extra: str) -> str:
    return text.replace('pipeline_parallel_microbatch_size = 2',
                        f'pipeline_parallel_microbatch_size = 2\n{extra}')


def test_layers_per_stage_and_schedules() -> None:
    # torchtitan: ceil((80 + 1 + 1) / 7) = 12 virtual stages, 3 on each of the 4 ranks
    par = _run(_with(HYBRID, "pipeline_parallel_layers_per_stage = 7"), gpus=256).parallel
    assert par.vp == 3 and par.stage_layers == (6,) + (7,) * 9 + (6, 5)
    # the embedding and the output not counted: 80 / 5 = 16 even stages
    even = _with(HYBRID, "pipeline_parallel_layers_per_stage = 5\n"
                         "pipeline_parallel_first_stage_less_layers = 0\n"
                         "pipeline_parallel_last_stage_less_layers = 0")
    par = _run(even, gpus=256).parallel
    assert par.vp == 4 and par.stage_layers is None
    # 82 / 5 -> 17 stages: torchtitan's check refuses them on 4 ranks, and so does the import
    with pytest.raises(ShardplanError, match="17 virtual stages, not a multiple of the 4"):
        _run(_with(HYBRID, "pipeline_parallel_layers_per_stage = 5"), gpus=256)
    parts = [["tok_embeddings"] + [f"layers.{i}" for i in range(9)]] + \
        [[f"layers.{i}" for i in range(a, a + 10)] for a in range(9, 69, 10)] + \
        [[f"layers.{i}" for i in range(69, 80)] + ["norm", "output"]]
    fqns = _with(HYBRID, f"module_fqns_per_model_part = {parts!r}".replace("'", '"'))
    assert _run(fqns, gpus=256).parallel.stage_layers == (9, 10, 10, 10, 10, 10, 10, 11)
    zbv = _run(HYBRID.replace("Interleaved1F1B", "ZBVZeroBubble"), gpus=256)
    assert zbv.execution["schedule"] == "interleaved-1f1b"
    assert any("ZBVZeroBubble" in n for n in zbv.notes)
    single = _run(HYBRID.replace("Interleaved1F1B", "GPipe"), gpus=256)
    assert single.parallel.vp == 1 and single.execution["schedule"] == "gpipe"


def test_tokens_per_step_batches_of_current_torchtitan() -> None:
    sections = parse_torchtitan_flags(
        "--module llama3 --config llama3_8b --training.seq_len 4096 "
        "--training.num_tokens_per_microbatch_per_dp_rank 8192 "
        "--training.num_tokens_per_train_step 1048576 "
        "--parallelism.data_parallel_shard_degree 8 --parallelism.no-enable-sequence-parallel")
    run = run_of_torchtitan(sections)
    assert run.model.spec == "llama3:8B,seq=4096"
    assert run.micro_batch_size == 2 and run.global_batch == 256 and run.microbatches == 16


def test_notes_for_options_that_change_the_run() -> None:
    text = (DATA / "llama3_8b.toml").read_text() + (
        "\n[compile]\nenable = true\n[experimental]\ncustom_import = 'x'\n")
    text = text.replace('selective_ac_option = "op"', 'selective_ac_option = "2"')
    run = _run(text)
    assert run.execution["recompute"] == "full"
    assert run.execution["recompute_every"] == 2  # every second block checkpointed
    assert run.notes == (
        "torchtitan option compile.enable changes the run and is not modelled",
        "torchtitan section [experimental] changes the run and is not modelled")


@pytest.mark.parametrize(("change", "gpus", "reason"), [
    (("tensor_parallel_degree = 8", "tensor_parallel_degree = 16"), 256,
     "does not divide the 8 query groups"),
    (("global_batch_size = 128", "global_batch_size = 100"), 256, "not a multiple of"),
    (("pipeline_parallel_microbatch_size = 2", "pipeline_parallel_microbatch_size = 3"), 256,
     "not a multiple of pipeline_parallel_microbatch_size 3"),
    (("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 4"), 256,
     "uses 512 GPUs"),
    (("data_parallel_shard_degree = -1", "data_parallel_shard_degree = -1"), 100,
     "not a multiple of replicate x tp x pp x cp = 128"),
    (("flavor = \"70B\"", "flavor = \"7B\""), 256, "unknown llama3 flavor"),
    (("mode = \"full\"", "mode = \"some\""), 256, "none, selective or full"),
    (("Interleaved1F1B", "Fancy"), 256, "unknown pipeline_parallel_schedule"),
])
def test_inconsistent_configs_are_refused(change: tuple[str, str], gpus: int,
                                          reason: str) -> None:
    with pytest.raises(ShardplanError, match=reason):
        _run(HYBRID.replace(*change), gpus=gpus)


@pytest.mark.parametrize(("training", "shard", "want"), [
    ("", -1, "fp32"),  # torchtitan's default reduce_dtype: float32
    ('mixed_precision_reduce = "float32"', -1, "fp32"),
    ('mixed_precision_reduce = "bfloat16"', -1, "param"),
    ('mixed_precision_param = "float32"', -1, "param"),  # no mixed precision at all
    ('mixed_precision_param = "float16"\nmixed_precision_reduce = "float16"', -1, "param"),
    ("", 1, "param"),  # no FSDP: its reduce_dtype does not apply
])
def test_gradient_reduction_precision(training: str, shard: int, want: str) -> None:
    text = (f'[model]\nname = "llama3"\nflavor = "8B"\n[training]\n{training}\n'
            f"[parallelism]\ndata_parallel_shard_degree = {shard}\n"
            f"data_parallel_replicate_degree = {64 if shard == 1 else 1}\n")
    run = _run(text)
    assert run.execution["grad_reduce"] == want
    assert run.notes == ()


def test_reading_errors() -> None:
    with pytest.raises(ShardplanError, match=r"mixed_precision_reduce is float32 or the "
                                             r"parameters' bfloat16, got 'float16'"):
        _run('[model]\nname = "llama3"\nflavor = "8B"\n[training]\n'
             'mixed_precision_reduce = "float16"\n')
    with pytest.raises(ShardplanError, match=r"parameters' float16, got 'bfloat16'"):
        _run('[model]\nname = "llama3"\nflavor = "8B"\n[training]\n'
             'mixed_precision_param = "float16"\nmixed_precision_reduce = "bfloat16"\n')
    with pytest.raises(ShardplanError, match="not TOML"):
        parse_torchtitan_toml("[model\nname = 1", source="x.toml")
    with pytest.raises(ShardplanError, match="GPUs the other degrees leave"):
        _run(HYBRID, gpus=None)
    with pytest.raises(ShardplanError, match="has no section"):
        parse_torchtitan_flags("--steps 10")
    with pytest.raises(ShardplanError, match="names no model"):
        run_of_torchtitan(parse_torchtitan_flags("--module m --config my_model"), num_gpus=8)
    with pytest.raises(ShardplanError, match="name and flavor"):
        _run("[training]\nseq_len = 10\n")


def test_405b_on_512_h100_splits_unevenly_as_torchtitan_does() -> None:
    """torchtitan's own Llama 3.1 405B run (FSDP 8 x TP 8 x PP 8 on 512 H100): 126 blocks do
    not divide over 8 or 16 stages; torchtitan counts the embedding and the output as layers
    and gives the first and last stages one block fewer."""
    text = (DATA / "llama3_405b_512gpu.flags").read_text()
    run = _run(text, gpus=512)
    assert run.model.spec == "llama3:405B,seq=8192"
    assert run.parallel == ParallelConfig(
        tp=8, pp=8, dp_shard=8, vp=2, stage_layers=(7,) + (8,) * 14 + (7,))
    assert (run.micro_batch_size, run.microbatches, run.global_batch) == (1, 32, 256)
    ex = run.execution  # what torchtitan's llama3_405b recipe sets under the flags
    assert ex["precision"] == "fp8" and ex["recompute"] == "full" and ex["tp_comm_overlap"]
    assert run.notes == ()
    one = _run(text.replace("Interleaved1F1B", "1F1B"), gpus=512)
    assert one.parallel.stage_layers == (15,) + (16,) * 6 + (15,)
    assert one.execution["schedule"] == "1f1b"
    # the same run as a 0.2-era TOML file
    toml = """
[model]
name = "llama3"
flavor = "405B"
converters = ["quantize.linear.float8"]
[training]
local_batch_size = 32
global_batch_size = 256
seq_len = 8192
[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
pipeline_parallel_degree = 8
pipeline_parallel_schedule = "Interleaved1F1B"
enable_async_tensor_parallel = true
[activation_checkpoint]
mode = "full"
"""
    assert _run(toml, gpus=512).parallel == run.parallel


def test_torchtitan_030_subcommands_and_recipes() -> None:
    sections = parse_torchtitan_flags(
        "--module llama3 --config llama3_70b --parallelism.data_parallel_shard_degree 4 "
        "activation_checkpoint:none --compile.enable --compile.enable_async_tensor_parallel")
    run = run_of_torchtitan(sections, num_gpus=32)
    assert run.parallel == ParallelConfig(tp=8, dp_shard=4)  # TP 8: the recipe's
    assert run.execution["recompute"] == "none" and run.execution["tp_comm_overlap"]
    assert run.micro_batch_size == 8
    assert parse_torchtitan_flags("activation_checkpoint:selective")[
        "activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    with pytest.raises(ShardplanError, match="unknown activation checkpointing subcommand"):
        parse_torchtitan_flags("activation_checkpoint:some")
