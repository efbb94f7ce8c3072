"""OpenNMT-py 3.5.1 beside this project on the same machine, data, model and batch: training target tokens/s.

    python benchmarks/peer_opennmt.py --model small [--steps 600 --from-step 300] [--wheels DIR] [--work DIR]

prints OpenNMT-py's speed, this project's and their ratio, and writes ``peer_<model>.json`` in ``--work``. Both
sides get:

- **the data**: Multi30k's training split as this project reads it (``MULTI30K_DIR``), cut into this project's own
  joint 8k BPE pieces (its cached SentencePiece model). OpenNMT-py reads the pieces as pre-tokenised text with no
  transforms and builds its vocabulary from them (``onmt_build_vocab -n_sample -1``);
- **the model**: this project's ``configs/model/<name>.yaml``: layers, width, heads, feed-forward, dropout,
  sinusoidal positions, embeddings shared and tied as it says (``small``, ``base``: one embedding for source and
  target, tied to the output), biases in every projection; the parameter counts are printed side by side.
  OpenNMT-py 3.5 normalises before each sublayer only, so where this project's model is post-norm (``base``) the
  two differ in where a LayerNorm sits, not in the work done;
- **the batch**: OpenNMT-py's ``batch_size`` (tokens, counted as max(source, target) per sentence) against this
  project's ``training.max_tokens`` of twice as many (source + target positions);
- **the precision**: on a GPU fp16 for OpenNMT-py (``model_dtype: fp16``, its fastest) and this project's default
  (bf16, CUDA graphs); on a CPU fp32 for both.

The speed is target tokens (EOS included, BOS not, as both count them) per second over the steps after
``--from-step``, which leaves start-up and warm-up out: for OpenNMT-py from its report lines (the tokens of each
interval over its seconds, summed), for this project from ``transformer-benchmark`` with ``untimed_steps`` the same.
The median of OpenNMT-py's intervals is printed too: its data loader has stalled for tens of seconds mid-run.

OpenNMT-py is installed from ``--wheels`` without network and without its dependencies into ``WORK/site``, never
into the environment. Training needs only torch, PyYAML and, from the folder, ``ConfigArgParse`` and ``pyonmttok``
(a binary wheel, one per Python version). Build the folder (default ``.whl/opennmt``, git-ignored, apart from the
wheels the application's tests install) where there is network::

    pip download --no-deps -d .whl/opennmt OpenNMT-py==3.5.1 ConfigArgParse==1.9.0
    pip download --no-deps -d .whl/opennmt --only-binary=:all: --python-version 3.12 pyonmttok==1.38.1

OpenNMT-py registers every data transform at import, and several need packages training does not (spacy,
fasttext, rapidfuzz, ...): those transforms are left unregistered, each named on stderr; none is used here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT_EVERY = 50
# "Step 350/  600; acc: ...; bsz: 1190/1105/35; 21012/19517 tok/s;     60 sec;"
REPORT_LINE = re.compile(r"Step\s+(\d+)(?:/\s*\d+)?;.*?bsz:\s*([\d.]+)/\s*([\d.]+)/\s*[\d.]+;"
                         r"\s*([\d.]+)/\s*([\d.]+) tok/s;")


def install(wheels: Path, site: Path) -> None:
    """OpenNMT-py and the two packages its training imports that environments lack, into ``site``."""
    if (site / "onmt").is_dir():
        return
    found = {name: sorted(wheels.glob(pattern)) for name, pattern in
             [("OpenNMT-py 3.5.1", "OpenNMT_py-3.5.1-*.whl"), ("ConfigArgParse", "[Cc]onfig[Aa]rg[Pp]arse-*.whl"),
              ("pyonmttok", "pyonmttok-*.whl")]}
    missing = [name for name, paths in found.items() if not paths]
    if missing:
        sys.exit(f"{wheels}: no wheel of {', '.join(missing)} (how to build the folder: {__file__}'s docstring)")
    # pip picks, among the pyonmttok wheels, the one this Python takes.
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target",
                    str(site), "--find-links", str(wheels), "OpenNMT-py==3.5.1", "ConfigArgParse", "pyonmttok"],
                   check=True)


def importable_opennmt(site: Path) -> None:
    """Make OpenNMT-py importable from ``site``, its transforms whose imports fail left out (named on stderr).

    Runs at the import of this file in the process that runs OpenNMT-py and in its data loader's workers (spawned:
    they import this file again before anything of OpenNMT-py), which ``OPENNMT_SITE`` marks.
    """
    sys.path.insert(0, str(site))
    real_import = importlib.import_module

    def tolerant_import(name: str, package: str | None = None):
        try:
            return real_import(name, package)
        except ImportError as error:
            if not name.startswith("onmt.transforms."):
                raise
            if __name__ == "__main__":  # once, not again in each worker
                print(f"OpenNMT-py: transform {name.rsplit('.', 1)[1]} left out ({error})", file=sys.stderr)
            return None

    importlib.import_module = tolerant_import  # onmt.transforms imports its modules through this name
    try:
        importlib.import_module("onmt.transforms")
    finally:
        importlib.import_module = real_import


if os.environ.get("OPENNMT_SITE") and __name__ in ("__main__", "__mp_main__"):
    importable_opennmt(Path(os.environ["OPENNMT_SITE"]))


def run_opennmt(tool: str, argv: list[str]) -> None:
    """``onmt_<tool>`` in this process."""
    module = importlib.import_module(f"onmt.bin.{tool}")
    sys.argv = [f"onmt_{tool}", *argv]
    module.main()


def project_config(model: str, max_tokens: int):
    sys.path.insert(0, str(ROOT))
    from transformer.app.recipes import compose_command

    # output_dir is Hydra's run folder, resolved only in a Hydra job; these settings do not use it.
    return compose_command("benchmark", [f"model={model}", f"training.max_tokens={max_tokens}", "output_dir=unused"])


def write_pieces(cfg, folder: Path) -> tuple[tuple[Path, Path], int]:
    """The training split in this project's subword pieces, one sentence a line (pairs with an empty side out), and
    the number of parameters of this project's model with these vocabularies."""
    from transformer.data.cache import load_or_build
    from transformer.data.splits import load_split
    from transformer.model.transformer import build_model

    src_tok, tgt_tok, _ = load_or_build(cfg.data)
    model = build_model(cfg.model, src_tok.vocab_size, tgt_tok.vocab_size, src_tok.pad_id)
    parameters = sum(p.numel() for p in model.parameters())
    src, tgt = load_split(cfg.data, cfg.data.train_split)
    pairs = [(s, t) for s, t in zip(src, tgt) if s and t]
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.src", folder / "train.tgt"
    for path, tok, side in zip(paths, (src_tok, tgt_tok), zip(*pairs)):
        lines = (" ".join(tok.id_to_piece(i) for i in ids) for ids in tok.encode_batch(list(side)))
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths, parameters


def opennmt_config(cfg, pieces: tuple[Path, Path], folder: Path, args: argparse.Namespace, cuda: bool) -> Path:
    m = cfg.model
    options = {
        "save_data": str(folder / "data"), "src_vocab": str(folder / "vocab.txt"), "share_vocab": True,
        "overwrite": True, "src_vocab_size": 100_000, "tgt_vocab_size": 100_000,
        "data": {"train": {"path_src": str(pieces[0]), "path_tgt": str(pieces[1])}},
        "save_model": str(folder / "model"), "train_steps": args.steps, "valid_steps": 10 * args.steps,
        "save_checkpoint_steps": 10 * args.steps, "report_every": REPORT_EVERY, "log_file": str(folder / "train.log"),
        "seed": 1234,
        "encoder_type": "transformer", "decoder_type": "transformer", "enc_layers": m.n_encoder_layers,
        "dec_layers": m.n_decoder_layers, "hidden_size": m.d_model, "word_vec_size": m.d_model, "heads": m.n_heads,
        "transformer_ff": m.d_ff, "dropout": [m.dropout], "attention_dropout": [m.attention_dropout],
        "position_encoding": True, "share_embeddings": m.share_embeddings,
        "share_decoder_embeddings": m.tie_output,
        "add_qkvbias": True, "add_ffnbias": True,  # as this project's layers (OpenNMT-py's default: none)
        "param_init": 0.0, "param_init_glorot": True,
        "batch_type": "tokens", "batch_size": args.batch, "normalization": "tokens", "accum_count": [1],
        "num_workers": 2, "optim": "adam", "adam_beta1": 0.9, "adam_beta2": 0.998, "decay_method": "noam",
        "learning_rate": 2.0, "warmup_steps": 1000, "label_smoothing": 0.1, "max_grad_norm": 0.0,
        "model_dtype": "fp16" if cuda else "fp32",
    }
    if cuda:
        options.update(gpu_ranks=[0], world_size=1)
    path = folder / "config.json"  # JSON is YAML: OpenNMT-py reads it as its config
    path.write_text(json.dumps(options, indent=2) + "\n")
    return path


def opennmt_speed(log: Path, from_step: int) -> dict[str, float]:
    """Target tokens/s over the report intervals after ``from_step``, and their median, from OpenNMT-py's log."""
    tokens = seconds = 0.0
    rates, per_batch = [], []
    text = log.read_text(encoding="utf-8")
    parameters = re.search(r"number of parameters: (\d+)", text)
    for match in REPORT_LINE.finditer(text):
        step, tgt_per_batch, tgt_rate = int(match[1]), float(match[3]), float(match[5])
        if step > from_step and tgt_rate > 0:
            interval_tokens = tgt_per_batch * REPORT_EVERY
            tokens, seconds = tokens + interval_tokens, seconds + interval_tokens / tgt_rate
            rates.append(tgt_rate)
            per_batch.append(tgt_per_batch)
    if not rates:
        sys.exit(f"{log}: no report line after step {from_step} (did OpenNMT-py train? its output is above)")
    return {"tgt_tokens_per_s": tokens / seconds, "median_interval": statistics.median(rates),
            "tgt_tokens_per_step": statistics.fmean(per_batch), "intervals": len(rates),
            "parameters": int(parameters[1]) if parameters else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl" / "opennmt",
                        help="folder of the wheels (default .whl/opennmt)")
    parser.add_argument("--model", default="small", help="this project's model config (small, base, half, ...)")
    parser.add_argument("--batch", type=int, default=4096, help="OpenNMT-py's batch_size in tokens (max(src, tgt))")
    parser.add_argument("--steps", type=int, default=600, help="training steps of each side")
    parser.add_argument("--from-step", type=int, default=300, help="the steps timed are those after this one")
    parser.add_argument("--work", type=Path, default=Path("outputs/peer_opennmt"), help="where everything goes")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--threads", type=int, help="CPU threads of each side (default: torch's)")
    parser.add_argument("--opennmt", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # TOOL ARGS...
    args = parser.parse_args()
    if args.opennmt:
        run_opennmt(args.opennmt[0], args.opennmt[1:])
        return
    if args.from_step % REPORT_EVERY or not 0 <= args.from_step < args.steps:
        parser.error(f"--from-step must be a multiple of {REPORT_EVERY} below --steps")
    import torch

    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    work = args.work.resolve()
    site, onmt_dir = work / "site", work / f"opennmt_{args.model}"
    onmt_dir.mkdir(parents=True, exist_ok=True)
    install(args.wheels, site)
    cfg = project_config(args.model, 2 * args.batch)
    pieces, parameters = write_pieces(cfg, work / "pieces")
    config = opennmt_config(cfg, pieces, onmt_dir, args, cuda)
    (onmt_dir / "train.log").unlink(missing_ok=True)
    me, env = [sys.executable, __file__, "--opennmt"], {**os.environ, "OPENNMT_SITE": str(site)}
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    subprocess.run([*me, "build_vocab", "-config", str(config), "-n_sample", "-1"], check=True, env=env)
    start = time.perf_counter()
    subprocess.run([*me, "train", "-config", str(config)], check=True, env=env)
    onmt_wall = time.perf_counter() - start
    onmt = opennmt_speed(onmt_dir / "train.log", args.from_step)

    ours_dir = work / f"ours_{args.model}"
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "scripts" / "benchmark.py"), f"model={args.model}",
                    f"training.max_tokens={2 * args.batch}", f"untimed_steps={args.from_step}",
                    f"train_steps={args.steps - args.from_step}", "decode_sentences=1",
                    f"device={'cuda' if cuda else 'cpu'}", f"hydra.run.dir={ours_dir}",
                    *([f"training.threads={args.threads}"] if args.threads else [])], check=True, cwd=ROOT)
    ours_wall = time.perf_counter() - start
    speed = json.loads((ours_dir / "benchmark.json").read_text())["training"]
    ours = {"tgt_tokens_per_s": speed["tgt_tokens_per_s"], "parameters": parameters,
            "tgt_tokens_per_step": speed["tgt_tokens_per_s"] * speed["seconds"] / speed["steps"]}

    device = torch.cuda.get_device_name() if cuda else "CPU"
    result = {"model": args.model, "device": device, "torch": torch.__version__, "steps": args.steps,
              "timed_after_step": args.from_step, "opennmt_batch_size": args.batch, "max_tokens": 2 * args.batch,
              "opennmt": {**onmt, "wall_s": onmt_wall}, "ours": {**ours, "wall_s": ours_wall},
              "ratio": ours["tgt_tokens_per_s"] / onmt["tgt_tokens_per_s"]}
    (work / f"peer_{args.model}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{args.model} on {device}, torch {torch.__version__}, steps {args.from_step + 1}-{args.steps}:")
    print("| | target tokens/s | target tokens a step | parameters | wall s |\n|---|---|---|---|---|")
    print(f"| OpenNMT-py 3.5.1, batch_size {args.batch} | {onmt['tgt_tokens_per_s']:,.0f} "
          f"(median interval {onmt['median_interval']:,.0f}) | {onmt['tgt_tokens_per_step']:,.0f} | "
          f"{onmt['parameters']:,} | {onmt_wall:.0f} |")
    print(f"| this project, max_tokens {2 * args.batch} | {ours['tgt_tokens_per_s']:,.0f} | "
          f"{ours['tgt_tokens_per_step']:,.0f} | {parameters:,} | {ours_wall:.0f} |")
    print(f"ratio: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
