"""Purge from a Debian root filesystem every package the image does not need at run time.

Run by ``scripts/image.sh`` as an mmdebstrap customize hook: ``python3 trim_rootfs.py ROOT PKG...``.
Keeps the named packages and everything they depend on (Depends and Pre-Depends, first
alternative that is installed), and purges the rest of the Essential set (perl, coreutils, bash,
util-linux, login...), which dpkg needed to install the packages but a Python service never runs.
Prints the kept packages, one per line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def installed(root: str) -> dict[str, list[list[str]]]:
    """Package -> its dependencies as lists of alternatives (names only), read from dpkg's status."""
    out = subprocess.run(
        ["chroot", root, "dpkg-query", "-W", "-f", "${Package}\t${Pre-Depends}, ${Depends}\n"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    deps: dict[str, list[list[str]]] = {}
    for line in out.splitlines():
        name, _, rest = line.partition("\t")
        groups = [g for g in (g.strip() for g in rest.split(",")) if g]
        deps[name] = [[re.split(r"[\s(:]", alt.strip())[0] for alt in g.split("|")] for g in groups]
    return deps


def closure(deps: dict[str, list[list[str]]], roots: list[str]) -> set[str]:
    """The roots and every installed package they need."""
    keep: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in keep or name not in deps:
            continue
        keep.add(name)
        for group in deps[name]:
            todo.extend(alt for alt in group[:1] if alt in deps)
            todo.extend(alt for alt in group[1:] if alt in deps and group[0] not in deps)
    return keep


def main(argv: list[str]) -> int:
    root, roots = argv[0], argv[1:]
    deps = installed(root)
    missing = [r for r in roots if r not in deps]
    if missing:
        print(f"trim_rootfs: not installed: {', '.join(missing)}", file=sys.stderr)
        return 2
    keep = closure(deps, roots)
    purge = sorted(set(deps) - keep)
    # Their removal scripts stop services, update alternatives and ask debconf, all with tools
    # that are themselves being purged; nothing runs in an image, so the scripts are dropped.
    info = Path(root, "var/lib/dpkg/info")
    for name in purge:
        for script in info.glob(f"{name}[.:]*"):
            if script.suffix in (".prerm", ".postrm"):
                script.unlink()
    if purge:
        subprocess.run(
            ["chroot", root, "dpkg", "--purge", "--force-remove-essential", "--force-depends", *purge],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    print("\n".join(sorted(keep)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
