#!/usr/bin/env bash
# Check nodeprep against a live NVIDIA GPU and driver: GPU labels from NVML and from
# `nvidia-smi -q -x` must agree; the loaded module, NVML, nvidia-smi and libnvidia-ml name one
# driver version and CUDA matches nodeprep's table; `nodeprep doctor` on the live system; the CDI
# spec generated from the live driver's libraries is valid. Prints a short report (docs/labels.md).
# With --nvidia-bin DIR (NVIDIA's binaries, plain or NAME.zst / NAME.xz, as NODEPREP_NVIDIA_BIN has them) also:
# GFD --oneshot vs `nodeprep labels`, `nvidia-ctk cdi generate` vs nodeprep's spec (differences
# listed), and the GPU Operator's validator against a nodeprep-layout root (acceptance/gpu/gpu_check.py).
# With --containers (root; podman, nvcc): real podman starts through nodeprep's CDI spec, its CUDA
# gate and NVIDIA's spec, with start times side by side (acceptance/gpu/gpu_containers.py).
#
#   acceptance/gpu/gpu-check.sh [--keep] [--nvidia-bin DIR] [--containers]   (--keep: leave the temp directory)
#
# Builds nothing and changes nothing outside one temp directory (its venv, the capture, the spec).
# Python: $PYTHON (default python3) with this checkout on PYTHONPATH when it has nodeprep's
# dependencies and nvidia-ml-py, else a venv in the temp directory (--system-site-packages) whose
# missing packages come from wheels in .whl/ of the checkout (pip --no-index) or, when pip can reach
# an index, from there.
# Exit: 0 every check passed, 1 a check failed, 2 usage or setup error, 3 skipped: no NVIDIA GPU/driver.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
keep=0
nvidia_bin=""
containers=""
usage() { echo "usage: scripts/gpu-check.sh [--keep] [--nvidia-bin DIR] [--containers]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --keep) keep=1 ;;
        --containers) containers=--containers ;;
        --nvidia-bin)
            if [ $# -lt 2 ] || [ ! -d "$2" ]; then usage; fi
            nvidia_bin=$(cd "$2" && pwd)
            shift ;;
        *) usage ;;
    esac
    shift
done

why=""
[ -r /proc/driver/nvidia/version ] || why="no /proc/driver/nvidia/version: the nvidia kernel module is not loaded"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    why="${why:+$why; }nvidia-smi is not on PATH"
elif [ -z "$why" ] && ! nvidia-smi -L >/dev/null 2>&1; then
    why="nvidia-smi -L lists no GPU"
fi
if [ -n "$why" ]; then
    echo "gpu-check: skipped: no NVIDIA GPU/driver found ($why)"
    exit 3
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/nodeprep-gpu-check.XXXXXX")
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    if [ "$keep" = 1 ]; then echo "gpu-check: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
export PYTHONDONTWRITEBYTECODE=1 PIP_CACHE_DIR="$work/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1

# module:distribution, nodeprep's dependencies (pyproject.toml) and NVML's bindings
needed="click:click yaml:pyyaml jinja2:jinja2 requests:requests zstandard:zstandard jsonschema:jsonschema tomli_w:tomli-w pynvml:nvidia-ml-py"
missing() {
    local m out=""
    for m in $needed; do
        "$py" -c "import ${m%%:*}" >/dev/null 2>&1 || out="$out ${m#*:}"
    done
    echo "$out"
}
python=${PYTHON:-python3}
py=$python
want=$(missing)
if [ -n "$want" ]; then  # not all there: a venv of our own that sees the system's packages
    if "$python" -m venv --system-site-packages "$work/venv" >/dev/null 2>&1; then
        py="$work/venv/bin/python"
        want=$(missing)
    else
        echo "gpu-check: no venv module for $python (python3-venv)" >&2
    fi
fi
if [ -n "$want" ] && [ "$py" != "$python" ]; then
    if [ -d "$repo/.whl" ]; then
        # shellcheck disable=SC2086  # one word per distribution
        "$py" -m pip install -q --no-index --find-links "$repo/.whl" $want >&2 || true
    else
        # shellcheck disable=SC2086
        "$py" -m pip install -q $want >&2 || true
    fi
    want=$(missing)
fi
if [ -n "$want" ]; then
    echo "gpu-check: setup failed: python packages missing:$want (put their wheels in $repo/.whl/)" >&2
    exit 2
fi

cd "$work"
set +e
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$py" "$repo/acceptance/gpu/gpu_check.py" --work "$work" \
    ${nvidia_bin:+--nvidia-bin "$nvidia_bin"} $containers
rc=$?
set -e
exit "$rc"
