"""Simulated GPU workloads: measured H200 signatures and how each workload varies over time.

A ``Signature`` is what a workload shows while its kernels run alone on a whole H200 (GPM
ratios measured on an H200, docs/boundness.md; NVML utilisation and power).  A ``Workload`` adds time:
``activity(t, rng)`` says which fraction of the window its kernels ran and what it moved over
PCIe / NVLink, so a training job alternates compute and data loading and an inference server
follows a daily load curve while keeping its signature.

Link traffic (bytes per second, the backend turns it into ``LinkTraffic``): a data-parallel
training job all-reduces over NVLink (~90 GB/s each way) while it computes, loads its next data
shard over PCIe (pageable staging, ~22 GB/s, a third of the link: its kernels still hold the
window, ``compute``) and writes a checkpoint out at ~21 GB/s with no kernel (those seconds read
``transfer``); ``HostCopy`` stages data from pinned host memory flat out with no kernels
(51.5 GB/s, 0.82 of a Gen5 x16 link: ``transfer``); an inference server offloading its KV cache
(``Diurnal`` with ``KV_OFFLOAD_BYTES_PER_SECOND``) keeps its memory-bound decode kernels next to
heavy PCIe traffic (``memory``); ``OffloadedOptimizer`` runs its GEMMs while gradients and
weights cross PCIe (``compute``).  Services move a few GB/s of requests; idle processes nothing.
A multi-node job (``AllReduceTraining``) also sends and receives over RDMA NICs (``Activity``'s
``nic_*``), bytes that cross the GPU's PCIe link too.

On another GPU model (exporter/sim/scenarios.py, ``GpuModel``) a workload keeps its time shares,
so its NVML GPU-Util and util.mem read the same; its power and link bytes are the H200's scaled to
that model's power span and link capacities (the backend does it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

GB = 1e9
"""Decimal gigabyte, for link throughputs (bytes/s)."""
H2D_PINNED_BYTES_PER_SECOND = 51.5 * GB
"""Host-to-device copies from pinned memory, back to back, on an H200 (PCIe Gen5 x16): the rate
measured on the H200, 0.82 of the link's 63.0 GB/s (the rest is packet headers and flow control)."""
READ_REQUEST_RATIO = 0.02
"""Bytes the GPU sends per byte it reads from host memory: a host-to-device copy is the GPU's copy
engine reading, and its read requests (some 20 bytes each, asking for 512 bytes to a few KB) cross
the link outwards."""
KV_OFFLOAD_BYTES_PER_SECOND = 30 * GB
"""PCIe traffic into the GPU, at peak load, of an LLM server that keeps its KV cache in host memory
(blocks of resumed and prefix-cached sequences come back; 0.6 of it goes out as evicted blocks)."""


@dataclass(frozen=True)
class Signature:
    """Ratios (0..1) and power (watts) of a workload running flat out alone on a whole H200."""

    sm_active: float
    sm_occupancy: float
    dram_active: float
    tensor_active: float = 0.0
    fp32_active: float = 0.0
    fp16_active: float = 0.0
    fp64_active: float = 0.0
    utilization: float = 0.99
    """NVML GPU-Util while running (time one or more kernels ran)."""
    memory_utilization: float = 0.0
    """NVML util.mem while running."""
    power_watts: float = 75.0
    """Board power it would draw unconstrained; above the 700 W limit the clocks are capped."""
    utilization_band: tuple[float, float] | None = None
    """If set, GPU-Util is drawn inside this band each window (launch-bound kernels jitter)."""
    graphics_activity: float | None = None
    """GPM graphics-engine activity while running, where it differs from GPU-Util; ``None`` = the
    same (they agree within 0.01 for steady kernels).  Copies count in NVML GPU-Util, not in GPM's graphics
    activity: an H200 copying from the host reads GPU-Util 1.0, graphics and SM activity 0."""


# GPM signatures measured on an H200 (docs/boundness.md, 1 s GPM window); power is our estimate.
MEMORY_COPY = Signature(0.99, 0.80, 0.88, utilization=1.0, memory_utilization=1.0, power_watts=540.0)
BF16_GEMM = Signature(
    0.96, 0.14, 0.17, tensor_active=0.93, utilization=0.99, memory_utilization=0.25, power_watts=760.0
)
FP32_GEMM = Signature(0.96, 0.12, 0.03, fp32_active=0.77, utilization=0.99, memory_utilization=0.04, power_watts=610.0)
LAUNCH_BOUND = Signature(
    0.0002, 0.0, 0.0, utilization=0.23, memory_utilization=0.0, power_watts=125.0, utilization_band=(0.19, 0.27)
)
# Not measured, shaped after the rows above: LLM decode streams weights and KV cache (memory
# bound with some tensor work); small-batch encoders sit in between.
LLM_DECODE = Signature(
    0.97,
    0.42,
    0.85,
    tensor_active=0.22,
    fp32_active=0.04,
    fp16_active=0.03,
    utilization=0.99,
    memory_utilization=0.9,
    power_watts=560.0,
)
SMALL_BATCH_INFERENCE = Signature(
    0.55,
    0.22,
    0.30,
    tensor_active=0.38,
    fp16_active=0.05,
    fp32_active=0.03,
    utilization=0.72,
    memory_utilization=0.3,
    power_watts=330.0,
)
FP16_BATCH = Signature(
    0.93,
    0.2,
    0.24,
    tensor_active=0.71,
    fp16_active=0.12,
    utilization=0.98,
    memory_utilization=0.3,
    power_watts=640.0,
)
# Pinned host-to-device copies and no kernel (GPU-Util and GPM as on the H200; power our estimate):
# the copy engine writes 51.5 GB/s into HBM, 1 % of its bandwidth.
HOST_COPY = Signature(
    0.0, 0.0, 0.011, utilization=1.0, graphics_activity=0.0, memory_utilization=0.02, power_watts=140.0
)
IDLE = Signature(0.0, 0.0, 0.0, utilization=0.0, power_watts=0.0)
# A rank waiting in an NCCL collective: NCCL runs one CUDA block per channel, and its 24 blocks
# spin on flags until the peers arrive.  Measured on the H200 (a kernel of 24 spinning blocks):
# SM activity 0.18, occupancy ~0.01, graphics busy and GPU-Util 1.0, DRAM and pipes 0; power our
# estimate.
NCCL_WAIT = Signature(0.18, 0.01, 0.0, utilization=1.0, memory_utilization=0.0, power_watts=210.0)
# Not measured, shaped after NCCL_WAIT: the same blocks moving an all-reduce's data (copying and
# adding bf16 buffers) touch HBM a little, a few percent of its bandwidth.
NCCL_ALLREDUCE = Signature(
    0.18, 0.01, 0.04, fp16_active=0.01, utilization=1.0, memory_utilization=0.04, power_watts=250.0
)


@dataclass(frozen=True)
class Activity:
    """What a workload did over one window."""

    share: float
    """Fraction of the window its kernels ran (0..1); scales its signature."""
    pcie_rx_bytes_per_second: float = 0.0
    pcie_tx_bytes_per_second: float = 0.0
    nvlink_bytes_per_second: float = 0.0
    """Each direction."""
    signature: Signature | None = None
    """What its kernels did in this window, when that changes over time (``Phased``); ``None`` =
    the workload's own signature."""
    nic_tx_bytes_per_second: float = 0.0
    """Bytes its RDMA NICs sent for it (inter-node traffic); the backend spreads them over the
    GPU's nearest NICs.  The NIC reads them from GPU memory over the GPU's PCIe link (directly with
    GPUDirect RDMA, through a host bounce buffer without), so they are in ``pcie_tx`` too."""
    nic_rx_bytes_per_second: float = 0.0
    """Bytes its NICs received for it; in ``pcie_rx`` too."""


@dataclass(frozen=True)
class Workload:
    """A signature plus a time pattern; ``offset_seconds`` desynchronises copies of one pattern."""

    signature: Signature
    offset_seconds: float = 0.0

    def activity(self, t: float, rng: random.Random) -> Activity:
        """Activity over the window ending at simulated time ``t`` (seconds)."""
        raise NotImplementedError


def _jitter(rng: random.Random, level: float, sd: float) -> float:
    return min(1.0, max(0.0, level + rng.gauss(0.0, sd)))


@dataclass(frozen=True)
class Steady(Workload):
    """Runs flat out (batch jobs, copy loops, busy-polling services)."""

    level: float = 0.98
    jitter: float = 0.01
    """Standard deviation of the share around ``level``."""
    pcie_rx: float = 0.3 * GB
    pcie_tx: float = 0.1 * GB
    pause_every_seconds: float = 0.0
    """If > 0, pauses for ``pause_seconds`` this often (writes results over PCIe)."""
    pause_seconds: float = 0.0

    def activity(self, t: float, rng: random.Random) -> Activity:
        if self.pause_every_seconds > 0:
            pos = (t + self.offset_seconds) % self.pause_every_seconds
            if pos < self.pause_seconds:
                return Activity(_jitter(rng, 0.03, 0.01), 0.2 * GB, _jitter(rng, 0.5, 0.05) * 24 * GB)
        return Activity(_jitter(rng, self.level, self.jitter), self.pcie_rx * (0.9 + 0.2 * rng.random()), self.pcie_tx)


@dataclass(frozen=True)
class Diurnal(Workload):
    """An online service: load follows a daily curve (one simulated day per ``period_seconds``)."""

    low: float = 0.2
    high: float = 0.9
    period_seconds: float = 1800.0
    request_bytes: float = 2 * GB
    """PCIe traffic (each way) at peak load."""

    def activity(self, t: float, rng: random.Random) -> Activity:
        phase = 2 * math.pi * (t + self.offset_seconds) / self.period_seconds
        level = self.low + (self.high - self.low) * (0.5 - 0.5 * math.cos(phase))
        share = _jitter(rng, level, 0.015 * (self.high - self.low) + 0.005)
        share = min(self.high, max(self.low, share))
        load = share / self.high if self.high > 0 else 0.0
        return Activity(share, self.request_bytes * load, 0.6 * self.request_bytes * load)


@dataclass(frozen=True)
class Training(Workload):
    """Data-parallel training: compute steps with NVLink all-reduce, stalls while the next data
    shard loads over PCIe, and a checkpoint written out every ``checkpoint_every_seconds``."""

    compute_seconds: float = 50.0
    load_seconds: float = 6.0
    checkpoint_every_seconds: float = 600.0
    checkpoint_seconds: float = 20.0

    def activity(self, t: float, rng: random.Random) -> Activity:
        local = t + self.offset_seconds
        if local % self.checkpoint_every_seconds >= self.checkpoint_every_seconds - self.checkpoint_seconds:
            return Activity(_jitter(rng, 0.02, 0.01), 0.1 * GB, _jitter(rng, 0.8, 0.05) * 26 * GB)
        cycle = self.compute_seconds + self.load_seconds
        if local % cycle >= self.compute_seconds:
            return Activity(_jitter(rng, 0.06, 0.02), _jitter(rng, 0.85, 0.05) * 26 * GB, 0.05 * GB)
        return Activity(_jitter(rng, 0.985, 0.008), 1.2 * GB, 0.05 * GB, _jitter(rng, 0.8, 0.05) * 110 * GB)


@dataclass(frozen=True)
class Bursty(Workload):
    """A lightly used interactive or request-driven process: short bursts, mostly waiting."""

    burst_probability: float = 0.3
    burst_level: float = 0.6

    def activity(self, t: float, rng: random.Random) -> Activity:
        if rng.random() < self.burst_probability:
            share = _jitter(rng, self.burst_level, 0.1)
            return Activity(share, share * 3 * GB, share * GB)
        return Activity(_jitter(rng, 0.01, 0.005), 0.01 * GB, 0.0)


@dataclass(frozen=True)
class Idle(Workload):
    """Holds memory (a CUDA context and tensors) and runs nothing: allocated but idle."""

    signature: Signature = IDLE

    def activity(self, t: float, rng: random.Random) -> Activity:
        return Activity(0.0)


@dataclass(frozen=True)
class Stalled(Workload):
    """A job waiting on its input part of the time: works ``on_seconds`` of every ``period_seconds``.

    Each 1 s window gets the overlap of the working phases with it, so a 1 s period at half duty
    reads 0.5 in every window, and a 4 s period reads whole busy and whole idle windows.
    """

    on_seconds: float = 0.5
    period_seconds: float = 1.0

    def activity(self, t: float, rng: random.Random) -> Activity:
        start, end = t - 1.0 + self.offset_seconds, t + self.offset_seconds
        busy = 0.0
        k = math.floor(start / self.period_seconds)
        while k * self.period_seconds < end:
            on_from = k * self.period_seconds
            busy += max(0.0, min(end, on_from + self.on_seconds) - max(start, on_from))
            k += 1
        share = _jitter(rng, busy * 0.99, 0.005) if busy > 0 else 0.0
        return Activity(share, 0.3 * GB * busy, 0.05 * GB)


@dataclass(frozen=True)
class Phased(Workload):
    """A job that changes what limits it: each phase runs one signature flat out (or nothing,
    for ``IDLE``) for its seconds, and the sequence repeats."""

    phases: tuple[tuple[Signature, float], ...] = ()

    def activity(self, t: float, rng: random.Random) -> Activity:
        cycle = sum(seconds for _, seconds in self.phases)
        pos = (t + self.offset_seconds) % cycle if cycle > 0 else 0.0
        for sig, seconds in self.phases:
            if pos < seconds:
                if sig is IDLE:
                    return Activity(0.0, signature=sig)
                return Activity(_jitter(rng, 0.98, 0.01), 0.3 * GB, 0.1 * GB, signature=sig)
            pos -= seconds
        return Activity(0.0)


@dataclass(frozen=True)
class HostCopy(Workload):
    """Copies between pinned host memory and the GPU, back to back, and no kernel: a data loader
    staging shards into device memory (``rx``), or a job spilling device memory to the host (``tx``).

    The rates are ceilings (pinned copies do not beat them); each window gets ~96-100 % of them.
    """

    signature: Signature = HOST_COPY
    rx_bytes_per_second: float = H2D_PINNED_BYTES_PER_SECOND
    tx_bytes_per_second: float = 0.0

    def activity(self, t: float, rng: random.Random) -> Activity:
        pace = _jitter(rng, 0.985, 0.01)
        rx = self.rx_bytes_per_second * pace
        tx = self.tx_bytes_per_second * pace + READ_REQUEST_RATIO * rx
        # The copies are back to back: the copy engine idles only between two memcpy calls.
        return Activity(_jitter(rng, 0.995, 0.003), rx, tx)


@dataclass(frozen=True)
class OffloadedOptimizer(Workload):
    """Training with the optimizer's state and update in host memory (ZeRO-Offload style).

    Each step runs forward and backward GEMMs for ``compute_seconds`` while the gradients stream
    out to the host and part of the previous update's weights stream back, then the GPU waits
    ``upload_seconds`` while the rest of the weights arrive from pinned buffers, running only a few
    cast kernels.  The defaults are a 30B-parameter model (60 GB of bf16 weights, as many gradient
    bytes each step): 7.5 GB/s out over 8 s of GEMMs, 1.4 GB/s in meanwhile (11 GB), and 49 GB in
    the 1 s wait.  The GEMMs hold the busy time (``compute``); PCIe is 0.1-0.8 of its capacity.
    """

    compute_seconds: float = 8.0
    upload_seconds: float = 1.0
    gradient_bytes_per_second: float = 7.5 * GB
    overlapped_weight_bytes_per_second: float = 1.4 * GB

    def activity(self, t: float, rng: random.Random) -> Activity:
        local = (t + self.offset_seconds) % (self.compute_seconds + self.upload_seconds)
        if local >= self.compute_seconds:
            rx = _jitter(rng, 0.95, 0.02) * H2D_PINNED_BYTES_PER_SECOND
            return Activity(_jitter(rng, 0.05, 0.01), rx, READ_REQUEST_RATIO * rx)
        rx = self.overlapped_weight_bytes_per_second * (0.9 + 0.2 * rng.random())
        tx = self.gradient_bytes_per_second * (0.9 + 0.2 * rng.random()) + READ_REQUEST_RATIO * rx
        return Activity(_jitter(rng, 0.97, 0.01), rx, tx)


def _overlap(start: float, end: float, period: float, lo: float, hi: float) -> float:
    """Seconds of ``[start, end]`` that fall in ``[lo, hi)`` of a cycle repeating every ``period``."""
    total = 0.0
    k = math.floor((start - hi) / period) + 1
    while k * period + lo < end:
        total += max(0.0, min(end, k * period + hi) - max(start, k * period + lo))
        k += 1
    return total


def blend(parts: tuple[tuple[Signature, float], ...]) -> Signature:
    """The signature of a window in which each ``(signature, seconds)`` ran for its seconds: every
    ratio and the power weighted by time (GPM and NVML average over the window)."""
    total = sum(seconds for _, seconds in parts)
    if total <= 0:
        return IDLE

    def mean(name: str) -> float:
        return sum(float(getattr(sig, name)) * seconds for sig, seconds in parts) / total

    graphics = [sig.graphics_activity for sig, _ in parts]
    return Signature(
        mean("sm_active"),
        mean("sm_occupancy"),
        mean("dram_active"),
        tensor_active=mean("tensor_active"),
        fp32_active=mean("fp32_active"),
        fp16_active=mean("fp16_active"),
        fp64_active=mean("fp64_active"),
        utilization=mean("utilization"),
        memory_utilization=mean("memory_utilization"),
        power_watts=mean("power_watts"),
        graphics_activity=None
        if all(g is None for g in graphics)
        else sum((g if g is not None else sig.utilization) * s for (sig, s), g in zip(parts, graphics, strict=True))
        / total,
    )


@dataclass(frozen=True)
class AllReduceTraining(Workload):
    """One rank of synchronous data-parallel training across nodes: each step it computes
    (``signature``) for ``compute_seconds``, waits in NCCL (``NCCL_WAIT``: no traffic) until the
    slowest rank has computed (``slowest_compute_seconds``), then all-reduces the gradients
    (``NCCL_ALLREDUCE``): ``nic_bytes_per_step`` each way over its NICs at ``nic_bytes_per_second``
    (the inter-node hop) while NVLink carries ``nvlink_bytes_per_second`` each way (the intra-node
    hops of NCCL's rings, at the network hop's pace).

    Each 1 s window gets the phases' overlaps with it (as ``Stalled`` does) and their blended
    signature, so over the classifier's window the class is the phase that holds most of the busy
    time: a rank that waits and all-reduces longer than it computes spins in NCCL most of the time.
    The ranks run in lock step (no ``offset_seconds``).  Sizes in bytes, rates in bytes/s each way.
    """

    signature: Signature = BF16_GEMM
    compute_seconds: float = 2.0
    slowest_compute_seconds: float = 2.0
    """When the slowest rank of the job finishes computing (>= ``compute_seconds``)."""
    nic_bytes_per_step: float = 23.25 * GB
    nic_bytes_per_second: float = 93 * GB / 8
    nvlink_bytes_per_second: float = 93 * GB
    loader_bytes_per_second: float = 0.05 * GB
    """The next batch's tokens over PCIe while it computes."""

    @property
    def allreduce_seconds(self) -> float:
        """How long the all-reduce of one step takes."""
        return self.nic_bytes_per_step / self.nic_bytes_per_second

    @property
    def step_seconds(self) -> float:
        """One training step: the slowest rank's compute, then the all-reduce."""
        return max(self.compute_seconds, self.slowest_compute_seconds) + self.allreduce_seconds

    def phase_seconds(self, t: float) -> tuple[float, float, float]:
        """Seconds of compute, NCCL wait and all-reduce in the 1 s window ending at ``t``."""
        start, end = t - 1.0 + self.offset_seconds, t + self.offset_seconds
        period = self.step_seconds
        synced = max(self.compute_seconds, self.slowest_compute_seconds)
        return (
            _overlap(start, end, period, 0.0, self.compute_seconds),
            _overlap(start, end, period, self.compute_seconds, synced),
            _overlap(start, end, period, synced, period),
        )

    def activity(self, t: float, rng: random.Random) -> Activity:
        compute, wait, allreduce = self.phase_seconds(t)
        busy = compute + wait + allreduce
        if busy <= 0:
            return Activity(0.0)
        sig = blend(((self.signature, compute), (NCCL_WAIT, wait), (NCCL_ALLREDUCE, allreduce)))
        pace = _jitter(rng, 0.99, 0.008) if allreduce > 0 else 0.0
        nic = self.nic_bytes_per_second * pace * allreduce
        loader = self.loader_bytes_per_second * compute
        return Activity(
            _jitter(rng, 0.995 * busy, 0.002),
            pcie_rx_bytes_per_second=nic + loader,
            pcie_tx_bytes_per_second=nic,
            nvlink_bytes_per_second=self.nvlink_bytes_per_second * pace * allreduce,
            signature=sig,
            nic_tx_bytes_per_second=nic,
            nic_rx_bytes_per_second=nic,
        )


@dataclass(frozen=True)
class Serving(Workload):
    """An inference server's GPU (exporter/sim/serving.py): busy ``level`` of the time with its
    signature (dense GEMMs for a prefill pod, weight and KV-cache reads for decode), requests and
    responses over PCIe, and the KV cache a disaggregated pair moves at full load: ``kv_nvlink``
    bytes/s each way over NVLink (a peer GPU on this node) and ``kv_nic_tx`` / ``kv_nic_rx`` over its
    RDMA NICs (a peer on another node; in its PCIe traffic too, as the NIC reads GPU memory)."""

    level: float = 0.9
    jitter: float = 0.01
    kv_nvlink: float = 0.0
    kv_nic_tx: float = 0.0
    kv_nic_rx: float = 0.0
    request_bytes: float = 0.05 * GB
    """PCIe traffic in (tokens, images) at full load; a tenth of it goes out."""

    def activity(self, t: float, rng: random.Random) -> Activity:
        share = _jitter(rng, self.level, self.jitter)
        load = share / self.level if self.level > 0 else 0.0
        return Activity(
            share,
            pcie_rx_bytes_per_second=(self.request_bytes + self.kv_nic_rx) * load,
            pcie_tx_bytes_per_second=(0.1 * self.request_bytes + self.kv_nic_tx) * load,
            nvlink_bytes_per_second=self.kv_nvlink * load,
            nic_tx_bytes_per_second=self.kv_nic_tx * load,
            nic_rx_bytes_per_second=self.kv_nic_rx * load,
        )
