"""Reading and writing the contract's JSON files (atomically)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from shardplan.errors import InvalidFileError, OutputError
from shardplan.ir.graph import GRAPH_FORMAT, Graph
from shardplan.ir.plan import PLAN_FORMAT, Plan
from shardplan.ir.topology import TOPOLOGY_FORMAT, Topology

__all__ = ["MAX_INPUT_BYTES", "check_output", "command_scope", "declare_inputs", "dumps",
           "inputs_read", "load", "load_graph", "load_plan", "load_topology", "max_input_bytes",
           "output_target", "read_bytes", "read_json", "read_text", "reset_inputs", "save",
           "write_atomic", "write_json"]

_KINDS: dict[str, type[Graph] | type[Topology] | type[Plan]] = {
    GRAPH_FORMAT: Graph, TOPOLOGY_FORMAT: Topology, PLAN_FORMAT: Plan}


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


#: Names of the process's own open streams: written through the descriptor they name, as a
#: shell's ``>`` would (no file is created or replaced).
_STREAMS = {"/dev/stdout": 1, "/dev/stderr": 2}
_FD_PREFIXES = ("/dev/fd/", "/proc/self/fd/")

#: Every file :func:`read_text` read since :func:`reset_inputs` -> its sha256.
_INPUTS: dict[str, str] = {}
#: The inputs the running command declared (:func:`declare_inputs`).
_DECLARED: list[str] = []
#: Whether a command is running (:func:`command_scope`): only then are outputs checked
#: against the inputs, so that a library user may load a file, change it and save it back.
_IN_COMMAND = False


@contextlib.contextmanager
def command_scope() -> Iterator[None]:
    """Run one command: inputs are forgotten on entry (:func:`reset_inputs`) and, until the
    block ends, :func:`write_atomic` refuses to write any of them."""
    global _IN_COMMAND
    reset_inputs()
    _IN_COMMAND = True
    try:
        yield
    finally:
        _IN_COMMAND = False


def declare_inputs(*paths: str | os.PathLike[str] | None) -> None:
    """Tell the writer the running command's input files: no output may be one of them.

    Files read through :func:`read_text` count as inputs without being declared; the
    command line declares every file it names as an input before the command runs (a model
    spec ``FILE.py:FUNCTION`` declares ``FILE.py``). None and names of no existing file are
    ignored.
    """
    for p in paths:
        if p is None:
            continue
        text = os.fspath(p)
        for cand in (text, text.rsplit(":", 1)[0] if ":" in text else None):
            if cand and os.path.exists(cand) and cand not in _DECLARED:
                _DECLARED.append(cand)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)


def _stream_fd(path: str) -> int | None:
    """The descriptor a stream name (``/dev/stdout``, ``/dev/fd/3``) names, else None."""
    if path in _STREAMS:
        return _STREAMS[path]
    for prefix in _FD_PREFIXES:
        if path.startswith(prefix) and path[len(prefix):].isdigit():
            return int(path[len(prefix):])
    return None


def output_target(path: str | os.PathLike[str]) -> tuple[str, str]:
    """Where and how :func:`write_atomic` writes ``path``: ``(file, how)`` with ``how``
    ``"replace"`` (a regular file, new or replaced atomically), ``"in-place"`` (a character
    device such as ``/dev/null``, or a FIFO: opened and written, never replaced) or
    ``"stream"`` (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``: written to that
    descriptor).

    The rules (one :class:`OutputError` line otherwise):

    - while a command runs (:func:`command_scope`), an output is never one of its inputs
      (:func:`declare_inputs`, and every file :func:`read_text` read): the same file by
      ``samefile`` (hard links too) or, for a file that does not exist yet, by real path;
    - a symbolic link is written through only when the file it leads to is in the folder the
      link is in (the link is kept, its target replaced); a link that leads out of that folder
      is refused, so a planted link cannot make a command write elsewhere;
    - a folder, a block device or a socket is refused; character devices and FIFOs are
      written in place (a FIFO must have a reader already: no waiting for one).
    """
    text = os.fspath(path)
    fd = _stream_fd(text)
    if fd is not None:
        return text, "stream"
    target = text
    try:
        st = os.lstat(text)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"cannot write {text}: {exc.strerror}") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(text)
        folder = os.path.realpath(os.path.dirname(os.path.abspath(text)))
        if os.path.dirname(real) != folder:
            raise OutputError(f"{text} is a symbolic link to {real}, outside its folder: not "
                              f"writing through it (remove the link, or name the file)")
        target = real
        try:
            st = os.lstat(real)
        except FileNotFoundError:
            st = None
    for name in chain(_INPUTS, _DECLARED) if _IN_COMMAND else ():
        if _same_file(target, name):
            raise OutputError(f"{text} is one of this command's inputs ({name}): not "
                              f"overwriting it (name another output file)")
    if st is None or stat.S_ISREG(st.st_mode):
        return target, "replace"
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write {text}: it is a folder")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return target, "in-place"
    what = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket"
    raise OutputError(f"cannot write {text}: it is {what}")


def check_output(path: str | os.PathLike[str]) -> None:
    """Refuse ``path`` as an output now, before any work, if :func:`write_atomic` would
    (:func:`output_target`'s rules); a FIFO's reader is only checked when writing."""
    output_target(path)


def _write_in_place(path: str, data: bytes, fifo_check: bool) -> None:
    flags = os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO and fifo_check:
            raise OutputError(f"cannot write {path}: a FIFO with no reader") from None
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise OutputError(f"{path} changed while being written: not writing it")
        os.set_blocking(fd, True)
        _write_all(fd, data)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: str | os.PathLike[str], text: str | bytes) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one.

    The one writer of every output a command writes (``-o``, ``--report``,
    ``--schedule-out``, checkpoints, training results): :func:`output_target` decides where
    and how (never one of the inputs, never through a symbolic link out of its folder,
    devices and FIFOs written in place). A regular file's data goes to a temporary file in
    the same directory, is flushed and fsynced, then renamed over ``path`` (``os.replace``
    is atomic on POSIX). The file gets the mode a plain ``open`` would give it (0666 less
    the umask), not ``mkstemp``'s private 0600.
    """
    name = os.fspath(path)
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    target, how = output_target(name)
    if how == "stream":
        fd = _stream_fd(name)
        assert fd is not None
        if fd in (1, 2):
            (sys.stdout if fd == 1 else sys.stderr).flush()
        _write_all(fd, data)
        return
    if how == "in-place":
        _write_in_place(target, data, fifo_check=stat.S_ISFIFO(os.stat(target).st_mode))
        return
    dest = Path(target)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    except OSError as exc:  # name the file asked for, not the temporary one
        raise OSError(exc.errno, f"cannot write {name}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
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


def reset_inputs() -> None:
    """Forget the files :func:`read_text` read and the inputs :func:`declare_inputs` named
    (the command line does so per command)."""
    _INPUTS.clear()
    _DECLARED.clear()


def inputs_read() -> dict[str, str]:
    """Path -> sha256 (hex) of every file :func:`read_text` read since
    :func:`reset_inputs`: the inputs a plan records."""
    return dict(_INPUTS)


#: Largest input file any reader accepts by default (256 MiB): every contract file a real
#: model or cluster gives is far smaller (a 1758-operator Swin-B graph is about 1 MB, a
#: 2048-device topology with its dense matrices about 170 MB; larger ones are stored
#: ``--compact``). The environment variable ``SHARDPLAN_MAX_INPUT_BYTES`` (or the command
#: line's ``--max-input-size``) overrides it.
MAX_INPUT_BYTES = 256 * 2**20
_LIMIT_VARIABLE = "SHARDPLAN_MAX_INPUT_BYTES"
_CHUNK = 2**20


def max_input_bytes() -> int:
    """The size limit of input files: ``SHARDPLAN_MAX_INPUT_BYTES`` when set, else
    :data:`MAX_INPUT_BYTES`."""
    raw = os.environ.get(_LIMIT_VARIABLE)
    if raw is None or not raw.strip():
        return MAX_INPUT_BYTES
    try:
        value = int(float(raw))
    except ValueError:
        raise InvalidFileError(f"{_LIMIT_VARIABLE}={raw!r} is not a number of bytes") from None
    if value < 1:
        raise InvalidFileError(f"{_LIMIT_VARIABLE}={raw!r} must be a positive number of bytes")
    return value


def _too_big(path: Any, limit: int) -> InvalidFileError:
    size = f"{limit / 2**20:.4g} MiB" if limit >= 2**20 else f"{limit} bytes"
    return InvalidFileError(f"{path}: larger than the {size} an input file may be (set "
                            f"--max-input-size or {_LIMIT_VARIABLE} to allow more)")


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A file's bytes, at most :func:`max_input_bytes` of them: a regular file larger than
    the limit is refused from its size before anything is read; anything else (a device
    such as ``/dev/zero``, a FIFO) is read in 1 MiB chunks and refused as soon as it passes
    the limit, so no input can exhaust memory or read forever. One
    :class:`InvalidFileError` line for any failure."""
    limit = max_input_bytes()
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError
            if stat.S_ISREG(st.st_mode) and st.st_size > limit:
                raise _too_big(path, limit)
            parts: list[bytes] = []
            size = 0
            while True:
                chunk = fh.read(min(_CHUNK, limit + 1 - size))
                if not chunk:
                    break
                parts.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise _too_big(path, limit)
            return b"".join(parts)
    except FileNotFoundError:
        raise InvalidFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidFileError(f"{path}: is a directory") from None
    except PermissionError:
        raise InvalidFileError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InvalidFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's contents (its sha256 remembered for :func:`inputs_read`), read by
    :func:`read_bytes` (size-limited); any failure to read it is one
    :class:`InvalidFileError` line."""
    data = read_bytes(path)
    _INPUTS[os.fspath(path)] = hashlib.sha256(data).hexdigest()
    try:
        return data.decode("utf-8")
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
