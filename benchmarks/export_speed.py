"""Decoding speed and BLEU: this app's PyTorch search against its CTranslate2 export, side by side.

    python benchmarks/export_speed.py CHECKPOINT [CHECKPOINT ...] [--threads 2] [--sentences N] [--work DIR]
    python benchmarks/export_speed.py CHECKPOINT --device cuda      # float16 exports, fixed-shape searches too

For each checkpoint (e.g. the default model, and models of the ``small`` and ``base`` widths) the model is exported
into ``--work`` in each of ``--quantizations`` (on a CPU fp32 and int8, on CUDA float16); then the test split of its
corpus (``--sentences`` of it) is translated, every setting once untimed on the first 64 sentences and then timed on
all of them, one after another in this process:

- ``torch greedy``, ``torch beam 5 gnmt`` (the app's length normalisation, ``eval.length_penalty`` 1.5),
  ``torch beam 5 average``: :class:`Translator` on the checkpoint (the search ``transformer-translate`` runs); with
  ``--fixed-shape`` (the default on CUDA) also greedy and beam 5 average in fixed shapes (``eval.fixed_shape``);
- ``ct2 fp32|int8|float16 greedy``, ``ct2 ... beam 5`` (average normalisation): :class:`Translator` on the export.

Batches: ``eval.batch_size`` sentences (64 on a CPU, 512 on CUDA) sorted by length on both backends (CTranslate2
per group of equal length limit). On a CPU, PyTorch and CTranslate2 both get ``--threads`` threads. Prints a
Markdown table: sentences/s, sacreBLEU, the speed relative to ``torch beam 5 gnmt``, and how many lines equal the
PyTorch search with the same settings.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from transformer.config import EvalConfig, LengthNorm
from transformer.data.splits import load_split
from transformer.inference.export import export
from transformer.inference.loading import load_trained
from transformer.inference.metrics import corpus_scores
from transformer.inference.translator import Translator

# the ordinary searches (fixed shapes are the default on a GPU; this script times them in rows of their own)
GREEDY = EvalConfig(beam_size=1, fixed_shape=False)
BEAM_GNMT = EvalConfig(beam_size=5, length_norm=LengthNorm.gnmt, length_penalty=1.5, fixed_shape=False)
BEAM_AVERAGE = EvalConfig(beam_size=5, length_norm=LengthNorm.average, fixed_shape=False)
LABELS = {"none": "fp32"}  # the table's names of the export quantizations; the others by their own


def timed(translator: Translator, lines: list[str]) -> tuple[list[str], float]:
    translator.translate(lines[:64])  # untimed: first-call set-up
    began = time.perf_counter()
    hypotheses = [nbest[0] for nbest in translator.translate(lines)]
    return hypotheses, time.perf_counter() - began


def bench_checkpoint(checkpoint: Path, threads: int, n_sentences: int | None, work: Path, device: str = "cpu",
                     quantizations: tuple[str, ...] = ("none", "int8"), fixed_shape: bool = False) -> list[dict]:
    trained = load_trained(checkpoint, torch.device("cpu"))
    data = trained.config.data
    src, refs = load_split(data, data.test_split)
    if n_sentences is not None:
        src, refs = src[:n_sentences], refs[:n_sentences]
    exports = {}
    for quantization in quantizations:
        out = work / f"{checkpoint.parent.parent.name}_{checkpoint.stem}_{quantization}"
        exports[quantization] = out if out.exists() else export(trained, out, quantization, {})
    cfg = trained.config.model
    size = f"d_model {cfg.d_model}, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers"
    settings = [("torch", "torch", None, GREEDY), ("torch", "torch", None, BEAM_GNMT),
                ("torch", "torch", None, BEAM_AVERAGE)]
    if fixed_shape:
        settings += [("torch fixed shapes", "torch", None, replace(search, fixed_shape=True))
                     for search in (GREEDY, BEAM_AVERAGE)]
    for quantization in quantizations:
        label = LABELS.get(quantization, quantization)
        settings += [(f"ct2 {label}", "ctranslate2", quantization, GREEDY),
                     (f"ct2 {label}", "ctranslate2", quantization, BEAM_AVERAGE)]
    rows, reference = [], {}
    for name, backend, quantization, search in settings:
        path = checkpoint if backend == "torch" else exports[quantization]
        translator = Translator.load(path, device=device, eval_cfg=search, threads=threads)
        hypotheses, seconds = timed(translator, src)
        what = "greedy" if search.beam_size == 1 else f"beam {search.beam_size} {search.length_norm.value}"
        reference.setdefault(what, hypotheses)  # the first of each search: the ordinary PyTorch one
        same = sum(a == b for a, b in zip(hypotheses, reference[what]))
        bleu = corpus_scores(hypotheses, refs).bleu
        rows.append({"model": size, "setting": f"{name} {what}", "per_s": len(src) / seconds, "bleu": bleu,
                     "same": f"{same}/{len(src)}"})
        print(f"  {size}: {name} {what}: {len(src) / seconds:.1f} sentences/s, BLEU {bleu:.2f}", flush=True)
    base = next(r["per_s"] for r in rows if r["setting"] == "torch beam 5 gnmt")
    for row in rows:
        row["speedup"] = row["per_s"] / base
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=None, help="the first N test sentences (default: all)")
    parser.add_argument("--work", type=Path, default=None, help="where the exports go (default: a temporary folder)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quantizations", default=None,
                        help="comma-separated export quantizations (default: none,int8 on a CPU, float16 on CUDA)")
    parser.add_argument("--fixed-shape", action=argparse.BooleanOptionalAction, default=None,
                        help="also PyTorch's fixed-shape searches (default: on CUDA)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    quantizations = tuple((args.quantizations or ("float16" if cuda else "none,int8")).split(","))
    fixed_shape = cuda if args.fixed_shape is None else args.fixed_shape
    torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="export_speed."))
    work.mkdir(parents=True, exist_ok=True)
    rows = [row for checkpoint in args.checkpoints
            for row in bench_checkpoint(checkpoint, args.threads, args.sentences, work, args.device, quantizations,
                                        fixed_shape)]
    where = torch.cuda.get_device_name() if cuda else f"{args.threads} threads"
    print(f"\n{where}, torch {torch.__version__}\n")
    print("| model | setting | sentences/s | × torch beam 5 gnmt | BLEU | same as torch |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['model']} | {row['setting']} | {row['per_s']:.1f} | {row['speedup']:.2f} | {row['bleu']:.2f} | "
              f"{row['same']} |")


if __name__ == "__main__":
    main()
