"""dpsub_dist: differentially private principal subspaces of Parquet data on Dask."""

from dpsub_dist._version import __version__

ESTIMATORS = ("PrivateSubspace", "PrivateSubspaceClustering")


def __getattr__(name: str):
    """The estimators, imported on first use: scikit-learn's import (about 1.5 s) is then
    paid by API users only, not by every ``dpsub`` command and Dask worker."""
    if name in ESTIMATORS:
        from dpsub_dist import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [*ESTIMATORS, "__version__"]
