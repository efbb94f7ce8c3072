#!/usr/bin/env bash
# Data diversification (docs/RESULTS.md, "Data diversification"): train teachers in both directions, extend the
# training split with their translations of it (transformer-diversify), and train a student on the result.
#
#   MULTI30K_DIR=../shared/data/multi30k scripts/train_diversified.sh OUT_DIR [OVERRIDES...]
#
# OVERRIDES go to every training, teachers and students (e.g. data=multi30k_de_en, device=cuda); each trains its
# whole schedule (training.max_minutes=null, as the figures were measured) unless OVERRIDES set a limit. The steps, each
# kept when run again after it finished and resumed when it did not (run the script again with the same OVERRIDES):
#   OUT_DIR/forward    the corpus's direction, one run per seed in SEEDS, scored as an ensemble
#                      (scripts/train_ensemble.sh)
#   OUT_DIR/backward   the other direction (data.src and data.tgt swapped), one run per seed in BACKWARD_SEEDS
#                      (BACKWARD_SEEDS=none: no backward teachers, no back-translations)
#   OUT_DIR/corpus     the training split, then its sources with the forward ensemble's translations, then the
#                      backward ensemble's translations with its targets: three times the pairs (beam 5; of
#                      OVERRIDES only device=... and eval.batch_size=... reach this step)
#   OUT_DIR/student_wide  students of model=wide (the default model at 1.5 times the width), trained on
#                      OUT_DIR/corpus (data.train_dir; all of it: data.max_pairs=null) for STUDENT_EPOCHS epochs,
#                      validated and tested on the corpus's own splits; one run per seed in WIDE_STUDENT_SEEDS
#                      (none: no wide student)
#   OUT_DIR/student    students of the recipe's own model, trained the same way, one run per seed in STUDENT_SEEDS;
#                      all students, wide ones included, scored as one ensemble (OUT_DIR/student/ensemble_val and
#                      ensemble_test). On Multi30k's validation set three students beat two, two beat one, and the
#                      wide one added to the three beat them.
# Environment: SEEDS="1234 1 2", BACKWARD_SEEDS="1234 1", STUDENT_SEEDS="1234 1 2", WIDE_STUDENT_SEEDS="1234",
# STUDENT_EPOCHS=15 (46 epochs of the corpus over three times the pairs: about the default's number of updates),
# PARALLEL and PYTHON as in scripts/train_ensemble.sh (PARALLEL only on a GPU), SCORE_TEACHERS=1 (0: score no
# teachers' ensemble; train_ensemble.sh on their folder scores it later). With PARALLEL > 1 the two directions'
# teachers train side by side, and so do the wide and the other students: up to twice PARALLEL runs at once. A kept
# corpus is not remade when the teachers change: remove OUT_DIR/corpus for that.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 OUT_DIR [OVERRIDES...]   (environment: see the header of $0)" >&2
    exit 2
fi
out=$1
shift
set -- training.max_minutes=null "$@"  # first, so that a limit in OVERRIDES wins
python=${PYTHON:-python}
here=$(cd "$(dirname "$0")" && pwd)
read -r -a forward_seeds <<<"${SEEDS:-1234 1 2}"
read -r -a backward_seeds <<<"${BACKWARD_SEEDS:-1234 1}"
if [[ ${#forward_seeds[@]} -eq 0 ]]; then
    echo "SEEDS names no seed: the forward teachers need at least one" >&2
    exit 2
fi
[[ ${backward_seeds[*]} == none ]] && backward_seeds=()

parallel=${PARALLEL:-1}
# On Ctrl-C every run saves and stops, and train_ensemble.sh waits for its runs; so does this script (the trap
# keeps it alive for that), then stops.
trap : INT TERM
side_by_side() {  # side_by_side F G: the functions F and G, at once when PARALLEL > 1; fails if either does
    # (F and G run one command each: errexit does not hold inside a function called before || or &&)
    if [[ $parallel -gt 1 ]]; then
        "$1" &
        local first=$! failed=0 status=0
        "$2" || failed=1
        wait "$first" || status=$?
        while [[ $status -gt 128 ]] && kill -0 "$first" 2>/dev/null; do  # the wait was cut by a trapped signal
            status=0
            wait "$first" || status=$?
        done
        [[ $status -eq 0 ]] || failed=1
        return "$failed"
    fi
    "$1" && "$2"
}

# The direction the recipe trains, as OVERRIDES compose it: the backward teachers train the other one.
# (checked before any training: a bad override stops the recipe here, with Hydra's message)
data=$("$python" "$here/train.py" "$@" --cfg job --package data) || {
    echo "the recipe's config does not compose from these overrides (Hydra's message above): $*" >&2
    exit 2
}
read -r src tgt < <("$python" -c 'import sys, yaml
data = yaml.safe_load(sys.stdin)
print(data["src"], data["tgt"])' <<<"$data")
if [[ -z ${tgt:-} ]]; then
    echo "no data.src and data.tgt in the composed config:" "$data" >&2
    exit 2
fi
overrides=("$@")
teachers_train_only=$([[ ${SCORE_TEACHERS:-1} == 0 ]] && echo 1 || echo 0)
forward() {
    SEEDS="${forward_seeds[*]}" TRAIN_ONLY=$teachers_train_only "$here/train_ensemble.sh" "$out/forward" "${overrides[@]}"
}
backward() {
    [[ ${#backward_seeds[@]} -eq 0 ]] && return 0
    SEEDS="${backward_seeds[*]}" TRAIN_ONLY=$teachers_train_only "$here/train_ensemble.sh" "$out/backward" \
        "${overrides[@]}" "data.src=$tgt" "data.tgt=$src"
}
side_by_side forward backward

runs() {  # runs DIR SEED...: the runs' folders, comma-separated, for a Hydra list
    local dir=$1
    shift
    local seed folders=()
    for seed in "$@"; do
        folders+=("$dir/seed_$seed")
    done
    (IFS=,; echo "${folders[*]}")
}
if [[ -f $out/corpus/diversify.json ]]; then
    echo "diversified corpus: made earlier, kept ($out/corpus)"
else
    rm -rf "$out/corpus"  # a crash before diversify.json leaves nothing worth keeping
    decoding=()  # the overrides that reach the translations: on which device, in batches of how many sentences
    for override in "$@"; do
        case $override in device=* | eval.batch_size=*) decoding+=("$override") ;; esac
    done
    "$python" "$here/diversify.py" "forward=[$(runs "$out/forward" "${forward_seeds[@]}")]" \
        "backward=[$(runs "$out/backward" ${backward_seeds[@]+"${backward_seeds[@]}"})]" "out_dir=$out/corpus" \
        "hydra.run.dir=$out/diversify" ${decoding[@]+"${decoding[@]}"}
fi

student=("$@" "data.train_dir=$out/corpus" data.max_pairs=null "training.max_epochs=${STUDENT_EPOCHS:-15}")
read -r -a wide_seeds <<<"${WIDE_STUDENT_SEEDS:-1234}"
[[ ${wide_seeds[*]} == none ]] && wide_seeds=()
wide_students() {
    [[ ${#wide_seeds[@]} -eq 0 ]] && return 0
    SEEDS="${wide_seeds[*]}" "$here/train_ensemble.sh" "$out/student_wide" "${student[@]}" model=wide  # wins: last
}
students() {  # the other students; with MORE_MEMBERS, scored with those as one ensemble
    SEEDS="${STUDENT_SEEDS:-1234 1 2}" "$here/train_ensemble.sh" "$out/student" "${student[@]}"
}
wide_unscored() { TRAIN_ONLY=1 wide_students; }
students_unscored() { TRAIN_ONLY=1 students; }
if [[ $parallel -gt 1 ]]; then  # side by side first; the calls below then keep them and score the ensembles
    side_by_side wide_unscored students_unscored
fi
TRAIN_ONLY=0 wide_students
TRAIN_ONLY=0 MORE_MEMBERS="${wide_seeds[*]/#/$out/student_wide/seed_}" students
