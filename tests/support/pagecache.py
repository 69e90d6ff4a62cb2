"""Put a machine's page cache back in its just-booted state, so start-up times can be measured cold.

``drop_page_cache()`` writes ``3`` to ``/proc/sys/vm/drop_caches`` (root on a real kernel or a VM).
Where that is refused (a container without it), it evicts the files a CUDA probe process reads —
the Python standard library, the CuPy / NumPy / NVIDIA wheels and the driver's libraries — with
``posix_fadvise(POSIX_FADV_DONTNEED)``, which any reader of a file may do.  Either way it returns
which method worked, so a report can say how cold "cold" was.
"""

from __future__ import annotations

import ctypes.util
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

PROBE_PACKAGES = ("cupy", "cupy_backends", "numpy", "numpy.libs", "nvidia", "cuda", "fastrlock", "probes")
"""Top-level names under site-packages whose files the probe process loads (prefix match)."""


def _files(roots: Iterable[Path]) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
        elif root.is_dir():
            for dirpath, _, names in os.walk(root):
                for name in names:
                    yield Path(dirpath, name)


def _probe_roots() -> list[Path]:
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sys.executable).resolve()]
    for sp in {*site.getsitepackages(), sysconfig.get_paths()["purelib"]}:
        base = Path(sp)
        if base.is_dir():
            roots += [p for p in base.iterdir() if p.name.split("-")[0].startswith(PROBE_PACKAGES)]
    cuda = ctypes.util.find_library("cuda")
    for directory in {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64"}:
        d = Path(directory)
        if d.is_dir():
            roots += [p for p in d.iterdir() if p.name.startswith(("libcuda", "libnvidia"))]
    if cuda:
        roots.append(Path(cuda))
    return roots


def evict_files(roots: Iterable[Path]) -> int:
    """Drop the cached pages of every file under ``roots``; the number of files evicted."""
    count = 0
    for path in _files(roots):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return count


def drop_page_cache() -> str:
    """Empty the page cache (or at least evict the probe's files); the method used, for the report."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        return f"fadvise({evict_files(_probe_roots())} files)"
