#!/bin/bash
# The serving workload's device run (issue 53), from the repository root, in one device call:
#   bash scripts/gpu_serving_run.sh            # results in $OUT/serving (summary.json, history.om.gz, details.tgz, run.log)
# Wheels: WHEELS (default .h100/whl: grpcio, protobuf, h2, hpack, hyperframe, h11, nvidia-ml-py,
# prometheus-client) go to /tmp/site, as for scripts/gpu_model_rerun.sh.  Extra arguments go to
# bench/gpu_serving_run.py (e.g. --hold 15).  The run is killed after LIMIT seconds (default 520:
# a device call's 600 less the self-check, the start and the copy back); what it recorded until
# then is still written (SIGTERM ends the engines and the exporter, then the record is written).
set -u
export PYTHONUNBUFFERED=1
WHEELS=${WHEELS:-.h100/whl}
DEST=${OUT:-/tmp/serving-out}/serving
mkdir -p "$DEST"
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || { echo "wheels did not install" | tee "$DEST/run.log"; exit 3; }
fi
export PYTHONPATH=/tmp/site:$PWD
# the model's cached decode against recompute (eager and through CUDA graphs) first: ~10 s
timeout -k 5 120 python3 scripts/gpu_serving.py --self-check 2>&1 | tee "$DEST/run.log"
timeout -k 15 "${LIMIT:-520}" python3 -m bench.gpu_serving_run --out "$DEST" "$@" 2>&1 | tee -a "$DEST/run.log"
rc=${PIPESTATUS[0]}
echo "gpu_serving_run rc=$rc" | tee -a "$DEST/run.log"
ls -la "$DEST"
exit "$rc"
