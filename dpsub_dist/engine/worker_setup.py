"""Preloaded by every worker of a local Dask cluster dpsub starts (Dask's ``preload``).

A task's warning (NumPy's "overflow encountered", a library's) can depend on the rows it
read, and a local cluster's workers share the driver's stderr, which is published: their
warnings go to an operator-only diagnostics file instead (:func:`route_warnings`).
"""

from __future__ import annotations

from typing import Any

from dpsub_dist.diagnostics import route_warnings


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: route this worker process's warnings."""
    route_warnings("worker")
