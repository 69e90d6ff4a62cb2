"""The NVML backend: the one seam to NVIDIA hardware (only ``session`` imports ``pynvml``)."""
