"""This node's name as the exporter labels every series it exports (``node``).

Role: one definition of the ``node`` label's value.  It is ``--kubernetes.node-name`` (or
``NODE_NAME``, which the chart sets from the downward API's ``spec.nodeName``); else, for a
simulated node, its scenario's name (``jobs-0``: a simulated node is not this host, and two
simulated nodes on one host must not share a name); else the host's name made a valid label value
(``exporter.label_values.label_value``).  The host name is only a
label: the Kubernetes API watch selects on the node name given, never on the host name (a host
name is not always the node's name: a fully qualified name, a cloud instance ID).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from exporter.label_values import label_value

NODE_LABEL = "node"
"""The label name: what the chart's ServiceMonitor, kube-state-metrics and node-exporter
dashboards join on (``Hostname`` is dcgm-exporter's, kept as it is with ``--compat.dcgm``); it
does not clash with Prometheus' own ``instance``."""


def node_label_value(node_name: str, simulated: str = "", hostname: Callable[[], str] | None = None) -> str:
    """The ``node`` label's value: ``node_name`` when given, else ``simulated`` (the simulated
    node's scenario, ``""`` on real GPUs), else the host's name as a valid label value; ``""`` (no
    label) only where the host has no name either.  ``hostname``: the host name's source (default
    ``socket.gethostname``, read at the call)."""
    if node_name:
        return node_name
    if simulated:
        return simulated
    try:
        host = (hostname or socket.gethostname)()
    except OSError:
        return ""
    return label_value(host) if host else ""
