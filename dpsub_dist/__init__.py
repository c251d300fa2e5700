"""dpsub_dist: differentially private principal subspaces of Parquet data on Dask."""

from dpsub_dist._version import __version__
from dpsub_dist.api import PrivateSubspace

__all__ = ["PrivateSubspace", "__version__"]
