"""Checkpoint and resume (issue #18): a run stopped after a checkpoint (normally or killed)
resumes to the same losses and final parameters, bit for bit, as the uninterrupted run, for the
pipeline, a replicated pipeline and every baseline, with Adam and SGD; checkpoints cannot run
code."""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import replace

import pytest

pytest.importorskip("torch")

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.runtime import (  # noqa: E402
    TrainConfig,
    config_for_plan,
    contiguous_plan,
    load_checkpoint_into,
    train_many,
)

pytestmark = [pytest.mark.torch]

# Dropout on (GPT-2's default 0.1): resumed runs draw the same masks.
SPEC = "transformers:gpt2,n_layer=2,n_embd=32,n_head=2,vocab_size=64"


def _graph(_cache: dict = {}) -> object:  # noqa: B006 - a per-session cache
    if "g" not in _cache:
        _cache["g"] = capture_spec(SPEC, batch_size=4, seq_len=8)
    return _cache["g"]


def pipeline_resume_configs(tmp_path) -> list[TrainConfig]:
    """Stop after 3 of 5 steps, resume, and the uninterrupted run: the fast suite runs these
    (the issue's Adam KeyError) inside the one launch of ``test_correctness.py``."""
    return list(_stop_and_resume([_config("pipeline", "adam")], tmp_path)[0])


def check_resume(results: list[object]) -> None:
    _, resumed, straight = results
    assert_same(resumed, straight, 3, "pipeline adam")


def _config(kind: str, optimizer: str, replicas: int = 1, stages: int = 2,
            **kw: object) -> TrainConfig:
    common = dict(model=SPEC, steps=5, microbatches=2, microbatch_size=2, optimizer=optimizer,
                  return_params=True, checkpoint_every=2, timeout=60.0, **kw)
    if kind == "pipeline":
        return config_for_plan(contiguous_plan(_graph(), stages, replicas), _graph(),
                               schedule="1f1b", **common)
    return TrainConfig(kind=kind, nproc=1 if kind == "single" else 2, seq_len=8, **common)


def assert_same(resumed: object, straight: object, start: int, label: str) -> None:
    import torch

    assert resumed.start_step == start and straight.start_step == 0, label
    assert resumed.losses == straight.losses[start:], (label, resumed.losses, straight.losses)
    assert set(resumed.params) == set(straight.params), label
    for name in straight.params:
        for a, b in zip(resumed.params[name], straight.params[name], strict=True):
            assert torch.equal(a, b), (label, name)


def _stop_and_resume(cfgs: list[TrainConfig], tmp_path) -> list[tuple[TrainConfig, ...]]:
    """Per config: run 3 of 5 steps (checkpoint at 2, and at 3 as the run ends), resume to
    5, and the uninterrupted run."""
    runs = []
    for i, cfg in enumerate(cfgs):
        ck = str(tmp_path / f"ck{i}")
        runs.append((replace(cfg, steps=3, checkpoint_dir=ck),
                     replace(cfg, checkpoint_dir=ck, resume=True),
                     replace(cfg, checkpoint_dir=str(tmp_path / f"straight{i}"))))
    return runs


@pytest.mark.slow
@pytest.mark.multiprocess
def test_resume_every_kind_and_optimizer(tmp_path) -> None:
    cfgs = [_config(kind, opt, reps) for opt in ("adam", "sgd")
            for kind, reps in (("pipeline", 1), ("pipeline", 2), ("ddp", 1), ("fsdp", 1),
                               ("single", 1))]
    runs = _stop_and_resume(cfgs, tmp_path)
    flat = [c for trio in runs for c in trio]
    two = [c for c in flat if c.world_size == 2 or c.kind == "single"]
    four = [c for c in flat if c.world_size == 4]
    got = dict(zip(map(id, two), train_many(two), strict=True))
    got.update(zip(map(id, four), train_many(four), strict=True))
    for cfg, resumed, straight in runs:
        assert_same(got[id(resumed)], got[id(straight)], 3,
                     f"{cfg.kind} {cfg.optimizer} R={cfg.replicas}")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("optimizer,replicas", [("adam", 1), ("sgd", 2)])
def test_kill_after_checkpoint_then_resume(tmp_path, optimizer, replicas) -> None:
    import torch

    from shardplan.workload import build

    cfg = _config("pipeline", optimizer, replicas)
    killed = str(tmp_path / "killed")
    # Rank 1 dies (SIGKILL) as it starts step index 3: after the checkpoint of 2 steps, before
    # the one of 4 steps.
    doomed = replace(cfg, checkpoint_dir=killed, fault=(1, 3))
    t0 = time.monotonic()
    with pytest.raises(ShardplanError, match=r"rank 1 was killed by signal 9"):
        train_many([doomed])
    assert time.monotonic() - t0 < 60.0  # well within the process-group timeout
    with open(os.path.join(killed, "latest"), encoding="utf-8") as fh:
        assert fh.read().strip() == "step-00000002"
    assert not [n for n in os.listdir(killed) if n.startswith(".tmp")]

    resumed = replace(cfg, checkpoint_dir=killed, resume=True)
    straight = replace(cfg, checkpoint_dir=str(tmp_path / "straight"))
    got, want = train_many([resumed, straight])
    assert_same(got, want, 2, f"killed {optimizer}")

    # The checkpoint loads into the unsplit model, tied weights included.
    model, _, _ = build(SPEC, batch_size=2, seq_len=8)
    assert load_checkpoint_into(killed, model) == 5
    for name, p in model.named_parameters(remove_duplicate=False):
        assert torch.equal(p.detach(), want.params[name][0]), name
    assert model.lm_head.weight is model.transformer.wte.weight


# ------------------------------------------------------------------ no code execution
class _Payload:
    """Unpickling this calls ``open(marker, "w")``: what a crafted file could do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def checkpoint(tmp_path):
    cfg = TrainConfig(kind="single", model="mlp", steps=2, microbatch_size=2,
                      checkpoint_dir=str(tmp_path / "ck"), optimizer="adam")
    from shardplan.runtime import train

    train(cfg)
    return cfg, os.path.join(cfg.checkpoint_dir, "step-00000002")


def _resume(cfg: TrainConfig) -> None:
    from shardplan.runtime import train

    train(replace(cfg, resume=True, steps=3))


def test_resume_of_a_single_run_works(checkpoint) -> None:
    cfg, _ = checkpoint
    from shardplan.runtime import train

    got = train(replace(cfg, resume=True, steps=3))
    want = train(replace(cfg, steps=3, checkpoint_dir=cfg.checkpoint_dir + "-2"))
    assert got.start_step == 2 and got.losses == want.losses[2:]


def test_crafted_metadata_is_refused_without_running(checkpoint, tmp_path) -> None:
    cfg, path = checkpoint
    marker = str(tmp_path / "pwned")
    with open(os.path.join(path, ".metadata"), "wb") as fh:
        pickle.dump({"state": _Payload(marker)}, fh)
    with pytest.raises(ShardplanError, match="refusing checkpoint metadata"):
        _resume(cfg)
    model = __import__("shardplan.workload", fromlist=["build"]).build(
        "mlp", batch_size=2)[0]
    with pytest.raises(ShardplanError, match="refusing checkpoint metadata"):
        load_checkpoint_into(cfg.checkpoint_dir, model)
    assert not os.path.exists(marker)


def test_non_tensor_entries_are_refused(checkpoint, tmp_path) -> None:
    import torch.distributed.checkpoint as dcp

    cfg, path = checkpoint
    # A DCP checkpoint with a non-tensor entry (DCP would read it with full unpickling).
    dcp.save({"model.x": {"a": 1}}, checkpoint_id=path, no_dist=True)
    with pytest.raises(ShardplanError, match="not a tensor"):
        _resume(cfg)


@pytest.mark.parametrize("latest,message", [("../../etc\n", "must name a step-"),
                                             ("step-00000009\n", "missing")])
def test_latest_must_name_a_checkpoint_here(checkpoint, latest, message) -> None:
    cfg, _ = checkpoint
    with open(os.path.join(cfg.checkpoint_dir, "latest"), "w", encoding="utf-8") as fh:
        fh.write(latest)
    with pytest.raises(ShardplanError, match=message):
        _resume(cfg)


@pytest.mark.parametrize("text,message", [
    ('{"format": "x"}', "is not shardplan.checkpoint/1"),
    ('{"format": "shardplan.checkpoint/1", "step": 2, "param_groups": [{"lr": {"a": 1}}]}',
     "malformed"),
    ("not json", "unreadable"),
    # issue 34: a NaN learning rate resumed and trained to NaN losses with exit 0
    ('{"format": "shardplan.checkpoint/1", "step": 2, "param_groups": [{"lr": NaN}]}',
     "not a finite number"),
    ('{"format": "shardplan.checkpoint/1", "step": 2, "param_groups": [{"lr": Infinity}]}',
     "not a finite number"),
    ('{"format": "shardplan.checkpoint/1", "step": 2, "param_groups": [{"lr": -0.1}]}',
     "must not be negative"),
    ('{"format": "shardplan.checkpoint/1", "step": 2, "param_groups": '
     '[{"lr": 0.1, "betas": [0.9, NaN]}]}', "not a finite number"),
])
def test_state_json_is_checked(checkpoint, text, message) -> None:
    cfg, path = checkpoint
    with open(os.path.join(path, "state.json"), "w", encoding="utf-8") as fh:
        fh.write(text)
    with pytest.raises(ShardplanError, match=message):
        _resume(cfg)


def test_checkpoint_of_another_model_is_refused(checkpoint) -> None:
    cfg, _ = checkpoint
    with pytest.raises(ShardplanError, match="does not fit this run"):
        _resume(replace(cfg, model="transformer,num_layers=1,d_model=16,num_heads=2",
                        seq_len=4))


# ------------------------------------------------- the metadata unpickler's allow-list
def _calling(module: str, name: str, *args: object) -> bytes:
    """A pickle naming ``module.name`` and, with ``args``, calling it on them when loaded
    (protocol 2: GLOBAL, then MARK args TUPLE REDUCE)."""
    head = b"\x80\x02c" + f"{module}\n{name}\n".encode()
    if not args:
        return head + b"."
    return head + b"(" + b"".join(pickle.dumps(a, 2)[2:-1] for a in args) + b"tR."


def _naming(module: str, name: str) -> bytes:
    """Protocol 4's STACK_GLOBAL, which also resolves dotted names (``nn.Module``)."""
    def text(s: str) -> bytes:
        return b"\x8c" + bytes([len(s)]) + s.encode()

    return b"\x80\x04" + text(module) + text(name) + b"\x93."


def _crafted(tmp_path, payload: bytes) -> str:
    """A checkpoint folder that is right in everything but its DCP metadata."""
    import json

    folder = tmp_path / "ck"
    step = folder / "step-00000002"
    step.mkdir(parents=True)
    (folder / "latest").write_text("step-00000002\n")
    (step / "state.json").write_text(json.dumps(
        {"format": "shardplan.checkpoint/1", "step": 2, "param_groups": []}))
    (step / ".metadata").write_bytes(payload)
    return str(folder)


def _load(folder: str) -> None:
    import torch

    load_checkpoint_into(folder, torch.nn.Linear(2, 2))


def _refusals(marker: str) -> dict[str, bytes]:
    """What a crafted state file may name, each a callable or object that is not a dtype; the
    ones that are called would create ``marker``."""
    return dict([
        ("torch.load", _calling("torch", "load", marker)),
        ("torch.save", _calling("torch", "save", None, marker)),
        ("torch.tensor", _calling("torch", "tensor", [1.0])),
        ("torch.Tensor", _naming("torch", "Tensor")),
        ("torch.dtype", _naming("torch", "dtype")),       # the class, not a dtype
        ("torch.nn", _naming("torch", "nn")),             # a module
        ("torch.nn.Module", _naming("torch", "nn.Module")),
        ("torch.float32.__class__", _naming("torch", "float32.__class__")),
        ("torch.nn.modules.module.Module",
         _calling("torch.nn.modules.module", "Module")),
        ("torch.serialization.load", _calling("torch.serialization", "load", marker)),
        ("torch.__builtins__", _naming("torch", "__builtins__")),
        ("os.system", _calling("os", "system", f"touch {marker}")),
        ("posix.system", _calling("posix", "system", f"touch {marker}")),
        ("builtins.eval", _calling("builtins", "eval", f"open({marker!r}, 'w')")),
        ("builtins.open", _calling("builtins", "open", marker, "w")),
        ("pathlib.Path", _calling("pathlib", "Path", marker)),
        ("collections.defaultdict", _naming("collections", "defaultdict")),
        ("torch.distributed.checkpoint.metadata.Path",
         _naming("torch.distributed.checkpoint.metadata", "Path")),
    ])


@pytest.mark.parametrize("what", list(_refusals("marker")))
def test_the_state_file_may_name_nothing_but_dcp_metadata_and_dtypes(tmp_path, what):
    marker = str(tmp_path / "pwned")
    folder = _crafted(tmp_path, _refusals(marker)[what])
    with pytest.raises(ShardplanError, match=r"refusing checkpoint metadata that names "
                                             + what.replace(".", r"\.") + " ") as info:
        _load(folder)
    assert "\n" not in str(info.value)
    assert not os.path.exists(marker)


@pytest.mark.parametrize("payload", [
    _naming("torch", "float32"), _naming("torch", "bfloat16"), _naming("torch", "int64"),
    _calling("torch", "Size", [2, 3]), _calling("collections", "OrderedDict"),
    _naming("torch.distributed.checkpoint.metadata", "TensorProperties"),
    _calling("pathlib", "PosixPath", "x"),
    _calling("torch.serialization", "_get_layout", "torch.strided"),
])
def test_dtypes_and_dcp_classes_are_read(tmp_path, payload):
    """What the allow-list admits loads (and is then refused for not being DCP metadata)."""
    with pytest.raises(ShardplanError, match="is not DCP metadata"):
        _load(_crafted(tmp_path, payload))


def test_a_malformed_state_file_is_one_line(tmp_path):
    with pytest.raises(ShardplanError, match="unreadable checkpoint metadata .*"
                                             "UnpicklingError"):
        _load(_crafted(tmp_path, b"\x80\x02garbage"))


@pytest.mark.parametrize("how", ["truncated", "altered"])
def test_damaged_tensor_data_is_one_clear_line(checkpoint, how) -> None:
    import glob

    cfg, path = checkpoint
    data_file = glob.glob(os.path.join(path, "*.distcp"))[0]
    with open(data_file, "rb") as fh:
        data = bytearray(fh.read())
    if how == "truncated":
        data = data[:len(data) // 2]
    else:
        for i in range(100, len(data), 997):
            data[i] ^= 0xFF
    with open(data_file, "wb") as fh:
        fh.write(bytes(data))
    with pytest.raises(ShardplanError) as info:
        _resume(cfg)
    text = str(info.value)
    assert "is damaged" in text and "\n" not in text, text
    assert "Traceback" not in text and "File " not in text and len(text) < 300, text
