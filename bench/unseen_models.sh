#!/bin/bash
# The surveys behind bench/results/unseen_models_2026-12-04.md and _2026-12-06b.md: writes the models of tests/fixtures/unseen_models.py,
# runs every stage CLI on each (no --shapes: models with symbolic non-batch dims are refused by build, as they
# should be), then `workbench demo --model PATH` with default settings. Prints one line per step:
#   MODEL STEP rc=EXIT tb=TRACEBACKS WALL_SECONDS PEAK_RSS :: first error line
# usage: nice [MODELS_DIR=DIR] bench/unseen_models.sh OUTDIR [MODEL ...]      (run from the repository root)
set -u
OUT=${1:?usage: bench/unseen_models.sh OUTDIR [MODEL ...]}; shift
REPO=$(pwd); PY=${PYTHON:-.venv/bin/python}
W="env PYTHONPATH=$REPO $PY -m workbench"
# MODELS_DIR: survey the .onnx files of that folder instead (e.g. the exports of bench/hf_models.py)
MODELS=${MODELS_DIR:-$OUT/models}
[ -z "${MODELS_DIR:-}" ] && $PY tests/fixtures/unseen_models.py "$OUT/models" >/dev/null
NAMES=${*:-$(ls "$MODELS" | sed -n 's/\.onnx$//p')}
for n in $NAMES; do
  d=$OUT/$n; m=$MODELS/$n.onnx; rm -rf "$d"; mkdir -p "$d"
  run() { local step=$1; shift; /usr/bin/time -o "$d/$step.time" -f "%e %M" timeout 600 $W "$@" >"$d/$step.out" 2>&1
    local rc=$? secs kib; read -r secs kib < <(tail -1 "$d/$step.time")
    echo "$n $step rc=$rc tb=$(grep -c Traceback "$d/$step.out") ${secs}s $((kib / 1024))MiB :: $(grep -m1 'error:' "$d/$step.out" | cut -c1-200)"; }
  run clean clean "$m" -o "$d/clean.onnx" --report "$d/clean.json"
  run build build "$m" -o "$d/fp32.engine" --no-progress
  run build16 build "$m" -o "$d/fp16.engine" --precision fp16 --no-progress
  run fusions fusions "$d/fp32.layers.json" --html "$d/fusions.html"
  run explore explore "$d/fp32.engine" --export "$d/explore"
  run calibrate calibrate "$m" --data random -o "$d/qdq.onnx" --cache "$d/cache.json" --no-progress
  run calib8 calibrate "$m" --data random --format fp8 -o "$d/fp8.onnx" --no-progress
  run build8 build "$d/qdq.onnx" -o "$d/int8.engine" --precision int8 --no-progress
  run buildf8 build "$d/fp8.onnx" -o "$d/fp8.engine" --precision fp8 --no-progress
  run diff diff "$m" "$d/qdq.onnx" --data random -o "$d/diff.json" --no-progress
  run export export "$d/fp32.engine" -o "$d/bundle"
  run verify verify "$d/bundle"
  run demo demo --model "$m" --out "$d/demo"
  grep -E '^\[' "$d/demo.out" | grep -v ' ok  ' | sed "s/^/$n demo   /" | cut -c1-220
done
