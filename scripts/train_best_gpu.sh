#!/usr/bin/env bash
# This project's best recipe, in minutes on one GPU: data diversification (scripts/train_diversified.sh: five
# teachers, their translations of the training split, four students decoding as one ensemble) shaped for a GPU.
# Its runs train side by side (PARALLEL=3: the five teachers at once, then the four students) under NVIDIA MPS,
# which lets their small kernels share the GPU's multiprocessors instead of taking turns on it; they validate every
# 1,082 steps (the teachers every other epoch of Multi30k, the students, on three times the pairs, about every
# two thirds of an epoch) and decode 2,048 sentences a batch; the teachers' ensembles are not scored.
#
#   MULTI30K_DIR=../shared/data/multi30k scripts/train_best_gpu.sh OUT_DIR [OVERRIDES...]   # e.g. data=multi30k_de_en
#
# Measured on one H100 (docs/RESULTS.md, "Nine minutes on one H100" and the section after it): 9.0 minutes in each
# direction, test_2016_flickr en-de 41.72 sacreBLEU / 42.17 tokenized, de-en 44.31 / 44.61; the result is
# OUT_DIR/student/ensemble_test. Run it again after a crash: what finished is kept, the rest resumed. MPS: started
# for this script's runs alone by scripts/with_mps.sh, where it can be; MPS=0 starts none (the runs then take turns
# on the GPU: about the sum of their times alone, not measured). Environment and OVERRIDES otherwise as for
# scripts/train_diversified.sh.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 OUT_DIR [OVERRIDES...]   (environment: see the header of $0)" >&2
    exit 2
fi
out=$1
shift
python=${PYTHON:-python}
here=$(cd "$(dirname "$0")" && pwd)
if ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "$0 is the recipe for a GPU, and $python's torch sees none here (or does not import); on a CPU," \
        "scripts/train_diversified.sh $out trains the same recipe one run at a time (about 8.5 hours on 2 cores)" >&2
    exit 2
fi

started=$SECONDS
PARALLEL=${PARALLEL:-3} SCORE_TEACHERS=${SCORE_TEACHERS:-0} "$here/with_mps.sh" "$here/train_diversified.sh" "$out" \
    training.validate_every_steps=1082 eval.batch_size=2048 "$@"
echo "the recipe took $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
"$python" - "$out/student/ensemble_test/metrics.json" <<'EOF'
import json
import sys

scored = json.load(open(sys.argv[1], encoding="utf-8"))
print(f"its ensemble on {scored['test_set']}: BLEU {scored['bleu']:.2f}, chrF {scored['chrf']:.2f}, tokenized BLEU "
      f"{scored.get('tokenized_bleu', float('nan')):.2f} ({sys.argv[1]})")
print(f"translate with it: transformer-translate checkpoint={scored['checkpoint']} "
      f"'ensemble=[{','.join(scored['ensemble'])}]' < input.txt > output.txt")
EOF
