"""Fault injection for the simulated backend: what tests and the CLI flip at run time.

A ``SimFaults`` object is shared between the code that injects faults (a test, the CLI's
``--sim.faults`` spec) and ``SimulatedBackend``, which consumes it once per ``sample()``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

from exporter.model import GpmSample, GpuSample, LeafSample

_IDENTITY_FIELDS = frozenset({"index", "uuid", "up", "leaves", "mig", "processes", "xid_events", "window_seconds"})

FAULTABLE_FIELDS: frozenset[str] = frozenset(
    f.name for cls in (GpuSample, LeafSample, GpmSample) for f in fields(cls) if f.name not in _IDENTITY_FIELDS
)
"""Field names that ``unsupported`` / ``transient`` may name: GpuSample, LeafSample and
GpmSample fields except identity.  ``gpm`` drops the whole GPM sample (a pre-Hopper GPU)."""


@dataclass(frozen=True)
class FaultView:
    """The faults that apply to one ``sample()`` call, taken atomically from ``SimFaults``."""

    lost: frozenset[int]
    unsupported: frozenset[str]
    failing: frozenset[str]
    """Fields that fail transiently in this cycle."""
    hang_seconds: float
    unavailable: bool

    @property
    def none_fields(self) -> frozenset[str]:
        """Fields that read ``None`` in this cycle (unsupported or failing)."""
        return self.unsupported | self.failing

    @property
    def quiet(self) -> bool:
        """True when no fault changes any value in this cycle (the fast path)."""
        return not (self.lost or self.unsupported or self.failing or self.unavailable)


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
    ) -> None:
        self._cond = threading.Condition()
        self.lost: set[int] = set(lost or ())
        self.unsupported: set[str] = set(unsupported or ())
        self.transient: dict[str, int] = dict(transient or {})
        self._hang_seconds = float(hang_seconds)
        self.unavailable = unavailable
        self.xid: dict[int, list[int]] = {k: list(v) for k, v in (xid or {}).items()}
        _check_fields(self.unsupported, "unsupported")
        _check_fields(self.transient, "transient")
        if self._hang_seconds < 0:
            raise ValueError(f"hang: must be >= 0 seconds, got {hang_seconds}")

    @property
    def hang_seconds(self) -> float:
        """Seconds each ``sample()`` blocks; 0 = no hang."""
        return self._hang_seconds

    @hang_seconds.setter
    def hang_seconds(self, value: float) -> None:
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
        """Build faults from a CLI spec, parts separated by ``;``.

        ``lost=3,5``  ``unsupported=fan_speed_ratio,gpm``  ``transient=power_watts:3``
        ``hang=30`` (seconds)  ``unavailable`` (or ``unavailable=true``)  ``xid=2:79,3:31``.
        An empty spec gives no faults.  A ValueError names the part it could not read.
        """
        lost: set[int] = set()
        unsupported: set[str] = set()
        transient: dict[str, int] = {}
        hang = 0.0
        unavailable = False
        xid: dict[int, list[int]] = {}
        for raw in spec.split(";"):
            part = raw.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            try:
                if key == "lost" and sep:
                    lost.update(_ints(value))
                elif key == "unsupported" and sep:
                    names = {n.strip() for n in value.split(",") if n.strip()}
                    _check_fields(names, "unsupported")
                    unsupported |= names
                elif key == "transient" and sep:
                    for item in value.split(","):
                        name, _, count = item.partition(":")
                        transient[name.strip()] = int(count) if count.strip() else 1
                    _check_fields(transient, "transient")
                elif key == "hang" and sep:
                    hang = float(value.removesuffix("s"))
                    if hang < 0:
                        raise ValueError("must be >= 0")
                elif key == "unavailable":
                    unavailable = _bool(value) if sep else True
                elif key == "xid" and sep:
                    for item in value.split(","):
                        gpu, colon, code = item.partition(":")
                        if not colon:
                            raise ValueError("expected GPU:XID")
                        xid.setdefault(int(gpu), []).append(int(code))
                else:
                    raise ValueError("unknown fault; valid: lost=, unsupported=, transient=, hang=, unavailable, xid=")
            except ValueError as exc:
                raise ValueError(f"bad fault spec part {part!r}: {exc}") from None
        return cls(lost, unsupported, transient, hang, unavailable, xid)


def _ints(value: str) -> set[int]:
    out = {int(v) for v in value.split(",") if v.strip()}
    if not out or any(v < 0 for v in out):
        raise ValueError("expected GPU indices >= 0")
    return out


def _bool(value: str) -> bool:
    low = value.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {value!r}")
