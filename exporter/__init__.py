"""gpulens exporter: per-GPU, per-MIG and per-pod GPU metrics for Prometheus."""

__version__ = "0.1.0"
