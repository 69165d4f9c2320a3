#!/usr/bin/env bash
# The network trained on a lent GPU, in one prepared call, against this machine's CPU.
#
# A lent GPU machine has CUDA, JAX and numpy but no TensorFlow, no Keras, no network and takes
# 64 MiB a call. So, here:
#   scripts/gpu_check.sh prepare [EXPORT OPTIONS]   the bundle (heapcast bundle export, default:
#        the full config on ./data) and the wheels the device lacks, into .gpu/ (ignored by git)
#   scripts/gpu_check.sh reference                  the same bundle trained on this CPU (TensorFlow)
# then one call of the device tool, from the repository root:
#   command: scripts/gpu_check.sh device    carry: [".gpu"]    timeout_s: 480
# and, with the folder the call's files came back in:
#   scripts/gpu_check.sh compare DIR                the table of studies/gpu_training/gpu_training.md
#
# The scaling study (studies/scaling/scaling.py, issue 43) on the same machine:
#   scripts/gpu_check.sh scaling-prepare ROOT       ROOT's events cut to the next-call columns
#        (tasks/learning/nextcall/slim_root.py: ~15 MiB for 60 M calls) into .gpu/scaling-root
# then one call, carry [".gpu"]:  scripts/gpu_check.sh scaling-device SECONDS [STUDY OPTIONS]
# which runs the study there for at most SECONDS (every finished point is kept: the JSON is
# written after each) into $OUT/scaling; draw its plot here with --render-only.
#
# On the device: the wheels go to /tmp/site, KERAS_BACKEND=jax, and the bundle is trained twice
# with the project's own code (tasks/learning/nextcall/bundle.py): at the config's batch size, then at the
# batch the GPU prefers (gpu_batch_size), each scored on the bundle's evaluation runs. What comes
# back under $OUT: device.txt, batch/result.json, gpu_batch/result.json and gpu_batch/model.keras.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=.gpu
WHEELS=(keras namex optree pydantic pydantic-core annotated-types typing-extensions
        typing-inspection pyyaml fsspec packaging)
DEVICE_PYTHON=${DEVICE_PYTHON:-3.12}  # the lent machine's python3 (NOTES.md)

prepare() {
  mkdir -p "$GPU_DIR"
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx "/$GPU_DIR/" "$exclude" 2>/dev/null || echo "/$GPU_DIR/" >> "$exclude"
  if (($#)); then .venv/bin/heapcast bundle export -o "$GPU_DIR/bundle.npz" "$@"
  else .venv/bin/heapcast bundle export -o "$GPU_DIR/bundle.npz"; fi
  wheels
}

wheels() {
  mkdir -p "$GPU_DIR/wheels"
  # the versions this environment runs, for the device's Python, binary wheels only
  pins=()
  for w in "${WHEELS[@]}"; do
    v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$w'))")
    pins+=("$w==$v")
  done
  rm -f "$GPU_DIR"/wheels/*.whl
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$DEVICE_PYTHON" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$GPU_DIR/wheels" "${pins[@]}"
  total=$(du -cb "$GPU_DIR"/bundle.npz "$GPU_DIR"/wheels/*.whl | tail -1 | cut -f1)
  echo "gpu_check: $GPU_DIR holds $((total / 1048576)) MiB to carry (64 MiB a call at most)"
  if ((total > 64 * 1048576)); then
    echo "gpu_check: too much to carry: export a smaller bundle (--set data.max_train_tokens=N)" >&2
    exit 1
  fi
}

# the carried wheels installed, Keras on JAX, and what the machine is, into $OUT/device.txt
device_setup() {
  OUT=${OUT:?the device tool sets OUT, the folder whose files come back}
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site "$GPU_DIR"/wheels/*.whl
  export PYTHONPATH="/tmp/site:$PWD" KERAS_BACKEND=jax
  (nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv) \
    > "$OUT/device.txt" 2>&1 || true
  python3 -c 'import jax; print(jax.devices())' >> "$OUT/device.txt" 2>&1
}

scaling_prepare() {
  local root=${1:?give the data root the study reads (studies/scaling/README.md)}
  rm -rf "$GPU_DIR/scaling-root"
  .venv/bin/python -m tasks.learning.nextcall.slim_root --root "$root" --out "$GPU_DIR/scaling-root" \
    --max-tokens-per-run 0
  wheels
  total=$(du -cb "$GPU_DIR" | tail -1 | cut -f1)
  echo "gpu_check: $GPU_DIR holds $((total / 1048576)) MiB in all (64 MiB a call at most)"
}

scaling_device() {
  local seconds=${1:?give the seconds the study may run}; shift
  device_setup
  # SIGINT first: a point cut short is dropped, every finished one is already written
  timeout -s INT -k 30 "$seconds" python3 studies/scaling/scaling.py \
    --root "$GPU_DIR/scaling-root" --out-dir "$OUT/scaling" "$@" || echo "gpu_check: study exit $?"
}

device() {
  device_setup
  train "$GPU_DIR/bundle.npz" "$OUT/batch" gpu_batch_size=null
  train "$GPU_DIR/bundle.npz" "$OUT/gpu_batch"
  rm -rf "$OUT"/*/checkpoints "$OUT/batch/model.keras"
}

reference() {
  export KERAS_BACKEND=tensorflow
  PYTHONPATH=$PWD train "$GPU_DIR/bundle.npz" "$GPU_DIR/reference" gpu_batch_size=null .venv/bin/python
  rm -rf "$GPU_DIR/reference/checkpoints"
}

# train BUNDLE OUT [KEY=VALUE] [PYTHON]: tasks/learning/nextcall/bundle.py's train_bundle, with its line
train() {
  local py=${4:-python3}
  "$py" - "$1" "$2" "${3:-}" <<'EOF'
import sys, yaml
from tasks.learning.nextcall.bundle import read_bundle, train_bundle
bundle, out, setting = sys.argv[1:4]
over = {}
if setting:
    k, v = setting.split("=", 1)
    over[k] = yaml.safe_load(v)
r = train_bundle(read_bundle(bundle), out, over, verbose=2)
o = r["unseen_runs"].get("all", {})
print(f"gpu_check: {out}: {r['placement']} {r['positions_per_second']:,.0f} positions/s, "
      f"{r['epochs']} epochs in {r['train_seconds']:.0f} s, unseen top-1 {o.get('top1')}")
EOF
}

compare() {
  .venv/bin/python studies/gpu_training/gpu_training.py "$GPU_DIR/reference" "${1:?give the folder where the device call put its files}"
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  wheels) wheels ;;
  device) device ;;
  scaling-prepare) shift; scaling_prepare "$@" ;;
  scaling-device) shift; scaling_device "$@" ;;
  reference) reference ;;
  compare) shift; compare "$@" ;;
  *) sed -n '2,27p' "$0"; exit 2 ;;
esac
