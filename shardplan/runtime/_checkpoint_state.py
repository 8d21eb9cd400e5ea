"""The plain-JSON side of checkpoints: which checkpoint of a folder is the newest complete
one, what its ``state.json`` says, and whether an LLM run may resume from it. No torch
here: ``shardplan train`` checks a resume before any process starts, and the ranks check it
again with the same functions (:mod:`shardplan.runtime._checkpoint`,
:mod:`shardplan.runtime._llm_checkpoint`).

A checkpoint folder ``D`` holds ``D/step-00000012/`` (one complete checkpoint: DCP's files
and ``state.json``), ``D/latest`` (the name of the newest complete one) and, while one is
written, ``D/.tmp-step-...``. ``state.json`` is plain JSON::

    {"format": "shardplan.checkpoint/1", "step": 12, "kind": "llm", "optimizer": "adam",
     "param_groups": [{"lr": 0.001, "betas": [0.9, 0.999], ...}],
     "global_batch": 12, "seed": 0, "next_sample": 144, "model": "llama3:debug",
     "parallel": {...}, "world_size": 4}

``step`` optimizer steps were taken; the data continue with step ``step``'s batch, whose
first sample is ``next_sample = step x global_batch`` (step ``t``'s batch, samples
``t x global_batch`` to ``(t + 1) x global_batch - 1``, is a function of ``seed`` and ``t``,
:func:`~shardplan.workload.batch_for_step`, and so is the random state of its forwards,
:func:`~shardplan.runtime._config.mix_seed`). ``global_batch``, ``seed``, ``next_sample``
and the fields after them are written since LLM checkpoints exist (issue 48); readers
ignore fields they do not know.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir.io import read_bytes

__all__ = ["FORMAT", "check_resume", "latest", "plain", "read_state", "step_name"]

FORMAT = "shardplan.checkpoint/1"
STEP_NAME = re.compile(r"^step-(\d{8})$")


def step_name(step: int) -> str:
    """The folder name of the checkpoint after ``step`` steps (``step-00000012``)."""
    return f"step-{step:08d}"


def latest(directory: str) -> tuple[int, str] | None:
    """``(step, path)`` of the newest complete checkpoint in ``directory``, or None."""
    try:
        with open(os.path.join(directory, "latest"), encoding="utf-8") as fh:
            name = fh.read(64).strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardplanError(f"checkpoint folder {directory!r}: cannot read 'latest' "
                             f"({exc})") from None
    match = STEP_NAME.match(name)
    if not match:
        raise ShardplanError(f"checkpoint folder {directory!r}: 'latest' must name a "
                             f"step-NNNNNNNN folder, it says {name[:40]!r}")
    path = os.path.join(directory, name)
    if not os.path.isdir(path):
        raise ShardplanError(f"checkpoint folder {directory!r} names {name!r} as the latest "
                             f"checkpoint, which is missing")
    return int(match.group(1)), path


def read_state(path: str, step: int) -> dict[str, Any]:
    """``state.json`` of the checkpoint ``path`` (of ``step`` steps), checked: plain JSON of
    the expected shape, finite and non-negative optimizer settings.

    Raises
    ------
    ShardplanError
        A missing, unreadable or malformed file, in one line.
    """
    state = os.path.join(path, "state.json")
    if not os.path.exists(state):
        raise ShardplanError(f"checkpoint {path!r} has no state.json")
    try:
        data = json.loads(read_bytes(state))  # size-limited, as every input file
    except InvalidFileError as exc:
        raise ShardplanError(f"checkpoint {path!r}: {exc}") from None
    except ValueError as exc:
        raise ShardplanError(f"checkpoint {path!r}: unreadable state.json "
                             f"({type(exc).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ShardplanError(f"checkpoint {path!r}: state.json is not {FORMAT}")
    if data.get("step") != step:
        raise ShardplanError(f"checkpoint {path!r}: state.json says step "
                             f"{data.get('step')!r}, the folder {step}")
    groups = data.get("param_groups")
    if not isinstance(groups, list) or not all(
            isinstance(g, dict) and all(plain(v) for v in g.values()) for g in groups):
        raise ShardplanError(f"checkpoint {path!r}: malformed optimizer settings in "
                             f"state.json")
    for g in groups:
        for key, v in g.items():
            bad = _bad_setting(key, v)
            if bad:
                raise ShardplanError(f"checkpoint {path!r}: state.json gives the optimizer "
                                     f"{key} {v!r}, {bad}")
    return data


#: Optimizer settings that must be >= 0 (torch's optimizers refuse negative ones when built,
#: but not when a resumed param_group brings them).
_NONNEGATIVE = ("lr", "weight_decay", "momentum", "dampening", "eps")


def _bad_setting(key: str, v: Any) -> str | None:
    """Why an optimizer setting of ``state.json`` is refused (None when it is fine): a NaN
    or infinite number anywhere (a NaN learning rate trains to NaN losses with exit 0), a
    negative learning rate, weight decay, momentum, dampening or eps."""
    values = v if isinstance(v, list) else [v]
    nums = [float(x) for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if any(not math.isfinite(x) for x in nums):
        return "not a finite number"
    if key in _NONNEGATIVE and any(x < 0 for x in nums):
        return "which must not be negative"
    return None


def plain(v: Any) -> bool:
    """Whether ``v`` is a JSON scalar or a flat list of numbers (an optimizer setting
    ``state.json`` may hold)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, list) and all(isinstance(x, (int, float, bool)) for x in v)


def check_resume(cfg: Any) -> tuple[int, str, dict[str, Any]]:
    """The checkpoint an LLM run resumes from, checked against the run before any tensor is
    read: ``(step, path, state)``.

    The run continues the checkpoint's data where it stopped, so it must train the same
    global batch (a changed data-parallel degree splits it anew) from the same seed; and it
    must use the optimizer the checkpoint's state belongs to. Whether the checkpoint holds
    this model's tensors is checked against DCP's metadata by the ranks
    (:func:`shardplan.runtime._llm_checkpoint.load`).

    Raises
    ------
    ShardplanError
        No complete checkpoint, a malformed ``state.json``, or one that does not fit the run
        (another global batch, seed or optimizer), in one line.
    """
    found = latest(str(cfg.checkpoint_dir))
    if found is None:
        raise ShardplanError(f"--resume: {cfg.checkpoint_dir!r} holds no complete checkpoint")
    step, path = found
    state = read_state(path, step)
    for key, mine, what in (("global_batch", cfg.global_batch, "a global batch of"),
                            ("seed", cfg.seed, "seed"),
                            ("optimizer", cfg.optimizer, "optimizer")):
        theirs = state.get(key)
        if theirs is None:
            raise ShardplanError(f"checkpoint {path!r} does not record its {key.replace('_', ' ')}"
                                 f" (written before LLM checkpoints existed): an LLM run "
                                 f"cannot continue its data")
        if theirs != mine:
            raise ShardplanError(f"checkpoint {path!r} was written with {what} {theirs!r}, "
                                 f"this run uses {mine!r}: resume with the same one (the data "
                                 f"continue step by step)")
    if state.get("next_sample") != step * cfg.global_batch:
        raise ShardplanError(f"checkpoint {path!r}: state.json's next sample "
                             f"{state.get('next_sample')!r} is not step {step} x global batch "
                             f"{cfg.global_batch}")
    return step, path, state
