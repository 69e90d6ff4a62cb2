#!/usr/bin/env bash
# The demo (README command 1): the exporter plus the dashboard on this machine.
# With an NVIDIA driver the exporter reads the real GPUs (--backend auto); without one it serves the
# simulated 8 x H200 fleet (set GPULENS_SIM_SCENARIO=mig|mig7x8|timeslice|mps|a100|l40s|a10g|p5en|p5en-nogdr for the others;
# GPULENS_SIM_SCENARIO=jobs runs two nodes, jobs-0 and jobs-1, on EXPORTER_PORT and the next port: four two-node jobs;
# GPULENS_SIM_SCENARIO=serving adds the node's inference engines' own /metrics, one port a pod from GPULENS_ENGINES_PORT
# (9500), with a Prometheus file_sd list of them in .demo/serving-targets.json: docs/serving.md).
# Ctrl-C stops them all.  Ports: GPULENS_EXPORTER_PORT (9445), GPULENS_DASHBOARD_PORT (8501).
set -euo pipefail
cd "$(dirname "$0")/.."
# uv from PATH, or fetched into .tools/ by the standard library alone: a stock Debian or Ubuntu Python
# refuses pip installs into the system (PEP 668), and this never asks it to.
UV=$(python3 scripts/bootstrap_uv.py)
[ -x .venv/bin/python ] || "$UV" venv -q -p python3 .venv
"$UV" pip install -q -p .venv -e '.[nvml,k8s,probes,dashboard]'

EXPORTER_PORT=${GPULENS_EXPORTER_PORT:-9445}
DASHBOARD_PORT=${GPULENS_DASHBOARD_PORT:-8501}
SCENARIO=${GPULENS_SIM_SCENARIO:-h200x8}
# One exporter per simulated node: "jobs" is the two nodes its multi-node jobs span (simulated
# whatever the machine has: two exporters of one machine's real GPUs would show each GPU twice).
BACKEND=${GPULENS_BACKEND:-auto}
if [ "$SCENARIO" = jobs ]; then NODES=(jobs-0 jobs-1); BACKEND=${GPULENS_BACKEND:-sim}; else NODES=("$SCENARIO"); fi
PORTS=()
for i in "${!NODES[@]}"; do PORTS+=($((EXPORTER_PORT + i))); done
# A port another process listens on (a first demo still running) would make the readiness check
# below pass against that process's exporter: refuse to start instead.
port_free() { .venv/bin/python -c "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, \
socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', int(sys.argv[1]))); s.close()" "$1" 2>/dev/null; }
for port in "${PORTS[@]}" "$DASHBOARD_PORT"; do
  port_free "$port" || { echo "port $port is in use (another demo running?): stop it, or set" \
    "GPULENS_EXPORTER_PORT / GPULENS_DASHBOARD_PORT" >&2; exit 2; }
done
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

urls=()
# Each exporter names its node (the node label of every series, what every page shows): the
# simulated node's name, jobs-0 and jobs-1 for "jobs". With real GPUs (--backend auto found a
# driver) NODE_NAME is left to the environment, else the exporter uses this host's name.
for i in "${!NODES[@]}"; do
  node=${NODE_NAME:-}
  if [ "$BACKEND" = sim ] || [ "${#NODES[@]}" -gt 1 ]; then node=${NODES[$i]}; fi
  NODE_NAME="$node" .venv/bin/python -m exporter --backend "$BACKEND" --sim.scenario "${NODES[$i]}" \
    --web.listen-address "127.0.0.1:${PORTS[$i]}" &
  pids+=($!)
  urls+=("http://127.0.0.1:${PORTS[$i]}/metrics")
done
if [ "$SCENARIO" = serving ]; then
  # The engines are the application pods' own endpoints, served by a process of their own: the
  # exporter never scrapes them (Prometheus joins them with its series on namespace and pod).
  mkdir -p .demo
  .venv/bin/python -m exporter.sim.engines --port "${GPULENS_ENGINES_PORT:-9500}" \
    --file-sd .demo/serving-targets.json &
  pids+=($!)
fi
ready() { .venv/bin/python -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" \
  "http://127.0.0.1:$1/readyz" >/dev/null 2>&1; }
for i in "${!NODES[@]}"; do
  for _ in $(seq 1 100); do
    kill -0 "${pids[$i]}" 2>/dev/null || { echo "exporter ${NODES[$i]} exited before it was ready" >&2; exit 1; }
    ready "${PORTS[$i]}" && break; sleep 0.2
  done
  ready "${PORTS[$i]}" || { echo "exporter ${NODES[$i]} did not start" >&2; exit 1; }
done

.venv/bin/python -m dashboard --scrape "$(IFS=,; echo "${urls[*]}")" \
  --address 127.0.0.1 --port "${DASHBOARD_PORT}" &
pids+=($!)
echo
for url in "${urls[@]}"; do echo "  exporter:  ${url}"; done
echo "  dashboard: http://127.0.0.1:${DASHBOARD_PORT}"
echo
wait -n "${pids[@]}"
