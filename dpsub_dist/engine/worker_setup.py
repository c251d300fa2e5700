"""Preloaded by every worker of a local Dask cluster dpsub starts (Dask's ``preload``).

- A task's warning (NumPy's "overflow encountered", a library's) can depend on the rows it
  read, and a local cluster's workers share the driver's stderr, which is published: their
  warnings go to an operator-only diagnostics file instead (:func:`route_warnings`).
- A Ctrl-C in a terminal sends SIGINT to the whole process group, the cluster's worker
  processes included. The driver alone handles it (exit 130, "interrupted: nothing was
  written"); a worker that took it too would print its own KeyboardInterrupt traceback
  before that line. Each worker therefore ignores SIGINT; the driver stops it on the way out.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from dpsub_dist.diagnostics import route_warnings


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, in each worker process as it starts: route its warnings and
    ignore SIGINT there."""
    route_warnings("worker")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
