"""Fault injection for the simulated backend: what tests and the CLI flip at run time.

A ``SimFaults`` object is shared between the code that injects faults (a test, the CLI's
``--sim.faults`` spec) and ``SimulatedBackend``, which consumes it once per ``sample()``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from exporter.model import NVLINK_ERROR_KINDS, GpmSample, GpuSample, LeafSample

_IDENTITY_FIELDS = frozenset({"index", "uuid", "up", "leaves", "mig", "processes", "xid_events", "window_seconds"})

FAULTABLE_FIELDS: frozenset[str] = frozenset(
    f.name for cls in (GpuSample, LeafSample, GpmSample) for f in fields(cls) if f.name not in _IDENTITY_FIELDS
)
"""Field names that ``unsupported`` / ``transient`` may name: GpuSample, LeafSample and
GpmSample fields except identity.  ``gpm`` drops the whole GPM sample (a pre-Hopper GPU)."""

MAX_GPU_INDEX = 255
"""Highest GPU index ``lost`` and ``xid`` take (no node has more GPUs than that)."""
MAX_TRANSIENT_CYCLES = 1_000_000
"""Most cycles a ``transient`` fault may last (11 days at the 1 s interval)."""
MAX_HANG_SECONDS = 86400.0
"""Longest ``hang`` in seconds: a day, far past the longest ``--collect.deadline`` (1 h)."""
MAX_XID = 999
"""Highest Xid code (NVIDIA's documented codes have at most three digits)."""
MAX_PCIE_GENERATION = 5
"""Highest PCIe generation a simulated link trains to (the H200's, and its slot's, maximum)."""
MAX_PCIE_WIDTH = 16
"""Most lanes a simulated PCIe link has (x16)."""
MAX_NVLINK_ERRORS_PER_CYCLE = 1_000_000
"""Most NVLink errors a ``nvlink_errors`` fault adds per cycle."""
MAX_NVLINK = 17
"""Highest NVLink number ``nvlink_down`` takes (an H200 has links 0 to 17)."""
_SPEC_HELP = (
    "valid: lost=GPU,...; unsupported=FIELD,...; transient=FIELD[:CYCLES],...; hang=SECONDS; unavailable; "
    "xid=GPU:XID,...; pcie_link=GPU:GEN:WIDTH,...; nvlink_errors=GPU:KIND:PER_CYCLE,...; nvlink_down=GPU:LINK,..."
)


@dataclass(frozen=True)
class FaultView:
    """The faults that apply to one ``sample()`` call, taken atomically from ``SimFaults``."""

    lost: frozenset[int]
    unsupported: frozenset[str]
    failing: frozenset[str]
    """Fields that fail transiently in this cycle."""
    hang_seconds: float
    unavailable: bool
    pcie_link: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    """GPU index -> (generation, lanes) its PCIe link trained to instead of Gen5 x16."""
    nvlink_errors: Mapping[tuple[int, str], int] = field(default_factory=dict)
    """(GPU index, error kind) -> NVLink errors its counter gains in this cycle."""
    nvlink_down: frozenset[tuple[int, int]] = frozenset()
    """(GPU index, link) of the NVLinks that are down in this cycle."""

    @property
    def none_fields(self) -> frozenset[str]:
        """Fields that read ``None`` in this cycle (unsupported or failing)."""
        return self.unsupported | self.failing

    @property
    def quiet(self) -> bool:
        """True when no fault changes any value in this cycle (the fast path)."""
        return not (
            self.lost or self.unsupported or self.failing or self.unavailable or self.pcie_link or self.nvlink_down
        )


def _check_fields(names: set[str] | dict[str, int], what: str) -> None:
    bad = sorted(set(names) - FAULTABLE_FIELDS)
    if bad:
        raise ValueError(f"{what}: unknown field(s) {', '.join(bad)}; valid: {', '.join(sorted(FAULTABLE_FIELDS))}")


class SimFaults:
    """Mutable, thread-safe set of faults for ``SimulatedBackend``.

    - ``lost``: GPU indices that answer ``GpuSample(up=False, index, uuid)`` only.
    - ``unsupported``: field names (``FAULTABLE_FIELDS``) that read ``None`` on every GPU/leaf.
    - ``transient``: field -> number of upcoming cycles in which it fails; each failed read
      (per GPU or leaf that has the field) counts as one ``"unknown"`` error in
      ``BackendSample.errors``.
    - ``hang_seconds``: every ``sample()`` blocks this long before answering (setting it to 0
      through the property wakes a call that is already blocked).
    - ``unavailable``: ``sample()`` answers ``BackendSample(up=False, error=...)``.
    - ``xid``: GPU index -> Xid codes delivered once, on the next sample in which the GPU is up.
    - ``pcie_link``: GPU index -> (generation, lanes) its PCIe link trained to while the fault is
      set (the maximum stays Gen5 x16, and the link's capacity follows): a degraded link.
    - ``nvlink_errors``: (GPU index, kind) -> errors the GPU's cumulative NVLink error counter of
      that kind (``model.NVLINK_ERROR_KINDS``) gains every cycle while the fault is set, on GPUs
      with NVLink (not in MIG mode); the counts stay after the fault is cleared.
    - ``nvlink_down``: (GPU index, link) of NVLinks that read inactive while the fault is set: the
      GPU's NVLink capacity and its peers' link count drop by one link each.

    Mutate the containers in place or assign new ones; both are safe while sampling runs.
    """

    def __init__(
        self,
        lost: set[int] | None = None,
        unsupported: set[str] | None = None,
        transient: dict[str, int] | None = None,
        hang_seconds: float = 0.0,
        unavailable: bool = False,
        xid: dict[int, list[int]] | None = None,
        pcie_link: dict[int, tuple[int, int]] | None = None,
        nvlink_errors: dict[tuple[int, str], int] | None = None,
        nvlink_down: set[tuple[int, int]] | None = None,
    ) -> None:
        self._cond = threading.Condition()
        self.lost: set[int] = set(lost or ())
        self.unsupported: set[str] = set(unsupported or ())
        self.transient: dict[str, int] = dict(transient or {})
        self._hang_seconds = float(hang_seconds)
        self.unavailable = unavailable
        self.xid: dict[int, list[int]] = {k: list(v) for k, v in (xid or {}).items()}
        self.pcie_link: dict[int, tuple[int, int]] = dict(pcie_link or {})
        self.nvlink_errors: dict[tuple[int, str], int] = dict(nvlink_errors or {})
        self.nvlink_down: set[tuple[int, int]] = set(nvlink_down or ())
        _check_fields(self.unsupported, "unsupported")
        _check_fields(self.transient, "transient")
        for index in self.lost:
            _check_range("lost", index, 0, MAX_GPU_INDEX)
        for count in self.transient.values():
            _check_range("transient", count, 1, MAX_TRANSIENT_CYCLES)
        for index, codes in self.xid.items():
            _check_range("xid GPU", index, 0, MAX_GPU_INDEX)
            for code in codes:
                _check_range("xid", code, 1, MAX_XID)
        for index, (generation, width) in self.pcie_link.items():
            _check_range("pcie_link GPU", index, 0, MAX_GPU_INDEX)
            _check_range("pcie_link generation", generation, 1, MAX_PCIE_GENERATION)
            _check_range("pcie_link width", width, 1, MAX_PCIE_WIDTH)
        for (index, kind), count in self.nvlink_errors.items():
            _check_range("nvlink_errors GPU", index, 0, MAX_GPU_INDEX)
            _check_kind(kind)
            _check_range("nvlink_errors per cycle", count, 1, MAX_NVLINK_ERRORS_PER_CYCLE)
        for index, link in self.nvlink_down:
            _check_range("nvlink_down GPU", index, 0, MAX_GPU_INDEX)
            _check_range("nvlink_down link", link, 0, MAX_NVLINK)
        _check_hang(self._hang_seconds)

    @property
    def hang_seconds(self) -> float:
        """Seconds each ``sample()`` blocks; 0 = no hang."""
        return self._hang_seconds

    @hang_seconds.setter
    def hang_seconds(self, value: float) -> None:
        _check_hang(float(value))
        with self._cond:
            self._hang_seconds = float(value)
            self._cond.notify_all()

    def take(self) -> FaultView:
        """The faults for one cycle; counts down ``transient`` (called once per sample)."""
        with self._cond:
            transient = dict(self.transient)
            failing = frozenset(name for name, left in transient.items() if left > 0)
            self.transient = {name: left - 1 for name, left in transient.items() if left > 1}
            return FaultView(
                lost=frozenset(self.lost),
                unsupported=frozenset(self.unsupported),
                failing=failing,
                hang_seconds=self._hang_seconds,
                unavailable=bool(self.unavailable),
                pcie_link=dict(self.pcie_link),
                nvlink_errors=dict(self.nvlink_errors),
                nvlink_down=frozenset(self.nvlink_down),
            )

    def take_xid(self, index: int) -> tuple[int, ...]:
        """Xid codes pending for GPU ``index``, removed so each is delivered once."""
        with self._cond:
            return tuple(self.xid.pop(index, ()))

    def has_xid(self) -> bool:
        """True if any Xid is waiting to be delivered."""
        return bool(self.xid)

    def hang(self, seconds: float) -> None:
        """Block up to ``seconds``, returning early if ``hang_seconds`` is set to 0 meanwhile."""
        if seconds <= 0:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._hang_seconds <= 0, timeout=seconds)

    @classmethod
    def parse(cls, spec: str) -> SimFaults:
        """Build faults from the ``--sim.faults`` spec, parts separated by ``;``.

        ``lost=3,5``  ``unsupported=fan_speed_ratio,gpm``  ``transient=power_watts:3``
        ``hang=30`` (seconds; ``30s`` and ``500ms`` too)  ``unavailable`` (or ``unavailable=true``)
        ``xid=2:79,3:31``  ``pcie_link=2:4:16,3:5:8`` (GPU 2 trained to Gen4 x16, GPU 3 to Gen5 x8)
        ``nvlink_errors=1:crc_data:5`` (GPU 1 gains 5 CRC data errors a cycle)
        ``nvlink_down=2:5,2:11`` (links 5 and 11 of GPU 2 are down).  Numbers are whole
        ASCII numbers within the ``MAX_*`` limits, the hang a plain decimal; ``hang`` and
        ``unavailable`` may be given once.  An empty spec gives no faults.  A ValueError names
        ``--sim.faults``, the part and the key it could not read.
        """
        lost: set[int] = set()
        unsupported: set[str] = set()
        transient: dict[str, int] = {}
        hang = 0.0
        unavailable = False
        xid: dict[int, list[int]] = {}
        pcie_link: dict[int, tuple[int, int]] = {}
        nvlink_errors: dict[tuple[int, str], int] = {}
        nvlink_down: set[tuple[int, int]] = set()
        seen: set[str] = set()
        for raw in spec.split(";"):
            part = raw.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            try:
                if key in seen and key in ("hang", "unavailable"):
                    raise ValueError(f"{key} is given twice")
                seen.add(key)
                if key == "lost" and sep:
                    lost.update(_whole(v, "lost", 0, MAX_GPU_INDEX) for v in _items(value, "lost", "GPU indices"))
                elif key == "unsupported" and sep:
                    names = set(_items(value, "unsupported", "field names"))
                    _check_fields(names, "unsupported")
                    unsupported |= names
                elif key == "transient" and sep:
                    transient.update(_transient(item) for item in _items(value, "transient", "FIELD[:CYCLES]"))
                    _check_fields(transient, "transient")
                elif key == "hang" and sep:
                    hang = _hang(value)
                elif key == "unavailable":
                    unavailable = _bool(value) if sep else True
                elif key == "xid" and sep:
                    for gpu, code in (_xid(item) for item in _items(value, "xid", "GPU:XID")):
                        xid.setdefault(gpu, []).append(code)
                elif key == "pcie_link" and sep:
                    pcie_link.update(_pcie_link(item) for item in _items(value, "pcie_link", "GPU:GEN:WIDTH"))
                elif key == "nvlink_errors" and sep:
                    items = _items(value, "nvlink_errors", "GPU:KIND:PER_CYCLE")
                    nvlink_errors.update(_nvlink_errors(item) for item in items)
                elif key == "nvlink_down" and sep:
                    nvlink_down.update(_nvlink_down(item) for item in _items(value, "nvlink_down", "GPU:LINK"))
                else:
                    raise ValueError(f"unknown fault {key!r}; {_SPEC_HELP}")
            except ValueError as exc:
                raise ValueError(f"--sim.faults: bad part {part!r}: {exc}") from None
        return cls(lost, unsupported, transient, hang, unavailable, xid, pcie_link, nvlink_errors, nvlink_down)


def _check_range(what: str, value: int, low: int, high: int) -> None:
    """ValueError naming ``what`` unless ``value`` is a whole number in ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} {value!r} is outside {low}..{high}")


def _check_hang(seconds: float) -> None:
    """ValueError unless ``seconds`` is a finite hang in 0..``MAX_HANG_SECONDS``."""
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_HANG_SECONDS):
        raise ValueError(f"hang {seconds!r} is outside 0..{MAX_HANG_SECONDS:g} seconds")


def _items(value: str, key: str, what: str) -> list[str]:
    """The comma-separated items of ``key``'s ``value``, stripped; ValueError when there is none."""
    out = [v.strip() for v in value.split(",") if v.strip()]
    if not out:
        raise ValueError(f"{key}: expected {what}")
    return out


def _whole(text: str, what: str, low: int, high: int) -> int:
    """A whole number ``low..high`` written in ASCII digits (no sign, ``_`` or spaces, unlike ``int()``)."""
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"{what} {text!r} is not a whole number in {low}..{high} written with digits 0-9")
    if len(text) > len(str(high)) or not low <= int(text) <= high:
        raise ValueError(f"{what} {text[:20]!r} is outside {low}..{high}")
    return int(text)


def _transient(item: str) -> tuple[str, int]:
    """``FIELD`` (one cycle) or ``FIELD:CYCLES`` -> (field, cycles)."""
    name, colon, count = item.partition(":")
    if not colon:
        return name, 1
    return name.strip(), _whole(count.strip(), "transient cycles", 1, MAX_TRANSIENT_CYCLES)


def _hang(text: str) -> float:
    """``30``, ``30s``, ``1.5s`` or ``500ms`` -> seconds in 0..``MAX_HANG_SECONDS``."""
    if len(text) > 32:
        raise ValueError(f"hang {text[:20]!r}... is longer than 32 characters")
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(ms|s)?", text)
    if not m:
        raise ValueError(
            f"hang {text!r} is not a number of seconds written with digits 0-9 (no sign, exponent, "
            "nan or inf), such as 30, 30s or 500ms"
        )
    seconds = float(m.group(1)) * (0.001 if m.group(2) == "ms" else 1.0)
    if seconds > MAX_HANG_SECONDS:
        raise ValueError(f"hang {text!r} is longer than {MAX_HANG_SECONDS:g} seconds")
    return seconds


def _xid(item: str) -> tuple[int, int]:
    """``GPU:XID`` -> (GPU index, Xid code)."""
    gpu, colon, code = item.partition(":")
    if not colon:
        raise ValueError(f"xid {item!r}: expected GPU:XID")
    return _whole(gpu.strip(), "xid GPU", 0, MAX_GPU_INDEX), _whole(code.strip(), "xid", 1, MAX_XID)


def _pcie_link(item: str) -> tuple[int, tuple[int, int]]:
    """``GPU:GEN:WIDTH`` -> (GPU index, (generation, lanes))."""
    parts = [p.strip() for p in item.split(":")]
    if len(parts) != 3:
        raise ValueError(f"pcie_link {item!r}: expected GPU:GEN:WIDTH")
    gpu = _whole(parts[0], "pcie_link GPU", 0, MAX_GPU_INDEX)
    generation = _whole(parts[1], "pcie_link generation", 1, MAX_PCIE_GENERATION)
    return gpu, (generation, _whole(parts[2], "pcie_link width", 1, MAX_PCIE_WIDTH))


def _nvlink_errors(item: str) -> tuple[tuple[int, str], int]:
    """``GPU:KIND:PER_CYCLE`` -> ((GPU index, kind), errors per cycle)."""
    parts = [p.strip() for p in item.split(":")]
    if len(parts) != 3:
        raise ValueError(f"nvlink_errors {item!r}: expected GPU:KIND:PER_CYCLE")
    gpu = _whole(parts[0], "nvlink_errors GPU", 0, MAX_GPU_INDEX)
    _check_kind(parts[1])
    return (gpu, parts[1]), _whole(parts[2], "nvlink_errors per cycle", 1, MAX_NVLINK_ERRORS_PER_CYCLE)


def _nvlink_down(item: str) -> tuple[int, int]:
    """``GPU:LINK`` -> (GPU index, link)."""
    gpu, colon, link = item.partition(":")
    if not colon:
        raise ValueError(f"nvlink_down {item!r}: expected GPU:LINK")
    return _whole(gpu.strip(), "nvlink_down GPU", 0, MAX_GPU_INDEX), _whole(
        link.strip(), "nvlink_down link", 0, MAX_NVLINK
    )


def _check_kind(kind: str) -> None:
    if kind not in NVLINK_ERROR_KINDS:
        raise ValueError(f"nvlink_errors kind {kind[:20]!r} is not one of {', '.join(NVLINK_ERROR_KINDS)}")


def _bool(value: str) -> bool:
    low = value.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {value!r}")
