"""Translate stdin with an exported model and nothing of this package: CTranslate2 and SentencePiece alone.

    python scripts/translate_with_ctranslate2.py EXPORT_DIR [--beam-size N] < input.txt > output.txt

EXPORT_DIR is what ``transformer-export`` wrote (a model with SentencePiece tokenizers). Greedy search by default
(what ``transformer-translate eval=greedy`` writes, line for line); with ``--beam-size`` beam search normalised by
length (``eval.length_norm=average``). The settings this app decodes with, from export.json: the hypothesis
length limit max(1, floor(max_len_a * source tokens + max_len_b)) (CTranslate2 takes one limit per call, so lines
are grouped by it), sources cut at the model's position limit, and EOS allowed as the first token.
"""

import argparse
import json
import math
import sys

import ctranslate2
import sentencepiece as spm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("--beam-size", type=int, default=1)
    args = parser.parse_args()
    with open(f"{args.export_dir}/export.json", encoding="utf-8") as handle:
        info = json.load(handle)
    kinds = {info[f"{side}_tokenizer"]["kind"] for side in ("source", "target")}
    if kinds != {"sentencepiece"}:
        sys.exit(f"{args.export_dir}: its tokenizers are {' and '.join(sorted(kinds))}; this script reads SentencePiece "
                 f"exports only: translate this one with transformer-translate export_dir={args.export_dir}")
    source = spm.SentencePieceProcessor(model_file=f"{args.export_dir}/{info['source_tokenizer']['path']}")
    target = spm.SentencePieceProcessor(model_file=f"{args.export_dir}/{info['target_tokenizer']['path']}")
    max_len_a, max_len_b = info["decoding"]["max_len_a"], info["decoding"]["max_len_b"]
    max_positions = info["model"]["max_positions"]
    translator = ctranslate2.Translator(args.export_dir, device="cpu")

    lines = [source.encode(line.rstrip("\n"), out_type=str)[:max_positions] for line in sys.stdin]
    groups: dict[int, list[int]] = {}  # hypothesis length limit -> line numbers
    for i, tokens in enumerate(lines):
        if tokens:  # a blank line stays blank
            groups.setdefault(min(max(1, math.floor(max_len_a * len(tokens) + max_len_b)), max_positions), []).append(i)
    output = [""] * len(lines)
    for limit, indices in groups.items():
        results = translator.translate_batch([lines[i] for i in indices], beam_size=args.beam_size,
                                             length_penalty=1.0, max_decoding_length=limit, min_decoding_length=0,
                                             max_batch_size=64)
        for i, result in zip(indices, results):
            output[i] = target.decode(result.hypotheses[0])
    sys.stdout.write("".join(line + "\n" for line in output))


if __name__ == "__main__":
    main()
