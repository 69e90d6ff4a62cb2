"""``gpulens-probe`` / ``python -m probes``: run the bandwidth probes once, print one JSON object.

Exit 0 with the results; on failure a non-zero exit and ``{"error": {"type": ..., "message": ...}}``
on stdout.  The exporter's probe scheduler runs this in a child process with a hard timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from probes.bandwidth import (
    CUDA_ERROR_MEMORY_ALLOCATION,
    ArrayDevice,
    BufferPlan,
    CupyDevice,
    MiB,
    NumpyDevice,
    ProbeError,
    load_cuda_runtime,
    plan_buffers,
)

EXIT_CODES: dict[str, int] = {
    "error": 1,
    "usage": 2,
    "timeout": 3,
    "out_of_memory": 4,
    "insufficient_memory": 4,
    "unavailable": 5,
    "device_not_found": 5,
    "cuda_error": 6,
}
"""Exit status per error type (the JSON error says the same in words)."""

NUMPY_MAX_COPY_BYTES = 32 * MiB
"""NumPy stands in for a GPU in CI: keep its run to a fraction of a second."""

MAX_TIMEOUT_SECONDS = 3600.0
"""Longest ``--timeout``: the exporter's ``--probes.timeout`` limit (it passes 90 % of that)."""
MAX_BUFFER_BYTES = 1 << 60
"""Largest ``--buffer-bytes`` / ``--transfer-bytes`` (1 EiB, the exporter's size limit); a size
above free memory is still tried and ends as an ``out_of_memory`` error."""
MAX_COPIES = 1000
"""Most ``--warmup`` and ``--repeats`` copies."""
MAX_DEVICE_INDEX = 255
"""Highest ``--device`` index."""
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID = re.compile(rf"GPU-{_HEX_UUID}|MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/[0-9]{{1,3}}/[0-9]{{1,3}}")
"""A GPU UUID, a MIG UUID, or a MIG instance in the older ``MIG-GPU-<uuid>/<gi>/<ci>`` form."""

_output_lock = threading.Lock()
_emitted = False


def _emit(doc: dict[str, Any]) -> bool:
    """Print ``doc`` as the process's single JSON line; False if something was printed already."""
    global _emitted
    with _output_lock:
        if _emitted:
            return False
        _emitted = True
        sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
        sys.stdout.flush()
        return True


def _error(kind: str, message: str) -> int:
    _emit({"error": {"type": kind, "message": message}})
    return EXIT_CODES.get(kind, 1)


class _JsonArgumentParser(argparse.ArgumentParser):
    """Usage errors are failures too: report them as the JSON error the caller parses (and, as
    argparse does, on stderr for a person)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(_error("usage", message))


def _seconds(text: str) -> float:
    """``--timeout``: seconds, more than 0 and at most ``MAX_TIMEOUT_SECONDS``, as a plain ASCII
    decimal (``float()`` would also take ``inf``, ``nan``, exponents, ``_`` and other digits)."""
    if len(text) > 32 or not re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
        raise argparse.ArgumentTypeError(
            f"{text[:32]!r} is not a number of seconds written with digits 0-9 (no sign, exponent, nan or inf)"
        )
    value = float(text)
    if not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 and at most {MAX_TIMEOUT_SECONDS:g} seconds")
    return value


def _whole(low: int, high: int, high_shown: str = "") -> Callable[[str], int]:
    """A parser of whole numbers ``low..high`` (``high_shown`` names ``high`` in messages) in ASCII
    digits (``int()`` would also take a sign, ``_``, spaces and other scripts' digits)."""
    span = f"{low}..{high_shown or high}"

    def parse(text: str) -> int:
        if not re.fullmatch(r"[0-9]+", text):
            raise argparse.ArgumentTypeError(f"{text[:32]!r} is not a whole number written with digits 0-9 ({span})")
        if len(text) > len(str(high)) or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"{text[:32]!r} is outside {span}")
        return int(text)

    return parse


def _uuid(text: str) -> str:
    """``--uuid``: ``GPU-<uuid>``, ``MIG-<uuid>`` or ``MIG-GPU-<uuid>/<gi>/<ci>``; anything else
    (an empty string, a list, an index) would make ``CUDA_VISIBLE_DEVICES`` pick another GPU or none."""
    if not _UUID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a GPU-... or MIG-... UUID")
    return text


def _parser() -> argparse.ArgumentParser:
    p = _JsonArgumentParser(prog="gpulens-probe", description=__doc__)
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--device",
        type=_whole(0, MAX_DEVICE_INDEX),
        help=f"GPU index as nvidia-smi numbers them (PCI bus order), 0..{MAX_DEVICE_INDEX}",
    )
    which.add_argument("--uuid", type=_uuid, help="GPU-... or MIG-... UUID of the GPU or MIG instance to probe")
    p.add_argument("--array", choices=("cupy", "numpy"), default="cupy", help="array module (default cupy)")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=10.0,
        help=f"give up after S seconds, more than 0 and at most {MAX_TIMEOUT_SECONDS:g} (default 10)",
    )
    p.add_argument(
        "--warmup",
        type=_whole(0, MAX_COPIES),
        default=1,
        help=f"untimed copies before measuring, 0..{MAX_COPIES} (default 1)",
    )
    p.add_argument(
        "--repeats",
        type=_whole(1, MAX_COPIES),
        default=5,
        help=f"timed copies, 1..{MAX_COPIES}; the median is reported (default 5)",
    )
    p.add_argument(
        "--buffer-bytes",
        type=_whole(1, MAX_BUFFER_BYTES, "2^60"),
        help="HBM copy buffer size in bytes, 1..2^60 (default: from L2 and free)",
    )
    p.add_argument(
        "--transfer-bytes",
        type=_whole(1, MAX_BUFFER_BYTES, "2^60"),
        default=24 * MiB,
        help="pinned H2D/D2H buffer size in bytes, 1..2^60 (default 24 MiB)",
    )
    return p


def _start_watchdog(timeout: float) -> threading.Timer:
    """Exit with a JSON timeout error if the probe is still running after ``timeout`` seconds.

    The scheduler's kill is the hard limit; this gives it a readable reason first.
    """

    def expire() -> None:
        if _emit({"error": {"type": "timeout", "message": f"probe exceeded {timeout:g} s"}}):
            os._exit(EXIT_CODES["timeout"])

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    return timer


def _open_device(args: argparse.Namespace) -> ArrayDevice:
    if args.array == "numpy":
        return NumpyDevice()
    # Narrow visibility before CUDA initialises: the context then exists on the probed GPU only,
    # and a MIG instance can only be addressed this way.
    if args.uuid:
        os.environ["CUDA_VISIBLE_DEVICES"] = args.uuid
        index = 0
    else:
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # match nvidia-smi / NVML indices
        index = args.device or 0
    return CupyDevice(index, load_cuda_runtime())


def _classify(exc: BaseException) -> str:
    """Error type for an exception raised by NumPy or CuPy, by class name (CuPy stays optional)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, MemoryError) or "OutOfMemoryError" in names:
        return "out_of_memory"
    if "CUDARuntimeError" in names and getattr(exc, "status", None) == CUDA_ERROR_MEMORY_ALLOCATION:
        return "out_of_memory"
    if names & {"CUDARuntimeError", "CUDADriverError"}:
        return "cuda_error"
    return "error"


def _plan(args: argparse.Namespace, device: ArrayDevice) -> BufferPlan:
    if args.buffer_bytes is not None:
        if args.buffer_bytes <= 0 or args.transfer_bytes <= 0:
            raise ProbeError("usage", "--buffer-bytes and --transfer-bytes must be positive")
        return BufferPlan(copy_bytes=args.buffer_bytes, transfer_bytes=args.transfer_bytes)
    if device.info.array == "numpy":
        return plan_buffers(
            device.info,
            min_cache_multiple=0,
            transfer_bytes=min(args.transfer_bytes, 8 * MiB),
            max_copy_bytes=NUMPY_MAX_COPY_BYTES,
        )
    return plan_buffers(device.info, transfer_bytes=args.transfer_bytes)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Open the device, size the buffers, run the probes; the JSON document as a dict."""
    from probes.bandwidth import run_probes

    started = time.perf_counter()
    device = _open_device(args)
    opened = time.perf_counter()
    try:
        plan = _plan(args, device)
        results = run_probes(device, plan, warmup=args.warmup, repeats=args.repeats)
    except BaseException:
        with contextlib.suppress(Exception):  # report the probe's failure, not a cleanup one
            device.close()
        raise
    device.close()
    info = device.info
    return {
        "array": info.array,
        "device": {
            "index": info.index,
            "uuid": args.uuid or info.uuid,
            "name": info.name,
            "pci_bus_id": info.pci_bus_id,
            "cache_bytes": info.cache_bytes,
            "free_bytes": info.free_bytes,
            "total_bytes": info.total_bytes,
        },
        "buffers": {"copy_bytes": plan.copy_bytes, "transfer_bytes": plan.transfer_bytes},
        "probes": {name: m.as_json() for name, m in results.items()},
        "gpu_seconds": sum(m.gpu_seconds for m in results.values()),
        "init_seconds": opened - started,
        "wall_seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gpulens-probe``; returns the exit status."""
    args = _parser().parse_args(argv)  # every value checked: a bad one exits 2 with a JSON usage error
    watchdog = _start_watchdog(args.timeout)
    try:
        doc = run(args)
    except ProbeError as exc:
        return _error(exc.kind, str(exc))
    except Exception as exc:  # any NumPy/CuPy failure must still end as one JSON error line
        return _error(_classify(exc), f"{type(exc).__name__}: {exc}")
    finally:
        watchdog.cancel()
    _emit(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
