"""Models from the user's own file (``FILE.py:FUNCTION``): ``FUNCTION()`` returns
``(model, example_inputs)``. Importing the file runs its code."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from torch import nn

from shardplan.errors import ShardplanError
from shardplan.workload._common import failure as _failure
from shardplan.workload._common import normalize_inputs

__all__ = ["load_user_function"]


def load_user_function(spec: str) -> tuple[nn.Module, tuple[Any, ...], str]:
    path, func_name = spec.rsplit(":", 1)
    if not os.path.isfile(path):
        raise ShardplanError(f"model file {path!r} does not exist")
    mod_name = f"_shardplan_user_{abs(hash(os.path.abspath(path)))}"
    loader = importlib.util.spec_from_file_location(mod_name, path)
    if loader is None or loader.loader is None:
        raise ShardplanError(f"cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(loader)
    sys.modules[mod_name] = module
    try:
        loader.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's file may fail any way
        sys.modules.pop(mod_name, None)
        raise ShardplanError(f"importing {path!r} failed: {_failure(exc)}") from None
    fn = getattr(module, func_name, None)
    if fn is None or not callable(fn):
        raise ShardplanError(f"{path!r} has no function {func_name!r}")
    try:
        result = fn()
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        raise ShardplanError(f"{func_name}() in {path!r} failed: {_failure(exc)}") from None
    if not (isinstance(result, (tuple, list)) and len(result) == 2
            and isinstance(result[0], nn.Module)):
        raise ShardplanError(f"{func_name}() in {path!r} must return (model, example_inputs) "
                             f"with model a torch.nn.Module, got {type(result).__name__}")
    model, inputs = result
    return model, normalize_inputs(inputs, what=f"{func_name}() in {path!r}"), func_name
