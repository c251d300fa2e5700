"""Report pages of runs and ledgers, and the same plots for notebooks.

- :func:`~dpsub_dist.report.run.write_run_report`: ``RUN/report.html`` (``dpsub report RUN``).
- :func:`~dpsub_dist.report.ledger.ledger_page`: the ledger's page (``dpsub report --ledger``).
- :func:`plot_explained_variance`: the scree plot of a manifest with matplotlib (the
  ``plot`` extra).

Every page is self-contained HTML with inline SVG, built from published values only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def plot_explained_variance(manifest: Mapping[str, Any], ax: Any = None) -> Any:
    """Bar chart of a run's released explained-variance ratio (with the Gram noise's level
    where the manifest publishes it) on ``ax`` (default: a new figure); returns the axes.

    Needs matplotlib: ``pip install 'dpsub_dist[plot]'``.
    """
    from dpsub_dist.errors import InputError
    from dpsub_dist.report.run import noise_ratio

    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError(
            "plotting needs matplotlib: pip install 'dpsub_dist[plot]' (or use dpsub report "
            "RUN_DIR for an HTML page)"
        ) from None
    ratios = (manifest.get("release") or {}).get("explained_variance_ratio")
    if not ratios:
        raise InputError("this run released no explained-variance ratio: nothing to plot")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    components = [f"PC{i + 1}" for i in range(len(ratios))]
    ax.bar(components, ratios, color="#1f6fb4")
    noise, _ = noise_ratio(manifest)
    if noise is not None:
        ax.axhline(noise, color="#c0392b", linestyle="--", label="Gram noise level")
        ax.legend()
    ax.set_ylabel("explained-variance ratio")
    ax.set_title("Released explained variance (published values; no budget)")
    return ax
