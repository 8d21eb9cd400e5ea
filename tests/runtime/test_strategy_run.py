"""Strategy and hybrid plans run (issue #16): a PaSE, data-parallel or expert plan executed with
DTensor, and a pipeline whose stages carry strategies, train exactly like one process.

Losses of every step (to 1e-6 relative) and final parameters (to 1e-5 relative) equal
single-process training with the same data and micro-batching, dropout included. Strategies
come from the real searches on graphs ``shardplan capture`` writes (``cutoff=1`` so that small
test batches still split), from the expert search on graphs given Megatron roles (capture
writes none: its ``expert`` is data-parallel), and from random valid configurations of every
node, which exercise layouts no search would pick. Hybrids come from
:func:`shardplan.strategy.hybrid_plan` on a contiguous pipeline.

One launch of 2 processes runs the fast subset; the full matrix (every model x strategy on 2
and 4 processes, hybrids of 2 stages x 2 devices under every schedule) is marked slow.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")

from shardplan import registry  # noqa: E402
from shardplan.capture import capture_spec  # noqa: E402
from shardplan.ir import Graph, Plan  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, contiguous_plan, train_many  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402
from shardplan.strategy import configurations, graph_spaces, hybrid_plan  # noqa: E402
from shardplan.topology import flat  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]

MODELS = {
    "mlp": "mlp",
    "transformer": "transformer,num_layers=2,d_model=32,num_heads=2,vocab_size=64",
    # GPT-2's default dropout (0.1 on embeddings, attention and residuals) stays on.
    "gpt2": "transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64",
}
BATCH, SEQ, STEPS = 8, 8, 3
LOSS_RTOL, PARAM_RTOL = 1e-6, 1e-5
WORST: dict[str, float] = {"loss": 0.0, "param": 0.0}

# Megatron-style roles per module leaf: column-parallel (split the output features) and
# row-parallel (split the reduced features) linear layers, vocabulary-parallel embeddings.
_COLUMN = {"qkv", "fc", "c_attn", "c_fc", "head", "lm_head", "fc1", "fc3"}
_ROW = {"proj", "c_proj", "fc2"}


@pytest.fixture(scope="module", autouse=True)
def _worst_differences():
    """With ``pytest -s``: the largest relative differences from one process seen."""
    yield
    print(f"\nworst relative difference from one process: losses {WORST['loss']:.2e}, "
          f"parameters (model norm) {WORST['param']:.2e}")


def graph_of(key: str, _cache: dict = {}) -> Graph:  # noqa: B006 - a per-session cache
    if key not in _cache:
        _cache[key] = capture_spec(MODELS[key], batch_size=BATCH, seq_len=SEQ)
    return _cache[key]


def megatron(graph: Graph) -> Graph:
    """The graph with ``expert`` roles (Megatron-LM's layout) on its spaces."""
    spaces = []
    for v, sp in enumerate(graph.spaces):
        if sp is None:
            spaces.append(None)
            continue
        sp = dict(sp)
        roles = {sp["dims"][0][0]: "data"}
        leaf = graph.modules[v].rsplit(".", 1)[-1]
        if sp["kind"] == "gemm" and graph.ops[v] in ("linear", "addmm"):
            if leaf in _COLUMN:
                roles["n"] = "model"
            elif leaf in _ROW:
                roles["k"] = "model"
        elif graph.ops[v] == "embedding" and leaf in ("tok_emb", "wte"):
            roles["v"] = "model"
        sp["expert"] = roles
        spaces.append(sp)
    return graph.replace(spaces=tuple(spaces))


def random_plan(graph: Graph, devices: int, seed: int, base: Plan | None = None) -> Plan:
    """``base`` (default: a one-stage plan on ``devices``) with a random valid configuration
    per node over its stage's devices."""
    if base is None:
        base = registry.run("strategy", "data-parallel", graph, flat(devices),
                            devices=devices, cutoff=1).plan
    rng = np.random.default_rng(seed)
    stage_devices = {v: len(st.devices) for st in base.stages for v in st.nodes}
    strategy = {}
    for v, sp in enumerate(graph_spaces(graph)):
        configs = configurations(sp, stage_devices[v], 1)
        strategy[str(v)] = tuple(int(f) for f in configs[rng.integers(len(configs))])
    return replace(base, strategy=strategy)


def strategy_config(key: str, algorithm: str, devices: int, **kw: object) -> TrainConfig:
    graph = graph_of(key)
    if algorithm.startswith("random"):
        plan = random_plan(graph, devices, int(algorithm[len("random"):] or 0))
    else:
        opts: dict[str, object] = {"devices": devices, "cutoff": 1}
        if algorithm == "expert":
            graph = megatron(graph)
        plan = registry.run("strategy", algorithm, graph, flat(devices), **opts).plan
    return _config(plan, graph_of(key), key, **kw)


def hybrid_config(key: str, algorithm: str, stages: int, devices: int, schedule: str,
                  **kw: object) -> TrainConfig:
    graph = graph_of(key)
    base = contiguous_plan(graph, stages, devices)
    if algorithm.startswith("random"):
        plan = random_plan(graph, devices, int(algorithm[len("random"):] or 0), base)
    else:
        plan = hybrid_plan(base, megatron(graph) if algorithm == "expert" else graph,
                           algorithm=algorithm, options={"cutoff": 1})
    return _config(plan, graph, key, schedule=schedule, **kw)


def _config(plan: Plan, graph: Graph, key: str, *, optimizer: str = "adam",
            microbatches: int = 2, microbatch_size: int = BATCH, **kw: object) -> TrainConfig:
    return config_for_plan(plan, graph, model=MODELS[key], steps=STEPS, microbatches=microbatches,
                           microbatch_size=microbatch_size, optimizer=optimizer,
                           lr=0.5 if optimizer == "sgd" else 1e-3, return_params=True, **kw)


def reference(cfg: TrainConfig) -> object:
    """One process: the unsplit model (strategy) or the plan's stage modules one after
    another (hybrid), each micro-batch whole."""
    fields = dict(kind="single", model=cfg.model, steps=cfg.steps, replicas=1,
                  microbatch_size=cfg.microbatch_size, microbatches=cfg.microbatches,
                  seq_len=cfg.seq_len, optimizer=cfg.optimizer, lr=cfg.lr, seed=cfg.seed,
                  return_params=True)
    if cfg.kind == "pipeline":
        fields.update(stages=cfg.stages, graph_nodes=cfg.graph_nodes, order=cfg.order,
                      export_batch=cfg.export_batch)
    return run_single(TrainConfig(**fields))


def check_equal(cfg: TrainConfig, got: object, ref: object) -> None:
    import torch

    label = (f"{cfg.kind} {cfg.model.split(',')[0]} mesh={cfg.mesh_shape} "
             f"stages={len(cfg.stages)} {cfg.optimizer}")
    assert len(got.losses) == len(ref.losses) == cfg.steps
    for a, b in zip(got.losses, ref.losses, strict=True):
        WORST["loss"] = max(WORST["loss"], abs(a - b) / abs(b))
        assert abs(a - b) <= LOSS_RTOL * abs(b), (label, got.losses, ref.losses)
    assert set(got.params) == set(ref.params), label
    num = den = 0.0
    for name, (want,) in ref.params.items():
        copies = got.params[name]
        for t in copies[1:]:  # tied copies in two stages stay identical
            assert torch.equal(t, copies[0]), (label, name)
        num += float((copies[0] - want).norm()) ** 2
        den += float(want.norm()) ** 2
    WORST["param"] = max(WORST["param"], num ** 0.5 / den ** 0.5)
    # Adam divides by the gradient's own size: entries whose exact gradient is zero move by
    # rounding noise, so the parameters are held to the whole model's norm.
    assert num ** 0.5 <= PARAM_RTOL * den ** 0.5, (label, num ** 0.5, den ** 0.5)


def _run(cfgs: list[TrainConfig]) -> list[object]:
    results = train_many(cfgs)
    for cfg, got in zip(cfgs, results, strict=True):
        check_equal(cfg, got, reference(cfg))
    return results


def test_two_process_subset(tmp_path) -> None:
    """The three searches on three models (expert with Megatron roles: parameter-parallel
    layers), random configurations of GPT-2 with dropout and of the transformer, SGD and
    Adam, a recomputing run; a hybrid whose one pipeline rank holds two stages split over
    its two devices (interleaved 1F1B, GPT-2's tied weights on both); resume; and the
    layouts themselves: data parallelism moves no activation, attention without dropout
    runs split, with dropout it runs whole and says so. The same launch trains paper 000's
    partitions (test_sharding_plans_run.py): the GNN by brute force, the MLP by the
    heuristic, as GPipe pipelines."""
    from test_sharding_plans_run import check as check_sharding
    from test_sharding_plans_run import sharding_configs

    from shardplan.runtime import load_checkpoint_into

    paper = sharding_configs(2)  # paper 000's partitions as GPipe pipelines
    ck = str(tmp_path / "ck")
    resume = dict(checkpoint_dir=ck, checkpoint_every=2)
    cfgs = [
        strategy_config("mlp", "data-parallel", 2),
        strategy_config("mlp", "expert", 2, optimizer="sgd"),
        strategy_config("transformer", "pase", 2),
        strategy_config("transformer", "expert", 2),
        strategy_config("gpt2", "pase", 2),
        strategy_config("gpt2", "random1", 2, optimizer="sgd"),
        strategy_config("transformer", "random2", 2, recompute=True),
        hybrid_config("gpt2", "random3", 2, 2, "interleaved-1f1b"),
        # Micro-batches the batch split does not divide: one sample, three samples.
        strategy_config("gpt2", "data-parallel", 2, microbatch_size=1),
        hybrid_config("gpt2", "data-parallel", 2, 2, "interleaved-1f1b", microbatch_size=3),
        strategy_config("transformer", "expert", 2, **resume),
    ]
    cfgs.append(replace(cfgs[-1], resume=True, steps=STEPS + 2))
    cfgs.append(replace(cfgs[-1], resume=False, checkpoint_dir=str(tmp_path / "ck2")))
    assert cfgs[1].shardings and any(s.factors[s.dims.index("n")] > 1 for s in cfgs[1].shardings
                                     if "n" in s.dims)  # a column-parallel layer
    assert cfgs[7].kind == "pipeline" and cfgs[7].world_size == 2 and len(cfgs[7].stages) == 2
    for cfg in cfgs[8:10]:  # the plan's batch split of 2 runs as 1
        assert any(s.batch_cut and s.planned[s.dims.index(s.output[0][0])] == 2
                   for s in cfg.shardings)
    results = train_many(cfgs + paper)
    check_sharding(paper, results[len(cfgs):])
    results = results[:len(cfgs)]
    for cfg, got in zip(cfgs[:-2], results[:-2], strict=True):
        check_equal(cfg, got, reference(cfg))
    resumed, straight = results[-2:]
    assert resumed.start_step == STEPS
    assert resumed.losses == straight.losses[STEPS:]
    for name, (want,) in straight.params.items():
        assert resumed.params[name][0].equal(want), name
    import torch

    from shardplan.workload import build

    model, _, _ = build(MODELS["transformer"], batch_size=2, seq_len=SEQ)
    assert load_checkpoint_into(ck, model) == STEPS + 2
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), resumed.params[name][0]), name

    dp, mp = results[0], results[1]
    assert dp.reshards == 0 and dp.replicated == []  # data parallel: no activation moves
    assert mp.reshards > 0  # Megatron: the row-parallel layer's partial sums are reduced
    assert results[2].replicated == []  # attention (no dropout) runs on batch shards
    assert results[4].replicated == ["scaled_dot_product_attention",
                                     "scaled_dot_product_attention_1"]  # dropout: whole


def _matrix(devices: int) -> list[TrainConfig]:
    cfgs = []
    for key in MODELS:
        for algorithm in ("pase", "data-parallel", "expert", "random7"):
            for optimizer in ("adam", "sgd"):
                cfgs.append(strategy_config(key, algorithm, devices, optimizer=optimizer))
        for mbs in (1, devices + 1):  # micro-batches the batch split does not divide
            cfgs.append(strategy_config(key, "data-parallel", devices, microbatch_size=mbs))
    return cfgs


@pytest.mark.slow
def test_two_process_matrix() -> None:
    _run(_matrix(2))


@pytest.mark.slow
def test_four_process_matrix() -> None:
    _run(_matrix(4) + [strategy_config("gpt2", "random11", 4, microbatches=1),
                       strategy_config("transformer", "random12", 4, recompute=True)])


@pytest.mark.slow
def test_hybrid_matrix(tmp_path) -> None:
    """Two stages x two devices (4 processes): every search, every schedule, tied weights
    across stages; four stages x two devices interleaved on two pipeline ranks; a hybrid
    stopped after a checkpoint resumes to the uninterrupted run's losses and parameters."""
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2)
    first = hybrid_config("gpt2", "random3", 2, 2, "1f1b", **ck)
    resume = [first, replace(first, resume=True, steps=STEPS + 2),
              replace(first, steps=STEPS + 2, checkpoint_dir=str(tmp_path / "ck2"))]
    cfgs = []
    for key in MODELS:
        for algorithm in ("pase", "data-parallel", "expert", "random5"):
            cfgs.append(hybrid_config(key, algorithm, 2, 2, "1f1b"))
    cfgs.append(hybrid_config("gpt2", "random6", 2, 2, "gpipe", optimizer="sgd"))
    cfgs.append(hybrid_config("gpt2", "random8", 4, 2, "interleaved-1f1b", microbatches=4))
    for key in MODELS:  # micro-batches of one sample
        cfgs.append(hybrid_config(key, "data-parallel", 2, 2, "1f1b", microbatch_size=1))
    assert {c.world_size for c in cfgs + resume} == {4}
    results = train_many(cfgs + resume)
    for cfg, got in zip(cfgs, results[:len(cfgs)], strict=True):
        check_equal(cfg, got, reference(cfg))
    resumed, straight = results[-2:]
    assert resumed.start_step == STEPS and resumed.losses == straight.losses[STEPS:]
    for name, copies in straight.params.items():
        assert all(a.equal(b) for a, b in zip(resumed.params[name], copies, strict=True))
