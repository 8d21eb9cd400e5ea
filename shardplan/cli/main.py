"""``shardplan``: the command line, a thin layer over the Python API.

Each command lives in its own module of this package with a ``register(subparsers)`` function
that adds its parser and sets ``handler``. Errors a user can cause are
:class:`~shardplan.errors.ShardplanError` and end as one line on stderr with exit status 2.

This module imports only the standard library at load time: :func:`main` limits the thread
pools (``OMP_NUM_THREADS=1`` unless set) *before* the command modules load NumPy, whose BLAS
reads the variable once, when it starts its threads (set later, it changes nothing, and on a
machine with few cores the idle-spinning BLAS threads made the command line several times
slower than the library). ``import shardplan`` loads nothing heavy either (PEP 562), so the
console script reaches :func:`main` with NumPy not yet imported.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from shardplan.errors import ShardplanError, ShardplanWarning

if TYPE_CHECKING:  # pragma: no cover
    from shardplan.cli._common import OneLineParser

__all__ = ["build_parser", "main"]

# Order of the commands in --help; each is the module ``shardplan.cli.<name>``.
_COMMAND_MODULES = (
    "capture", "inspect", "importer", "generate", "topology", "partition", "map", "strategy",
    "cost", "simulate", "report", "export", "train", "plan", "replan", "demo",
)

#: Environment the command line sets (unless the user did) before anything loads NumPy or
#: torch: one thread per process (with 2 cores, oversubscription makes torch 15-70x slower
#: and NumPy's BLAS several times slower), and no model hub access.
_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def build_parser() -> OneLineParser:
    import importlib

    from shardplan import __version__
    from shardplan.cli._common import OneLineParser
    from shardplan.cli.plan import byte_size

    parser = OneLineParser(
        prog="shardplan",
        description="Plan how to train a PyTorch model on many devices: capture its graph, "
                    "partition, map onto a topology, simulate, run.",
    )
    parser.add_argument("--version", action="version", version=f"shardplan {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log what shardplan does on stderr (-vv: more)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="only errors on stderr (no notes or warnings)")
    parser.add_argument("--max-input-size", metavar="SIZE", type=byte_size,
                        help="largest input file read (default 256MiB; also "
                             "SHARDPLAN_MAX_INPUT_BYTES)")
    parser.add_argument("--config", metavar="FILE.toml",
                        help="options of the command from a TOML file (flags given on the "
                             "command line override them)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name in _COMMAND_MODULES:
        importlib.import_module(f"shardplan.cli.{name}").register(sub)
    return parser


#: Optional dependencies and the extra that installs them.
EXTRAS = {"matplotlib": "plot", "torch": "torch", "torchvision": "torch",
          "transformers": "torch"}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line message for a missing optional dependency, or None if ``exc`` is not
    about one."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return f"this needs {top}, which is not installed: pip install 'shardplan[{extra}]'"


def _with_config(parser: Any, argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` with the tokens of ``--config FILE`` inserted after the command name, and
    the config file (None without one)."""
    from shardplan.cli._config import config_tokens, split_config

    path, rest = split_config(argv)
    if path is None:
        return rest, None
    sub = next(a for a in parser._actions if a.dest == "command")
    for i, tok in enumerate(rest):
        if tok in sub.choices:
            return (rest[:i + 1] + config_tokens(path, tok, dict(sub.choices)) + rest[i + 1:],
                    path)
    return rest, path


def _check_files(args: Any, config: str | None) -> None:
    """Tell the writer the command's inputs and check its outputs before it runs
    (:func:`shardplan.cli._common.declare_files`)."""
    from shardplan.ir.io import check_output, declare_inputs

    def values(dests: tuple[str, ...]) -> list[str]:
        out: list[str] = []
        for dest in dests:
            v = getattr(args, dest, None)
            out.extend(str(x) for x in (v if isinstance(v, (list, tuple)) else [v])
                       if x is not None)
        return out

    declare_inputs(config, *values(getattr(args, "input_args", ())))
    written: dict[str, str] = {}
    for dest in getattr(args, "output_args", ()):
        for path in values((dest,)):
            check_output(path)
            flag = "-o" if dest == "output" else "--" + dest.replace("_", "-")
            if os.path.exists(path) and not os.path.isfile(path):
                continue  # a device or a FIFO (/dev/null) takes any number of writers
            key = os.path.realpath(path)
            if key in written:  # the second writer replaced the first's file
                raise ShardplanError(f"{written[key]} and {flag} both write {path}: give each "
                                     f"its own file")
            written[key] = flag


def _setup_logging(verbose: int, quiet: bool) -> None:
    """The ``shardplan`` logger on stderr: warnings by default, info with -v, debug with -vv,
    errors only with -q (which also silences the one-line notes)."""
    log = logging.getLogger("shardplan")
    if quiet:
        level = logging.ERROR
    else:
        level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    log.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("shardplan: %(levelname)s: %(message)s"))
        log.addHandler(handler)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (tests replace it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _process_age() -> float:
    """Seconds since this process started (interpreter start-up included), from
    ``/proc/self/stat``; 0 where that is not available. Clock-tick resolution."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return 0.0
    return min(max(uptime - started, 0.0), 60.0)


_SHOW_WARNING = warnings.showwarning


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A :class:`ShardplanWarning` is one line ``shardplan: note: ...``; others as usual."""
    if issubclass(category, ShardplanWarning):
        sys.stderr.write(f"shardplan: note: {message}\n")
    else:
        _SHOW_WARNING(message, category, filename, lineno, file, line)


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that ``finally`` blocks run (worker processes
    stopped, temporary files removed)."""


#: The process that installed :func:`_on_sigterm` (set by :func:`main`).
_MAIN_PID: list[int] = []


def _on_sigterm(signum: int, frame: FrameType | None) -> Any:
    # A worker forked from this process keeps this handler until its initializer resets it;
    # terminated in that window (the pool stopped at a time limit), raising here printed the
    # worker's traceback under the command's one line. Such a worker just ends.
    if _MAIN_PID and os.getpid() != _MAIN_PID[-1]:
        os._exit(128 + signum)
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 user error, 130 interrupted,
    143 terminated)."""
    started = time.monotonic() - (_process_age() if argv is None else 0.0)
    for key, value in _ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from shardplan.cli import _common

    _common.set_command_start(started)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv, config = _with_config(parser, argv)
    except ShardplanError as exc:
        sys.stderr.write(f"shardplan: error: {exc}\n")
        return 2
    args = parser.parse_args(argv)
    limit_before = os.environ.get("SHARDPLAN_MAX_INPUT_BYTES")
    if args.max_input_size is not None:  # the environment carries it to worker processes
        os.environ["SHARDPLAN_MAX_INPUT_BYTES"] = str(int(args.max_input_size))
    _setup_logging(args.verbose, args.quiet)
    _common.set_quiet(args.quiet)
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        _MAIN_PID.append(os.getpid())
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    from shardplan.ir.io import command_scope

    try:
        with warnings.catch_warnings(), command_scope():
            warnings.simplefilter("ignore" if args.quiet else "always", ShardplanWarning)
            warnings.showwarning = _show_warning
            _check_files(args, config)
            rc = args.handler(args)
    except ShardplanError as exc:
        sys.stderr.write(f"shardplan: error: {exc}\n")
        return 2
    except ModuleNotFoundError as exc:
        message = missing_extra(exc)
        if message is None:
            raise
        sys.stderr.write(f"shardplan: error: {message}\n")
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file that cannot be read or written: the user's to fix
        where = f": {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"shardplan: error: {exc.strerror or exc}{where}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("shardplan: error: interrupted\n")
        return 130
    except _Terminated:
        sys.stderr.write("shardplan: error: terminated\n")
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            _MAIN_PID.pop()
        if args.max_input_size is not None:  # main() may run again in this process
            if limit_before is None:
                os.environ.pop("SHARDPLAN_MAX_INPUT_BYTES", None)
            else:
                os.environ["SHARDPLAN_MAX_INPUT_BYTES"] = limit_before
        _common.set_command_start(None)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
