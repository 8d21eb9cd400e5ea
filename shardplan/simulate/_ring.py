"""A ring collective in closed form, when nothing else can touch its devices or links.

The simulator (:mod:`shardplan.simulate._collectives`) runs a ring collective of a stage's R
replicas as ``steps`` synchronised steps: in each, every replica i sends ``bytes / R`` to
replica ``i + 1`` through its FIFO send queue and the network, and the next step starts when
the whole step has arrived. That is ``R x steps`` messages (``2 R (R - 1)`` for an
all-reduce: about a million per simulation for 8 stages of 512 replicas), each a handful of
events.

When the ring is *private* from a step boundary on, the remaining steps are determined:

- every path of the ring is one direct link (a topology without physical ``links``: a pair
  talks over its own link, which only its sender's messages use, one at a time), so no
  other message can share the ring's bandwidth;
- every ring device's send queue is empty and idle, and nothing else will be queued on it
  before the ring ends: every worker on those devices has finished its actions (only the
  optimizer step, which waits for this ring, is left), and every other stage placed on
  them has finished its gradient synchronisation with nothing queued or running.
- on routed links (meshes, tori, a topology's physical ``links``): the ring's paths share no
  link, nothing is in flight, and the conditions above hold for every device, worker and
  stage (any message could cross the ring's links); each message then streams alone at its
  path's bottleneck;
- a plan of one stage under overlap: its collectives, one at a time, are all the traffic
  there is, so an empty network and idle send queues suffice, whatever its workers compute.

Then replica i's message of each step starts at the step's start ``t``, waits its latency
``l_i`` and streams its chunk ``c`` alone on its link at the link's capacity ``b_i``,
arriving at ``(t + l_i) + c / b_i``; the step ends at the latest arrival, the next starts
there. :func:`ring_arrivals` evaluates exactly that recurrence (the same floating-point
operations the stepwise path performs, vectorised over the replicas), so the result is the
stepwise simulation's to rounding (its event loop delivers arrivals within 1e-12 relative
of each other together); ``tests/simulate/test_ring.py`` compares the two on random cases.
Anything else (links shared by the ring's own paths, a busy queue, a worker still
computing, a measured collective curve) takes the stepwise path; the simulator checks again
at every step boundary, so a ring whose devices are still sending their last gradients
switches to the closed form once they are done.

Complexity: O(steps x R) floating-point work in numpy, against O(steps x R log E) events.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ring_arrivals"]


def ring_arrivals(start: float, latency: np.ndarray, rate: np.ndarray, chunk: float,
                  steps: int) -> np.ndarray:
    """Start times of the remaining steps of a private ring, and its end.

    Parameters
    ----------
    start : float
        When the first remaining step starts.
    latency : ndarray, shape (R,)
        Latency of every replica's message (its link's latency times one tensor).
    rate : ndarray, shape (R,)
        Capacity (bytes/s) of every replica's link.
    chunk : float
        Bytes of every message (``bytes / R``); at most 0: messages take their latency.
    steps : int
        Steps left (>= 0).

    Returns
    -------
    ndarray, shape (steps + 1,)
        ``out[k]``: when step k starts (``out[0] = start``); ``out[steps]``: when the ring
        ends. O(steps x R).
    """
    lat = np.asarray(latency, dtype=np.float64)
    stream = chunk / np.asarray(rate, dtype=np.float64) if chunk > 0 else np.zeros_like(lat)
    out = np.empty(int(steps) + 1)
    t = float(start)
    out[0] = t
    for k in range(int(steps)):
        t = float(((t + lat) + stream).max())
        out[k + 1] = t
    return out
