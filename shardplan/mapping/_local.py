"""Swap local search that tightens the initial upper bound of Algorithm 1.

Not in the paper, which starts the bisection from "the minimum value between random mapping
and heuristic mapping". A tighter start halves the interval fewer times and lets the inner
searches prune earlier; it changes neither the optimum nor the proof.

Each step looks at a slowest vertex v of G' and the vertices whose time moves with v's
device (its replica's adjacent stages under p2p and overlap; its stage's other replicas
when the view charges the all-reduce), and tries moving each of them to every other
device: a free device, or a swap with the vertex there. Under link contention, when none of
those moves improves, the ends of the transfers that share links with the slowest vertex's
are tried next. All candidate mappings are evaluated in one vectorised batch
(:func:`~shardplan.mapping._stage_time.p2p_times` takes leading batch dimensions); the best
one is taken if it lowers ``(max stage time, sum of stage times)`` lexicographically, which
also makes the search finite.
O(steps x k D x S^2 R) with k the vertices tried per step.
"""

from __future__ import annotations

import time

import numpy as np

from shardplan.mapping._stage_time import MappingProblem, stage_times

__all__ = ["improve"]

_REL = 1e-12


def _score(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    flat = times.reshape(times.shape[0], -1)
    return flat.max(axis=1), np.where(np.isfinite(flat), flat, 1e300).sum(axis=1)


def _better(best: tuple[float, float, int, int, int], cur_max: float, cur_sum: float) -> bool:
    bmx, bsm = best[0], best[1]
    return bmx < cur_max * (1 - _REL) or (bmx <= cur_max and bsm < cur_sum * (1 - _REL))


def _sharing(problem: MappingProblem, dev: np.ndarray, s: int, r: int, *,
             limit: int = 8) -> list[tuple[int, int]]:
    """Under link contention: the replicas at either end of the other devices' transfers
    that share a link with a transfer replica (s, r) pays for, most shared bytes first (at
    most ``limit``). Moving one of them may reroute what slows (s, r) down. O(K H)."""
    ts, tt = problem.transfer_stages
    if ts.size == 0:
        return []
    rr = np.arange(problem.num_replicas)
    ks, kt = np.repeat(ts, rr.size), np.repeat(tt, rr.size)
    kr = np.tile(rr, ts.size)
    paths = problem.paths(dev[ks, kr], dev[kt, kr])
    mine = (ks == s) & (kr == r)
    if problem.view == "p2p":
        mine |= (kt == s) & (kr == r)
    links = np.unique(paths[mine])
    links = links[links >= 0]
    if links.size == 0:
        return []
    nbytes = np.repeat(problem.stage_bytes[ts, tt], rr.size)
    hit = np.isin(paths, links).any(axis=1) & ~mine
    order = np.flatnonzero(hit)[np.argsort(-nbytes[hit], kind="stable")]
    out: list[tuple[int, int]] = []
    for k in order.tolist():
        for v in ((int(ks[k]), int(kr[k])), (int(kt[k]), int(kr[k]))):
            if v != (s, r) and v not in out:
                out.append(v)
        if len(out) >= limit:
            break
    return out[:limit]


def improve(problem: MappingProblem, model: str, devices: np.ndarray, *,
            deadline: float | None = None, max_steps: int = 500,
            chunk_elements: int = 1 << 22) -> tuple[np.ndarray, int]:
    """Hill-climb from ``devices`` (S, R); returns the improved mapping and steps taken.

    Candidates are evaluated in batches of at most ``chunk_elements`` device ids (so memory
    stays bounded on thousands of devices), and ``deadline`` (``time.monotonic``) is checked
    between batches: a step cut short keeps the mapping it started from."""
    S, R, D = problem.num_stages, problem.num_replicas, problem.num_devices
    dev = np.array(devices, dtype=np.int64)
    owner = np.full(D, -1, dtype=np.int64)  # flat vertex index s * R + r, or -1 if free
    owner[dev.reshape(-1)] = np.arange(S * R)
    cur_max, cur_sum = (x[0] for x in _score(stage_times(problem, dev[None], model)))
    per_chunk = max(1, chunk_elements // max(S * R, 1))
    steps = 0

    def late() -> bool:
        return deadline is not None and time.monotonic() > deadline

    while steps < max_steps:
        if late():
            break
        times = stage_times(problem, dev, model)
        s, r = np.unravel_index(int(np.argmax(times)), times.shape)
        movers = [(s, q) for q in range(R)] if model == "allreduce" or \
            (problem.ar_weight and R > 1) else [(s, r)]
        if model != "allreduce":
            movers += [(int(t), r) for t in np.flatnonzero(problem.adjacent[s])]
        tiers = [movers]
        if problem.contention:  # then the ends of the transfers that share its links
            tiers.append([m for m in _sharing(problem, dev, int(s), int(r))
                          if m not in movers])
        # The best candidate by (max stage time, sum of stage times), first one on ties,
        # in the order (mover, target device); a later tier only if no earlier one improves.
        best: tuple[float, float, int, int, int] | None = None
        cut_short = False
        for tier in tiers:
            for a, b in tier:
                d0 = int(dev[a, b])
                targets = np.flatnonzero(np.arange(D) != d0)
                for lo in range(0, targets.size, per_chunk):
                    if best is not None and late():
                        cut_short = True
                        break
                    xs = targets[lo:lo + per_chunk]
                    cand = np.broadcast_to(dev, (xs.size, S, R)).copy()
                    rows = np.arange(xs.size)
                    cand[rows, a, b] = xs
                    o = owner[xs]
                    swap = o >= 0
                    cand[rows[swap], o[swap] // R, o[swap] % R] = d0  # the vertex there swaps
                    mx, sm = _score(stage_times(problem, cand, model))
                    i = int(np.lexsort((sm, mx))[0])
                    if best is None or (mx[i], sm[i]) < (best[0], best[1]):
                        best = (float(mx[i]), float(sm[i]), a, b, int(xs[i]))
                if cut_short:
                    break
            if cut_short or (best is not None and _better(best, cur_max, cur_sum)):
                break
        if best is None or cut_short:
            break
        bmx, bsm, a, b, x = best
        if not _better(best, cur_max, cur_sum):
            break
        d0 = dev[a, b]
        o = owner[x]
        dev[a, b] = x
        owner[x] = a * R + b
        owner[d0] = o
        if o >= 0:
            dev[o // R, o % R] = d0
        cur_max, cur_sum = bmx, bsm
        steps += 1
    return dev, steps
