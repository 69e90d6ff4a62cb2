#!/bin/bash
# Re-measure every H200 finding of docs/boundness.md on another GPU model (issue 55: the H100).
#
# Runs, one after another on GPU 0, in the background (setsid, so the GPU keeps working between
# device calls), from the repository root:
#   A  scripts/gpu_boundness.py, every load, with the GPM-off exporter beside it (compute, memory,
#      launch, the time-sliced mixes, the stalls, the stops, the coarse classes);
#   B  scripts/gpu_probes.py (the probes against probes/expected.py), then scripts/gpu_transfer.py
#      (the transfer loads and stops);
#   C  bench/real_gpu.py against nvitop-exporter (scraped every 15 s, idle).
# Each part ends as $RUN_DIR/<model>_<part>.tgz and a file done_<part>.  Wheels: WHEELS (default
# .h100/whl: h2, hpack, hyperframe, grpcio, protobuf, nvidia-ml-py, nvitop, nvitop-exporter,
# prometheus-client, h11, as docs/boundness.md lists), installed into /tmp/site.
#
#   setsid nohup bash scripts/gpu_model_rerun.sh > /tmp/rerun.log 2>&1 < /dev/null &
#   # later: cp /tmp/rerun/*.tgz "$OUT"/
# Back here, per part:
#   python3 scripts/gpu_boundness.py --make-fixtures A/b --fixtures-dir tests/fixtures/gpm_traces_h100
#   python3 scripts/gpu_transfer.py --make-fixtures B/t --fixtures-dir tests/fixtures/transfer_traces_h100
set -u
export PYTHONUNBUFFERED=1
MODEL=${MODEL:-h100}
R=${RUN_DIR:-/tmp/rerun}
WHEELS=${WHEELS:-.h100/whl}
mkdir -p "$R"
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || { echo "wheels did not install"; exit 3; }
fi
export PYTHONPATH=/tmp/site:$PWD
for part in ${PARTS:-A B C}; do
  W=$R/w_$part
  mkdir -p "$W"
  {
    date -u
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,power.limit,power.default_limit,power.max_limit,power.draw,clocks.sm,clocks.max.sm,clocks.max.mem,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.max,memory.total,mig.mode.current --format=csv
    python3 -c "import importlib.metadata as m; print({d: m.version(d) for d in ['nvidia-ml-py', 'torch', 'h2', 'grpcio', 'protobuf', 'nvitop-exporter']})"
  } > "$W/facts.txt" 2>&1
  case $part in
  A)
    nvidia-smi -q > "$W/smi_q.txt" 2>&1
    timeout 520 python3 scripts/gpu_boundness.py --out "$W/b" --seconds 16 --compare-without-gpm > "$W/b.log" 2>&1
    ;;
  B)
    timeout 150 python3 scripts/gpu_probes.py "$W/p" > "$W/p.log" 2>&1
    timeout 360 python3 scripts/gpu_transfer.py --out "$W/t" --seconds 12 > "$W/t.log" 2>&1
    ;;
  C)
    timeout 240 python3 -m bench.real_gpu --chain full --client prometheus --scrapes 300 --quiet-seconds 60 \
      --scrape-interval 15 --load none --out "$W/c" --tag idle15 > "$W/c.log" 2>&1
    ;;
  esac
  echo "part $part rc=$? $(date -u)"
  tar -czf "$R/${MODEL}_$part.tgz" -C "$W" .
  touch "$R/done_$part"
done
