"""``shardplan --config FILE.toml COMMAND ...``: flags from a TOML file, the command line's
own flags overriding them (as torchtitan's ``--job.config_file`` does).

The file holds option values by their long name (``microbatches = 8``, ``time-limit = 60``;
``_`` and ``-`` alike). Top-level keys apply to every command that has the option and are
ignored by the others (a key no command has is an error); a table ``[simulate]`` applies to
that command only, and every key in it must be one of its options. ``true`` gives a switch
(``recompute = true``), ``false`` leaves it off; an option whose value is optional takes
either (``recompute = true`` or ``recompute = "selective"``); a list gives the option's
values in order.
The values become command-line tokens inserted before the command's own, so argparse checks
them as it checks typed flags, and a flag given on the command line, coming later, wins.
Positional arguments (files) stay on the command line.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Sequence
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["config_tokens", "split_config"]


def split_config(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(config path, argv without it)``: ``--config F`` / ``--config=F`` before the
    command."""
    out: list[str] = []
    path: str | None = None
    it = iter(range(len(argv)))
    skip = False
    for i in it:
        if skip:
            skip = False
            continue
        tok = argv[i]
        if tok == "--config":
            if i + 1 >= len(argv):
                raise ShardplanError("--config needs a FILE.toml")
            path, skip = argv[i + 1], True
            continue
        if tok.startswith("--config="):
            path = tok.split("=", 1)[1]
            continue
        out.append(tok)
    return path, out


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's optional actions by dest and by long name (dashes as underscores)."""
    out: dict[str, argparse.Action] = {}
    for act in parser._actions:
        if not act.option_strings or isinstance(act, argparse._HelpAction):
            continue
        out[act.dest] = act
        for opt in act.option_strings:
            if opt.startswith("--"):
                out[opt[2:].replace("-", "_")] = act
    return out


def _tokens(key: str, value: Any, act: argparse.Action, where: str) -> list[str]:
    flag = next((o for o in act.option_strings if o.startswith("--")), act.option_strings[0])
    if act.nargs == 0:  # a switch
        if not isinstance(value, bool):
            raise ShardplanError(f"{where}: {key} is a switch, give true or false")
        return [flag] if value else []
    if act.nargs == "?" and isinstance(value, bool):  # a switch with an optional value
        return [flag] if value else [flag, "none"] if act.choices and "none" in act.choices \
            else []
    if isinstance(value, bool):
        raise ShardplanError(f"{where}: {key} takes a value, not {str(value).lower()}")
    if isinstance(value, list):
        return [flag, *(str(v) for v in value)]
    if isinstance(value, dict):
        raise ShardplanError(f"{where}: {key} takes a value, not a table")
    return [flag, str(value)]


def config_tokens(path: str, command: str,
                  subparsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """The command-line tokens the config file gives ``command``. One-line errors for an
    unreadable file, a key no command has, or a bad value."""
    from shardplan.ir.io import read_text

    try:
        data = tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise ShardplanError(f"{path}: not valid TOML ({exc})") from None
    opts = {name: _options(p) for name, p in subparsers.items()}
    out: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in subparsers:
                raise ShardplanError(f"{path}: [{key}] is not a command")
            continue
        k = key.replace("-", "_")
        if not any(k in o for o in opts.values()):
            raise ShardplanError(f"{path}: no command has an option {key!r}")
        if k in opts.get(command, {}):
            out += _tokens(key, value, opts[command][k], path)
    table = data.get(command)
    if isinstance(table, dict):
        for key, value in table.items():
            k = key.replace("-", "_")
            if k not in opts[command]:
                raise ShardplanError(f"{path}: [{command}] has no option {key!r}")
            out += _tokens(key, value, opts[command][k], f"{path} [{command}]")
    return out
