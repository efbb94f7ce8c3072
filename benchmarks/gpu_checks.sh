#!/usr/bin/env bash
# The GPU measurements of docs/RESULTS.md, each mode sized for one ten-minute command on a GPU machine; logs under
# $OUT (else gpu_checks/).
#
#   benchmarks/gpu_checks.sh targets  # every figure the GPU targets still lack, in one command of TARGETS_LIMIT
#                                  # seconds (560): the suite's gpu tests, operators a decoding step and where
#                                  # the step's GPU time goes (float32; and bfloat16); the default model's test set
#                                  # decoded greedy and beam 5, cache on and off, ordinary and in fixed shapes, in
#                                  # float32 and bfloat16 (512 and 1,000 sentences a batch) (TARGETS_CHECKPOINT, else
#                                  # the default job trained here for two minutes), and by CTranslate2 in float16
#                                  # (the anchor; its wheel in .whl/ctranslate2); base's MFU at 16,384 positions
#                                  # (profiled) and 32,768. Each part gets what time is left; the logs come back as
#                                  # one targets.tgz (OpenNMT-py beside this project, met at 0.9.13: the peers mode)
#   benchmarks/gpu_checks.sh short # what one ten-minute command can hold, for 15 minutes of GPU time in all: the gpu
#                                  # tests, the default job with CUDA graphs (limited to 3.5 minutes: annealed if cut),
#                                  # then eager against graphs for the default model and decoding its checkpoint
#   benchmarks/gpu_checks.sh short_more  # its second command: the default job de->en (CUDA graphs), decoding profiled on
#                                     # its model, the whole suite (8 pytest-xdist workers), eager against graphs
#                                     # for base
#   benchmarks/gpu_checks.sh levers   # what makes one model of the default cheaper on a GPU (one command):
#                                  # validating every other epoch, 4096- and 8192-position batches (lr raised)
#   benchmarks/gpu_checks.sh best [DATA]  # the GPU recipe, transformer-recipe best_gpu, timed whole; stopped
#                                      # after BEST_LIMIT seconds (default 560), the runs kept in
#                                      # outputs/gpu_best_DATA: run it again (the machine still warm) to finish;
#                                      # SUITE_BESIDE=1: the whole suite beside it (4 workers, niced, outside MPS)
#   benchmarks/gpu_checks.sh tests    # the suite's gpu tests, then the whole suite
#   benchmarks/gpu_checks.sh speed    # training tokens/s and profiles: half (the default), small and base, eager
#                                  # (training.cuda_graphs=false) against CUDA graphs (a GPU's default)
#   benchmarks/gpu_checks.sh job      # the README's default job with CUDA graphs, timed whole; decoding its model
#   benchmarks/gpu_checks.sh decode   # the decoding target: the default job (3 minutes at most), then greedy and
#                                  # beam 5 on the whole test set, cache on and off, 200 / 512 / 1,000 sentences a
#                                  # batch, timed on a second pass; one profile of each search
#   benchmarks/gpu_checks.sh fixed    # the searches in fixed shapes, replayed as CUDA graphs: their gpu tests,
#                                  # operators and ms a step (decode_step.py), the default job (3 minutes at most),
#                                  # its test set decoded greedy and beam 5 both ways (the same lines?), and the
#                                  # decoding benchmark at 512 sentences a batch (each command within 10 minutes)
#   benchmarks/gpu_checks.sh peers    # OpenNMT-py 3.5.1 and this project trained on the same data, model and batch,
#                                  # small then base, 600 steps each, target tokens/s over steps 301-600 and the
#                                  # ratio (benchmarks/peer_opennmt.py; its wheels in .whl/, as its docstring says)
#   benchmarks/gpu_checks.sh mfu      # base at 16,384 positions with its compiled step replayed from the graphs (fused
#                                  # elementwise work; profiled), that path's gpu test, then base replayed as
#                                  # targets runs it (profiled) for the ratio
#   benchmarks/gpu_checks.sh quality [DATA]   # experiment=multi30k_gpu (DATA: multi30k_en_de, or multi30k_de_en),
#                                          # timed whole; its training stops after 8.5 minutes (a command: 10)
#   benchmarks/gpu_checks.sh ensemble [DATA]  # four seeds of the default trained at once, scored as one ensemble
#                                          # (transformer-recipe ensemble); stopped after 9 minutes, the runs kept in
#                                          # outputs/gpu_ensemble_DATA: run it again (the machine still warm) to
#                                          # resume them and finish
#
# Needs MULTI30K_DIR (a copy of Multi30k that travelled with the tree) and hydra-core, omegaconf,
# antlr4-python3-runtime and sacremoses importable (docs/guide/gpu.md, "Tests on a GPU machine": where a GPU
# machine lacks hydra).
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

ctranslate2_on_cuda() {  # install .whl/ctranslate2 into /tmp/gpu_targets/ct2; say whether it sees the GPU
    # CTranslate2 4.x's wheels load cuBLAS 12 (libcublas.so.12) when they first use the GPU. A machine with CUDA 13
    # alone gets cuBLAS 13 under that name, for this benchmark only (the functions a float16 translation calls kept
    # their names and arguments); the anchor's column "same as torch" shows whether its translations hold up.
    local wheel lib
    wheel=$(ls .whl/ctranslate2/ctranslate2-*.whl 2>/dev/null | head -n 1)
    if [[ -z $wheel ]]; then
        echo "== anchor: skipped, no CTranslate2 wheel in .whl/ctranslate2 (benchmarks/gpu_inputs.sh)"
        return 1
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_targets/ct2 "$wheel" || return 1
    cublas12=/tmp/gpu_targets/cublas12
    mkdir -p "$cublas12"
    if ! ldconfig -p | grep -q 'libcublas\.so\.12 '; then
        local packages
        packages=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        for lib in cublas cublasLt; do
            found=$(timeout 30 find /usr/local /usr/lib /opt "$packages" -name "lib$lib.so.1[23]*" 2>/dev/null |
                sort | head -n 1)
            echo "lib$lib.so.12: ${found:-not found}"
            [[ -n $found ]] && ln -sf "$found" "$cublas12/lib$lib.so.12"
        done
    fi
    LD_LIBRARY_PATH="$cublas12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        PYTHONPATH="/tmp/gpu_targets/ct2${PYTHONPATH:+:$PYTHONPATH}" python -c "import ctranslate2
n = ctranslate2.get_cuda_device_count()
print('ctranslate2', ctranslate2.__version__, 'sees', n, 'GPU(s)')
raise SystemExit(n == 0)"
}

within() {  # within SECONDS NAME COMMAND...: step NAME, limited to SECONDS or to what is left before $deadline
    local cap=$1 name=$2 left=$((deadline - SECONDS))
    shift 2
    if ((left < 15)); then
        echo "== $name: skipped, $left s left of the time limit"
        return
    fi
    step "$name" timeout -k 10 $((left < cap ? left : cap)) "$@"
}

case "${1:-}" in
targets)
    deadline=$((SECONDS + ${TARGETS_LIMIT:-560}))
    logs="$out"
    out=/tmp/gpu_targets/logs  # everything here, packed into $logs/targets.tgz at the end, however it ends
    mkdir -p "$out"
    trap 'tar czf "$logs/targets.tgz" -C /tmp/gpu_targets logs' EXIT
    echo "libcublas.so.12 (CTranslate2 4.x's CUDA build needs it): $(ldconfig -p | grep -c 'libcublas\.so\.12 ') found"
    within 150 gpu_tests python -m pytest -q -m gpu tests/test_fixed_shape.py tests/test_gpu.py \
        -k 'not compiled_step'  # compiling takes minutes: the mfu mode's
    within 40 decode_step python benchmarks/decode_step.py --device cuda --d-model 128 --rows 512 --profile
    within 40 decode_step_bf16 python benchmarks/decode_step.py --device cuda --d-model 128 --rows 512 --bf16
    checkpoint="${TARGETS_CHECKPOINT:-}"
    if [[ ! -f $checkpoint ]]; then
        echo "no TARGETS_CHECKPOINT file ('$checkpoint'): the default job trains here for two minutes"
        checkpoint=/tmp/gpu_targets/default_job/checkpoints/final.pt
        within 170 default_job python scripts/train.py training.max_minutes=2 hydra.run.dir=/tmp/gpu_targets/default_job
    fi
    within 100 decoding python scripts/benchmark.py "checkpoint=$checkpoint" train_steps=5 eval.beam_size=5 \
        "hydra.run.dir=$out/decoding"
    sed -n '/^| decoding/,$p' "$out/decoding/benchmark.md" 2>/dev/null
    if ((deadline - SECONDS > 30)) && ctranslate2_on_cuda; then  # the anchor: float16 export, by CTranslate2
        within 90 anchor env LD_LIBRARY_PATH="$cublas12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            PYTHONPATH="/tmp/gpu_targets/ct2${PYTHONPATH:+:$PYTHONPATH}" \
            python benchmarks/export_speed.py "$checkpoint" --device cuda --work /tmp/gpu_targets/exports
        sed -n '/^| model/,$p' "$out/anchor.log" 2>/dev/null
    fi
    for batch in 512 1000; do  # bfloat16; and the whole test set in one batch
        within 100 "decoding_bf16_$batch" python scripts/benchmark.py "checkpoint=$checkpoint" train_steps=5 \
            eval.beam_size=5 eval.precision=bf16 "eval.batch_size=$batch" "hydra.run.dir=$out/decoding_bf16_$batch"
        sed -n '/^| decoding/,$p' "$out/decoding_bf16_$batch/benchmark.md" 2>/dev/null
    done
    for positions in 16384 32768; do
        profile=$([[ $positions == 16384 ]] && echo 10 || echo 0)
        within 75 "base_$positions" python scripts/benchmark.py model=base "training.max_tokens=$positions" \
            train_steps=60 untimed_steps=10 decode_sentences=10 "profile_steps=$profile" \
            "hydra.run.dir=$out/base_$positions"
        grep -h "FLOP\|target tokens/s\|per step" "$out/base_$positions/benchmark.md" 2>/dev/null
    done
    grep -h "profiled steps" "$out/base_16384/profile.txt" 2>/dev/null
    echo "targets: $SECONDS s in all"
    ;;
short)
    runs=/tmp/gpu_short  # the runs' folders, packed without checkpoints into $out/short_runs.tgz at the end
    step gpu_tests timeout 180 python -m pytest -q -m gpu tests/test_gpu.py tests/test_fixed_shape.py -k 'not compiled_step'
    graphs=true  # unless the test comparing replayed graphs with the eager step failed or did not run
    if ! grep -q " passed" "$out/gpu_tests.log" || grep -q "FAILED.*test_recorded_graphs" "$out/gpu_tests.log"; then
        graphs=false
    fi
    step default_job timeout 300 python scripts/train.py "training.cuda_graphs=$graphs" training.max_minutes=3.5 \
        "hydra.run.dir=$runs/default_job"
    grep -h "training stopped\|projected\|final model\|test " "$runs/default_job/train.log" | tail -n 8
    step half timeout 55 python scripts/benchmark.py training.cuda_graphs=false train_steps=200 untimed_steps=30 \
        decode_sentences=100 profile_steps=20 "checkpoint=$runs/default_job/checkpoints/final.pt" \
        "hydra.run.dir=$runs/half"
    step half_graphs timeout 40 python scripts/benchmark.py training.cuda_graphs=true train_steps=200 \
        untimed_steps=30 decode_sentences=20 "hydra.run.dir=$runs/half_graphs"
    tar czf "$out/short_runs.tgz" --exclude='*.pt' -C "$(dirname "$runs")" "$(basename "$runs")"
    ;;
short_more)
    runs=/tmp/gpu_short_more
    step de_en_job timeout 180 python scripts/train.py data=multi30k_de_en training.cuda_graphs=true \
        training.max_minutes=3 "hydra.run.dir=$runs/de_en_job"
    grep -h "training stopped\|projected\|test " "$runs/de_en_job/train.log" | tail -n 4
    step decoding timeout 45 python scripts/benchmark.py data=multi30k_de_en train_steps=50 decode_sentences=200 \
        profile_steps=10 "checkpoint=$runs/de_en_job/checkpoints/final.pt" "hydra.run.dir=$runs/decoding"
    step suite timeout 130 python -m pytest -q -n 8
    step base timeout 40 python scripts/benchmark.py model=base training.cuda_graphs=false training.max_tokens=16384 \
        train_steps=60 untimed_steps=10 decode_sentences=10 "hydra.run.dir=$runs/base"
    step base_graphs timeout 40 python scripts/benchmark.py model=base training.max_tokens=16384 \
        training.cuda_graphs=true train_steps=60 untimed_steps=10 decode_sentences=10 "hydra.run.dir=$runs/base_graphs"
    tar czf "$out/short_more_runs.tgz" --exclude='*.pt' -C "$(dirname "$runs")" "$(basename "$runs")"
    ;;
levers)
    runs=/tmp/gpu_levers
    for lever in "every2 training.validate_every_steps=1082" \
        "b4096 training.max_tokens=4096 training.lr=3e-3 training.warmup_steps=500" \
        "b8192 training.max_tokens=8192 training.lr=4e-3 training.warmup_steps=250"; do
        read -r name overrides <<<"$lever"
        # shellcheck disable=SC2086  # the overrides split into words on purpose
        step "$name" timeout 170 python scripts/train.py $overrides training.max_minutes=2.5 "hydra.run.dir=$runs/$name"
        grep -h "training stopped\|projected\|validation BLEU\|test " "$runs/$name/train.log" | tail -n 4
    done
    tar czf "$out/levers_runs.tgz" --exclude='*.pt' -C "$(dirname "$runs")" "$(basename "$runs")"
    ;;
best)
    data="${2:-multi30k_en_de}"
    runs="outputs/gpu_best_$data"  # outside $out: the next command resumes what this one leaves
    if [[ ${SUITE_BESIDE:-0} == 1 ]]; then  # the whole suite on 4 niced workers, outside MPS
        OMP_NUM_THREADS=1 nice -n 10 python -m pytest -q -n 4 -p no:cacheprovider >"$out/suite.log" 2>&1 &
    fi
    step "best_$data" timeout -s INT -k 30 "${BEST_LIMIT:-560}" python -m transformer recipe best_gpu "$runs" "data=$data"
    grep -h "MPS\|the recipe took" "$out/best_$data.log"
    for log in "$runs"/*/seed_*/train.log; do
        echo "$log: $(grep -h "training stopped" "$log" | tail -n 1 | sed 's/.*training stopped/stopped/')"
        grep -h " test (" "$log" | tail -n 1
    done
    cp -r "$runs"/student/ensemble_* "$out/" 2>/dev/null
    if [[ ${SUITE_BESIDE:-0} == 1 ]]; then
        wait
        echo "suite: $(tail -n 1 "$out/suite.log")"
        grep -h "^FAILED\|^ERROR" "$out/suite.log" | head -n 20
    fi
    tar czf "$out/best_runs.tgz" --exclude='*.pt' --exclude='*.gz' -C outputs "gpu_best_$data"
    ;;
tests)
    step gpu_tests python -m pytest -q -m gpu tests/test_gpu.py tests/test_fixed_shape.py
    step suite python -m pytest -q -x
    ;;
speed)
    bench half training.cuda_graphs=false train_steps=300 untimed_steps=30 decode_sentences=100 profile_steps=20
    bench half_graphs training.cuda_graphs=true train_steps=300 untimed_steps=30 decode_sentences=100 profile_steps=20
    bench small model=small training.cuda_graphs=false train_steps=300 untimed_steps=30 decode_sentences=100 profile_steps=20
    bench small_graphs model=small training.cuda_graphs=true train_steps=300 untimed_steps=30 decode_sentences=100 profile_steps=20
    bench base model=base training.cuda_graphs=false training.max_tokens=16384 train_steps=100 untimed_steps=10 \
        decode_sentences=100
    bench base_graphs model=base training.max_tokens=16384 training.cuda_graphs=true train_steps=100 \
        untimed_steps=10 decode_sentences=100
    ;;
job)
    step default_job python scripts/train.py training.cuda_graphs=true "hydra.run.dir=$out/default_job"
    bench decoding "checkpoint=$out/default_job/checkpoints/final.pt" train_steps=5  # beam 5, cache on and off
    ;;
decode)
    runs=/tmp/gpu_decode
    step default_job timeout 240 python scripts/train.py training.max_minutes=3 "hydra.run.dir=$runs/default_job"
    grep -h "training stopped\|test " "$runs/default_job/train.log" | tail -n 2
    for batch in 200 512 1000; do
        profile=$([[ $batch == 512 ]] && echo 5 || echo 0)  # profile_steps > 0 also profiles the decoding
        bench "decode_$batch" "checkpoint=$runs/default_job/checkpoints/final.pt" train_steps=5 eval.beam_size=5 \
            "eval.batch_size=$batch" "profile_steps=$profile"
    done
    ;;
fixed)
    runs=/tmp/gpu_fixed
    step fixed_tests timeout 60 python -m pytest -q -m gpu tests/test_fixed_shape.py
    step decode_step timeout 60 python benchmarks/decode_step.py --device cuda --d-model 128 --rows 512
    step default_job timeout 200 python scripts/train.py training.max_minutes=2.5 "hydra.run.dir=$runs/default_job"
    for search in greedy beam; do
        beam=$([[ $search == greedy ]] && echo 1 || echo 5)
        for fixed in false true; do
            step "${search}_fixed_$fixed" timeout 40 python scripts/evaluate.py "run_dir=$runs/default_job" \
                "eval.beam_size=$beam" "eval.fixed_shape=$fixed" "hydra.run.dir=$runs/${search}_fixed_$fixed"
        done
        cmp "$runs/${search}_fixed_false/hypotheses.txt" "$runs/${search}_fixed_true/hypotheses.txt" &&
            echo "$search: the same lines"
    done
    step fixed_512 timeout 60 python scripts/benchmark.py "checkpoint=$runs/default_job/checkpoints/final.pt" \
        train_steps=5 eval.beam_size=5 eval.batch_size=512 "hydra.run.dir=$runs/fixed_512"
    ;;
mfu)
    # within ten minutes: the compiled step first (what targets lacks), its gpu test, then base as targets runs it
    step base_16k_compiled timeout 300 python scripts/benchmark.py model=base training.max_tokens=16384 \
        training.cuda_graphs=true training.compile=true train_steps=100 untimed_steps=10 decode_sentences=10 \
        profile_steps=10 "hydra.run.dir=$out/base_16k_compiled"
    step compiled_step_test timeout 150 python -m pytest -q -m gpu tests/test_gpu.py -k compiled_step
    step base_16k timeout 120 python scripts/benchmark.py model=base training.max_tokens=16384 train_steps=100 \
        untimed_steps=10 decode_sentences=10 profile_steps=10 "hydra.run.dir=$out/base_16k"
    grep -h "model FLOP utilisation\|target tokens/s\|milliseconds per step" "$out"/base_*/benchmark.md
    ;;
peers)
    for model in small base; do
        step "peers_$model" timeout 270 python benchmarks/peer_opennmt.py --model "$model" --work /tmp/gpu_peers
        cp "/tmp/gpu_peers/opennmt_$model/train.log" "$out/peers_${model}_opennmt.log" 2>/dev/null
        cp "/tmp/gpu_peers/ours_$model/benchmark.md" "$out/peers_${model}_ours.md" 2>/dev/null
        cp "/tmp/gpu_peers/peer_$model.json" "$out/" 2>/dev/null
    done
    ;;
quality)
    data="${2:-multi30k_en_de}"
    step "quality_$data" python scripts/train.py experiment=multi30k_gpu "data=$data" training.max_minutes=8.5 \
        "hydra.run.dir=$out/quality_$data"
    grep -h "training stopped\|final model\|test " "$out/quality_$data/train.log" | tail -n 8
    ;;
ensemble)
    data="${2:-multi30k_en_de}"
    runs="outputs/gpu_ensemble_$data"  # outside $out: the next command resumes what this one leaves
    # SIGINT, not timeout's SIGTERM: a run interrupted so saves last.pt after its current step
    step "ensemble_$data" timeout -s INT -k 60 540 python -m transformer recipe ensemble "$runs" experiment=multi30k_cpu \
        "data=$data" training.save_every_minutes=1 --seeds 1234,1,2,3 --parallel 4 --mps
    for log in "$runs"/seed_*/train.log; do
        echo "$log: $(grep "validation: bleu" "$log" | tail -n 1)"
    done
    cp -r "$runs"/ensemble_* "$out/" 2>/dev/null
    ;;
*)
    echo "usage: $0 targets|short|short_more|levers|best|tests|speed|job|decode|fixed|mfu|peers|quality|ensemble [DATA]" >&2
    exit 2
    ;;
esac
