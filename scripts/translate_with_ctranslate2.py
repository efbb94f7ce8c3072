"""Translate stdin with an exported model and nothing of this package: CTranslate2 and SentencePiece alone.

    python scripts/translate_with_ctranslate2.py EXPORT_DIR < input.txt > output.txt

EXPORT_DIR is what ``transformer-export`` wrote (a model with SentencePiece tokenizers). Greedy search, with the
hypothesis length limit this app uses: max(1, floor(max_len_a * source tokens + max_len_b)), from export.json.
"""

import json
import math
import sys

import ctranslate2
import sentencepiece as spm


def main() -> None:
    export = sys.argv[1]
    with open(f"{export}/export.json", encoding="utf-8") as handle:
        info = json.load(handle)
    source = spm.SentencePieceProcessor(model_file=f"{export}/{info['source_tokenizer']['path']}")
    target = spm.SentencePieceProcessor(model_file=f"{export}/{info['target_tokenizer']['path']}")
    max_len_a, max_len_b = info["decoding"]["max_len_a"], info["decoding"]["max_len_b"]
    translator = ctranslate2.Translator(export, device="cpu")
    for line in sys.stdin:
        tokens = source.encode(line.rstrip("\n"), out_type=str)
        if not tokens:  # a blank line stays blank
            print()
            continue
        limit = max(1, math.floor(max_len_a * len(tokens) + max_len_b))
        result = translator.translate_batch([tokens], beam_size=1, max_decoding_length=limit)
        print(target.decode(result[0].hypotheses[0]))


if __name__ == "__main__":
    main()
