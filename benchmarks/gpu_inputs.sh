#!/usr/bin/env bash
# What a GPU machine without network access needs beside the checkout, built here where there is network; all of it
# git-ignored, so a fresh checkout has none of it:
#
#   .whl/           hydra-core, omegaconf, antlr4-python3-runtime and sacremoses (pure Python; a bare CUDA image may
#                   lack them): install there with
#                   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#                   and export PYTHONPATH=/tmp/site:$PWD
#   .whl/opennmt/   OpenNMT-py 3.5.1 and what its training imports (benchmarks/peer_opennmt.py), pyonmttok's binary
#                   wheel for the GPU machine's Python (GPU_PYTHON, default 3.12)
#   .whl/ctranslate2/  CTranslate2 4.8.5's binary wheel for that Python: the float16 anchor of gpu_checks.sh targets
#   data/multi30k/  the English and German files of Multi30k from MULTI30K_DIR (the GPU checks read no others):
#                   there, export MULTI30K_DIR=$PWD/data/multi30k
#
#   MULTI30K_DIR=../shared/data/multi30k bash benchmarks/gpu_inputs.sh
#
# then copy the folders to the GPU machine with the checkout (rsync, scp) and run benchmarks/gpu_checks.sh there. It
# ends with the size of the checkout and the folders together: what the copy moves.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MULTI30K_DIR:?set MULTI30K_DIR to the folder of the gzipped Multi30k files}"

python3 -m pip wheel -q --no-deps -w .whl hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 \
    sacremoses==0.2.0
python3 -m pip download -q --no-deps -d .whl/opennmt OpenNMT-py==3.5.1 ConfigArgParse==1.9.0
binary=(--no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
rm -f .whl/opennmt/pyonmttok-*.whl .whl/ctranslate2/*.whl  # one wheel of each: another Python's would be sent too
python3 -m pip download -q "${binary[@]}" -d .whl/opennmt pyonmttok==1.38.1
python3 -m pip download -q "${binary[@]}" -d .whl/ctranslate2 ctranslate2==4.8.5
mkdir -p data/multi30k
cp "$MULTI30K_DIR"/*.en.gz "$MULTI30K_DIR"/*.de.gz data/multi30k/

ls -1 .whl .whl/opennmt .whl/ctranslate2
du -sh .whl data/multi30k
tree=$(git ls-files -z | xargs -0 cat | wc -c)
carried=$(du -sb .whl data/multi30k | awk '{s += $1} END {print s}')
echo "the tree ($((tree / 1024)) KiB) and these folders: $(((tree + carried) / 1048576)) MiB in all"
