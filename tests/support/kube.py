"""Helpers for the tests of the Kubernetes API source: a client factory and a polling wait."""

from __future__ import annotations

import time
from collections.abc import Callable

from exporter.attribution.kube_http import KubeClient, endpoint_for


def client_factory(url: str) -> Callable[[], KubeClient]:
    """What ``KubePodSource`` calls to get a client of the API server at ``url``."""
    return lambda: KubeClient(endpoint_for(url))


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
    """Poll ``predicate`` every 20 ms until it holds or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
