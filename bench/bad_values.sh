#!/bin/bash
# Bad values on the CLI's options, one command per line below (OUT, BADJSON, BADPLAN, EMPTYDIR, BADNPZDIR, PNGDIR are
# replaced by files this script writes under OUTDIR). Prints one line per command:
#   N rc=EXIT tb=TRACEBACKS :: COMMAND :: first error line
# Every command should exit 2 with an `error:` line and no traceback, except `--formats ""` and `--screen 0` (defaults)
# and `build --timing-cache` on a file that is not one (TensorRT-RTX ignores timing caches; the file is left as it was).
# usage: nice bench/bad_values.sh OUTDIR      (run from the repository root; results: unseen_models_2026-12-06b.md)
set -u
OUT=${1:?usage: bench/bad_values.sh OUTDIR}; REPO=$(pwd); PY=${PYTHON:-.venv/bin/python}
rm -rf "$OUT"; mkdir -p "$OUT/empty" "$OUT/badnpz" "$OUT/png"
echo '{not json' > "$OUT/bad.json"
echo '{"default": "int9", "overrides": {"x": 3}}' > "$OUT/badplan.json"
printf 'garbage' > "$OUT/notonnx.onnx"
$PY -c "import numpy as np; np.savez('$OUT/badnpz/b.npz', wrong=np.zeros((2, 3)))"
printf 'notapng' > "$OUT/png/a.png"
i=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  i=$((i+1))
  cmd=${line//OUT/$OUT}; cmd=${cmd//BADJSON/$OUT/bad.json}; cmd=${cmd//BADPLAN/$OUT/badplan.json}
  cmd=${cmd//EMPTYDIR/$OUT/empty}; cmd=${cmd//BADNPZDIR/$OUT/badnpz}; cmd=${cmd//PNGDIR/$OUT/png}
  eval "timeout 300 env PYTHONPATH=$REPO $PY -m workbench $cmd" >"$OUT/o$i.txt" 2>&1; rc=$?
  echo "$i rc=$rc tb=$(grep -c Traceback "$OUT/o$i.txt") :: $line :: $(grep -m1 -E 'error:' "$OUT/o$i.txt" | cut -c1-160)"
done <<'CASES'
calibrate digits-cnn --percentile 150 -o OUT/a.onnx
calibrate digits-cnn --percentile nan -o OUT/a.onnx
calibrate digits-cnn --method percentile --percentile 0 -o OUT/a.onnx
calibrate digits-cnn --max-batches 0 -o OUT/a.onnx
calibrate digits-cnn --max-batches -3 -o OUT/a.onnx
calibrate digits-cnn --target-drop nan -o OUT/a.onnx
calibrate digits-cnn --target-drop -0.1 -o OUT/a.onnx
calibrate digits-cnn --target-drop 5 -o OUT/a.onnx
calibrate digits-cnn --target-drop 0.01 --budget 0 -o OUT/a.onnx
calibrate digits-cnn --target-drop 0.01 --confidence 1.5 -o OUT/a.onnx
calibrate digits-cnn --target-drop 0.01 --formats int8,bogus -o OUT/a.onnx
calibrate digits-cnn --target-drop 0.01 --formats "" -o OUT/a.onnx
calibrate digits-cnn --target-drop 0.01 --formats fp16 -o OUT/a.onnx
calibrate digits-cnn --target-drop 0.01 --keep-8bit Bogus -o OUT/a.onnx
calibrate digits-cnn --target-drop 0.01 --screen 0 -o OUT/a.onnx
calibrate digits-cnn --target-drop 0.01 --screen -5 -o OUT/a.onnx
calibrate digits-cnn --eval-limit 0 --target-drop 0.01 -o OUT/a.onnx
calibrate digits-cnn --keep nosuchnode -o OUT/a.onnx
calibrate digits-cnn --keep , -o OUT/a.onnx
calibrate digits-cnn --plan /dev/null -o OUT/a.onnx
calibrate digits-cnn --plan OUT -o OUT/a.onnx
calibrate digits-cnn --plan BADJSON -o OUT/a.onnx
calibrate digits-cnn --plan BADPLAN -o OUT/a.onnx
calibrate digits-cnn --cache BADJSON -o OUT/a.onnx
calibrate digits-cnn --cache BADPLAN -o OUT/a.onnx
calibrate digits-cnn --data EMPTYDIR -o OUT/a.onnx
calibrate digits-cnn --data BADNPZDIR -o OUT/a.onnx
calibrate digits-cnn --data PNGDIR -o OUT/a.onnx
calibrate digits-cnn --format fp8 --method entropy -o OUT/a.onnx
calibrate digits-cnn -o OUT
calibrate digits-cnn -o /proc/version
build digits-cnn --shapes x -o OUT/e.engine
build digits-cnn --shapes input:0x1x28x28 -o OUT/e.engine
build digits-cnn --shapes nosuch:1x1x28x28 -o OUT/e.engine
build digits-cnn --shapes input:4x1x28x28,2x1x28x28,1x1x28x28 -o OUT/e.engine
build digits-cnn --workspace-mib -5 -o OUT/e.engine
build digits-cnn --opt-level 9 -o OUT/e.engine
build digits-cnn --compute-capability SM999 -o OUT/e.engine
build digits-cnn --compute-capability foo -o OUT/e.engine
build digits-cnn --plan BADPLAN -o OUT/e.engine
build digits-cnn --precision int8 -o OUT/e.engine
build digits-cnn --timing-cache BADJSON -o OUT/e.engine
build OUT/notonnx.onnx -o OUT/e.engine
build BADJSON -o OUT/e.engine
diff digits-cnn OUT/notonnx.onnx -o OUT/d.json
diff digits-cnn digits-cnn -o OUT/d.json
time digits-cnn --streams 0
time digits-cnn --streams -1
time digits-cnn --batch 0
time OUT/notonnx.onnx
export OUT/notonnx.onnx -o OUT/b
export BADJSON -o OUT/b
verify OUT
verify /dev/null
fusions BADJSON
fusions OUT/notonnx.onnx
explore BADJSON --export OUT/x
zoo eval nosuch
zoo eval digits-cnn --limit -1
zoo calib-data digits-cnn OUT/cd --limit 0
precision digits-cnn --plan BADPLAN -o OUT/p.onnx
model BADJSON
model /dev/zero
demo --model OUT/notonnx.onnx --out OUT/demo
demo --model digits-cnn --eval-samples 0 --out OUT/demo
demo --model digits-cnn --calibration-samples -1 --out OUT/demo
demo --model digits-cnn --precision bogus --out OUT/demo
CASES
