"""Reading and writing the contract's JSON files (atomically)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardplan.errors import InvalidFileError
from shardplan.ir.graph import GRAPH_FORMAT, Graph
from shardplan.ir.plan import PLAN_FORMAT, Plan
from shardplan.ir.topology import TOPOLOGY_FORMAT, Topology

__all__ = ["dumps", "inputs_read", "load", "load_graph", "load_plan", "load_topology",
           "read_json", "read_text", "reset_inputs", "save", "write_atomic", "write_json"]

_KINDS = {GRAPH_FORMAT: Graph, TOPOLOGY_FORMAT: Topology, PLAN_FORMAT: Plan}


def _default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _finite(o: Any) -> Any:
    """Replace non-finite floats by None so that any plain JSON parser reads the file."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o


def dumps(data: Any, *, indent: int | None = None) -> str:
    """JSON text of ``data`` (a contract object or plain data); NaN/inf become ``null``."""
    if hasattr(data, "to_dict"):
        data = data.to_dict()
    try:
        return json.dumps(data, default=_default, indent=indent, allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere: clean it (rare, so done only then)
        plain = json.loads(json.dumps(data, default=_default))
        return json.dumps(_finite(plain), indent=indent, allow_nan=False)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once, at import: os.umask can only be read by setting it


def write_atomic(path: str | os.PathLike[str], text: str | bytes) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one.

    The data goes to a temporary file in the same directory, is flushed and fsynced, then
    renamed over ``path`` (``os.replace`` is atomic on POSIX). The file gets the mode a
    plain ``open`` would give it (0666 less the umask), not ``mkstemp``'s private 0600.
    """
    path = Path(path)
    mode = "wb" if isinstance(text, bytes) else "w"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # name the file asked for, not the temporary one
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, mode) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Atomically write a contract object (or any JSON-able data) to ``path``."""
    write_atomic(path, dumps(data) + "\n")


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Atomically write a graph, topology or plan to ``path`` (argument order of a method)."""
    write_json(path, obj)


_INPUTS: dict[str, str] = {}


def reset_inputs() -> None:
    """Forget the files :func:`read_text` read (the command line does so per command)."""
    _INPUTS.clear()


def inputs_read() -> dict[str, str]:
    """Path -> sha256 (hex) of every file :func:`read_text` read since
    :func:`reset_inputs`: the inputs a plan records."""
    return dict(_INPUTS)


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's contents (its sha256 remembered for :func:`inputs_read`); any
    failure to read it is one :class:`InvalidFileError` line."""
    try:
        data = Path(path).read_bytes()
        _INPUTS[os.fspath(path)] = hashlib.sha256(data).hexdigest()
        return data.decode("utf-8")
    except FileNotFoundError:
        raise InvalidFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidFileError(f"{path}: is a directory") from None
    except PermissionError:
        raise InvalidFileError(f"{path}: permission denied") from None
    except UnicodeDecodeError:
        raise InvalidFileError(f"{path}: not a UTF-8 text file") from None


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file; any failure is one :class:`InvalidFileError` line (malformed text,
    nesting deep enough to exhaust the parser's recursion, an integer of thousands of
    digits)."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidFileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} "
                               f"column {exc.colno})") from None
    except RecursionError:
        raise InvalidFileError(f"{path}: JSON nested too deeply (no contract file nests more "
                               "than a few levels)") from None
    except ValueError as exc:  # an integer beyond Python's digit limit (4300 by default)
        why = "an integer has too many digits" if "digits" in str(exc) else \
            str(exc).splitlines()[0]
        raise InvalidFileError(f"{path}: not a usable JSON file ({why})") from None


def load(path: str | os.PathLike[str]) -> Graph | Topology | Plan:
    """Load any contract file, dispatching on its ``format`` field."""
    data = read_json(path)
    fmt = data.get("format") if isinstance(data, dict) else None
    cls = _KINDS.get(fmt)  # type: ignore[arg-type]
    if cls is None:
        raise InvalidFileError(f"{path}: unknown format {fmt!r} (expected one of "
                               f"{', '.join(_KINDS)})")
    try:
        return cls.from_dict(data)
    except InvalidFileError as exc:
        raise InvalidFileError(f"{path}: {exc}") from None


def _load_kind(path: str | os.PathLike[str], cls: type) -> Any:
    obj = load(path)
    if not isinstance(obj, cls):
        want = {Graph: "graph", Topology: "topology", Plan: "plan"}[cls]
        raise InvalidFileError(f"{path}: expected a {want} file, got a "
                               f"{type(obj).__name__.lower()} file")
    return obj


def load_graph(path: str | os.PathLike[str]) -> Graph:
    """Load and validate a ``shardplan.graph/1`` file."""
    return _load_kind(path, Graph)


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Load and validate a ``shardplan.topology/1`` file."""
    return _load_kind(path, Topology)


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Load and validate a ``shardplan.plan/1`` file."""
    return _load_kind(path, Plan)
