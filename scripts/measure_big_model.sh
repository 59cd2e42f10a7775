#!/usr/bin/env bash
# The big-model path measured end to end (docs/measurements/big-models-2026-12-06.md): a random model in a published
# shape made by tests/big_models.py, exported float32 (`onnx --hf`), quantized int4, the float file deleted, the int4
# file verified with verify's default checks. Each step under `/usr/bin/time -v` (wall, peak RSS, file-system reads
# and writes) and scripts/memwatch.py (peaks of RssAnon and RssFile, 50 ms); the verify's RssAnon is also sampled
# every 2 s into WORK/anon.log beside its progress lines (WORK/verify.err). OMP/MKL threads 2.
#
#   scripts/measure_big_model.sh llama-3-8b WORK [STAGE]    # or tinyllama-1b
#
# STAGE: where the model folder is made for the export (default WORK; /dev/shm where the disk cannot hold the
# source, the float32 file and its staging at once, as for the 8 B model on a 75 GB disk); it is moved into WORK
# before the verify, and the page cache is dropped there where this runs as root.
set -euo pipefail
shape=$1 work=$(realpath -m "$2") stage=$(realpath -m "${3:-$2}")
root=$(cd "$(dirname "$0")/.." && pwd)
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
mkdir -p "$work" "$stage"
model="$stage/$shape" f32="$work/f32" int4="$work/int4"
rm -rf "$model" "$f32" "$int4" "$work/report" "$work/$shape"
timed() { local log=$1; shift; /usr/bin/time -v python "$root/scripts/memwatch.py" -- "$@" > "$log" 2>&1; }
summary() { grep -E '^\{"exit"|Elapsed|Maximum resident|File system' "$1"; }
echo "start $(date -u +%T)"; df -h "$work" | tail -1
(cd "$root/tests" && /usr/bin/time -v python -m big_models "$shape" "$model" 128) > "$work/make.log" 2>&1
grep -E "wrote|Elapsed" "$work/make.log"
timed "$work/export.log" mhaexport onnx --hf "$model" -o "$f32"; summary "$work/export.log"; du -sh "$f32"
timed "$work/quantize.log" mhaexport quantize "$f32" -o "$int4" --weights int4; summary "$work/quantize.log"
du -sh "$int4"; rm -rf "$f32"
[ "$stage" = "$work" ] || mv "$model" "$work/$shape"
sync; { [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches; } || true
echo "verify $(date -u +%T)"; df -h "$work" | tail -1
/usr/bin/time -v -o "$work/verify.time" python "$root/scripts/memwatch.py" -- mhaexport verify "$int4" --hf "$work/$shape" --runtime ort-cpu \
  -o "$work/report" > "$work/verify.out" 2> "$work/verify.err" &
top=$! start=$(date +%s)
: > "$work/anon.log"
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
while kill -0 "$top" 2>/dev/null; do  # RssAnon (MB) of the verify's process tree, every 2 s
  kb=0
  for p in $(descendants "$top"); do
    a=$(awk '/RssAnon/{print $2}' "/proc/$p/status" 2>/dev/null || true); kb=$((kb + ${a:-0}))
  done
  echo "$(( $(date +%s) - start )) $((kb / 1024))" >> "$work/anon.log"
  sleep 2
done
wait "$top" && rc=0 || rc=$?
echo "done $(date -u +%T): verify exit $rc"; tail -n 3 "$work/verify.err"; summary "$work/verify.time"
echo "highest 2 s sample (s, MB): $(sort -k2 -n "$work/anon.log" | tail -1)"
