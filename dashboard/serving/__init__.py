"""Serving: what the GPUs produce (tokens, requests, latency) per pod, model and role, read from the
inference engines' own metrics and joined with gpulens' allocation in Prometheus (docs/serving.md).

- :mod:`dashboard.serving.engines`: the one declared mapping from each engine's metric names to
  serving concepts, and the roles.
- :mod:`dashboard.serving.rules`: the ``gpulens.serving`` recording rules generated from it.
"""
