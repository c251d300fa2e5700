"""Worker preload of the local cluster dpsub starts (:func:`dpsub_dist.engine.cluster.run_place`).

A Ctrl-C in a terminal sends SIGINT to the whole process group, the cluster's worker
processes included. The driver alone handles it (exit 130, "interrupted: nothing was
written"); a worker that took it too would print its own KeyboardInterrupt traceback
before that line. Each worker therefore ignores SIGINT; the driver stops it on the way out.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


def dask_setup(worker: Any) -> None:
    """Called by Dask in each worker process as it starts: ignore SIGINT there."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
