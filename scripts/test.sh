#!/usr/bin/env bash
# The test command (README, .ci/run): installs everything the tests need on a fresh Debian machine
# (Prometheus, VictoriaMetrics, Chromium, the container tools, uv, the Python deps), then runs lint, types and the
# whole pytest suite, which builds the images with scripts/image.sh and runs them under podman.
# Exits non-zero if anything fails (pytest's "no tests collected" included). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
# VictoriaMetrics (tests/support/victoriametrics.py): the single-node server and vmalert.
command -v victoria-metrics >/dev/null && command -v vmalert >/dev/null || need+=(victoria-metrics)
# Images (tests/test_image.py): mmdebstrap + buildah build them, podman + runc + slirp4netns run them.
for tool in mmdebstrap buildah podman runc slirp4netns; do command -v "$tool" >/dev/null || need+=("$tool"); done
[ -x /usr/bin/newuidmap ] || need+=(uidmap)
if [ ${#need[@]} -gt 0 ]; then
  echo "+ apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# uv from PATH, or fetched into .tools/ by the standard library alone: a stock Debian or Ubuntu Python
# refuses pip installs into the system (PEP 668), and this never asks it to.
UV=$(python3 scripts/bootstrap_uv.py)
export PATH="$(dirname "$UV"):$PATH"  # scripts/image.sh and the image tests run uv too
[ -x .venv/bin/python ] || "$UV" venv -q -p python3 .venv
"$UV" pip install -q -p .venv -e '.[dev]'

# One command per line: under set -e a failure on the left of && would not stop the script.
echo "+ ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "+ mypy"; .venv/bin/mypy
echo "+ pytest"
set +e
# Parallel: a module's tests and servers stay on one worker (loadfile), in the order conftest.py gives
# (the modules of minutes first). GPULENS_TEST_WORKERS=0 runs serially.
.venv/bin/python -m pytest -n "${GPULENS_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi
exit "$rc"
