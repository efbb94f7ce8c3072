#!/usr/bin/env bash
# Run a command with NVIDIA MPS (Multi-Process Service) on, so that the CUDA processes it starts share the GPU's
# multiprocessors at once instead of taking turns on it: what several small trainings on one GPU need (each alone
# leaves most of the GPU's multiprocessors idle: docs/RESULTS.md, "Nine minutes on one H100").
#
#   scripts/with_mps.sh COMMAND [ARGS...]     # e.g. PARALLEL=4 scripts/with_mps.sh scripts/train_ensemble.sh OUT
#
# A control daemon of its own (its pipe folder private to COMMAND's processes) is started where
# nvidia-cuda-mps-control exists and a CUDA process can use it, and stopped when COMMAND ends; otherwise COMMAND
# runs without MPS, with a warning. MPS=0 starts none. The GPU's settings (compute mode and others) are left alone.
set -uo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi
python=${PYTHON:-python}

stop_mps() {
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
    rm -rf "$CUDA_MPS_PIPE_DIRECTORY"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
if [[ ${MPS:-1} == 0 ]]; then
    echo "MPS=0: without MPS, the CUDA processes take turns on the GPU"
elif ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "no nvidia-cuda-mps-control on the PATH: without MPS, the CUDA processes take turns on the GPU" >&2
elif ! CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d "${TMPDIR:-/tmp}/mps.XXXXXX"); then
    unset CUDA_MPS_PIPE_DIRECTORY
    echo "no folder for MPS's pipes: without MPS, the CUDA processes take turns on the GPU" >&2
else
    export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY
    trap stop_mps EXIT  # before the daemon starts: an interruption from here on stops it too
    if nvidia-cuda-mps-control -d && "$python" -c 'import torch; torch.ones(1, device="cuda").sum().item()'; then
        echo "MPS: on (pipe folder $CUDA_MPS_PIPE_DIRECTORY)"
    else
        echo "MPS did not start ($(tail -n 2 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null)):" \
            "without it, the CUDA processes take turns on the GPU" >&2
        stop_mps
        trap - EXIT
    fi
fi
"$@"
