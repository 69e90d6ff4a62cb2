#!/usr/bin/env bash
# The fast test loop on the lowest versions pyproject.toml allows: a separate venv (.venv-lowest,
# gitignored) where uv resolves every direct dependency (the runtime ones and the extras of
# '.[dev]') to its floor (--resolution lowest-direct), then the fast loop
# (-m 'not gpu and not integration'). A floor that no longer installs on this Python, or under which
# a test fails, must be raised in pyproject.toml: that is what this script is for.
# Lint and types are not run here (ruff and mypy are lowered too; their floors only matter to the
# main venv's scripts/test.sh).
#
# Usage: scripts/lowest_versions.sh [extra pytest args]
# Env:   UV      the uv binary (default: uv on PATH)
#        PYTHON  the interpreter the venv is made from (default: python3.11, else python3)
#        GPULENS_LOWEST_VENV  the venv's folder (default .venv-lowest)
#        GPULENS_LOWEST_WORKERS  pytest-xdist workers (default 2)
# Exits non-zero if the install or any test fails (pytest's "no tests collected" included).
set -euo pipefail
cd "$(dirname "$0")/.."

UV=${UV:-$(command -v uv || true)}
if [ -z "$UV" ]; then
  echo "uv not found: set UV or put uv on PATH" >&2
  exit 2
fi
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=${GPULENS_LOWEST_VENV:-.venv-lowest}
WORKERS=${GPULENS_LOWEST_WORKERS:-2}

start=$(date +%s)
echo "+ venv $VENV from $PYTHON"
"$UV" venv -q --clear -p "$PYTHON" "$VENV"  # fresh each time: uv pip install would keep a newer version already there
echo "+ uv pip install --resolution lowest-direct -e '.[dev]'"
"$UV" pip install -q -p "$VENV" --resolution lowest-direct -e '.[dev]'
installed=$(date +%s)
echo "+ installed in $((installed - start)) s; the floors in use:"
"$UV" pip freeze -p "$VENV" | grep -iE '^(prometheus-client|pyyaml|bcrypt|h11|nvidia-ml-py|h2|numpy|streamlit|pandas|requests|pytest|pytest-timeout|pytest-xdist|trustme|kubernetes|grpcio|protobuf|grpcio-tools|playwright)==' || true

echo "+ pytest (fast loop)"
set +e
"$VENV/bin/python" -m pytest -q -m 'not gpu and not integration' -n "$WORKERS" -p no:cacheprovider "$@"
rc=$?
set -e
end=$(date +%s)
echo "+ tests in $((end - installed)) s; total $((end - start)) s"
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi
exit "$rc"
