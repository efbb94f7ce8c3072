#!/usr/bin/env bash
# The GPU measurements of docs/RESULTS.md in a few calls on a lent GPU machine, logs under $OUT (else gpu_checks/).
#
#   scripts/gpu_checks.sh tests    # the suite's gpu tests, then the whole suite
#   scripts/gpu_checks.sh speed    # training tokens/s and profiles: half (the default), small and base, eager
#                                  # against CUDA graphs
#   scripts/gpu_checks.sh job      # the README's default job with CUDA graphs, timed whole; decoding its model
#   scripts/gpu_checks.sh quality [DATA]   # experiment=multi30k_gpu (DATA: multi30k_en_de, or multi30k_de_en),
#                                          # timed whole; its training stops after 8.5 minutes (a device call: 10)
#   scripts/gpu_checks.sh ensemble [DATA]  # four seeds of the default trained at once, scored as one ensemble
#                                          # (scripts/train_ensemble.sh); stopped after 9 minutes, the runs kept in
#                                          # outputs/gpu_ensemble_DATA: call it again (the machine still warm) to
#                                          # resume them and finish
#
# Needs MULTI30K_DIR (a copy of Multi30k that travelled with the tree) and hydra-core, omegaconf and
# antlr4-python3-runtime importable (README: "GPU machines without hydra").
set -uo pipefail
out="${OUT:-gpu_checks}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu.txt"

step() {  # step NAME COMMAND...: run it, log to $out/NAME.log, print its last lines and wall time
    local name=$1 start=$SECONDS
    shift
    echo "== $name: $*"
    "$@" >"$out/$name.log" 2>&1
    echo "   exit $?, $((SECONDS - start)) s"
    grep -v WARNING "$out/$name.log" | tail -n 4
}

bench() {  # bench NAME OVERRIDES...: transformer-benchmark into $out/NAME/
    local name=$1
    shift
    step "$name" python scripts/benchmark.py "$@" "hydra.run.dir=$out/$name"
}

case "${1:-}" in
tests)
    step gpu_tests python -m pytest -q -m gpu tests/test_gpu.py
    step suite python -m pytest -q -x
    ;;
speed)
    bench half train_steps=300 untimed_steps=30 decode_sentences=100 profile_steps=20
    bench half_graphs training.cuda_graphs=true train_steps=300 untimed_steps=30 decode_sentences=100 profile_steps=20
    bench small model=small train_steps=300 untimed_steps=30 decode_sentences=100 profile_steps=20
    bench small_graphs model=small training.cuda_graphs=true train_steps=300 untimed_steps=30 decode_sentences=100 profile_steps=20
    bench base model=base training.max_tokens=16384 train_steps=100 untimed_steps=10 decode_sentences=100
    bench base_graphs model=base training.max_tokens=16384 training.cuda_graphs=true train_steps=100 \
        untimed_steps=10 decode_sentences=100
    ;;
job)
    step default_job python scripts/train.py training.cuda_graphs=true "hydra.run.dir=$out/default_job"
    bench decoding "checkpoint=$out/default_job/checkpoints/final.pt" train_steps=5  # beam 5, cache on and off
    ;;
quality)
    data="${2:-multi30k_en_de}"
    step "quality_$data" python scripts/train.py experiment=multi30k_gpu "data=$data" training.max_minutes=8.5 \
        "hydra.run.dir=$out/quality_$data"
    grep -h "training stopped\|final model\|test " "$out/quality_$data/train.log" | tail -n 8
    ;;
ensemble)
    data="${2:-multi30k_en_de}"
    runs="outputs/gpu_ensemble_$data"  # outside $out: the next call resumes what this one leaves
    # SIGINT, not timeout's SIGTERM: a run interrupted so saves last.pt after its current step
    SEEDS="1234 1 2 3" PARALLEL=4 step "ensemble_$data" timeout -s INT -k 60 540 scripts/train_ensemble.sh "$runs" \
        experiment=multi30k_cpu "data=$data" training.save_every_minutes=1
    for log in "$runs"/seed_*/train.log; do
        echo "$log: $(grep "validation: bleu" "$log" | tail -n 1)"
    done
    cp -r "$runs"/ensemble_* "$out/" 2>/dev/null
    ;;
*)
    echo "usage: $0 tests|speed|job|quality|ensemble [DATA]" >&2
    exit 2
    ;;
esac
