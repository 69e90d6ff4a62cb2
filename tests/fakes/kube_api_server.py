"""A small Kubernetes API emulator on loopback: pod list + watch (chunked JSON lines) and job GET.

Written instead of using ``kmock`` (PyPI 0.8): kmock is asyncio/aiohttp-based (three new test
dependencies, and an event loop thread next to our synchronous client), ignores ``fieldSelector``
(so a node-scoped watch cannot be verified), answers lists with ``resourceVersion: "..."`` (so
resuming a watch from a version and 410 Gone cannot be exercised), and calls itself early v0.
This one does exactly what the real API server does for the calls gpulens makes, plus faults.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


def make_pod(
    name: str,
    namespace: str = "default",
    uid: str | None = None,
    node: str = "gpu-node-1",
    phase: str = "Running",
    owner: tuple[str, str] | None = None,
    labels: dict[str, str] | None = None,
    containers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod object as the API returns it; ``containers`` maps container name -> runtime ID."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "labels": labels or {},
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": "o", "controller": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": c} for c in (containers or {"main": ""})]},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": c, "containerID": f"containerd://{cid}"} for c, cid in (containers or {}).items() if cid
            ],
        },
    }


class KubeApiEmulator:
    """Pods with resource versions and an event log; watches stream events after a version.

    Faults: ``fail_status`` answers every pod request with that HTTP status; ``expire_watches``
    answers watches with a 410 Gone ERROR event; ``drop_watches()`` cuts open streams;
    ``jobs_forbidden`` answers job GETs with 403.  ``stop()``/``start()`` keep the port.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.fail_status: int | None = None
        self.expire_watches = False
        self.jobs_forbidden = False
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._generation = 0
        self._server: ThreadingHTTPServer | None = None
        self.port = 0

    # --- state ---------------------------------------------------------------------------

    def _bump(self, kind: str, pod: dict[str, Any]) -> None:
        self.rv += 1
        pod = json.loads(json.dumps(pod))
        pod["metadata"]["resourceVersion"] = str(self.rv)
        if kind != "DELETED":
            self.pods[pod["metadata"]["uid"]] = pod
        self.events.append((self.rv, kind, pod))
        self.cond.notify_all()

    def put(self, pod: dict[str, Any]) -> None:
        """Create or update a pod (ADDED / MODIFIED event)."""
        with self.cond:
            kind = "MODIFIED" if pod["metadata"]["uid"] in self.pods else "ADDED"
            self._bump(kind, pod)

    def delete(self, uid: str) -> None:
        """Delete a pod (DELETED event)."""
        with self.cond:
            pod = self.pods.pop(uid)
            self._bump("DELETED", pod)

    def bookmark(self) -> int:
        """Advance the resource version without a pod change and send a BOOKMARK event."""
        with self.cond:
            self.rv += 1
            obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}}
            self.events.append((self.rv, "BOOKMARK", obj))
            self.cond.notify_all()
            return self.rv

    def add_job(self, namespace: str, name: str, cronjob: str | None) -> None:
        """A Job, owned by ``cronjob`` if given."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if cronjob:
            meta["ownerReferences"] = [{"kind": "CronJob", "name": cronjob, "controller": True}]
        self.jobs[(namespace, name)] = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta}

    def drop_watches(self) -> None:
        """End every open watch stream (like an API server restart or a load balancer idle cut)."""
        with self.cond:
            self._generation += 1
            self.cond.notify_all()

    def watch_count(self) -> int:
        return sum(1 for _, q in self.requests if q.get("watch") == "true")

    def list_count(self) -> int:
        return sum(1 for p, q in self.requests if p == "/api/v1/pods" and q.get("watch") != "true")

    # --- server --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> KubeApiEmulator:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                emulator._handle(self)

        ThreadingHTTPServer.allow_reuse_address = True
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="kube-api-emulator", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Stop listening (the port refuses connections) and cut open watches."""
        self.drop_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KubeApiEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- request handling ----------------------------------------------------------------

    @staticmethod
    def _send_json(h: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _status(code: int, reason: str, message: str) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        self.requests.append((parsed.path, query))
        parts = parsed.path.strip("/").split("/")
        if parts[:4] == ["apis", "batch", "v1", "namespaces"] and len(parts) == 7 and parts[5] == "jobs":
            if self.jobs_forbidden:
                self._send_json(h, 403, self._status(403, "Forbidden", "jobs.batch is forbidden"))
            elif (parts[4], parts[6]) in self.jobs:
                self._send_json(h, 200, self.jobs[(parts[4], parts[6])])
            else:
                self._send_json(h, 404, self._status(404, "NotFound", "job not found"))
            return
        if parsed.path != "/api/v1/pods":
            self._send_json(h, 404, self._status(404, "NotFound", parsed.path))
            return
        if self.fail_status is not None:
            reason = {403: "Forbidden", 500: "InternalError"}.get(self.fail_status, "Error")
            msg = 'pods is forbidden: User "system:serviceaccount:gpulens:gpulens" cannot list resource "pods"'
            self._send_json(h, self.fail_status, self._status(self.fail_status, reason, msg))
            return
        node = None
        selector = query.get("fieldSelector", "")
        if selector.startswith("spec.nodeName="):
            node = selector.split("=", 1)[1]

        def on_node(pod: dict[str, Any]) -> bool:
            if "spec" not in pod:
                return True  # a bookmark: every watcher gets it
            return node is None or pod["spec"].get("nodeName") == node

        if query.get("watch") != "true":
            with self.cond:
                items = [p for p in self.pods.values() if on_node(p)]
                body = {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            self._send_json(h, 200, body)
            return
        self._stream_watch(
            h, int(query.get("resourceVersion") or 0), float(query.get("timeoutSeconds") or 300), on_node
        )

    def _stream_watch(self, h: BaseHTTPRequestHandler, since: int, timeout: float, on_node: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(obj: dict[str, Any]) -> None:
            data = (json.dumps(obj) + "\n").encode()
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        try:
            if self.expire_watches:
                chunk({"type": "ERROR", "object": self._status(410, "Expired", "too old resource version")})
            else:
                with self.cond:
                    generation = self._generation
                sent = since
                deadline = timeout
                while True:
                    with self.cond:
                        pending = [(rv, k, p) for rv, k, p in self.events if rv > sent]
                        if not pending and generation == self._generation:
                            if not self.cond.wait(timeout=min(deadline, 0.1)):
                                deadline -= 0.1
                            pending = [(rv, k, p) for rv, k, p in self.events if rv > sent]
                        if generation != self._generation or deadline <= 0:
                            break
                    for rv, kind, pod in pending:
                        sent = rv
                        if on_node(pod):
                            chunk({"type": kind, "object": pod})
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        h.close_connection = True
