"""A workload's program: the model exported by ``torch.export`` (training IR), and which of
its fx nodes are operators.

Capture makes one graph node of each operator (:mod:`shardplan.capture._export`); the runtime
exports the same model itself and matches the graph's nodes to its program by fx name
(:mod:`shardplan.runtime._split`). Both read the rule here, so they cannot disagree: every
``call_function`` node is an operator except ``operator.getitem`` (folded into the operator
whose output it selects), bookkeeping calls that produce no tensor and have no users
(``_assert_tensor_metadata``), and in-place updates of buffers that nothing reads (BatchNorm's
``num_batches_tracked += 1``).
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.fx.node import map_arg
from torch.utils import _pytree as pytree

from shardplan.errors import ShardplanError

__all__ = ["export_model", "graph_ops", "is_buffer_update", "kept_ops", "module_stack",
           "node_args", "op_name", "output_held", "strip_prefix", "tensor_bytes"]


def tensor_bytes(val: Any) -> int:
    """Bytes of all tensors in a (possibly nested) value; 0 for non-tensors."""
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(val)
               if isinstance(t, torch.Tensor))


@contextlib.contextmanager
def output_held() -> Iterator[list[bytes]]:
    """Hold what is written to file descriptors 1 and 2 (Python, C++ and torch's loggers
    alike) in temporary files; the list receives ``[stdout bytes, stderr bytes]`` when the
    block ends. The descriptors are restored however it ends."""
    held: list[bytes] = []
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            yield held
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            for f in (out, err):
                f.seek(0)
                held.append(f.read())


def export_model(model: torch.nn.Module, example_inputs: tuple[Any, ...], *,
                 name: str, dynamic_batch: bool = False) -> torch.export.ExportedProgram:
    """``torch.export.export(model, example_inputs, strict=False)``, errors made one line.

    With ``dynamic_batch``, the leading dimension of every tensor input is exported as one
    symbolic size (``torch.export.Dim.DYNAMIC``), so that the program runs at any batch size
    (the runtime's micro-batches); the example inputs should have at least 2 samples (torch
    specialises sizes 0 and 1).

    What ``torch.export`` prints while tracing (a failing trace logs the partial program,
    dozens of lines) is held back: after a success it is passed on unchanged, after a
    failure dropped, so the failure is the one line of the :class:`ShardplanError` (a model
    that calls ``sys.exit`` while traced fails the same way)."""
    dynamic = None
    if dynamic_batch:
        dynamic = tuple({0: torch.export.Dim.DYNAMIC}
                        if isinstance(t, torch.Tensor) and t.dim() > 0 else None
                        for t in example_inputs)
    failure: BaseException | None = None
    with output_held() as held:
        try:
            program = torch.export.export(model, example_inputs, dynamic_shapes=dynamic,
                                          strict=False)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure is the model's
            failure = exc
    if failure is not None:
        if isinstance(failure, SystemExit):
            raise ShardplanError(f"torch.export could not trace {name!r}: the model called "
                                 f"sys.exit({failure.code!r})") from None
        first = (str(failure).strip().splitlines() or [type(failure).__name__])[0]
        raise ShardplanError(f"torch.export could not trace {name!r}: "
                             f"{type(failure).__name__}: {first[:300]}") from None
    for stream, data in zip((sys.stdout, sys.stderr), held, strict=True):
        if data:
            stream.write(data.decode("utf-8", "replace"))
            stream.flush()
    return program


def op_name(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target)).split(".")[-1]


def strip_prefix(fqn: str, prefix: str) -> str:
    if prefix and fqn.startswith(prefix):
        return fqn[len(prefix):]
    return "" if prefix and fqn == prefix.rstrip(".") else fqn


def module_stack(node: torch.fx.Node, prefix: str) -> tuple[tuple[str, str], ...]:
    stack = node.meta.get("nn_module_stack") or {}
    out: list[tuple[str, str]] = []
    for value in stack.values():
        fqn, typ = value if isinstance(value, tuple) else (str(value), "")
        tname = typ if isinstance(typ, str) else getattr(typ, "__qualname__", str(typ))
        fqn = strip_prefix(str(fqn), prefix)
        if prefix and fqn == "" and out:  # the wrapper and the wrapped model share ''
            out[-1] = (fqn, tname.split(".")[-1])
            continue
        out.append((fqn, tname.split(".")[-1]))
    return tuple(out)


def is_bookkeeping(node: torch.fx.Node) -> bool:
    """Calls that compute no tensor and feed nothing (assertions, grad-mode switches)."""
    if node.users:
        return False
    val = node.meta.get("val")
    return not any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(val))


def is_buffer_update(node: torch.fx.Node, buffers: Mapping[str, str]) -> bool:
    """In-place updates of buffers that nothing reads (train-mode BatchNorm's
    ``num_batches_tracked.add_(1)``): state bookkeeping, not computation of the step."""
    if node.users:
        return False
    reads = node_args(node)
    return bool(reads) and all(a.op == "placeholder" and a.name in buffers for a in reads)


def kept_ops(calls: Sequence[torch.fx.Node], buffer_of: Mapping[str, str]) -> list[torch.fx.Node]:
    """The operators that become graph nodes (see the module docstring)."""
    return [n for n in calls if n.target is not operator.getitem and not is_bookkeeping(n)
            and not is_buffer_update(n, buffer_of)]


def graph_ops(ep: torch.export.ExportedProgram, *, module_prefix: str = ""
              ) -> list[tuple[str, str, str]]:
    """``(fx name, operator, module)`` of every operator capture makes a graph node of, in
    program order: what a graph's ``names``, ``ops`` and ``modules`` hold for this program.
    The runtime matches a graph against the program it exports itself. O(n)."""
    buffer_of = dict(ep.graph_signature.inputs_to_buffers)
    calls = [n for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    out = []
    for n in kept_ops(calls, buffer_of):
        stack = module_stack(n, module_prefix)
        out.append((n.name, op_name(n.target), stack[-1][0] if stack else ""))
    return out


def node_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The fx nodes a node reads, in argument order, each once."""
    found: dict[torch.fx.Node, None] = {}
    map_arg((node.args, node.kwargs), lambda a: found.setdefault(a, None))
    return list(found)
