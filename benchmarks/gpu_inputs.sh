#!/usr/bin/env bash
# What a GPU machine without network access needs beside the checkout, built here where there is network; all of it
# git-ignored, so a fresh checkout has none of it:
#
#   .whl/           hydra-core, omegaconf, antlr4-python3-runtime and sacremoses (pure Python; a bare CUDA image may
#                   lack them): install there with
#                   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#                   and export PYTHONPATH=/tmp/site:$PWD
#   .whl/opennmt/   OpenNMT-py 3.5.1 and what its training imports (benchmarks/peer_opennmt.py), pyonmttok's binary
#                   wheel for Python 3.11 and 3.12
#   data/multi30k/  a copy of Multi30k from MULTI30K_DIR: there, export MULTI30K_DIR=$PWD/data/multi30k
#
#   MULTI30K_DIR=../shared/data/multi30k bash benchmarks/gpu_inputs.sh
#
# then send the three folders with the tree (a device runner's "carry", or rsync) and run benchmarks/gpu_checks.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MULTI30K_DIR:?set MULTI30K_DIR to the folder of the gzipped Multi30k files}"

python3 -m pip wheel -q --no-deps -w .whl hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 \
    sacremoses==0.2.0
python3 -m pip download -q --no-deps -d .whl/opennmt OpenNMT-py==3.5.1 ConfigArgParse==1.9.0
for version in 3.11 3.12; do
    python3 -m pip download -q --no-deps -d .whl/opennmt --only-binary=:all: --python-version "$version" \
        pyonmttok==1.38.1
done
mkdir -p data/multi30k
cp "$MULTI30K_DIR"/*.gz data/multi30k/

ls -1 .whl .whl/opennmt
du -sh .whl data/multi30k
