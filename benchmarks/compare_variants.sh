#!/usr/bin/env bash
# The attention and position variants compared on Multi30k en->de (docs/RESULTS.md, "Attention and position
# variants"): every variant trains the `mini` model for the same wall-clock time (training.max_minutes, where
# the cosine schedule ends since version 0.7; the figures there predate that: their schedule was set to end at step
# 500, after the time limit on the development machine, so they stopped at a higher rate) with the same seed, two runs side by side on one thread each; each is scored on test_2016_flickr (greedy) and draws one
# alignment picture. Then the extrapolation check: each position option trained on pairs of <= 20 tokens,
# scored on the test pairs longer than that.
#
#   [MULTI30K_DIR=/path/to/multi30k] benchmarks/compare_variants.sh [OUT_DIR]
#
# MINUTES (default 12) sets the training time of each run; the whole script takes about 6 x (MINUTES + 2) minutes.
# A failed run is reported on stderr and left out of the table; the others go on.
set -euo pipefail
out=${1:-outputs/compare}
minutes=${MINUTES:-12}
mkdir -p "$out"
common=(model=mini eval=greedy training.threads=1 "training.max_minutes=$minutes" training.max_steps=500
        training.warmup_steps=200 training.valid_max_sentences=500 training.progress_bar=false
        training.lr=1e-3 training.max_tokens=2048 training.accumulate=2 training.patience=8
        training.weight_decay=0.0)  # the defaults it ran with
# one test sentence for the alignment pictures (test_2016_flickr line 3: twelve words)
python - "$out" <<'PY'
import os
import sys
from pathlib import Path
from transformer.config import DataConfig
from transformer.data.splits import load_split
src, ref = load_split(DataConfig(source_dir=os.environ.get("MULTI30K_DIR")), "test_2016_flickr")
Path(sys.argv[1], "picture.en").write_text(src[2] + "\n", encoding="utf-8")
Path(sys.argv[1], "picture.de").write_text(ref[2] + "\n", encoding="utf-8")
PY

train() {  # name, overrides...: train one variant, score it and draw its alignment picture
    local name=$1 run=$out/$1
    shift
    transformer-train "${common[@]}" "$@" hydra.run.dir="$run" > "$out/$name.log" 2>&1
    OMP_NUM_THREADS=1 transformer-evaluate run_dir="$run" eval=greedy src_file="$out/picture.en" \
        ref_file="$out/picture.de" 'attention.indices=[0]' output_dir="$run/picture" >> "$out/$name.log" 2>&1
}

extrapolate() {  # name, overrides...: train on pairs of <= 20 tokens, score the longer test pairs
    local name=long_$1 run=$out/long_$1
    shift
    transformer-train "${common[@]}" data.max_len=20 "$@" hydra.run.dir="$run" > "$out/$name.log" 2>&1
    OMP_NUM_THREADS=1 transformer-evaluate run_dir="$run" eval=greedy longer_than=20 output_dir="$run/longer" \
        >> "$out/$name.log" 2>&1
}

pair() {  # two jobs side by side, each one command line; a failure is reported and the rest goes on
    local first second
    eval "$1" & first=$!
    eval "$2" & second=$!
    wait "$first" || echo "failed: $1 (see its log in $out)" >&2
    wait "$second" || echo "failed: $2 (see its log in $out)" >&2
}

pair "train scaled_dot" "train additive experiment=attention_additive"
pair "train multiplicative experiment=attention_multiplicative" "train learned experiment=positions_learned"
pair "train relative experiment=positions_relative" "train rope experiment=positions_rope"
pair "train none experiment=positions_none" "extrapolate sinusoidal"
pair "extrapolate learned experiment=positions_learned" "extrapolate relative experiment=positions_relative"
pair "extrapolate rope experiment=positions_rope" "extrapolate none experiment=positions_none"
python - "$out" <<'PY'
import json
import re
import statistics
import sys
from pathlib import Path
out = Path(sys.argv[1])
print("| run | params | steps (stopped by) | target tok/s (median of the log) | test BLEU | chrF | tokenized BLEU | sentences |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for run in sorted(p for p in out.iterdir() if (p / "metrics.json").is_file()):
    m = json.loads((run / "metrics.json").read_text())
    longer = run / "longer" / "metrics.json"
    if run.name.startswith("long_") and not longer.is_file():
        print(f"{run.name}: its evaluation on the longer sentences failed; left out", file=sys.stderr)
        continue
    test = json.loads(longer.read_text()) if run.name.startswith("long_") else m["test"]
    log = (out / f"{run.name}.log").read_text()
    rates = [float(r) for r in re.findall(r"([0-9.]+) tok/s", log)]
    params = re.search(r"model: ([0-9.]+M) parameters", log)
    tokenized = test.get("tokenized_bleu")
    print(f"| {run.name} | {params.group(1) if params else '?'} | {m['train']['steps']} ({m['train']['reason']}) | "
          f"{statistics.median(rates):.0f} | {test['bleu']:.2f} | {test['chrf']:.2f} | "
          f"{'–' if tokenized is None else f'{tokenized:.2f}'} | {test['n_sentences']} |")
PY
