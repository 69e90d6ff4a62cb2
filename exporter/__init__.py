"""gpulens exporter: per-GPU, per-MIG and per-pod GPU metrics for Prometheus."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpulens")
    """The installed distribution's version: ``pyproject.toml`` is the one place it is written."""
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "unknown"
