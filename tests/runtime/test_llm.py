"""The LLM plan kind runs (issue 36 item 3): the tiny Llama (``llama3:debug``) under TP 2,
TP 2 x PP 2, FSDP 2 x TP 2 and DP 2 x PP 2 x VP 2 trains like one process, and its memory by
category is torch's own accounting (MemTracker).

Losses of every step (to 1e-6 relative) and final parameters (to 1e-5 of the model's norm,
as the strategy runs are held) equal single-process training of the unsplit model with the
same data and micro-batching; the tensor- and data-parallel copies of every parameter agree.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.generate import chain  # noqa: E402
from shardplan.ir import ExecutionSettings, Objective, ParallelConfig, Plan, Stage  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, llm_memory, train_many  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402

pytestmark = [pytest.mark.torch]

MODEL = "llama3:debug,seq=16"  # dim 64, 2 blocks, 4 query and 2 key/value heads, vocab 256
MODEL5 = "llama3:debug,seq=16,n_layers=5"
STEPS = 3
LOSS_RTOL, PARAM_RTOL = 1e-6, 1e-5


def llm_config(parallel: ParallelConfig, **kw: object) -> TrainConfig:
    fields: dict[str, object] = dict(model=MODEL, steps=STEPS, kind="llm", parallel=parallel,
                                     microbatches=4, microbatch_size=4, optimizer="adam",
                                     lr=1e-3, return_params=True)
    fields.update(kw)
    return TrainConfig(**fields)  # type: ignore[arg-type]


def llm_plan(parallel: ParallelConfig, *, reverse: bool = False, **settings: object
             ) -> tuple[Plan, object]:
    """A plan of the LLM kind as the planner lays it out (until ``layout_plan`` exists): the
    ``pp * vp`` virtual stages in pipeline order, stage ``j`` on pipeline rank ``j % pp``'s
    devices, its nodes a contiguous piece of a stand-in chain graph (the runtime splits the
    model by module names, not by the graph). ``reverse``: pipeline rank ``p`` on the
    devices the layout's rank order gives pipeline rank ``pp - 1 - p``."""
    graph = chain(2 * parallel.num_stages, batch_size=4).replace(meta={"model": MODEL})
    n, s, per = graph.num_nodes, parallel.num_stages, parallel.devices_per_rank
    ranks = [parallel.pp - 1 - j % parallel.pp if reverse else j % parallel.pp
             for j in range(s)]
    stages = tuple(Stage(tuple(range(j * n // s, (j + 1) * n // s)),
                         tuple(range(ranks[j] * per, (ranks[j] + 1) * per)))
                   for j in range(s))
    plan = Plan(graph=graph.name, topology="", algorithm="layout", stages=stages,
                objective=Objective("none", 0.0), parallel=parallel,
                execution=ExecutionSettings(**settings))  # type: ignore[arg-type]
    return plan, graph


def captured(_cache: dict = {}) -> object:  # noqa: B006 - a per-session cache
    """The tiny Llama's operator graph as ``shardplan capture`` writes it."""
    from shardplan.capture import capture_spec

    if not _cache:
        _cache["g"] = capture_spec(MODEL, batch_size=4, seq_len=16)
    return _cache["g"]


def reference(cfg: TrainConfig) -> object:
    """One process, the unsplit model, each micro-batch whole."""
    return run_single(TrainConfig(kind="single", model=cfg.model, steps=cfg.steps,
                                  microbatches=cfg.microbatches,
                                  microbatch_size=cfg.microbatch_size, optimizer=cfg.optimizer,
                                  lr=cfg.lr, seed=cfg.seed, return_params=True))


def check_equal(cfg: TrainConfig, got: object, ref: object) -> None:
    import torch

    label = cfg.parallel.label()
    assert len(got.losses) == len(ref.losses) == cfg.steps
    for a, b in zip(got.losses, ref.losses, strict=True):
        assert abs(a - b) <= LOSS_RTOL * abs(b), (label, got.losses, ref.losses)
    assert set(got.params) == set(ref.params), label
    holders = cfg.world_size // cfg.parallel.pp  # each parameter lives on one pipeline rank
    assert {len(c) for c in got.params.values()} == {holders}, label
    num = den = 0.0
    for name, (want,) in ref.params.items():
        copies = got.params[name]
        for t in copies[1:]:  # tensor- and data-parallel copies stay alike
            torch.testing.assert_close(t, copies[0], rtol=0, atol=1e-6, msg=f"{label} {name}")
        num += float((copies[0] - want).norm()) ** 2
        den += float(want.norm()) ** 2
    assert num ** 0.5 <= PARAM_RTOL * den ** 0.5, (label, num ** 0.5, den ** 0.5)


def test_config_refuses_what_is_not_run() -> None:
    with pytest.raises(ShardplanError, match="context parallelism"):
        llm_config(ParallelConfig(cp=2))
    with pytest.raises(ShardplanError, match="not divisible by the 4"):
        llm_config(ParallelConfig(dp=2, dp_shard=2), microbatch_size=2)
    with pytest.raises(ShardplanError, match="parallel layout"):
        TrainConfig(model=MODEL, steps=1, kind="llm")
    assert llm_config(ParallelConfig(tp=2, pp=2)).world_size == 4


def test_config_for_plan() -> None:
    """A plan with a ``parallel`` layout runs as an ``llm`` run with the plan's settings;
    its virtual stages decide the schedule; stages that are not the layout's are refused."""
    plan, graph = llm_plan(ParallelConfig(tp=2, pp=2), microbatches=4, microbatch_size=4,
                           schedule="gpipe", recompute=True)
    cfg = config_for_plan(plan, graph, steps=1)
    assert (cfg.kind, cfg.world_size, cfg.schedule, cfg.microbatches, cfg.microbatch_size,
            cfg.recompute, cfg.model) == ("llm", 4, "gpipe", 4, 4, True, MODEL)
    assert cfg.parallel == plan.parallel and cfg.layout_devices == (0, 1, 2, 3)
    for rc, on in (("none", False), ("selective", False), ("full", True)):  # full only
        plan, graph = llm_plan(ParallelConfig(tp=2, pp=2), recompute=rc)
        assert config_for_plan(plan, graph, steps=1).recompute is on
    plan, graph = llm_plan(ParallelConfig(tp=2, pp=2), reverse=True)
    assert config_for_plan(plan, graph, steps=1).layout_devices == (2, 3, 0, 1)
    plan, graph = llm_plan(ParallelConfig(pp=2, vp=2), schedule="1f1b", microbatches=4)
    assert config_for_plan(plan, graph, steps=1).schedule == "interleaved-1f1b"
    wrong = Plan(graph=plan.graph, topology="", algorithm="layout",
                 stages=(Stage(tuple(range(graph.num_nodes)), (0, 1)),),
                 objective=plan.objective, parallel=ParallelConfig(tp=2, pp=2))
    with pytest.raises(ShardplanError, match="pp x vp = 2 stages of 2 devices"):
        config_for_plan(wrong, graph, steps=1)
    # the model's dimensions as capture records them, checked before any process starts
    plan, graph = llm_plan(ParallelConfig(tp=4, pp=2))
    dims = {"family": "llama", "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 256}
    with pytest.raises(ShardplanError, match="does not divide key/value heads"):
        config_for_plan(plan, graph.replace(meta={**graph.meta, "transformer": dims}), steps=1)
    plan, graph = llm_plan(ParallelConfig(pp=2, stage_layers=(2, 1)))
    with pytest.raises(ShardplanError, match="add up to 3, the model has 2"):
        config_for_plan(plan, graph.replace(meta={**graph.meta, "transformer": dims}), steps=1)
    assert config_for_plan(plan, graph, steps=1).kind == "llm"  # dimensions not recorded


def _model_bytes() -> dict[str, int]:
    """Bytes of the tiny Llama's parameters: all, those TP splits, its buffers, its largest
    tensor; and the parameter count."""
    from shardplan.workload.zoo import build_model

    model, _, _ = build_model(MODEL, batch_size=1)
    split = ("wq", "wk", "wv", "wo", "w1", "w2", "w3", "tok_embeddings", "output")
    params = dict(model.named_parameters())
    return {"all": sum(4 * p.numel() for p in params.values()),
            "split": sum(4 * p.numel() for n, p in params.items()
                         if any(f"{s}." in n for s in split)),
            "buffers": sum(4 * b.numel() for b in model.buffers()),
            "tensors": len(params), "largest": max(4 * p.numel() for p in params.values())}


def check_memory(memory: list[dict[str, int]], tp: int) -> None:
    """Peak bytes by category of every rank of a ``tp``-way run with Adam: parameters and
    optimizer state exactly the model's share, categories adding up to the total, and the
    tensor-parallel ranks alike: every category exactly but the activations, within 1%.
    gloo frees a collective's buffers when its worker thread finishes the work,
    asynchronously to the step; a buffer as large as a logits shard, freed late on one rank,
    made the ranks' peaks differ by up to a fifth while the head all-gathered the logits
    (now the loss runs on them split, ``loss_parallel``). Small statistics tensors of the
    loss may still be freed late (seen: 248 bytes)."""
    size = _model_bytes()
    mine = size["all"] - size["split"] + size["split"] // tp
    assert len(memory) == tp
    exact = ("parameters", "buffers", "gradients", "optimizer", "other")
    acts = [m["activations"] for m in memory]
    assert max(acts) - min(acts) <= 0.01 * min(acts)
    for m in memory:
        assert {k: m[k] for k in exact} == {k: memory[0][k] for k in exact}
        assert m["parameters"] == mine
        assert m["buffers"] == size["buffers"]
        # Adam: two moments per parameter and one 4-byte step count per tensor
        assert m["optimizer"] == 2 * mine + 4 * size["tensors"]
        # at most one gradient in flight beside those accumulated (MemTracker labels the
        # incoming gradient of a split embedding as well as the accumulated one)
        assert 0 < m["gradients"] <= mine + size["largest"]
        assert m["activations"] > 0
        assert sum(v for k, v in m.items() if k != "total") == m["total"]


@pytest.mark.multiprocess
def test_tensor_parallel_two_processes() -> None:
    """TP 2 alone, TP 2 with full recompute and SGD, TP 2 with sequence parallelism, and
    TP 2's memory by category without and with sequence parallelism: one launch of 2
    processes."""
    cfgs = [llm_config(ParallelConfig(tp=2)),
            llm_config(ParallelConfig(tp=2), recompute=True, optimizer="sgd", lr=0.5),
            llm_config(ParallelConfig(tp=2), sequence_parallel=True),
            llm_config(ParallelConfig(tp=2), steps=2, measure_memory=True),
            llm_config(ParallelConfig(tp=2), steps=2, measure_memory=True,
                       sequence_parallel=True)]
    results = train_many(cfgs)
    for cfg, got in zip(cfgs[:3], results[:3], strict=True):
        check_equal(cfg, got, reference(cfg))
    plain, sp = results[3].memory, results[4].memory
    check_memory(plain, 2)
    check_memory(sp, 2)
    # sequence parallelism keeps the norms' activations and the residual stream split
    assert max(r["activations"] for r in sp) < min(r["activations"] for r in plain)


@pytest.mark.multiprocess
def test_memory_one_process() -> None:
    """MemTracker's peak of one step of the unsplit tiny Llama (a launch of one process)."""
    check_memory(llm_memory(llm_config(ParallelConfig())), 1)


@pytest.mark.multiprocess
def test_four_processes() -> None:
    """TP 2 x PP 2 (1F1B, the plan ``layout_plan`` makes of the captured graph),
    FSDP 2 x TP 2 without and with sequence parallelism, TP 2 x PP 2 x VP 2 with sequence
    parallelism and an uneven first stage (5 blocks as 2, 1, 1, 1), DP 2 x PP 2 with 2
    interleaved stages per rank and an uneven last stage (5 blocks), HSDP (DP 2 x FSDP 2)
    recomputing, DP 2 x TP 2 (DTensor gradients all-reduced) and FSDP 2 x PP 2 (GPipe,
    recomputing): one launch of 4 processes."""
    from shardplan.strategy.llm import layout_plan
    from shardplan.topology import flat

    graph = captured()
    plan = layout_plan(graph, flat(4), ParallelConfig(tp=2, pp=2),
                       ExecutionSettings(microbatches=4, microbatch_size=4, schedule="1f1b"))
    cfgs = [config_for_plan(plan, graph, steps=STEPS, return_params=True),
            llm_config(ParallelConfig(tp=2, dp_shard=2)),
            llm_config(ParallelConfig(tp=2, dp_shard=2), sequence_parallel=True),
            llm_config(ParallelConfig(tp=2, pp=2, vp=2), model=MODEL5, sequence_parallel=True),
            llm_config(ParallelConfig(pp=2, dp=2, vp=2, stage_layers=(1, 1, 1, 2)),
                       model=MODEL5, schedule="interleaved-1f1b"),
            llm_config(ParallelConfig(dp=2, dp_shard=2), recompute=True),
            llm_config(ParallelConfig(dp=2, tp=2), optimizer="sgd", lr=0.5),
            llm_config(ParallelConfig(pp=2, dp_shard=2), schedule="gpipe", recompute=True)]
    for cfg, got in zip(cfgs, train_many(cfgs), strict=True):
        check_equal(cfg, got, reference(cfg))


def test_train_command_reads_llm_plans(tmp_path) -> None:
    """``shardplan train``'s arguments: an LLM plan runs as ``llm`` (``--measure-memory``
    asks for its memory), its ``single`` and ``fsdp`` baselines run the unsplit model on one
    process and on the layout's processes; measuring a baseline is refused."""
    import argparse

    from shardplan.ir import save
    from shardplan.runtime._args import add_arguments, config_from_args
    from shardplan.topology import flat

    plan, graph = llm_plan(ParallelConfig(tp=2), microbatches=2, microbatch_size=4)
    files = [str(tmp_path / f) for f in ("p.json", "g.json", "t.json")]
    for obj, path in zip((plan, graph, flat(2)), files, strict=True):
        save(obj, path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def prepare(*extra: str) -> object:
        return config_from_args(parser.parse_args([*files, "--steps", "2", *extra]))

    run = prepare("--measure-memory")
    assert (run.config.kind, run.config.world_size, run.config.measure_memory) == \
        ("llm", 2, True)
    assert run.summary()["parallel"]["tp"] == 2
    single, fsdp = prepare("--baseline", "single").config, prepare("--baseline", "fsdp").config
    assert (single.kind, single.world_size, single.microbatches) == ("single", 1, 2)
    assert (fsdp.kind, fsdp.world_size) == ("fsdp", 2)
    with pytest.raises(ShardplanError, match="not a baseline"):
        prepare("--measure-memory", "--baseline", "single")


@pytest.mark.multiprocess
def test_fsdp_in_half_precision() -> None:
    """FSDP 2 in bf16 as torch's MixedPrecisionPolicy runs it (torchtitan's mixed precision),
    the gradients reduce-scattered in fp32 and in bf16, in fp16, beside the same run in fp32
    (one launch of 2 processes): the losses within bf16's rounding of one process's fp32 run;
    the optimizer steps the fp32 shards (Adam's moments are the fp32 run's); the gradients
    hold at least their fp32 shards whatever the reduction's precision (what the cost model
    holds for FSDP2), and that precision changes the weights; the gathered half-precision
    blocks hold less than the fp32 ones."""
    import torch

    plain = llm_config(ParallelConfig(dp_shard=2), steps=2, measure_memory=True)
    cfgs = [plain,
            llm_config(ParallelConfig(dp_shard=2), steps=2, measure_memory=True,
                       precision="bf16", grad_reduce="fp32"),
            llm_config(ParallelConfig(dp_shard=2), steps=2, measure_memory=True,
                       precision="bf16"),
            llm_config(ParallelConfig(dp_shard=2), steps=2, precision="fp16")]
    fp32, fp32_grads, half_grads, fp16 = train_many(cfgs)
    ref = reference(plain)
    for got in (fp32_grads, half_grads, fp16):
        assert got.losses == pytest.approx(ref.losses, rel=2e-2)
        assert got.losses != pytest.approx(ref.losses, rel=1e-6)  # really in half precision
    assert fp16.losses != half_grads.losses  # fp16 rounds otherwise than bf16
    size = _model_bytes()
    for got in (fp32, fp32_grads, half_grads):
        for m in got.memory:
            assert m["optimizer"] == fp32.memory[0]["optimizer"]
            assert m["optimizer"] == size["all"] + 4 * size["tensors"]  # 2 x 4 bytes / 2
    # FSDP2's gradient shards are fp32 (4 bytes per parameter over the 2 ranks) whatever the
    # reduction's precision; the peaks add the unsharded gradients and cast buffers in flight
    for got in (fp32_grads, half_grads):
        assert min(m["gradients"] for m in got.memory) >= size["all"] // 2
    # the reduction's precision shows in the updated weights
    assert any(not torch.equal(a[0], b[0]) for a, b in
               zip(fp32_grads.params.values(), half_grads.params.values(), strict=True))
    for m in fp32_grads.memory:
        assert size["all"] // 2 < m["parameters"] < fp32.memory[0]["parameters"]


def test_half_precision_plans_say_how_they_run(tmp_path) -> None:
    """``shardplan train`` of a bf16 LLM plan: under FSDP in bf16 with the plan's gradient
    reduction, fp8 as bf16 with a note, without FSDP in fp32 with a note."""
    import argparse

    from shardplan.ir import save
    from shardplan.runtime._args import add_arguments, config_from_args
    from shardplan.topology import flat

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def prepare(parallel: ParallelConfig, **settings: object) -> object:
        plan, graph = llm_plan(parallel, microbatches=2, microbatch_size=4, **settings)
        files = [str(tmp_path / f) for f in ("p.json", "g.json", "t.json")]
        for obj, path in zip((plan, graph, flat(parallel.world_size)), files, strict=True):
            save(obj, path)
        return config_from_args(parser.parse_args([*files, "--steps", "2"]))

    run = prepare(ParallelConfig(dp_shard=2), precision="bf16", grad_reduce="fp32")
    assert (run.config.precision, run.config.grad_reduce) == ("bf16", "fp32")
    assert not any("precision" in n or "fp32" in n for n in run.notes)
    run = prepare(ParallelConfig(dp_shard=2), precision="fp16")
    assert (run.config.precision, run.config.grad_reduce) == ("fp16", "param")
    run = prepare(ParallelConfig(dp_shard=2), precision="fp8")
    assert run.config.precision == "bf16"
    assert "the plan trains in fp8, whose matrix products need fp8 tensor cores: this run " \
           "is bf16" in run.notes
    run = prepare(ParallelConfig(tp=2), precision="bf16")
    assert run.config.precision == "fp32"
    assert "the plan trains in bf16; the runtime runs half precision only for LLM plans " \
           "under FSDP (dp_shard > 1, torch's MixedPrecisionPolicy): this run is fp32" \
        in run.notes
    assert prepare(ParallelConfig(tp=2)).config.precision == "fp32"
    with pytest.raises(ShardplanError, match="fp32, bf16 or fp16, not 'fp8'"):
        TrainConfig(model=MODEL, steps=1, precision="fp8")
    with pytest.raises(ShardplanError, match="'param' or 'fp32', not 'bf16'"):
        TrainConfig(model=MODEL, steps=1, grad_reduce="bf16")
