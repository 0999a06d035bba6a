"""pallas_pinned: GPU kernels that write device data straight into pinned host memory.

Ops on a buffer that lives in ``pinned_host`` memory, updated or read with
device-resident indices and data, without copying the buffer:

* :func:`at` — ``at(x)[index].set(y)``, ``.add``, ``.subtract``, ``.min``, ``.max``,
  ``.multiply``/``.mul`` and ``.get()``, for every index form jnp takes
  (boolean masks aside) plus ``mode="wrap"``;
* :func:`scatter_to_host` — ``x.at[i].set(y)``, last duplicate wins;
* :func:`scatter_add_to_host` — ``x.at[i].add(y)``, duplicates combined first;
* :func:`scatter_min_to_host`, :func:`scatter_max_to_host`,
  :func:`scatter_mul_to_host` — ``.min``, ``.max``, ``.multiply``;
* :func:`gather_from_host` — ``x.at[i].get()``, result in device memory;
* :func:`sort_indices` — one stable order of a batch of row indices, shared
  by the ops of a step that reads and then writes the same rows;
* :func:`fix_memory_space` — the same buffer, with a type that says where it
  lives (for arrays from checkpoint restores or ``jit(out_shardings=...)``);
* :mod:`cached_table` — pinned tables with a device cache of their busiest rows,
  optimizers built in and a prefetch pipeline over many tables (FBGEMM's TBE, for JAX).

:mod:`pallas_pinned.tuning` holds the measured thresholds the ops choose their
paths by; :mod:`pallas_pinned.testing` the specs and oracles of the tests and
benchmarks.
"""

import contextlib
import importlib

from pallas_pinned import _registry, cached_table, tuning
from pallas_pinned._placement import fix_memory_space
from pallas_pinned.at import at
from pallas_pinned.gather import gather_from_host
from pallas_pinned.order import sort_indices
from pallas_pinned.scatter import scatter_to_host
from pallas_pinned.scatter_add import scatter_add_to_host
from pallas_pinned.scatter_combine import (
    scatter_max_to_host,
    scatter_min_to_host,
    scatter_mul_to_host,
)

__all__ = [
    "at",
    "cached_table",
    "fix_memory_space",
    "gather_from_host",
    "scatter_add_to_host",
    "scatter_max_to_host",
    "scatter_min_to_host",
    "scatter_mul_to_host",
    "scatter_to_host",
    "sort_indices",
    "tuning",
]
__version__ = "0.1.0"

# Pallas defines configuration options as it first imports, and JAX keys its trace caches
# on them: imported inside a trace (the first op, or a user's jit around it), it made that
# function compile again on its second call. So it is imported here, where it imports at all.
_registry.pallas_triton_importable()
# Likewise Pallas's interpreter (backend="interpret") imports its fuser as it first lowers a
# call, and the fuser defines such an option: the first call compiled again on its second,
# and a user's jit kept the second trace's tuning. About 10 ms here; a private module, so
# only where it exists.
with contextlib.suppress(ImportError):
    importlib.import_module("jax._src.pallas.fuser")
