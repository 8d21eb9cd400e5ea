"""Resume an LLM run after losing a process, and after gaining one, under a new layout
(issue 48 item 3): torch's distributed checkpoint (DCP) writes every layout's state as
global tensors by name and reads it back resharded into any other layout.

For TP 2 x PP 2, FSDP 4 and HSDP 2 x 2 on 4 gloo processes: one rank is killed (SIGKILL,
at the start of a step or in the middle of a save), the launcher fails in one line, the
newest complete checkpoint is the one before the kill; 3 processes resume it under another
layout (PP 3, FSDP 3 with 2 micro-batches, DP 3), then 4 processes resume theirs under a
third one (PP 2 x DP 2 x VP 2, FSDP 2 x TP 2, HSDP 2 x 2 with 3 micro-batches). Every
resumed step's loss equals one process's uninterrupted training of the unsplit model (to
1e-6 relative: the layouts only reorder float sums), and exactly that of the same layout
resumed from an untouched copy of the checkpoint; the final parameters equal one
process's; the samples continue where the checkpoint stopped, each trained once.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("torch")

from helpers import run_cli  # noqa: E402

from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir import ParallelConfig  # noqa: E402
from shardplan.runtime import TrainConfig, load_checkpoint_into, train_many  # noqa: E402
from shardplan.runtime._checkpoint_state import check_resume, latest, step_name  # noqa: E402
from shardplan.runtime._llm_checkpoint import _ranges, part_samples  # noqa: E402
from shardplan.runtime._worker import run_single  # noqa: E402
from shardplan.workload.zoo import build_model  # noqa: E402

pytestmark = [pytest.mark.torch]

MODEL = "llama3:debug,seq=16,n_layers=6"  # dim 64, 6 blocks, 4 heads, 2 key/value heads
BATCH = 12  # the global batch of every layout: each splits it its own way
EVERY, KILLED_STEPS, LOST_STEPS, GAINED_STEPS = 2, 8, 6, 8
LOSS_RTOL, PARAM_RTOL = 1e-6, 1e-5

#: name: (4-process layout, its micro-batches, the rank killed and the step, killed in the
#: save?), (3-process layout, micro-batches, schedule), (4-process layout, micro-batches,
#: schedule)
LAYOUTS = {
    "tp-pp-dp": ((ParallelConfig(tp=2, pp=2), 2, (3, 3), False),
                 (ParallelConfig(pp=3), 3, "1f1b"),
                 (ParallelConfig(pp=2, dp=2, vp=2), 2, "interleaved-1f1b")),
    "fsdp": ((ParallelConfig(dp_shard=4), 1, (3, 4), True),
             (ParallelConfig(dp_shard=3), 2, "gpipe"),
             (ParallelConfig(dp_shard=2, tp=2), 1, "gpipe")),
    "hsdp": ((ParallelConfig(dp=2, dp_shard=2), 1, (1, 5), False),
             (ParallelConfig(dp=3), 1, "gpipe"),
             (ParallelConfig(dp=2, dp_shard=2), 3, "gpipe")),
}


def llm_config(parallel: ParallelConfig, microbatches: int, **kw: object) -> TrainConfig:
    fields: dict[str, object] = dict(model=MODEL, kind="llm", parallel=parallel,
                                     microbatches=microbatches,
                                     microbatch_size=BATCH // microbatches, optimizer="adam",
                                     lr=1e-3, checkpoint_every=EVERY)
    fields.update(kw)
    return TrainConfig(**fields)  # type: ignore[arg-type]


def copy_latest(directory: str, to: str) -> str:
    """A folder holding a copy of ``directory``'s newest complete checkpoint alone."""
    step, path = latest(directory)  # type: ignore[misc]
    os.makedirs(to)
    shutil.copytree(path, os.path.join(to, step_name(step)))
    with open(os.path.join(to, "latest"), "w", encoding="utf-8") as fh:
        fh.write(step_name(step) + "\n")
    return to


def check_losses(got: object, ref: object, start: int, label: str) -> None:
    assert got.start_step == start, label
    want = ref.losses[start:start + len(got.losses)]
    assert len(got.losses) == len(want) > 0, label
    for a, b in zip(got.losses, want, strict=True):
        assert abs(a - b) <= LOSS_RTOL * abs(b), (label, got.losses, want)


def check_samples(got: object, start: int, stop: int, label: str) -> None:
    """Step ``t`` trained samples ``t x BATCH`` to ``(t + 1) x BATCH``, each once."""
    assert got.samples == [[[t * BATCH, (t + 1) * BATCH]] for t in range(start, stop)], label


def check_params(got: object, ref: object, label: str) -> None:
    """Every copy of every parameter alike, and the parameters ``ref``'s (1e-5 of their
    norm); ``got``: a run's result, or its ``params`` themselves."""
    import torch

    params = got if isinstance(got, dict) else got.params
    num = den = 0.0
    for name, (want,) in ref.params.items():
        copies = params[name]
        for t in copies[1:]:  # tensor- and data-parallel copies stay alike
            torch.testing.assert_close(t, copies[0], rtol=0, atol=1e-6, msg=f"{label} {name}")
        num += float((copies[0] - want).norm()) ** 2
        den += float(want.norm()) ** 2
    assert num ** 0.5 <= PARAM_RTOL * den ** 0.5, (label, num ** 0.5, den ** 0.5)


@pytest.mark.multiprocess
def test_lose_a_process_then_gain_one_under_new_layouts(tmp_path) -> None:
    """The module docstring's runs: three launches of 4 processes that lose one, one of 3
    resuming the three layouts (and the same layouts from copies of the checkpoints), one
    of 4 resuming again."""
    ref = run_single(TrainConfig(kind="single", model=MODEL, steps=GAINED_STEPS,
                                 microbatches=1, microbatch_size=BATCH, optimizer="adam",
                                 lr=1e-3, return_params=True))
    dirs = {name: str(tmp_path / name) for name in LAYOUTS}
    kept: dict[str, int] = {}
    for name, ((pc, m, fault, in_save), _, _) in LAYOUTS.items():
        doomed = llm_config(pc, m, steps=KILLED_STEPS, checkpoint_dir=dirs[name],
                            fault=fault, fault_in_save=in_save)
        with pytest.raises(ShardplanError) as err:
            train_many([doomed])
        assert str(err.value) == (f"training failed: rank {fault[0]} was killed by signal 9; "
                                  f"the other ranks were stopped"), name
        step, path = latest(dirs[name])  # type: ignore[misc]
        assert step == (fault[1] - 1) // EVERY * EVERY, name  # the one before the kill
        with open(os.path.join(path, "state.json"), encoding="utf-8") as fh:
            state = json.load(fh)
        assert (state["next_sample"], state["global_batch"]) == (step * BATCH, BATCH)
        unfinished = os.path.join(dirs[name], f".tmp-{step_name(fault[1])}")
        assert os.path.isdir(unfinished) == in_save, name  # written, never published
        kept[name] = step
    copies = {name: copy_latest(d, str(tmp_path / f"{name}-copy")) for name, d in dirs.items()}

    lost = [llm_config(pc, m, schedule=s, steps=LOST_STEPS, checkpoint_dir=dirs[name],
                       resume=True) for name, (_, (pc, m, s), _) in LAYOUTS.items()]
    clean = [llm_config(pc, m, schedule=s, steps=LOST_STEPS, checkpoint_dir=copies[name],
                        resume=True) for name, (_, (pc, m, s), _) in LAYOUTS.items()]
    three = train_many(lost + clean)
    for name, got, again in zip(LAYOUTS, three[:3], three[3:], strict=True):
        label = f"{name} on 3"
        check_losses(got, ref, kept[name], label)
        assert got.losses == again.losses, label  # as if never interrupted
        check_samples(got, kept[name], LOST_STEPS, label)

    gained = [llm_config(pc, m, schedule=s, steps=GAINED_STEPS, checkpoint_dir=dirs[name],
                         resume=True, return_params=True)
              for name, (_, _, (pc, m, s)) in LAYOUTS.items()]
    for name, got in zip(LAYOUTS, train_many(gained), strict=True):
        label = f"{name} on 4 again"
        check_losses(got, ref, LOST_STEPS, label)
        check_samples(got, LOST_STEPS, GAINED_STEPS, label)
        check_params(got, ref, label)
        # the checkpoint itself holds the global tensors: it loads into the unsplit model
        model, _, _ = build_model(MODEL, batch_size=1)
        assert load_checkpoint_into(dirs[name], model) == GAINED_STEPS
        check_params({n: [p.detach()] for n, p in model.named_parameters()}, ref, label)


def test_samples_of_a_part_and_their_ranges() -> None:
    """Part ``p`` of micro-batch ``j`` is what :func:`chunks` cuts: with 2 micro-batches of
    6 samples in 3 parts, part 1 of step 2 trains samples 26, 27 and 32, 33."""
    assert part_samples(2, 12, 2, 3, 1) == [[[26, 28]], [[32, 34]]]
    assert [part_samples(2, 12, 1, 3, p)[0] for p in range(3)] == \
        [[[24, 28]], [[28, 32]], [[32, 36]]]
    assert part_samples(0, 5, 1, 2, 1) == [[[3, 5]]]  # uneven parts, as chunks cuts them
    assert _ranges([3, 4, 5, 9, 10, 4]) == [[3, 6], [9, 11], [4, 5]]
    assert _ranges([]) == []


def _state_file(directory: str, **fields: object) -> None:
    path = os.path.join(directory, step_name(2))
    os.makedirs(path)
    state = {"format": "shardplan.checkpoint/1", "step": 2, "kind": "llm",
             "optimizer": "adam", "param_groups": [{"lr": 1e-3}], "global_batch": BATCH,
             "seed": 0, "next_sample": 2 * BATCH, **fields}
    with open(os.path.join(path, "state.json"), "w", encoding="utf-8") as fh:
        json.dump({k: v for k, v in state.items() if v is not None}, fh)
    with open(os.path.join(directory, "latest"), "w", encoding="utf-8") as fh:
        fh.write(step_name(2) + "\n")


@pytest.mark.parametrize("fields,message", [
    ({}, None),
    ({"global_batch": 8, "next_sample": 16}, "with a global batch of 8, this run uses 12"),
    ({"seed": 3}, "with seed 3, this run uses 0"),
    ({"optimizer": "sgd"}, "with optimizer 'sgd', this run uses 'adam'"),
    ({"global_batch": None}, "does not record its global batch"),
    ({"next_sample": 7}, "next sample 7 is not step 2 x global batch 12"),
])
def test_a_resume_must_continue_the_checkpoints_data(tmp_path, fields, message) -> None:
    _state_file(str(tmp_path), **fields)
    cfg = llm_config(ParallelConfig(dp_shard=2), 1, steps=4, checkpoint_dir=str(tmp_path),
                     resume=True)
    if message is None:
        assert check_resume(cfg)[0] == 2
        return
    with pytest.raises(ShardplanError, match=message):
        check_resume(cfg)


def _llm_files(tmp_path, parallel: ParallelConfig) -> list[str]:
    from test_llm import llm_plan

    from shardplan.ir import save
    from shardplan.topology import flat

    plan, graph = llm_plan(parallel, microbatches=1, microbatch_size=BATCH)
    graph = graph.replace(meta={"model": MODEL})
    files = [str(tmp_path / f) for f in ("p.json", "g.json", "t.json")]
    for obj, path in zip((plan, graph, flat(parallel.world_size)), files, strict=True):
        save(obj, path)
    return files


@pytest.mark.parametrize("make,message", [
    (lambda d: None, "does not exist"),
    (lambda d: (os.makedirs(d), _state_file(d, global_batch=8, next_sample=16)),
     "with a global batch of 8, this run uses 12"),
])
def test_train_resume_refuses_in_one_line_before_spawning(tmp_path, capsys, monkeypatch,
                                                          make, message) -> None:
    """``shardplan train PLAN GRAPH TOPO --checkpoint-dir D --resume`` of an LLM plan: a
    missing folder and a checkpoint of another global batch are one line, exit 2, and no
    process is started."""
    import shardplan.runtime._launch as launch

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch, "run_ranks", refuse)
    files = _llm_files(tmp_path, ParallelConfig(dp_shard=2))
    ck = str(tmp_path / "ck")
    make(ck)
    code = run_cli(["train", *files, "--steps", "4", "--checkpoint-dir", ck, "--resume"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("shardplan: error: ")
    assert message in err


def test_train_resume_of_an_llm_plan_is_prepared(tmp_path) -> None:
    """``--checkpoint-dir D --resume`` with a checkpoint that fits: an ``llm`` run that
    resumes (the checkpoint's layout does not matter)."""
    import argparse

    from shardplan.runtime._args import add_arguments, config_from_args

    files = _llm_files(tmp_path, ParallelConfig(dp_shard=3))
    ck = str(tmp_path / "ck")
    os.makedirs(ck)
    _state_file(ck, parallel={"dp_shard": 4}, world_size=4)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(
        [*files, "--steps", "4", "--checkpoint-dir", ck, "--resume"])).config
    assert (cfg.kind, cfg.resume, cfg.world_size, cfg.global_batch) == ("llm", True, 3, BATCH)


@pytest.mark.multiprocess
def test_train_resume_refuses_another_models_checkpoint(tmp_path, capsys) -> None:
    """A checkpoint of the 2-block Llama (written by one process: the same keys) resumed by
    an LLM plan of the 6-block one: one line naming what it lacks, exit 2."""
    ck = str(tmp_path / "ck")
    run_single(TrainConfig(kind="single", model="llama3:debug,seq=16", steps=2,
                           microbatches=1, microbatch_size=BATCH, optimizer="adam",
                           checkpoint_dir=ck))
    files = _llm_files(tmp_path, ParallelConfig())
    code = run_cli(["train", *files, "--steps", "4", "--checkpoint-dir", ck, "--resume"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("shardplan: note: ")]
    assert len(lines) == 1 and lines[0].startswith("shardplan: error: training failed on rank 0: ")
    assert "was written for another model: it lacks 'layers.2." in err
