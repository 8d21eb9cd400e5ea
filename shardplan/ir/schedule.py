"""Pipeline schedules as plain data: per rank, the ordered list of actions it runs.

A :class:`Schedule` says, for every pipeline rank, in which order it runs the forward (``F``)
and backward of each (stage, micro-batch) and when it starts the gradient all-reduce of a
stage (``REDUCE_GRAD``). A backward is either one action (``B``) or, in the zero-bubble
schedules (Qi et al. 2024), an input-gradient action (``I``, what the previous stage waits
for) and a later weight-gradient action (``W``); DualPipeV's ``(0F3;3B1)OVERLAP_F_B`` runs
a forward and a backward together. Its text form is that of ``torch.distributed.pipelining``'s
``_Action`` (``2F0`` is stage 2's forward of micro-batch 0, ``1REDUCE_GRAD`` the all-reduce of
stage 1), one rank per CSV row, exactly the file torch's ``_load_csv`` reads; so the simulator,
the runtime (``shardplan train``) and torch can run the very same schedule::

    0F0,0F1,0B0,0B1,0REDUCE_GRAD
    1F0,1B0,1F1,1B1,1REDUCE_GRAD

What the CSV cannot hold (the name, the stage-to-rank placement when a rank lists no action of
a stage) goes in a sidecar JSON (:meth:`Schedule.meta`, written as ``FILE.meta.json`` beside
``FILE`` by :func:`save_schedule`). :meth:`Schedule.from_text` reads everything torch's
``get_schedule_ops`` produces: empty cells (torch's ``None`` gaps) are skipped, and a stage
whose rank never lists its ``REDUCE_GRAD`` gets one right after its last ``B`` or ``W``, where
torch's ``_add_reduce_grad`` puts it. Communication actions (``SEND_F`` ...) and FSDP's
``UNSHARD``/``RESHARD`` are refused in one line: they follow from the stage graph.

Sends and receives are not listed: they follow from the stage graph (a stage sends its
activations to every stage that reads them after its forward, and gradients back after its
backward), as torch's ``_add_send_recv`` derives them.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from shardplan.errors import ShardplanError

__all__ = ["BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "FORWARD", "OPS", "OVERLAP_F_B",
           "REDUCE_GRAD", "SCHEDULE_FORMAT", "SCHEDULES", "Action", "Schedule", "gpipe",
           "interleaved_1f1b", "load_schedule", "make_schedule", "one_f_one_b",
           "save_schedule"]

SCHEDULE_FORMAT = "shardplan.schedule/1"
FORWARD, BACKWARD, REDUCE_GRAD = "F", "B", "REDUCE_GRAD"
BACKWARD_INPUT, BACKWARD_WEIGHT, OVERLAP_F_B = "I", "W", "OVERLAP_F_B"
OPS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, REDUCE_GRAD, OVERLAP_F_B)
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
_GRAD_DONE = (BACKWARD, BACKWARD_WEIGHT)  # the action that ends a micro-batch's backward

_ACTION = re.compile(r"^(\d+)(F|B|I|W|REDUCE_GRAD)(\d*)$")
_OVERLAP = re.compile(r"^\(([^()]*)\)OVERLAP_F_B$")
_TORCH_ONLY = re.compile(r"^\d+(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD)\d*$")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One step of a rank: ``op`` of ``stage`` on ``microbatch`` (None for REDUCE_GRAD).

    ``OVERLAP_F_B`` holds its forward and backward in ``sub`` (its own stage is -1, as in
    torch); :meth:`leaves` gives them, or the action itself.

    Examples
    --------
    >>> str(Action(2, "F", 0)), Action.from_str("1REDUCE_GRAD")
    ('2F0', Action(stage=1, op='REDUCE_GRAD', microbatch=None, sub=()))
    >>> str(Action.from_str("(0F3;3B1)OVERLAP_F_B"))
    '(0F3;3B1)OVERLAP_F_B'
    """

    stage: int
    op: str
    microbatch: int | None = None
    sub: tuple[Action, ...] = ()

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ShardplanError(f"unknown schedule action {self.op!r} (choose from "
                                 f"{', '.join(OPS)})")
        if self.op == OVERLAP_F_B:
            if not self.sub or any(a.op not in (FORWARD, BACKWARD, BACKWARD_INPUT,
                                                BACKWARD_WEIGHT) for a in self.sub):
                raise ShardplanError("OVERLAP_F_B needs forward and backward sub-actions")
            return
        if self.sub:
            raise ShardplanError(f"action {self.op} takes no sub-actions")
        if (self.op == REDUCE_GRAD) != (self.microbatch is None):
            need = "takes no" if self.op == REDUCE_GRAD else "needs a"
            raise ShardplanError(f"action {self.op} {need} micro-batch")

    def __str__(self) -> str:
        if self.op == OVERLAP_F_B:
            return f"({';'.join(map(str, self.sub))}){OVERLAP_F_B}"
        return f"{self.stage}{self.op}{'' if self.microbatch is None else self.microbatch}"

    def leaves(self) -> tuple[Action, ...]:
        """The compute actions this action runs, in order: its sub-actions or itself."""
        return self.sub if self.op == OVERLAP_F_B else (self,)

    @classmethod
    def from_str(cls, text: str) -> Action:
        text = text.strip()
        m = _OVERLAP.match(text)
        if m is not None:
            return cls(-1, OVERLAP_F_B, None,
                       tuple(cls.from_str(t) for t in m.group(1).split(";") if t.strip()))
        m = _ACTION.match(text)
        if m is None:
            if _TORCH_ONLY.match(text):
                raise ShardplanError(f"schedule action {text!r} is a communication or FSDP "
                                     "action; give the compute-only schedule (F, B, I, W, "
                                     "REDUCE_GRAD, OVERLAP_F_B)")
            raise ShardplanError(f"cannot read schedule action {text!r} (expected "
                                 "STAGE OP [MICROBATCH] like 2F0, 1B3, 1I3, 1W3, 0REDUCE_GRAD)")
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
        """Check that every rank runs exactly its stages' actions: per (stage, micro-batch)
        one F, then either one B or one I followed by one W, and per stage one REDUCE_GRAD
        after its last B or W. Raises :class:`ShardplanError` naming the first offending
        action. O(S M)."""
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
            for a in (leaf for act in actions for leaf in act.leaves()):
                where = f"rank {r}, action {a}"
                if not 0 <= a.stage < s_num or self.stage_rank[a.stage] != r:
                    raise ShardplanError(f"{where}: stage {a.stage} does not run on rank {r}")
                if a.microbatch is not None and not 0 <= a.microbatch < m_num:
                    raise ShardplanError(f"{where}: micro-batch out of range 0..{m_num - 1}")
                key = (a.stage, a.op, a.microbatch)
                if key in seen:
                    raise ShardplanError(f"{where}: appears twice")
                if a.op in (BACKWARD, BACKWARD_INPUT):
                    if (a.stage, FORWARD, a.microbatch) not in seen:
                        raise ShardplanError(f"{where}: backward before its forward")
                    other = BACKWARD_INPUT if a.op == BACKWARD else BACKWARD
                    if (a.stage, other, a.microbatch) in seen:
                        raise ShardplanError(f"{where}: the micro-batch's backward ran already")
                elif a.op == BACKWARD_WEIGHT and \
                        (a.stage, BACKWARD_INPUT, a.microbatch) not in seen:
                    raise ShardplanError(f"{where}: weight gradient before its input gradient")
                if a.op in _GRAD_DONE:
                    backward_left[a.stage] -= 1
                elif a.op == REDUCE_GRAD and backward_left[a.stage]:
                    raise ShardplanError(f"{where}: before the stage's last backward")
                seen.add(key)
            for s in backward_left:
                for mb in range(m_num):
                    if (s, FORWARD, mb) not in seen:
                        raise ShardplanError(f"rank {r} never runs {Action(s, FORWARD, mb)}")
                    if (s, BACKWARD, mb) not in seen and (s, BACKWARD_WEIGHT, mb) not in seen:
                        what = Action(s, BACKWARD_WEIGHT if (s, BACKWARD_INPUT, mb) in seen
                                      else BACKWARD, mb)
                        raise ShardplanError(f"rank {r} never runs {what}")
                if (s, REDUCE_GRAD, None) not in seen:
                    raise ShardplanError(f"rank {r} never runs {Action(s, REDUCE_GRAD)}")

    @property
    def split_backward(self) -> bool:
        """Whether any backward is split into input-gradient (I) and weight-gradient (W)
        actions (the zero-bubble schedules)."""
        return any(leaf.op == BACKWARD_INPUT for acts in self.ranks for a in acts
                   for leaf in a.leaves())

    def in_flight(self) -> tuple[int, ...]:
        """Per stage, the most micro-batches whose activations it holds at once: the peak of
        (forwards started - backwards done) along its rank's actions, a split backward
        holding them until its W. GPipe gives M, 1F1B ``min(S - s, M)`` (what the memory
        model charges). O(S M).

        Examples
        --------
        >>> one_f_one_b(3, 5).in_flight(), gpipe(2, 3).in_flight()
        ((3, 2, 1), (3, 3))
        """
        peak = [0] * self.num_stages
        for actions in self.ranks:
            now = dict.fromkeys(range(self.num_stages), 0)
            for a in (leaf for act in actions for leaf in act.leaves()):
                if a.op == FORWARD:
                    now[a.stage] += 1
                    peak[a.stage] = max(peak[a.stage], now[a.stage])
                elif a.op in _GRAD_DONE:
                    now[a.stage] -= 1
        return tuple(peak)

    def rank_in_flight(self, rank: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """The micro-batches each stage of one rank holds after each of its actions: the
        rank's stages (in first-action order) and one tuple of counts per action. A rank's
        memory peaks where the counts, weighted by each stage's bytes per micro-batch, sum
        highest, which under interleaving is less than the sum of :meth:`in_flight`'s
        per-stage peaks (they come at different times). O(S M / P).

        Examples
        --------
        >>> one_f_one_b(2, 2).rank_in_flight(0)[1]
        [(1,), (2,), (1,), (0,)]
        """
        leaves = [leaf for act in self.ranks[rank] for leaf in act.leaves()]
        stages = tuple(dict.fromkeys(a.stage for a in leaves))
        index = {s: i for i, s in enumerate(stages)}
        now = [0] * len(stages)
        out: list[tuple[int, ...]] = []
        for a in leaves:
            if a.op == FORWARD:
                now[index[a.stage]] += 1
            elif a.op in _GRAD_DONE:
                now[index[a.stage]] -= 1
            else:
                continue
            out.append(tuple(now))
        return stages, out

    # ------------------------------------------------------------------ text form
    def to_text(self) -> str:
        """The CSV torch's ``_load_csv`` reads: one row per rank, one compute action per
        cell. ``REDUCE_GRAD`` is left out, as torch's compute-only format requires (its
        runtime adds it after each stage's last backward); :meth:`meta` records where ours
        are and :meth:`from_text` puts them back."""
        return "".join(",".join(str(a) for a in acts if a.op != REDUCE_GRAD) + "\n"
                       for acts in self.ranks)

    def meta(self) -> dict[str, object]:
        """What the CSV does not hold, for the sidecar file (:func:`save_schedule`): the
        name, sizes, the stage-to-rank placement and, per stage, how many compute actions
        of its rank run before its ``REDUCE_GRAD``."""
        after = [0] * self.num_stages
        for acts in self.ranks:
            n = 0
            for a in acts:
                if a.op == REDUCE_GRAD:
                    after[a.stage] = n
                else:
                    n += 1
        return {"format": SCHEDULE_FORMAT, "name": self.name, "stages": self.num_stages,
                "microbatches": self.num_microbatches, "ranks": self.num_ranks,
                "stage_rank": list(self.stage_rank), "reduce_grad_after": after}

    @classmethod
    def from_text(cls, text: str, meta: dict[str, object] | None = None) -> Schedule:
        """Read a CSV schedule (:meth:`to_text`, torch's ``_dump_csv``, or the rows of
        torch's ``get_schedule_ops``) with the sidecar ``meta`` (:meth:`meta`) when there
        is one. Without it, the stages and micro-batches are inferred from the actions and
        stage s runs on the rank that lists it. Empty cells are skipped; a missing
        ``REDUCE_GRAD`` is added after the stage's last ``B`` or ``W``. Files of the older
        form, whose first line is ``# shardplan.schedule/1 key=value ...``, still read."""
        info: dict[str, object] = dict(meta or {})
        rows: list[list[Action]] = []
        lines = text.splitlines()
        if lines and lines[0].lstrip().startswith("#"):
            for tok in lines.pop(0).lstrip()[1:].split():
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    info.setdefault(k, v)
        for line in csv.reader(lines):
            if not any(c.strip() for c in line):
                continue
            rows.append([Action.from_str(c) for c in line if c.strip()])
        if not rows:
            raise ShardplanError("the schedule has no rank lines")
        leaves = [leaf for row in rows for a in row for leaf in a.leaves()]
        try:
            stages = int(str(info.get("stages", 1 + max(a.stage for a in leaves))))
            mbs = int(str(info.get("microbatches", 1 + max(
                (a.microbatch for a in leaves if a.microbatch is not None), default=0))))
            placement = info.get("stage_rank")
            if isinstance(placement, str):
                placement = placement.split(",")
            if placement is not None:
                stage_rank = tuple(int(x) for x in placement)  # type: ignore[attr-defined]
            else:
                owner = {a.stage: r for r, row in enumerate(rows) for act in row
                         for a in act.leaves()}
                stage_rank = tuple(owner.get(s, -1) for s in range(stages))
        except (TypeError, ValueError):
            raise ShardplanError("the schedule's metadata has a malformed number") from None
        after = info.get("reduce_grad_after")
        if isinstance(after, list) and len(after) == stages and \
                not any(a.op == REDUCE_GRAD for row in rows for a in row):
            for r, row in enumerate(rows):  # where the sidecar says, last first
                for s in sorted((s for s in range(stages) if stage_rank[s] == r),
                                key=lambda s: -int(after[s])):
                    row.insert(min(int(after[s]), len(row)), Action(s, REDUCE_GRAD))
        # torch's generators leave REDUCE_GRAD out (its runtime adds it): add it where torch does
        for r, row in enumerate(rows):
            mine = [s for s in range(stages) if s < len(stage_rank) and stage_rank[s] == r]
            have = {a.stage for a in row if a.op == REDUCE_GRAD}
            if all(s in have for s in mine):
                continue
            out: list[Action] = []
            done: dict[int, int] = {}
            for act in row:
                out.append(act)
                for a in act.leaves():
                    if a.op in _GRAD_DONE and a.stage not in have:
                        done[a.stage] = done.get(a.stage, 0) + 1
                        if done[a.stage] == mbs:
                            out.append(Action(a.stage, REDUCE_GRAD))
            rows[r] = out
        return cls(name=str(info.get("name", "custom")), num_stages=stages,
                   num_microbatches=mbs, ranks=tuple(tuple(r) for r in rows),
                   stage_rank=stage_rank)


def save_schedule(schedule: Schedule, path: str | os.PathLike[str]) -> str:
    """Write ``schedule``'s CSV to ``path`` (torch's ``_load_csv`` reads it as it is) and its
    metadata to ``path + ".meta.json"``, both atomically. Returns the sidecar's path."""
    from shardplan.ir.io import write_atomic, write_json

    side = os.fspath(path) + ".meta.json"
    write_atomic(path, schedule.to_text())
    write_json(side, schedule.meta())
    return side


def load_schedule(path: str | os.PathLike[str]) -> Schedule:
    """Read a CSV schedule, with ``path + ".meta.json"`` when it exists beside it."""
    import json

    from shardplan.ir.io import read_text

    side = os.fspath(path) + ".meta.json"
    meta = None
    if os.path.exists(side):
        try:
            meta = json.loads(read_text(side))
        except json.JSONDecodeError as exc:
            raise ShardplanError(f"{side}: not valid JSON ({exc.msg})") from None
        if not isinstance(meta, dict):
            raise ShardplanError(f"{side}: expected a JSON object")
    return Schedule.from_text(read_text(path), meta)


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
    0F0,0F1,0B0,0B1
    1F0,1F1,1B0,1B1
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

