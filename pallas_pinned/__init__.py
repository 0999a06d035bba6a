"""pallas_pinned: GPU kernels that write device data straight into pinned host memory."""

from pallas_pinned._scatter import scatter_to_host

__all__ = ["scatter_to_host"]
__version__ = "0.1.0"
