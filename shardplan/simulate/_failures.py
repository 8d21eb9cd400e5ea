"""Expected goodput of a training run whose devices fail (issue 48, item 4).

Failures are a Poisson process: each device fails at ``rate`` per hour, so a run on ``N``
devices sees ``rate x N`` failures per hour. Goodput is the share of the run's time that
trains: ``T / (T + rate_s x T x L) = 1 / (1 + rate_s x L)`` for a step of ``T`` seconds, a
failure rate ``rate_s`` per second of training and ``L`` the useful seconds a failure costs
(to first order: failures do not overlap, which holds while ``rate_s x L`` and the expected
number of nodes down at once, ``rate x N x repair``, are well below 1; the result reports
the latter as ``nodes_down``).

**Without re-planning** a failure costs the work since the last checkpoint (half an interval
on average), the checkpoint's write time (the brief of issue 48: a checkpoint is written
asynchronously and costs nothing until a failure forces the run back to it), and the
restart: the job rescheduled, the checkpoint loaded, the run warmed up, and waiting for the
failed node or a spare to join when that takes longer::

    L_restart = C / 2 + W + max(R, H)

**With re-planning** the survivors keep training on the re-plan's layout
(:func:`shardplan.planner._replan.replan`): the interrupted step (half a step on average),
the re-plan's search, the reshard onto the survivors, the slower steps until the node (or a
spare) returns -- ``H`` of wall time trains ``H x T / T'`` of useful time -- and the reshard
back; if the failed node held state no survivor holds (an unreplicated optimizer shard) the
run also goes back to the checkpoint::

    L_replan = T / 2 + P + S_1 + H (1 - T / T') + S_2 [+ C / 2 + W]

and the operator re-plans only when that costs less than a restart: the goodput with
re-planning uses ``min(L_replan, L_restart)``.

Nothing here reads a clock or a random generator: the figures in, the expectation out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["LLAMA3_RATE", "FailureModel", "Goodput", "Recovery", "goodput", "parse_rate"]

#: Llama 3 405B's pre-training as the Llama 3 report publishes it (Llama Team, "The Llama 3
#: Herd of Models", arXiv 2407.21783, section 3.3.4): 419 unexpected interruptions during a
#: 54-day period on 16,384 H100 GPUs. The rate per GPU-hour is derived from those three
#: figures alone (about 1.97e-5).
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16384
LLAMA3_RATE = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)


def parse_rate(text: str) -> float:
    """``--failures RATE``: failures per device per hour, a number >= 0 or ``llama3``
    (:data:`LLAMA3_RATE`).

    Examples
    --------
    >>> round(parse_rate("llama3") * 1e5, 3)
    1.973
    >>> parse_rate("2e-5")
    2e-05
    """
    if text.strip().lower() == "llama3":
        return LLAMA3_RATE
    try:
        rate = float(text)
    except ValueError:
        raise ShardplanError(f"--failures takes failures per device per hour (a number) or "
                             f"'llama3', got {text!r}") from None
    if not (rate >= 0 and math.isfinite(rate)):
        raise ShardplanError(f"--failures must be a finite rate >= 0, got {text!r}")
    return rate


@dataclass(frozen=True)
class FailureModel:
    """The failures a run sees and what a restart costs. Seconds throughout.

    Attributes
    ----------
    rate : float
        Failures per device per hour.
    devices : int
        Devices of the run.
    checkpoint_interval : float
        Seconds between checkpoints (``C``).
    checkpoint_write : float
        Seconds a checkpoint takes to write (``W``).
    restart : float
        Seconds a restart from the checkpoint takes (``R``).
    repair : float
        Seconds until the failed node or a spare joins the run (``H``).
    """

    rate: float
    devices: int
    checkpoint_interval: float
    checkpoint_write: float = 0.0
    restart: float = 0.0
    repair: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rate", "checkpoint_write", "restart", "repair"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ShardplanError(f"{name.replace('_', ' ')} must be finite and >= 0, "
                                     f"got {v!r}")
        if not (self.checkpoint_interval > 0 and math.isfinite(self.checkpoint_interval)):
            raise ShardplanError(f"the checkpoint interval must be positive, got "
                                 f"{self.checkpoint_interval!r}")
        if self.devices < 1:
            raise ShardplanError(f"a run needs at least one device, got {self.devices}")

    @property
    def failures_per_second(self) -> float:
        return self.rate * self.devices / 3600.0

    @property
    def restart_loss(self) -> float:
        """``L_restart`` (module docstring)."""
        return self.checkpoint_interval / 2 + self.checkpoint_write + max(self.restart,
                                                                          self.repair)


@dataclass(frozen=True)
class Recovery:
    """What re-planning after one failure costs (module docstring), seconds.

    Attributes
    ----------
    step_seconds : float
        The re-plan's step ``T'`` (``inf``: no layout fits the survivors).
    reshard_seconds, reshard_back_seconds : float
        ``S_1`` onto the survivors, ``S_2`` back when the node returns.
    plan_seconds : float
        The re-plan's search ``P``.
    rollback : bool
        The failed node held state no survivor holds: back to the checkpoint as well.
    """

    step_seconds: float
    reshard_seconds: float = 0.0
    reshard_back_seconds: float = 0.0
    plan_seconds: float = 0.0
    rollback: bool = False


@dataclass(frozen=True)
class Goodput:
    """The expected goodput with and without re-planning, and its terms."""

    without_replan: float
    with_replan: float
    restart_loss: float
    replan_loss: float
    failures_per_hour: float
    nodes_down: float
    replans: bool

    def to_dict(self) -> dict[str, Any]:
        return {"goodput_without_replan": self.without_replan,
                "goodput_with_replan": self.with_replan,
                "seconds_lost_per_failure_restart": self.restart_loss,
                "seconds_lost_per_failure_replan": self.replan_loss,
                "failures_per_hour": self.failures_per_hour,
                "hours_between_failures": (1.0 / self.failures_per_hour
                                           if self.failures_per_hour > 0 else math.inf),
                "nodes_down": self.nodes_down, "replan_chosen": self.replans}


def replan_loss(step_seconds: float, model: FailureModel, recovery: Recovery) -> float:
    """``L_replan`` (module docstring); ``inf`` when no layout fits the survivors. O(1).

    Examples
    --------
    >>> m = FailureModel(rate=1e-5, devices=8, checkpoint_interval=600, repair=100)
    >>> replan_loss(2.0, m, Recovery(step_seconds=4.0, reshard_seconds=3.0))
    54.0
    """
    t2 = recovery.step_seconds
    if not (t2 > 0 and math.isfinite(t2)):
        return math.inf
    slow = max(0.0, 1.0 - step_seconds / t2)
    loss = (step_seconds / 2 + recovery.plan_seconds + recovery.reshard_seconds
            + model.repair * slow + recovery.reshard_back_seconds)
    if recovery.rollback:
        loss += model.checkpoint_interval / 2 + model.checkpoint_write
    return loss


def goodput(step_seconds: float, model: FailureModel,
            recovery: Recovery | None = None) -> Goodput:
    """The expected goodput of a run of ``step_seconds`` steps under ``model``, with and
    without re-planning (module docstring; without a ``recovery``, re-planning is not
    possible and both are the restart's). O(1).

    Examples
    --------
    >>> m = FailureModel(rate=0.0, devices=16384, checkpoint_interval=1800, restart=600)
    >>> goodput(5.0, m).without_replan
    1.0
    >>> m = FailureModel(rate=1e-3, devices=1000, checkpoint_interval=3600)
    >>> round(goodput(5.0, m).without_replan, 4)  # one failure an hour, half an hour lost
    0.6667
    """
    lam = model.failures_per_second
    restart = model.restart_loss
    again = math.inf if recovery is None else replan_loss(step_seconds, model, recovery)
    best = min(restart, again)
    return Goodput(without_replan=1.0 / (1.0 + lam * restart),
                   with_replan=1.0 / (1.0 + lam * best), restart_loss=restart,
                   replan_loss=again, failures_per_hour=lam * 3600.0,
                   nodes_down=lam * model.repair, replans=again < restart)
