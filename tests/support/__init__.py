"""Shared test support: real Prometheus and exporter processes on loopback."""
