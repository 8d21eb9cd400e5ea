"""What every zoo family shares: the output wrapper, the example-input tuple, the
``key=value`` overrides of a spec, and the one line that says how user code failed."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardplan.errors import ShardplanError

__all__ = ["OutputSelector", "failure", "normalize_inputs", "parse_overrides"]


class OutputSelector(nn.Module):
    """Wraps a model whose output is a dict or tuple so that ``forward`` returns one tensor.

    Capture strips the ``model.`` prefix this wrapper adds to module paths.
    """

    prefix = "model."

    def __init__(self, model: nn.Module, key: Any) -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, *args: Any) -> torch.Tensor:
        return self.model(*args)[self.key]


def failure(exc: BaseException) -> str:
    """One line saying how the user's code failed: its exception's first line, or the
    ``sys.exit`` it called (whose status must not become the command's)."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:200]}"


def normalize_inputs(inputs: Any, *, what: str = "example_inputs") -> tuple[Any, ...]:
    """A single tensor or a sequence of arguments as a tuple of positional arguments."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    raise ShardplanError(f"{what}: example inputs must be a tensor or a tuple of arguments, "
                         f"got {type(inputs).__name__}")


def parse_overrides(text: str, spec: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in (p for p in text.split(",") if p.strip()):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip():
            raise ShardplanError(f"bad option {part!r} in model {spec!r}: expected key=value")
        raw = raw.strip()
        value: Any
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[key.strip()] = value
    return out
