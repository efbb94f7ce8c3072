#!/usr/bin/env bash
# The attention and position variants compared on Multi30k en->de (docs/RESULTS.md, "Attention and position
# variants"): every variant trains the `mini` model for the same wall-clock time with the same seed, two runs
# side by side on one thread each, then is scored on test_2016_flickr (greedy) and draws one alignment picture.
# Then the extrapolation check: each position option trained on pairs of <= 20 tokens, scored on the test
# pairs longer than that.
#
#   MULTI30K_DIR=../shared/data/multi30k scripts/compare_variants.sh [OUT_DIR]
#
# MINUTES (default 8) sets the training time of each run; the whole script takes about 6 x (MINUTES + 2) minutes.
set -euo pipefail
out=${1:-outputs/compare}
minutes=${MINUTES:-8}
mkdir -p "$out"
common=(model=mini eval=greedy training.threads=1 "training.max_minutes=$minutes" training.max_steps=600
        training.warmup_steps=300 training.valid_max_sentences=500 training.progress_bar=false)
# one test sentence for the alignment pictures (test_2016_flickr line 3: twelve words)
python - "$out" <<'EOF'
import sys
from pathlib import Path
from transformer.config import DataConfig
from transformer.corpus_files import load_split
src, ref = load_split(DataConfig(), "test_2016_flickr")
Path(sys.argv[1], "picture.en").write_text(src[2] + "\n", encoding="utf-8")
Path(sys.argv[1], "picture.de").write_text(ref[2] + "\n", encoding="utf-8")
EOF

train() {  # name, overrides...: train one variant, score it and draw its alignment picture
    local name=$1 run=$out/$1
    shift
    transformer-train "${common[@]}" "$@" hydra.run.dir="$run" > "$out/$name.log" 2>&1
    transformer-evaluate run_dir="$run" eval=greedy src_file="$out/picture.en" ref_file="$out/picture.de" \
        attention.indices=[0] output_dir="$run/picture" >> "$out/$name.log" 2>&1
}

extrapolate() {  # name, overrides...: train on pairs of <= 20 tokens, score the longer test pairs
    local name=long_$1 run=$out/long_$1
    shift
    transformer-train "${common[@]}" data.max_len=20 "$@" hydra.run.dir="$run" > "$out/$name.log" 2>&1
    transformer-evaluate run_dir="$run" eval=greedy longer_than=20 output_dir="$run/longer" >> "$out/$name.log" 2>&1
}


train scaled_dot & train additive experiment=attention_additive & wait
train multiplicative experiment=attention_multiplicative & train learned experiment=positions_learned & wait
train relative experiment=positions_relative & train rope experiment=positions_rope & wait
train none experiment=positions_none & extrapolate sinusoidal & wait
extrapolate learned experiment=positions_learned & extrapolate relative experiment=positions_relative & wait
extrapolate rope experiment=positions_rope & extrapolate none experiment=positions_none & wait
python - "$out" <<'EOF'
import json
import re
import statistics
import sys
from pathlib import Path
out = Path(sys.argv[1])
print("| run | params | steps | target tok/s (median of the log) | test BLEU | chrF | tokenized BLEU | sentences |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for run in sorted(p for p in out.iterdir() if (p / "metrics.json").is_file()):
    m = json.loads((run / "metrics.json").read_text())
    longer = run / "longer" / "metrics.json"
    test = json.loads(longer.read_text()) if longer.is_file() else m["test"]
    log = (out / f"{run.name}.log").read_text()
    rates = [float(r) for r in re.findall(r"([0-9.]+) tok/s", log)]
    params = re.search(r"model: ([0-9.]+M) parameters", log)
    sentences = re.search(r"on a side: (\d+)\)", test.get("test_set", ""))
    print(f"| {run.name} | {params.group(1) if params else '?'} | {m['train']['steps']} | "
          f"{statistics.median(rates):.0f} | {test['bleu']:.2f} | {test['chrf']:.2f} | "
          f"{test.get('tokenized_bleu') or 0:.2f} | {sentences.group(1) if sentences else 1000} |")
EOF
