"""Megatron-LM argument import: every published GPU run, Llama-style models, notes, errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from shardplan.errors import ShardplanError
from shardplan.importers.megatron import megatron_args_of_row, parse_megatron, split_arguments
from shardplan.ir import ParallelConfig

RUNS = Path(__file__).resolve().parents[3] / "shared" / "gpu-runs"
ROWS = [row for f in sorted(RUNS.glob("*.csv")) for row in csv.DictReader(f.open())]

GPT = ("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
       "--max-position-embeddings 1024 --vocab-size 51200 --micro-batch-size 2 ")


def _n(row: dict, key: str, default: int = 1) -> int:
    return int(row[key]) if row[key].strip() else default


SHAPED = [row for row in ROWS if row["layers"].strip()]


def _padded(vocab: int, tp: int) -> int:
    return -(-vocab // (128 * tp)) * 128 * tp


@pytest.mark.skipif(not SHAPED, reason="no gpu-runs CSV beside the repository")
@pytest.mark.parametrize("row", SHAPED, ids=[r["id"] for r in SHAPED])
def test_every_published_row_imports(row: dict) -> None:
    run = parse_megatron(megatron_args_of_row(row), num_gpus=int(row["gpus"]))
    tp, pp, vp, dp = _n(row, "tp"), _n(row, "pp"), _n(row, "vp"), _n(row, "dp")
    cp = _n(row, "cp") if "cp" in row else 1
    zero3 = row["optimizer_sharding"].startswith("zero3")
    par = run.parallel
    assert (par.tp, par.pp, par.vp, par.cp) == (tp, pp, vp, cp)
    assert (par.dp, par.dp_shard) == ((1, dp) if zero3 else (dp, 1))
    assert par.world_size == int(row["gpus"])
    assert sum(par.layers_per_stage(int(row["layers"]))) == int(row["layers"])
    m = run.model
    llama = "llama" in row.get("model", "").lower()
    kv = _n(row, "kv_heads", int(row["heads"])) if "kv_heads" in row else int(row["heads"])
    assert (m.family, m.hidden, m.num_heads, m.num_kv_heads, m.num_layers, m.seq_len) == (
        "llama" if llama or kv != int(row["heads"]) else "gpt", int(row["hidden"]),
        int(row["heads"]), kv, int(row["layers"]), int(row["seq"]))
    assert m.vocab == _padded(int(row["vocab"]), tp)
    assert m.ffn == (int(row["ffn"]) if row.get("ffn", "").strip() else 4 * m.hidden)
    micro = _n(row, "micro_batch")
    assert run.micro_batch_size == micro and run.global_batch == int(row["global_batch"])
    ex = run.execution
    assert ex["microbatch_size"] == micro * dp
    assert ex["microbatches"] == int(row["global_batch"]) // (micro * dp)
    assert ex["precision"] == row["precision"]
    assert ex["recompute"] == (row["recompute"] or "none")
    assert ex["sequence_parallel"] == (row["sequence_parallel"] == "1")
    sync = {"zero3": "sharded", "zero1": "zero1"}.get(row["optimizer_sharding"][:5], "end")
    assert ex["gradient_sync"] == sync
    assert ex["schedule"] == ("interleaved-1f1b" if vp > 1 else "1f1b")
    assert ex["virtual_stages"] == vp
    assert run.notes == ()


def test_published_uneven_splits_as_each_stack_makes_them() -> None:
    """Megatron-DeepSpeed balances the blocks (and, by type:transformer|embedding, the two
    embeddings) over the stages; Megatron-Core counts the embedding and loss as layers."""
    row = {"layers": "70", "hidden": "14336", "heads": "64", "vocab": "250680", "seq": "2048",
           "tp": "4", "pp": "12", "dp": "8", "global_batch": "2048", "micro_batch": "2",
           "precision": "bf16", "recompute": "full", "stack": "Megatron-DeepSpeed",
           "optimizer_sharding": "zero1 (DeepSpeed BF16 optimizer)",
           "notes": "partition type:transformer|embedding"}
    run = parse_megatron(megatron_args_of_row(row), num_gpus=384)
    assert run.parallel.stage_layers == (5,) + (6,) * 10 + (5,)
    assert run.execution["gradient_sync"] == "zero1"
    run = parse_megatron(megatron_args_of_row({**row, "layers": "78", "notes": ""}),
                         num_gpus=384)
    assert run.parallel.stage_layers == (7,) * 6 + (6,) * 6
    mcore = (GPT.replace("--num-layers 24", "--num-layers 126") + "--global-batch-size 8 "
             "--pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 8 "
             "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")
    run = parse_megatron(mcore, num_gpus=8)
    assert run.parallel.stage_layers == (1,) + (2,) * 62 + (1,)
    with pytest.raises(ShardplanError, match="do not divide evenly"):
        parse_megatron(mcore.replace("--num-layers 126", "--num-layers 125"), num_gpus=8)
    with pytest.raises(ShardplanError, match="exclude each other"):
        parse_megatron(mcore + " --decoder-first-pipeline-num-layers 1", num_gpus=8)
    with pytest.raises(ShardplanError, match="--pp-partition-method"):
        parse_megatron(megatron_args_of_row(row) + " --pp-partition-method parameters",
                       num_gpus=384)


def test_data_parallel_size_from_the_cluster() -> None:
    run = parse_megatron(GPT + "--global-batch-size 64 --tensor-model-parallel-size 2 "
                         "--pipeline-model-parallel-size 2", num_gpus=16)
    assert run.parallel == ParallelConfig(tp=2, pp=2, dp=4)
    assert run.microbatches == 8 and run.execution["microbatch_size"] == 8
    # no cluster and no --data-parallel-size: one replica; the default global batch
    alone = parse_megatron(GPT)
    assert alone.parallel.world_size == 1 and alone.global_batch == 2


def test_vocabulary_padded_as_megatron_pads_it() -> None:
    base = GPT.replace("--vocab-size 51200 ", "")
    assert parse_megatron(base + "--vocab-size 50257").model.vocab == 50304
    assert parse_megatron(base + "--vocab-size 50257 --tensor-model-parallel-size 8",
                          num_gpus=8).model.vocab == 51200
    assert parse_megatron(base + "--tokenizer-type GPT2BPETokenizer").model.vocab == 50304
    assert parse_megatron(base + "--padded-vocab-size 50257").model.vocab == 50257
    assert parse_megatron(base + "--vocab-size 1000 --make-vocab-size-divisible-by 64"
                          ).model.vocab == 1024
    with pytest.raises(ShardplanError, match="--vocab-size"):
        parse_megatron(base)


LLAMA = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
         "--num-query-groups 8 --ffn-hidden-size 14336 --seq-length 8192 "
         "--max-position-embeddings 8192 --vocab-size 128256 --swiglu --normalization RMSNorm "
         "--position-embedding-type rope --untie-embeddings-and-output-weights "
         "--micro-batch-size 1 --global-batch-size 128 --bf16 ")


def test_llama_style_arguments_select_the_llama_family() -> None:
    run = parse_megatron(LLAMA + "--tensor-model-parallel-size 8 --sequence-parallel "
                         "--use-distributed-optimizer --overlap-grad-reduce "
                         "--overlap-param-gather --tp-comm-overlap", num_gpus=64)
    # 128,256 padded to a multiple of 128 x tp 8, as Megatron-LM trains it
    # the zoo's Llama with every dimension set (a spec the capture builds)
    assert run.model.spec == ("llama3:8B,dim=4096,n_layers=32,n_heads=32,n_kv_heads=8,"
                              "ffn_dim=14336,vocab_size=129024,seq=8192")
    from shardplan.workload.zoo import parameter_estimate

    # Llama 3 8B, with the vocabulary padded by 768 rows twice (embedding and untied head)
    assert parameter_estimate(run.model.spec) == \
        parameter_estimate("llama3:8B,seq=8192") + 2 * 768 * 4096
    assert run.parallel == ParallelConfig(tp=8, dp=8)
    ex = run.execution
    assert ex["gradient_sync"] == "zero1" and ex["tp_comm_overlap"] and ex["sequence_parallel"]
    assert ex["precision"] == "bf16" and ex["recompute"] == "none"
    # the distributed optimizer's overlaps are read, not noted (simulate._llm prices them)
    assert ex["overlap_grad_reduce"] and ex["overlap_param_gather"]
    assert not any("--overlap-param-gather" in n for n in run.notes)
    plain = parse_megatron(LLAMA + "--use-distributed-optimizer", num_gpus=64).execution
    assert not plain["overlap_grad_reduce"] and not plain["overlap_param_gather"]
    sel = parse_megatron(LLAMA + "--recompute-granularity selective --recompute-modules "
                         "mla_up_proj mlp", num_gpus=64).execution
    assert sel["recompute"] == "selective" and sel["recompute_modules"] == ("mla_up_proj", "mlp")
    with pytest.raises(ShardplanError, match="--recompute-modules takes"):
        parse_megatron(LLAMA + "--recompute-granularity selective --recompute-modules attn",
                       num_gpus=64)
    # swiglu's default FFN width, as Megatron computes it
    bare = LLAMA.replace("--ffn-hidden-size 14336 ", "")
    assert parse_megatron(bare, num_gpus=1).model.ffn == int(4 * 4096 * 2 / 3 / 64) * 64
    # a GPT model with RMSNorm: the GPT family, and a note
    rms = parse_megatron(GPT + "--normalization RMSNorm")
    assert rms.model.family == "gpt" and any("RMSNorm" in n for n in rms.notes)
    # a tensor-parallel degree that splits the heads but not the 8 query groups
    with pytest.raises(ShardplanError, match="query groups"):
        parse_megatron(LLAMA + "--tensor-model-parallel-size 16", num_gpus=16)


def test_virtual_and_uneven_stages() -> None:
    vp = parse_megatron(GPT + "--pipeline-model-parallel-size 4 "
                        "--num-layers-per-virtual-pipeline-stage 2 --global-batch-size 16")
    assert vp.parallel.vp == 3 and vp.execution["schedule"] == "interleaved-1f1b"
    same = parse_megatron(GPT + "--pipeline-model-parallel-size 4 "
                          "--num-virtual-stages-per-pipeline-rank 3 --global-batch-size 16")
    assert same.parallel == vp.parallel
    uneven = parse_megatron(GPT + "--pipeline-model-parallel-size 4 "
                            "--decoder-first-pipeline-num-layers 3 "
                            "--decoder-last-pipeline-num-layers 5")
    assert uneven.parallel.stage_layers == (3, 8, 8, 5)
    both = parse_megatron(GPT + "--pipeline-model-parallel-size 2 "
                          "--num-virtual-stages-per-pipeline-rank 2 "
                          "--decoder-first-pipeline-num-layers 8")
    # rank 0: 8 layers in 2 virtual stages; rank 1: 16 in 2
    assert both.parallel.stage_layers == (4, 8, 4, 8)
    with pytest.raises(ShardplanError, match="not an even split"):
        parse_megatron(GPT + "--pipeline-model-parallel-size 3 "
                       "--decoder-first-pipeline-num-layers 3")
    with pytest.raises(ShardplanError, match="do not divide evenly"):
        parse_megatron(GPT + "--pipeline-model-parallel-size 5")
    with pytest.raises(ShardplanError, match="virtual pipeline stages need"):
        parse_megatron(GPT + "--num-virtual-stages-per-pipeline-rank 2")


def test_settings() -> None:
    fsdp = parse_megatron(GPT + "--use-torch-fsdp2 --fp16", num_gpus=8)
    assert fsdp.parallel == ParallelConfig(dp_shard=8)
    assert fsdp.execution["gradient_sync"] == "sharded"
    assert fsdp.execution["precision"] == "fp16"
    z1 = parse_megatron(GPT + "--use-megatron-fsdp --data-parallel-sharding-strategy optim",
                        num_gpus=8)
    assert z1.parallel == ParallelConfig(dp=8) and z1.execution["gradient_sync"] == "zero1"
    plain = parse_megatron(GPT + "--use-megatron-fsdp", num_gpus=8)
    assert plain.parallel == ParallelConfig(dp=8) and plain.execution["gradient_sync"] == "end"
    assert any("no_shard" in n for n in plain.notes)
    ddp = parse_megatron(GPT + "--overlap-grad-reduce --optimizer sgd", num_gpus=2)
    assert ddp.execution["gradient_sync"] == "bucketed" and ddp.execution["optimizer"] == "sgd"
    fp8 = parse_megatron(GPT + "--bf16 --fp8-format hybrid")
    assert fp8.execution["precision"] == "fp8"
    sel = parse_megatron(GPT + "--recompute-activations")
    assert sel.execution["recompute"] == "selective"
    part = parse_megatron(GPT + "--recompute-granularity full --recompute-method block "
                          "--recompute-num-layers 4")
    assert part.execution["recompute"] == "full" and any("block" in n for n in part.notes)
    sp = parse_megatron(GPT + "--sequence-parallel")
    assert not sp.execution["sequence_parallel"] and any("sequence" in n for n in sp.notes)
    cp = parse_megatron(GPT + "--context-parallel-size 2", num_gpus=2)
    assert cp.parallel == ParallelConfig(cp=2)


@pytest.mark.parametrize(("extra", "want"), [
    ("", "param"), ("--fp16", "param"), ("--accumulate-allreduce-grads-in-fp32", "param"),
    ("--fp16 --accumulate-allreduce-grads-in-fp32", "fp32"), ("--bf16", "fp32"),
    ("--bf16 --fp8-format hybrid", "fp32"),
    ("--bf16 --deepspeed --zero-stage 3 --no-pipeline-parallel", "param"),
    ("--fp16 --accumulate-allreduce-grads-in-fp32 --deepspeed", "param"),
    ("--bf16 --grad-reduce-in-bf16", "param"), ("--bf16 --fp8-format hybrid --grad-reduce-in-bf16",
                                                "param"),
    ("--bf16 --accumulate-allreduce-grads-in-fp32 --grad-reduce-in-bf16", "param"),
    ("--fp16 --accumulate-allreduce-grads-in-fp32 --grad-reduce-in-bf16", "fp32"),
])
def test_gradient_reduction_precision(extra: str, want: str) -> None:
    """Megatron-LM's fp32 gradient accumulation: asked for, or implied by --bf16 unless
    --grad-reduce-in-bf16 (which wins over the request, and only speaks to bf16); not under
    fp32 training, nor when DeepSpeed runs the step."""
    run = parse_megatron(GPT + extra, num_gpus=8)
    assert run.execution["grad_reduce"] == want
    assert run.settings()[0].grad_reduce == want
    assert run.notes == () or "--deepspeed" in extra


def test_megatron_deepspeed_zero_stages() -> None:
    """Megatron-DeepSpeed's ``--deepspeed --zero-stage N``: stage 3 shards everything and
    gathers module by module (DeepSpeed), 1 and 2 shard the optimizer, 0 is plain DDP."""
    z3 = parse_megatron(GPT + "--deepspeed --zero-stage 3 --no-pipeline-parallel "
                        "--deepspeed-activation-checkpointing --checkpoint-activations --fp16",
                        num_gpus=8)
    assert z3.parallel == ParallelConfig(dp_shard=8)
    assert (z3.execution["gradient_sync"], z3.execution["shard_unit"]) == ("sharded", "module")
    assert z3.execution["recompute"] == "full" and z3.notes == ()
    assert z3.settings()[0].shard_unit == "module"
    fsdp2 = parse_megatron(GPT + "--use-torch-fsdp2", num_gpus=8)
    assert fsdp2.execution["shard_unit"] == "block"
    z1 = parse_megatron(GPT + "--deepspeed --zero-stage 1", num_gpus=8)
    assert z1.parallel == ParallelConfig(dp=8) and z1.execution["gradient_sync"] == "zero1"
    assert z1.execution["shard_unit"] == "block"
    z2 = parse_megatron(GPT + "--deepspeed --zero-stage 2", num_gpus=8)
    assert z2.execution["gradient_sync"] == "zero1"
    assert any("--zero-stage 2" in n for n in z2.notes)
    z0 = parse_megatron(GPT + "--deepspeed --deepspeed_config ds.json", num_gpus=8)
    assert z0.execution["gradient_sync"] == "end"
    assert any("--deepspeed_config is not read" in n for n in z0.notes)
    off = parse_megatron(GPT + "--zero-stage 3", num_gpus=8)
    assert off.parallel == ParallelConfig(dp=8) and off.execution["gradient_sync"] == "end"
    assert any("without --deepspeed" in n for n in off.notes)


@pytest.mark.parametrize(("extra", "reason"), [
    ("--deepspeed --zero-stage 3 --use-torch-fsdp2", "exclude each other"),
    ("--deepspeed --zero-stage 1 --use-distributed-optimizer", "exclude each other"),
    ("--deepspeed --zero-stage 4", "0, 1, 2 or 3"),
    ("--deepspeed --zero-stage 3 --pipeline-model-parallel-size 2", "ZeRO stage 0 or 1"),
    ("--no-pipeline-parallel --pipeline-model-parallel-size 2", "contradict"),
])
def test_inconsistent_deepspeed_runs_are_refused(extra: str, reason: str) -> None:
    with pytest.raises(ShardplanError, match=reason):
        parse_megatron(GPT + extra, num_gpus=8)


def test_a_deepspeed_zero3_row_reads_as_megatron_deepspeed() -> None:
    row = next(r for r in ROWS if "zero3 (deepspeed" in r["optimizer_sharding"].lower()) \
        if ROWS else \
        {"id": "z3", "hidden": "1024", "heads": "16", "layers": "24", "vocab": "51200",
         "seq": "1024", "tp": "1", "pp": "1", "dp": "8", "global_batch": "16",
         "micro_batch": "2", "precision": "fp16", "recompute": "full",
         "optimizer_sharding": "zero3 (DeepSpeed)"}
    args = megatron_args_of_row(row)
    assert "--deepspeed --zero-stage 3" in args and "fsdp" not in args
    run = parse_megatron(args, num_gpus=int(row["dp"]))
    assert run.execution["shard_unit"] == "module"
    other = dict(row, optimizer_sharding="zero3")
    assert "--use-megatron-fsdp" in megatron_args_of_row(other)


def test_unmodelled_arguments_get_a_note_and_harmless_ones_none() -> None:
    run = parse_megatron(GPT + "--lr 1e-4 --min-lr 1e-5 --save /ckpt --log-interval 10 "
                         "--cpu-offloading --recompute-modules core_attn mlp "
                         "--rampup-batch-size 16 16 1000 --moe-aux-loss-coeff 1e-2")
    assert run.notes == tuple(f"Megatron-LM argument {a} changes the run and is not modelled"
                              for a in ("--cpu-offloading", "--rampup-batch-size")) + (
        "--recompute-modules without --recompute-granularity selective does nothing",)


@pytest.mark.parametrize(("extra", "gpus", "reason"), [
    ("--tensor-model-parallel-size 3", 3, "does not divide the 16 attention heads"),
    ("--global-batch-size 10", 4, "not a multiple of micro-batch 2 x data-parallel size 4"),
    ("--tensor-model-parallel-size 4", 6, "not a multiple of tp x pp x cp = 4"),
    ("--data-parallel-size 2", 4, "disagree"),
    ("--fp16 --bf16", None, "exclude each other"),
    ("--seq-length 2048", None, "longer than --max-position-embeddings"),
    ("--context-parallel-size 3", 3, "multiple of 2 x context parallelism 3"),
    ("--recompute-granularity most", None, "full or selective"),
    ("--micro-batch-size x", None, "takes an integer"),
    ("--fp16 1", None, "takes no value"),
])
def test_inconsistent_runs_are_refused(extra: str, gpus: int | None, reason: str) -> None:
    with pytest.raises(ShardplanError, match=reason):
        parse_megatron(GPT + extra, num_gpus=gpus)


def test_splitting() -> None:
    assert split_arguments("--a 1 --b --c=2 \\\n --d -1 'x y'") == [
        ("--a", ["1"]), ("--b", []), ("--c", ["2"]), ("--d", ["-1", "x y"])]
    with pytest.raises(ShardplanError, match="got 'pretrain_gpt.py' first"):
        split_arguments("pretrain_gpt.py --num-layers 2")
    with pytest.raises(ShardplanError, match="cannot split"):
        split_arguments("--a 'unclosed")
    with pytest.raises(ShardplanError, match="needs --num-layers"):
        parse_megatron("--hidden-size 8")
