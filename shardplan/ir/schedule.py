"""Pipeline schedules as plain data: per rank, the ordered list of actions it runs.

A :class:`Schedule` says, for every pipeline rank, in which order it runs the forward (``F``)
and backward (``B``) of each (stage, micro-batch) and when it starts the gradient all-reduce of
a stage (``REDUCE_GRAD``). Its text form is that of ``torch.distributed.pipelining``'s
``_Action`` (``2F0`` is stage 2's forward of micro-batch 0, ``1REDUCE_GRAD`` the all-reduce of
stage 1), one rank per line with the actions comma-separated, like the CSV schedules torch
loads; so the simulator and the runtime (``shardplan train``) can run the very same schedule::

    # shardplan.schedule/1 name=1f1b stages=2 microbatches=2 ranks=2
    0F0,0F1,0B0,0B1,0REDUCE_GRAD
    1F0,1B0,1F1,1B1,1REDUCE_GRAD

Sends and receives are not listed: they follow from the stage graph (a stage sends its
activations to every stage that reads them after its forward, and gradients back after its
backward), as torch's ``_add_send_recv`` derives them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from shardplan.errors import ShardplanError

__all__ = ["BACKWARD", "FORWARD", "OPS", "REDUCE_GRAD", "SCHEDULE_FORMAT", "SCHEDULES", "Action",
           "Schedule", "gpipe", "interleaved_1f1b", "make_schedule", "one_f_one_b"]

SCHEDULE_FORMAT = "shardplan.schedule/1"
FORWARD, BACKWARD, REDUCE_GRAD = "F", "B", "REDUCE_GRAD"
OPS = (FORWARD, BACKWARD, REDUCE_GRAD)
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")

_ACTION = re.compile(r"^(\d+)(F|B|REDUCE_GRAD)(\d*)$")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One step of a rank: ``op`` of ``stage`` on ``microbatch`` (None for REDUCE_GRAD).

    Examples
    --------
    >>> str(Action(2, "F", 0)), Action.from_str("1REDUCE_GRAD")
    ('2F0', Action(stage=1, op='REDUCE_GRAD', microbatch=None))
    """

    stage: int
    op: str
    microbatch: int | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ShardplanError(f"unknown schedule action {self.op!r} (choose from "
                                 f"{', '.join(OPS)})")
        if (self.op == REDUCE_GRAD) != (self.microbatch is None):
            need = "takes no" if self.op == REDUCE_GRAD else "needs a"
            raise ShardplanError(f"action {self.op} {need} micro-batch")

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{'' if self.microbatch is None else self.microbatch}"

    @classmethod
    def from_str(cls, text: str) -> Action:
        m = _ACTION.match(text.strip())
        if m is None:
            raise ShardplanError(f"cannot read schedule action {text.strip()!r} (expected "
                                 "STAGE OP [MICROBATCH] like 2F0, 1B3, 0REDUCE_GRAD)")
        mb = int(m.group(3)) if m.group(3) else None
        return cls(int(m.group(1)), m.group(2), mb)


@dataclass(frozen=True)
class Schedule:
    """The actions of every rank, in order, and which rank runs each stage.

    Attributes
    ----------
    name : str
        ``gpipe``, ``1f1b``, ``interleaved-1f1b`` or anything a user wrote.
    num_stages, num_microbatches : int
    ranks : tuple of tuple of Action
        ``ranks[r]``: what rank r runs, in order.
    stage_rank : tuple of int
        The rank of every (pipeline-ordered) stage: ``s`` for one stage per rank; ``s mod P``
        for the looping placement of interleaved 1F1B over P ranks.
    """

    name: str
    num_stages: int
    num_microbatches: int
    ranks: tuple[tuple[Action, ...], ...]
    stage_rank: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(tuple(r) for r in self.ranks))
        object.__setattr__(self, "stage_rank", tuple(int(r) for r in self.stage_rank))
        self.validate()

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    def validate(self) -> None:
        """Check that every rank runs exactly its stages' F and B of every micro-batch once,
        each B after its F, and each REDUCE_GRAD once, after that stage's last B.
        Raises :class:`ShardplanError` naming the first offending action. O(S M)."""
        s_num, m_num = self.num_stages, self.num_microbatches
        if s_num < 1 or m_num < 1:
            raise ShardplanError("a schedule needs at least one stage and one micro-batch")
        if len(self.stage_rank) != s_num or any(not 0 <= r < len(self.ranks)
                                                for r in self.stage_rank):
            raise ShardplanError(f"stage_rank must give a rank in [0, {len(self.ranks)}) for "
                                 f"each of the {s_num} stages")
        for r, actions in enumerate(self.ranks):
            seen: set[tuple[int, str, int | None]] = set()
            backward_left = {s: m_num for s in range(s_num) if self.stage_rank[s] == r}
            for a in actions:
                where = f"rank {r}, action {a}"
                if not 0 <= a.stage < s_num or self.stage_rank[a.stage] != r:
                    raise ShardplanError(f"{where}: stage {a.stage} does not run on rank {r}")
                if a.microbatch is not None and not 0 <= a.microbatch < m_num:
                    raise ShardplanError(f"{where}: micro-batch out of range 0..{m_num - 1}")
                key = (a.stage, a.op, a.microbatch)
                if key in seen:
                    raise ShardplanError(f"{where}: appears twice")
                if a.op == BACKWARD:
                    if (a.stage, FORWARD, a.microbatch) not in seen:
                        raise ShardplanError(f"{where}: backward before its forward")
                    backward_left[a.stage] -= 1
                elif a.op == REDUCE_GRAD and backward_left[a.stage]:
                    raise ShardplanError(f"{where}: before the stage's last backward")
                seen.add(key)
            for s in backward_left:
                if (s, REDUCE_GRAD, None) not in seen:
                    raise ShardplanError(f"rank {r} never runs {Action(s, REDUCE_GRAD)}")
                for op in (FORWARD, BACKWARD):
                    for mb in range(m_num):
                        if (s, op, mb) not in seen:
                            raise ShardplanError(f"rank {r} never runs {Action(s, op, mb)}")

    def in_flight(self) -> tuple[int, ...]:
        """Per stage, the most micro-batches whose activations it holds at once: the peak of
        (forwards started - backwards done) along its rank's actions. GPipe gives M, 1F1B
        ``min(S - s, M)`` (what the memory model charges). O(S M).

        Examples
        --------
        >>> one_f_one_b(3, 5).in_flight(), gpipe(2, 3).in_flight()
        ((3, 2, 1), (3, 3))
        """
        peak = [0] * self.num_stages
        for actions in self.ranks:
            now = dict.fromkeys(range(self.num_stages), 0)
            for a in actions:
                if a.op == FORWARD:
                    now[a.stage] += 1
                    peak[a.stage] = max(peak[a.stage], now[a.stage])
                elif a.op == BACKWARD:
                    now[a.stage] -= 1
        return tuple(peak)

    # ------------------------------------------------------------------ text form
    def to_text(self) -> str:
        """The CSV-like text form (see the module docstring); :meth:`from_text` reads it."""
        head = (f"# {SCHEDULE_FORMAT} name={self.name} stages={self.num_stages} "
                f"microbatches={self.num_microbatches} ranks={self.num_ranks} "
                f"stage_rank={','.join(map(str, self.stage_rank))}")
        return "\n".join([head, *(",".join(map(str, acts)) for acts in self.ranks)]) + "\n"

    @classmethod
    def from_text(cls, text: str) -> Schedule:
        """Read :meth:`to_text`'s form. Without a header line, the stages and micro-batches
        are inferred from the actions and stage s is taken to run on the rank that lists it."""
        meta: dict[str, str] = {}
        rows: list[tuple[Action, ...]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                for tok in line[1:].split():
                    if "=" in tok:
                        k, v = tok.split("=", 1)
                        meta[k] = v
                continue
            rows.append(tuple(Action.from_str(t) for t in line.split(",") if t.strip()))
        if not rows:
            raise ShardplanError("the schedule has no rank lines")
        acts = [a for row in rows for a in row]
        try:
            stages = int(meta.get("stages", 1 + max(a.stage for a in acts)))
            mbs = int(meta.get("microbatches", 1 + max(
                (a.microbatch for a in acts if a.microbatch is not None), default=0)))
            if "stage_rank" in meta:
                stage_rank = tuple(int(x) for x in meta["stage_rank"].split(","))
            else:
                owner = {a.stage: r for r, row in enumerate(rows) for a in row}
                stage_rank = tuple(owner.get(s, -1) for s in range(stages))
        except ValueError:
            raise ShardplanError("the schedule's header has a malformed number") from None
        return cls(name=meta.get("name", "custom"), num_stages=stages, num_microbatches=mbs,
                   ranks=tuple(rows), stage_rank=stage_rank)


def _check(num_stages: int, num_microbatches: int) -> None:
    for what, v in (("number of stages", num_stages),
                    ("number of micro-batches", num_microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ShardplanError(f"the {what} must be a positive integer, got {v!r}")


def _with_reduce(actions: Iterable[Action], num_microbatches: int) -> tuple[Action, ...]:
    """Insert each stage's REDUCE_GRAD right after its last backward."""
    out: list[Action] = []
    left: dict[int, int] = {}
    for a in actions:
        out.append(a)
        if a.op == BACKWARD:
            left[a.stage] = left.get(a.stage, num_microbatches) - 1
            if left[a.stage] == 0:
                out.append(Action(a.stage, REDUCE_GRAD))
    return tuple(out)


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """GPipe (Huang et al. 2019): every rank runs all M forwards, then all M backwards.

    Backwards run in micro-batch order 0..M-1, as in torch's ``ScheduleGPipe`` (the paper
    runs them in reverse; with equal stages both take ``(M + S - 1)(f + b)``). O(S M).

    Examples
    --------
    >>> print(gpipe(2, 2).to_text(), end="")
    # shardplan.schedule/1 name=gpipe stages=2 microbatches=2 ranks=2 stage_rank=0,1
    0F0,0F1,0B0,0B1,0REDUCE_GRAD
    1F0,1F1,1B0,1B1,1REDUCE_GRAD
    """
    _check(num_stages, num_microbatches)
    ranks = []
    for s in range(num_stages):
        acts = [Action(s, FORWARD, m) for m in range(num_microbatches)]
        acts += [Action(s, BACKWARD, m) for m in range(num_microbatches)]
        ranks.append(_with_reduce(acts, num_microbatches))
    return Schedule("gpipe", num_stages, num_microbatches, tuple(ranks),
                    tuple(range(num_stages)))


def one_f_one_b(num_stages: int, num_microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021; torch's ``Schedule1F1B``).

    Rank s runs ``min(S - 1 - s, M)`` warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards; so it holds at most ``min(S - s, M)``
    micro-batches of activations (GPipe holds M). O(S M).

    Examples
    --------
    >>> [",".join(map(str, r)) for r in one_f_one_b(2, 3).ranks]
    ['0F0,0F1,0B0,0F2,0B1,0B2,0REDUCE_GRAD', '1F0,1B0,1F1,1B1,1F2,1B2,1REDUCE_GRAD']
    """
    _check(num_stages, num_microbatches)
    ranks = []
    m_num = num_microbatches
    for s in range(num_stages):
        warm = min(num_stages - 1 - s, m_num)
        acts = [Action(s, FORWARD, m) for m in range(warm)]
        f, b = warm, 0
        while f < m_num:
            acts.append(Action(s, FORWARD, f))
            f += 1
            acts.append(Action(s, BACKWARD, b))
            b += 1
        acts += [Action(s, BACKWARD, m) for m in range(b, m_num)]
        ranks.append(_with_reduce(acts, m_num))
    return Schedule("1f1b", num_stages, num_microbatches, tuple(ranks),
                    tuple(range(num_stages)))


def interleaved_1f1b(num_ranks: int, virtual_stages: int, num_microbatches: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2) over ``P = num_ranks`` ranks
    with ``v = virtual_stages`` stages each: stage s runs on rank ``s mod P``.

    The order is that of torch's ``ScheduleInterleaved1F1B`` (``_get_warmup_ops`` and
    ``_get_1f1b_rank_ops`` without the ``None`` padding, which only aligns time steps):
    ``rounds = max(1, M // P)`` rounds of ``M / rounds`` micro-batches, rank r runs
    ``(v - 1) * M/rounds + 2 (P - 1 - r)`` warm-up forwards (at most ``v M``), then one
    forward and one backward at a time, earlier micro-batches first ("depth first").
    Requires ``M`` to be a multiple of the rounds, as torch does. O(v P M).

    Examples
    --------
    >>> sch = interleaved_1f1b(2, 2, 2)
    >>> sch.stage_rank, ",".join(map(str, sch.ranks[1]))
    ((0, 1, 0, 1), '1F0,1F1,3F0,3B0,3F1,3B1,3REDUCE_GRAD,1B0,1B1,1REDUCE_GRAD')
    """
    _check(num_ranks, num_microbatches)
    _check(virtual_stages, num_microbatches)
    p_num, v, m_num = num_ranks, virtual_stages, num_microbatches
    rounds = max(1, m_num // p_num)
    per_round = m_num // rounds
    if m_num % rounds:
        raise ShardplanError(f"interleaved 1F1B needs the micro-batches ({m_num}) to be a "
                             f"multiple of the rounds max(1, M // ranks) = {rounds}")
    ranks = []
    for r in range(p_num):
        warm = min((v - 1) * per_round + 2 * (p_num - 1 - r), m_num * v)
        total = v * m_num

        def fwd_stage(step: int, r: int = r) -> int:
            return ((step // per_round) % v) * p_num + r

        def bwd_stage(step: int, r: int = r, warm: int = warm) -> int:
            return (v - 1 - ((step - warm) // per_round) % v) * p_num + r

        fmb: dict[int, int] = {}
        bmb: dict[int, int] = {}
        acts: list[Action] = []

        def add(stage: int, op: str, counter: dict[int, int],
                acts: list[Action] = acts) -> None:
            counter[stage] = counter.get(stage, 0) + 1
            acts.append(Action(stage, op, counter[stage] - 1))

        for step in range(warm):
            add(fwd_stage(step), FORWARD, fmb)
        for step in range(warm, total):
            add(fwd_stage(step), FORWARD, fmb)
            add(bwd_stage(step), BACKWARD, bmb)
        for step in range(total, total + warm):
            add(bwd_stage(step), BACKWARD, bmb)
        ranks.append(_with_reduce(acts, m_num))
    return Schedule("interleaved-1f1b", p_num * v, m_num, tuple(ranks),
                    tuple(s % p_num for s in range(p_num * v)))


def make_schedule(name: str, num_stages: int, num_microbatches: int, *,
                  virtual_stages: int = 2) -> Schedule:
    """The schedule ``name`` (one of :data:`SCHEDULES`) for ``num_stages`` pipeline stages.

    For ``interleaved-1f1b``, ``num_stages`` must be a multiple of ``virtual_stages``; the
    stages then run on ``num_stages / virtual_stages`` ranks.
    """
    if name == "gpipe":
        return gpipe(num_stages, num_microbatches)
    if name == "1f1b":
        return one_f_one_b(num_stages, num_microbatches)
    if name == "interleaved-1f1b":
        if isinstance(virtual_stages, bool) or not isinstance(virtual_stages, int) \
                or virtual_stages < 1 or num_stages % virtual_stages:
            raise ShardplanError(f"interleaved 1F1B needs the stages ({num_stages}) to be a "
                                 f"multiple of the virtual stages per rank ({virtual_stages})")
        return interleaved_1f1b(num_stages // virtual_stages, virtual_stages, num_microbatches)
    raise ShardplanError(f"unknown schedule {name!r} (choose from {', '.join(SCHEDULES)})")

