#!/usr/bin/env bash
# Install everything heapcast needs on a fresh Debian 12 machine, idempotently:
#   - Debian packages: a C toolchain for the tracer, the traced programs, the container engine,
#     bubblewrap for the local runner, debootstrap for the base image, heaptrack for benchmarks,
#     the allocators the allocators stage compares (for the local runner; images have their own);
#   - a virtual environment in .venv with the project and its locked dependency set.
# Re-running it is cheap: each step checks what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  gcc g++ make libc6-dev             # build the tracer and the test programs (g++: the C++ one)
  sqlite3 python3.11 redis-server redis-tools git freeciv-server   # programs traced on the host
  perl python3-numpy                 # more programs traced on the host (make and gcc: above)
  docker.io bubblewrap debootstrap   # the container engine, the local sandbox, the base image
  heaptrack                          # the benchmark's reference tracer
  libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0   # allocators compared (configs/allocators.yaml)
  chromium fonts-dejavu-core         # the report test opens its HTML in headless chromium (with a font)
  golang-go nodejs                   # the export tests read heapcast's exports with go tool pprof and speedscope
  curl ca-certificates
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "heapcast setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "heapcast setup: creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
# Reinstall only when the declared or locked dependencies change.
stamp=.venv/.heapcast-installed
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "heapcast setup: installing Python dependencies (a minute or two on a cold machine)"
  extras="test"
  # Same code on a GPU machine: the CUDA wheels come with the gpu extra.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then extras="test,gpu"; fi
  # uv installs the same locked set as pip (compared package by package), downloading and
  # unpacking in parallel and byte-compiling on every core: 34 s against pip's 78 s on these 2
  # cores (docs/speeds-pipeline.md). pip, with this machine's pip configuration, where uv
  # cannot be had or fails.
  if .venv/bin/python -m pip install -q uv \
    && .venv/bin/uv pip install --python .venv/bin/python --compile-bytecode -q \
      -c requirements.lock -e ".[$extras]"; then
    :
  else
    echo "heapcast setup: uv could not install the set; installing it with pip"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -c requirements.lock -e ".[$extras]"
  fi
  echo "$want" > "$stamp"
fi
# heapcast's Keras models load in any fresh Python of this environment, mlflow.keras.load_model
# included: a start-up line that adds heapcast_keras' lazy hook (its docstring says how and why).
purelib=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo 'import importlib.util; importlib.util.find_spec("heapcast_keras") and __import__("heapcast_keras").install()' \
  > "$purelib/heapcast-keras.pth"
# speedscope's importer reads `heapcast export --format collapsed` files in the export tests
# (tests/tasks/stacks/speedscope_folded.mjs); npm's package, pinned, kept out of the tree
if [ ! -f .cache/npm/node_modules/speedscope/package.json ]; then
  if ! command -v npm >/dev/null; then  # Debian's nodejs comes without it (NodeSource's has it)
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  echo "heapcast setup: installing speedscope (npm) into .cache/npm"
  npm install -s --no-audit --no-fund --prefix .cache/npm speedscope@1.25.0 >/dev/null
fi
make -s -C native >/dev/null
echo "heapcast setup: ready (.venv/bin/heapcast)"
