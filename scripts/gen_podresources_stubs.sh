#!/usr/bin/env bash
# Regenerate the kubelet PodResources v1 Python stubs in exporter/attribution/_proto/.
# Use grpcio-tools equal to the OLDEST runtime grpcio we support (1.84.0: the GPU image),
# because the generated *_pb2_grpc.py refuses to import on a grpcio older than the generator.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
want="1.84.0"
have="$("$PY" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')"
case "$have" in
  "$want"*) ;;
  *) echo "grpcio-tools $have found; install grpcio-tools==${want} (see pyproject dev extra)" >&2; exit 1 ;;
esac
out=exporter/attribution/_proto
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. "$out/api.proto"
# generated code is not ours to type-check or lint
for f in "$out"/api_pb2.py "$out"/api_pb2_grpc.py; do
  { echo "# mypy: ignore-errors"; cat "$f"; } > "$f.tmp" && mv "$f.tmp" "$f"
done
echo "generated with grpcio-tools $have:"
ls "$out"
