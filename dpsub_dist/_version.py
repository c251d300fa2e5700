"""The package version (a leaf module: anything may import it without importing the package)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dpsub_dist")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+local"
