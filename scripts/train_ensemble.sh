#!/usr/bin/env bash
# Train one recipe with several seeds, then score the runs as one ensemble (docs/RESULTS.md, "Ensembles"): the
# largest gain measured on Multi30k once a single model's recipe is trained to its end.
#
#   MULTI30K_DIR=../shared/data/multi30k scripts/train_ensemble.sh OUT_DIR [OVERRIDES...]
#
# OVERRIDES go to every training (e.g. experiment=multi30k_cpu data=multi30k_de_en). Environment:
#   SEEDS="1234 1 2"   the members' seeds, one run each in OUT_DIR/seed_<seed> (its console in seed_<seed>.out);
#                      with one seed, one run and no ensemble
#   PARALLEL=1         how many to train at once: more only on a GPU, which one small model leaves mostly idle
#                      (its steps are bound by host work), never on a 2-core CPU; the others start once the
#                      first has its data ready (corpus copy, tokenizers, encoded split), so that all share it
#   VALID_SPLIT=val    the corpus's validation split
#   MORE_MEMBERS=      finished runs of another recipe on the same data (run folders, space-separated; e.g. a larger
#                      model), scored with these runs as one ensemble
#   PYTHON=python      the interpreter that runs scripts/train.py and scripts/evaluate.py
#   TRAIN_ONLY=0       1: train (or keep) the runs and score no ensemble; run again without it to score them
# Run it again after a crash (with the same OVERRIDES): a finished run (its metrics.json written) is kept, an
# unfinished one resumed. Each run scores itself on the test set (train.log, metrics.json); the ensemble of all of
# them, decoded with the eval settings among OVERRIDES, is scored on the validation and test splits in
# OUT_DIR/ensemble_val and OUT_DIR/ensemble_test (metrics.json, hypotheses.txt).
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 OUT_DIR [OVERRIDES...]   (env: SEEDS=\"1234 1 2\", PARALLEL=1)" >&2
    exit 2
fi
out=$1
shift
read -r -a seeds <<<"${SEEDS:-1234 1 2}"
parallel=${PARALLEL:-1}
python=${PYTHON:-python}
if [[ ${#seeds[@]} -lt 1 ]]; then
    echo "SEEDS names no seed" >&2
    exit 2
fi
if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501)); then
    echo "$0 needs bash 5.1 or newer (wait -n -p), this is $BASH_VERSION" >&2
    exit 2
fi
read -r -a more_members <<<"${MORE_MEMBERS:-}"
for run in ${more_members[@]+"${more_members[@]}"}; do  # checked before hours of training, not after
    if [[ ! -f $run/checkpoints/final.pt ]]; then
        echo "MORE_MEMBERS: $run is not a finished run (no $run/checkpoints/final.pt)" >&2
        exit 2
    fi
done
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"

member() {  # member SEED OVERRIDES...: train, resume or keep the run of one seed; console output in seed_SEED.out
    local seed=$1 run="$out/seed_$1" console="$out/seed_$1.out"
    shift
    local command=("$python" "$here/train.py" "$@" "training.seed=$seed" training.progress_bar=false)
    if [[ -f $run/metrics.json ]]; then
        echo "seed $seed: finished earlier, kept ($run)"
        return 0
    elif [[ -f $run/checkpoints/last.pt ]]; then  # the recipe must match the run's (the resume check says so)
        echo "seed $seed: resuming $run"
        command+=("resume=$run" "hydra.run.dir=$run.resumed")  # that command's own log
    else
        echo "seed $seed: training $run"
        command+=("hydra.run.dir=$run")
    fi
    "${command[@]}" >>"$console" 2>&1 || { echo "seed $seed: failed, see $console" >&2; return 1; }
}

data_ready() {  # data_ready PID LOG: wait until the run PID logs its training data ready, or has stopped
    while kill -0 "$1" 2>/dev/null && ! grep -qs "training pairs:" "$2"; do
        sleep 2
    done
}

# Ctrl-C (or timeout's SIGINT) reaches the runs too, and each saves after its current step: this script starts no
# further run and waits for them, so that nothing is cut while it saves. So does a failed run: the rest would fail alike.
failed=0
interrupted=0
trap 'interrupted=1' INT TERM
running=0
wait_one() {  # wait until one run ends and record a failure; a trapped signal interrupts the wait, ending no run
    local pid='' status=0
    wait -n -p pid || status=$?
    if [[ -n ${pid:-} ]]; then  # wait unsets it first
        running=$((running - 1))
        [[ $status -eq 0 ]] || failed=1
    fi
}
for seed in "${seeds[@]}"; do
    [[ $interrupted -eq 0 && $failed -eq 0 ]] || break
    member "$seed" "$@" &
    running=$((running + 1))
    if [[ $seed == "${seeds[0]}" && $parallel -gt 1 ]]; then
        data_ready $! "$out/seed_$seed/train.log"
    fi
    while [[ $running -ge $parallel ]]; do
        wait_one
    done
done
while [[ $running -gt 0 ]]; do
    wait_one
done
if [[ $interrupted -ne 0 ]]; then
    echo "interrupted: run this script again, with the same overrides, to resume" >&2
    exit 130
elif [[ $failed -ne 0 ]]; then
    echo "run this script again, with the same overrides, to resume the failed training" >&2
    exit 1
fi

if [[ ${TRAIN_ONLY:-0} == 1 ]]; then
    exit 0
fi
members=()
for seed in "${seeds[@]}"; do
    members+=("$out/seed_$seed")
done
members+=(${more_members[@]+"${more_members[@]}"})
test_line() {  # test_line LABEL RUN: the run's own test score, as its training logged it
    grep -h "test (" "$2/train.log" | tail -n 1 | sed "s|^.*test (|$1: test (|" || true
}
if [[ ${#members[@]} -eq 1 ]]; then  # one run: no ensemble to score
    test_line "seed ${seeds[0]}" "${members[0]}"
    exit 0
fi
decoding=()  # the overrides evaluate shares with training: how to decode, on which device
for override in "$@"; do
    case $override in eval=* | eval.* | device=*) decoding+=("$override") ;; esac
done
ensemble=("run_dir=${members[0]}" "ensemble=[$(IFS=,; echo "${members[*]:1}")]" "${decoding[@]}")
"$python" "$here/evaluate.py" "${ensemble[@]}" "split=${VALID_SPLIT:-val}" "hydra.run.dir=$out/ensemble_val"
"$python" "$here/evaluate.py" "${ensemble[@]}" "hydra.run.dir=$out/ensemble_test"
for seed in "${seeds[@]}"; do  # each member alone, as its run scored itself
    test_line "seed $seed" "$out/seed_$seed"
done
for run in ${more_members[@]+"${more_members[@]}"}; do
    test_line "$run" "$run"
done
