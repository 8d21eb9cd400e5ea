"""Partitioners: each module registers one algorithm of the ``partition`` family.

Paper 000 (sharding cost, section 2): :mod:`.brute_force`, :mod:`.heuristic`,
:mod:`.hierarchical`. Parmesan (pipeline stages, section 4) and the baselines a user would
otherwise pick: :mod:`.parmesan`, :mod:`.pipedream`, :mod:`.uniform`, :mod:`.params`,
:mod:`.metis`.
"""

import importlib as _importlib
import importlib.util as _util

# Each is imported (and so registered) if it exists.
_ALGORITHMS = ("brute_force", "heuristic", "hierarchical", "parmesan", "pipedream", "uniform",
               "params", "metis")
for _name in _ALGORITHMS:
    if _util.find_spec(f"{__name__}.{_name}") is not None:
        _importlib.import_module(f"{__name__}.{_name}")
