"""dpsub_dist: differentially private principal subspaces of Parquet data on Dask."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dpsub_dist")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+local"

from dpsub_dist.api import PrivateSubspace, PrivateSubspaceClustering  # noqa: E402

__all__ = ["PrivateSubspace", "PrivateSubspaceClustering", "__version__"]
