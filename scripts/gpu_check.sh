#!/usr/bin/env bash
# The GPU run, prepared: on a machine with an NVIDIA GPU, CUDA 13 and cuDNN 9, verify the default (`small`) and
# `bench` presets on ort-cuda and eager-cuda — float32 and float16, concat and shared KV cache — then bench with the
# CUDA rows, and put report.md, bench.md and bench.png in one folder. It never reports a CPU fallback as a GPU
# result: CUDA is probed first (ONNX Runtime's session must really list CUDAExecutionProvider, and torch must see
# the device), and every verify names ort-cuda/eager-cuda with --runtime, so a runtime that falls back makes the
# verdict "not verified" (exit 4), which fails this script.
#
# usage: scripts/gpu_check.sh [--wheel PATH.whl] [--out DIR] [--presets "small bench"] [--skip-install] [--quick]
#   --wheel PATH   an onnxruntime-gpu wheel to install (pip install --no-deps --force-reinstall), e.g. one that
#                  arrived on the machine in parts: cat part_* > onnxruntime_gpu-...whl
#   -o, --out DIR  where everything goes (default artifacts/gpu-check)
#   --presets P    the presets to verify (default "small bench")
#   --skip-install do not pip-install the package (it must be importable already)
#   --quick        verify float32 concat and shared only, bench 32 new tokens (a smoke run)
# exit codes: 0 all verified on the GPU, 1 a check failed, 2 bad usage, 4 CUDA does not really run here (no GPU at
#   all: before anything is installed)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^# exit codes/p' "$0" | sed 's/^# \{0,1\}//' >&2; }
WHEEL="" OUT="artifacts/gpu-check" PRESETS="small bench" INSTALL=1 QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) [ $# -ge 2 ] || { echo "gpu_check: --wheel needs a path" >&2; exit 2; }; WHEEL="$2"; shift 2 ;;
    -o|--out) [ $# -ge 2 ] || { echo "gpu_check: --out needs a folder" >&2; exit 2; }; OUT="$2"; shift 2 ;;
    --presets) [ $# -ge 2 ] || { echo "gpu_check: --presets needs a list" >&2; exit 2; }; PRESETS="$2"; shift 2 ;;
    --skip-install) INSTALL=0; shift ;;
    --quick) QUICK=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; usage; exit 2 ;;
  esac
done
if [ -n "$WHEEL" ] && [ ! -f "$WHEEL" ]; then echo "gpu_check: wheel $WHEEL does not exist" >&2; exit 2; fi
PY="${PYTHON:-python3}"
say() { printf '\n== %s\n' "$*" >&2; }
START=$(date +%s)

if [ "$INSTALL" = 1 ] || [ -n "$WHEEL" ]; then  # no GPU: install nothing (onnxruntime-gpu is ~340 MB)
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi is missing or lists none): nothing installed, nothing verified" >&2
    exit 4
  fi
fi
if [ "$INSTALL" = 1 ]; then
  say "install"
  "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install torch
  "$PY" -m pip install -e '.[gpu]' >/dev/null  # onnxruntime-gpu (the [gpu] extra)
fi
if [ -n "$WHEEL" ]; then
  say "install $WHEEL"
  "$PY" -m pip install --no-deps --force-reinstall "$WHEEL" >/dev/null
fi

say "probe: does CUDA really run? (never report a CPU fallback as a GPU result)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
"$PY" - <<'PY' || exit 4
import sys
from mhaexport.runtime.session import provider_unavailable
why = provider_unavailable("cuda")
if why is not None:
    print(f"gpu_check: ONNX Runtime does not run on CUDA here: {why}", file=sys.stderr)
    sys.exit(4)
import torch
if not torch.cuda.is_available():
    print(f"gpu_check: torch {torch.__version__} sees no CUDA device (eager-cuda cannot run)", file=sys.stderr)
    sys.exit(4)
print(f"CUDA runs: ONNX Runtime CUDAExecutionProvider, torch on {torch.cuda.get_device_name(0)}", file=sys.stderr)
PY
mkdir -p "$OUT"
MHA="$PY -m mhaexport"
RUNTIMES="--runtime eager --runtime eager-cuda --runtime ort-cpu --runtime ort-cuda"
DTYPES="float32 float16"; CACHES="concat shared"; NEW=128
[ "$QUICK" = 1 ] && { DTYPES="float32"; NEW=32; }
status=0
for preset in $PRESETS; do
  REPORTS=()
  for dtype in $DTYPES; do
    for cache in $CACHES; do
      dir="$OUT/$preset-$dtype-$cache"
      say "export $preset $dtype $cache -> $dir"
      $MHA onnx --config "$preset" --dtype "$dtype" --kv-cache "$cache" -o "$dir"
      [ "$dtype-$cache" = "float32-concat" ] && $MHA torchscript --config "$preset" -o "$dir"
      say "verify $dir on $RUNTIMES"
      rc=0; MHAEXPORT_HOST_LABEL="$preset-$dtype-$cache" $MHA verify "$dir" $RUNTIMES -o "$dir" || rc=$?
      [ "$rc" = 4 ] && { echo "gpu_check: $dir was not verified on the GPU (a CUDA runtime skipped): failing" >&2; exit 4; }
      [ "$rc" != 0 ] && status=1
      REPORTS+=("$dir/report.json")
    done
  done
  # one model a merge: each preset's layouts side by side (report merge refuses reports of different models)
  say "merge the $preset reports -> $OUT/merged-$preset/report.md"
  $MHA report merge "${REPORTS[@]}" -o "$OUT/merged-$preset" || status=1
done

if [[ " $PRESETS " == *" bench "* ]]; then
  say "bench with the CUDA rows"
  cmp=()
  for d in "$OUT"/bench-*; do [ "$d" != "$OUT/bench-float32-concat" ] && [ -d "$d" ] && cmp+=(--compare "$d"); done
  $MHA bench "$OUT/bench-float32-concat" "${cmp[@]}" --runtimes eager,eager-cuda,ort-cpu,ort-cuda \
    --prompt-len 32 --new-tokens "$NEW" --repeats 3 --long 1024 -o "$OUT" || status=1
fi
say "done in $(( $(date +%s) - START )) s: $OUT/merged-*/report.md $OUT/bench.md $OUT/bench.png (exit $status)"
exit $status
