"""Error types raised at shardplan's boundaries.

Every user-facing mistake (a malformed file, an impossible option, an infeasible problem) is a
:class:`ShardplanError`, a ``ValueError`` subclass whose message is one line. The command line
prints that line as ``shardplan: error: ...`` and exits with status 2; library users catch it like
any ``ValueError``. Internal invariants use ``assert``.
"""

from __future__ import annotations

__all__ = ["InfeasibleError", "InvalidFileError", "OutputError", "ShardplanError",
           "ShardplanWarning", "TimeLimitError"]


class ShardplanError(ValueError):
    """A user error: bad input, bad option or infeasible problem (one-line message)."""


class InvalidFileError(ShardplanError):
    """A graph, topology or plan file that cannot be read or fails validation."""


class OutputError(ShardplanError):
    """An output that must not be written: one of the command's inputs, a symbolic link out
    of its folder, a folder or a block device (:func:`shardplan.ir.io.output_target`)."""


class InfeasibleError(ShardplanError):
    """The problem as posed has no solution (for example, a stage cannot fit in memory)."""


class TimeLimitError(ShardplanError):
    """A computation that cannot return a partial answer (one simulation) ran past the
    deadline it was given."""



class ShardplanWarning(UserWarning):
    """Something a user should know that is not an error (a planner working on part of the
    topology, a fallback taken). The command line prints it as one line
    ``shardplan: note: ...``."""
