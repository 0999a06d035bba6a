"""pallas_pinned: GPU kernels that write device data straight into pinned host memory.

Ops on a buffer that lives in ``pinned_host`` memory, updated or read with
device-resident indices and data, without copying the buffer:

* :func:`scatter_to_host` — ``x.at[i].set(y)``, last duplicate wins;
* :func:`scatter_add_to_host` — ``x.at[i].add(y)``, duplicates combined first;
* :func:`gather_from_host` — ``x.at[i].get()``, result in device memory;
* :func:`at` — the same three as ``at(x)[i].set(y)``, ``.add(y)``, ``.get()``.
"""

from pallas_pinned._add import scatter_add_to_host
from pallas_pinned._at import at
from pallas_pinned._gather import gather_from_host
from pallas_pinned._scatter import scatter_to_host

__all__ = ["at", "gather_from_host", "scatter_add_to_host", "scatter_to_host"]
__version__ = "0.1.0"
