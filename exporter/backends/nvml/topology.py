"""NVLink topology of one node: which GPUs reach which over NVLink, and over how many links.

``nvidia-smi topo -m`` prints ``NV#`` between two GPUs joined by # NVLinks.  Two layouts give it:

- **direct links** (NVLink bridges, the older hybrid cube meshes): a GPU's active link whose far
  end is the other GPU (``nvmlDeviceGetNvLinkRemotePciInfo`` names its PCI bus ID);
- **NVSwitches** (HGX H100/H200 boards, 18 links a GPU): every link of every GPU reaches a switch,
  and each GPU reaches every other over all of them: ``NV18`` between any two.  A switch link
  counts towards a peer only when NVML says the pair can do peer-to-peer over NVLink
  (``nvmlDeviceGetP2PStatus`` with the NVLink index): a fabric partition or a GPU left out of it
  reaches no one.  Where NVML does not answer that question the pair is taken as reachable (both
  GPUs reach switches of one board).

The answer changes only when a GPU's links change (re-read every minute, see links.py) or a
GPU comes or goes, so it is computed then and repeated in between: no NVML call on other cycles.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from exporter.backends.nvml.query import GpuLost, NvmlQuery
from exporter.model import GpuSample, NvLink, NvLinkPeer

_BDF = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])$")


def bus_key(bus_id: str | None) -> tuple[int, int, int, int] | None:
    """A PCI bus ID as (domain, bus, device, function), whatever its zero padding
    (``00000000:18:00.0`` and ``0000:18:00.0`` are one device); ``None`` when it does not parse."""
    m = _BDF.match((bus_id or "").strip())
    if m is None:
        return None
    domain, bus, device, function = m.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function)


def nvlink_peers(samples: Sequence[GpuSample], p2p: Callable[[str, str], bool]) -> dict[str, tuple[NvLinkPeer, ...]]:
    """Each GPU with active NVLinks -> the GPUs it reaches and over how many links (see the module
    docstring); ``p2p(a, b)`` says whether GPUs ``a`` and ``b`` (UUIDs) may do peer-to-peer over
    NVLink, asked only for pairs that both reach NVSwitches."""
    linked = [s for s in samples if s.up and any(link.active for link in s.nvlinks)]
    by_bus = {k: s.uuid for s in linked if (k := bus_key(s.pci_bus_id)) is not None}
    switched = {s.uuid: sum(1 for x in s.nvlinks if x.active and x.remote == "switch") for s in linked}
    out: dict[str, tuple[NvLinkPeer, ...]] = {}
    for s in linked:
        direct = Counter(
            by_bus.get(key)
            for x in s.nvlinks
            if x.active and x.remote != "switch" and (key := bus_key(x.remote_pci_bus_id)) is not None
        )
        peers: list[NvLinkPeer] = []
        for t in linked:
            if t.uuid == s.uuid:
                continue
            n = direct.get(t.uuid, 0)
            if switched[s.uuid] and switched[t.uuid] and p2p(s.uuid, t.uuid):
                n += switched[s.uuid]
            if n:
                peers.append(NvLinkPeer(t.index, t.uuid, n))
        out[s.uuid] = tuple(peers)
    return out


class NvLinkTopology:
    """Fills each GPU sample's ``nvlink_peers`` from the node's NVLink states (one per session)."""

    def __init__(self, q: NvmlQuery) -> None:
        self._q = q
        self._for: tuple[tuple[str, bool, tuple[NvLink, ...]], ...] | None = None
        self._peers: dict[str, tuple[NvLinkPeer, ...]] = {}

    def apply(self, samples: Sequence[GpuSample], handles: Mapping[str, Any]) -> list[GpuSample]:
        """``samples`` with ``nvlink_peers`` set on each GPU with active NVLinks; ``handles`` are
        the GPUs' NVML handles by UUID (for the peer-to-peer question)."""
        key = tuple((s.uuid, s.up, s.nvlinks) for s in samples)
        if key != self._for:
            self._for = key
            self._peers = nvlink_peers(samples, lambda a, b: self._p2p(a, b, handles))
        return [replace(s, nvlink_peers=self._peers[s.uuid]) if s.uuid in self._peers else s for s in samples]

    def _p2p(self, a: str, b: str, handles: Mapping[str, Any]) -> bool:
        """Whether NVML lets GPUs ``a`` and ``b`` do peer-to-peer over NVLink (``True`` where it does
        not answer)."""
        q, nvml = self._q, self._q.nvml
        index = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
        ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
        if index is None or a not in handles or b not in handles:
            return True
        try:
            status = q.call(a, q.fns.nvmlDeviceGetP2PStatus, handles[a], handles[b], index, key="p2p_nvlink")
        except GpuLost:
            return False  # read as lost on the next cycle, and the topology computed again then
        return status is None or status == ok
