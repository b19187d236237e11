#!/usr/bin/env bash
# The GPU path's device check (issue 8) for a fresh GPU machine, from the repository root:
#
#   bash tests/gpu/device_check.sh
#
# Prints the device, builds oga in place from this checkout with what the machine has, runs
# tests/gpu/test_kernels.py and tests/gpu/test_cuda_device.py (every kernel, CudaDevice and DeviceOps
# against numpy references at full size, each way of loading the kernels, timings),
# tests/gpu/test_onnx_cuda.py (end to end: a builder fp16
# PagedAttention decoder on ONNX Runtime's CUDA execution provider through the engine, eager and
# with CUDA graphs, against the CPU path; it needs onnxruntime-gpu, e.g. a carried wheel) and the
# CPU kernel tests, and closes with a summary of what ran, what passed and what was NOT run. Each
# step has a time limit and the whole stays within 8 minutes. Exit status 0 only when both GPU test
# files ran and passed.
#
# The lent GPU machines reach no package index, so nothing is installed from one by default: the
# machine's python3 must have numpy, Cython, setuptools, pytest and cuda-python (the H200 image
# does), and wheels carried under .whl/ are installed offline first. On a machine with an index,
# OGA_PIP_INSTALL=1 installs '.[gpu,test]' instead (then onnxruntime-gpu replaces onnxruntime, as
# the README's Set-up does). PYTHON picks the interpreter (default python3).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d)  # this run's scratch: step output, offline-installed wheels
LOG=${OUT:-$WORK}/device_check.log
STEP_OUT=$WORK/step.out
SITE=$WORK/site
BUDGET=470  # seconds for all steps (8 minutes less a margin for the summary)
start=$(date +%s)
summary=()
last_counts=""
exec > >(tee "$LOG") 2>&1

remaining() { echo $((BUDGET - ($(date +%s) - start))); }

# step NAME LIMIT COMMAND...: runs COMMAND under the smaller of LIMIT and the time left; the
# status is in $step_status (124: timed out, 125: not started for lack of time).
step() {
  local name=$1 limit=$2 left
  shift 2
  left=$(remaining)
  [ "$limit" -gt "$left" ] && limit=$left
  echo
  echo "== $name (limit ${limit}s, $(($(date +%s) - start))s elapsed)"
  if [ "$limit" -lt 10 ]; then
    echo "not started: the 8-minute budget is spent"
    step_status=125
    return
  fi
  timeout --kill-after=5 "$limit" "$@" | tee "$STEP_OUT"
  step_status=${PIPESTATUS[0]}
  [ "$step_status" -eq 124 ] && echo "TIMED OUT after ${limit}s"
  # pytest's closing counts ("3 passed, 1 skipped in 2.0s"), when the step was a pytest run.
  last_counts=$(grep -E "[0-9]+ (passed|failed|skipped|error)" "$STEP_OUT" | tail -n 1 |
    sed 's/=//g; s/^ *//; s/ *$//')
}

# What a pytest step's status and counts say, for the summary.
verdict() {
  case $1 in
    0) echo "passed ($last_counts)" ;;
    5) echo "NO TESTS RAN" ;;
    124) echo "TIMED OUT ($last_counts so far; partial output above)" ;;
    125) echo "NOT RUN (no time left)" ;;
    *) echo "FAILED ($last_counts; pytest status $1)" ;;
  esac
}

show_environment() {
  "$PYTHON" --version
  if command -v nvcc >/dev/null; then nvcc --version | tail -n 2; else echo "nvcc: none (kernels via NVRTC)"; fi
  "$PYTHON" -m pip list 2>/dev/null | grep -i -E \
    '^(numpy|cython|setuptools|pytest|cuda-python|cuda-bindings|nvidia-cuda-nvrtc|onnxruntime|onnxruntime-gpu) '
  return 0
}

# With a package index only: the gpu and test extras, then onnxruntime-gpu alone (README, Set-up).
pip_install_extras() {
  "$PYTHON" -m pip install -q '.[gpu,test]' &&
    "$PYTHON" -m pip uninstall -y -q onnxruntime onnxruntime-gpu &&
    "$PYTHON" -m pip install -q --no-deps 'onnxruntime-gpu>=1.31,<2'
}
export PYTHON
export -f show_environment pip_install_extras

step "device" 30 nvidia-smi
if [ "$step_status" -eq 0 ]; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
  summary+=("device: $gpu")
else
  summary+=("device: nvidia-smi failed or is missing (status $step_status)")
fi

step "environment" 60 bash -c show_environment

if ls .whl/*.whl >/dev/null 2>&1; then
  step "carried wheels" 90 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  summary+=("carried wheels: status $step_status")
fi
if [ "${OGA_PIP_INSTALL:-0}" = 1 ]; then
  step "pip install .[gpu,test]" 240 bash -c pip_install_extras
  summary+=("pip install '.[gpu,test]': status $step_status")
fi

# In place: the extension and, with nvcc, oga/kernels/*.ptx and *.cubin (the loader's first two ways).
step "build in place" 240 "$PYTHON" setup.py build_ext --inplace -q
build_status=$step_status
if [ "$build_status" -eq 0 ]; then
  built=$(ls oga/kernels/*.cubin oga/kernels/*.ptx 2>/dev/null | wc -l)
  summary+=("build: ok; nvcc-built kernel files: $built (0: the machine has no usable nvcc, NVRTC only)")
else
  summary+=("build: FAILED (status $build_status): nothing below could run")
fi

# A pytest step's verdict, where a run in which every test was skipped counts as NOT RUN.
gpu_verdict() {
  if [ "$1" -eq 0 ] && ! grep -q " passed" <<<"$last_counts"; then
    echo "NOT RUN: every test was skipped ($last_counts; the reason is above)"
  else
    verdict "$1"
  fi
}

status_line="not run"
gpu_line="NOT RUN (the build failed)"
onnx_line="NOT RUN (the build failed)"
cpu_line="NOT RUN (the build failed)"
if [ "$build_status" -eq 0 ]; then
  step "cuda_status" 60 "$PYTHON" -c "import oga.cuda_kernels as ck; print(*ck.cuda_status(), sep=': ')"
  status_line=$(tail -n 1 "$STEP_OUT")

  step "tests/gpu/test_kernels.py, tests/gpu/test_cuda_device.py" 240 env PYTHONUNBUFFERED=1 "$PYTHON" -m pytest \
    -q -s -rs -p no:cacheprovider tests/gpu/test_kernels.py tests/gpu/test_cuda_device.py
  gpu_line=$(gpu_verdict "$step_status")

  step "ONNX Runtime providers" 30 "$PYTHON" -c \
    "import onnxruntime as ort; print(ort.__version__, ort.get_available_providers())"
  summary+=("onnxruntime: $(tail -n 1 "$STEP_OUT")")

  step "tests/gpu/test_onnx_cuda.py" 150 env PYTHONUNBUFFERED=1 "$PYTHON" -m pytest -q -s -rs -p no:cacheprovider \
    tests/gpu/test_onnx_cuda.py
  onnx_line=$(gpu_verdict "$step_status")

  step "CPU kernel tests (NVRTC compile, Philox, emulator)" 120 env PYTHONUNBUFFERED=1 "$PYTHON" -m pytest -q \
    -p no:cacheprovider tests/test_cuda_kernels.py tests/test_kernel_emulation.py
  cpu_line=$(verdict "$step_status")
fi

echo
echo "== summary ($(($(date +%s) - start))s; log: $LOG)"
for line in "${summary[@]}"; do echo "  $line"; done
echo "  cuda_status: $status_line"
echo "  tests/gpu/test_kernels.py + test_cuda_device.py (kernels and CudaDevice / DeviceOps on the device vs"
echo "    numpy references, loading ways, timings): $gpu_line"
echo "  tests/gpu/test_onnx_cuda.py (PagedAttention decoder on ONNX Runtime's CUDA provider through the"
echo "    engine: device KV cache, staged inputs, device sampling, CUDA graphs, auto-sizing, throughput;"
echo "    vs the CPU path): $onnx_line"
echo "  CPU kernel tests on this machine: $cpu_line"
case "$gpu_line/$onnx_line" in passed*/passed*) exit 0 ;; *) exit 1 ;; esac
