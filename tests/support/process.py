"""A child process that lives for a ``with`` block: started, waited on until ready, stopped."""

from __future__ import annotations

import os
import ssl
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.net import wait_http

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def managed_process(
    argv: Sequence[str],
    ready_url: str,
    *,
    log: Path | None = None,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    ready_context: ssl.SSLContext | None = None,
    ready_headers: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv``, wait until ``ready_url`` answers 200, yield the process; SIGTERM (then
    SIGKILL after 10 s) on exit.  If it never gets ready, RuntimeError carries its log's tail.
    Output goes to ``log`` (kept) or to a temporary file.  ``ready_context`` / ``ready_headers``
    reach an https or authenticated ``ready_url``."""
    with open(log, "wb") if log else tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        try:
            try:
                wait_http(ready_url, timeout=timeout, context=ready_context, headers=ready_headers)
            except TimeoutError:
                proc.kill()
                proc.wait()
                out.flush()
                out.seek(0)
                tail = (log.read_bytes() if log else out.read()).decode(errors="replace")[-4000:]
                raise RuntimeError(f"{argv[0]} did not become ready at {ready_url}:\n{tail}") from None
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes], grace_seconds: float = 10.0) -> None:
    """End ``proc`` if it still runs: SIGTERM, then SIGKILL after ``grace_seconds``; reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
