"""Two commits of this repository, compared on what a change that only moves code must leave alone.

    python benchmarks/same_results.py OLD_REV NEW_REV [--work /tmp/same_results] [--pairs 2]

For each commit, from a ``git worktree`` of it and with its own package first on ``PYTHONPATH``:

1. the default model, seed 1234, trains 50 optimizer steps on the CPU; the SHA-256 of every weight is compared;
2. that model's greedy sacreBLEU on the validation set;
3. a ``last.pt`` written at step 50 by OLD_REV's code (a run of 70 steps, stopped at 50) resumes under each
   commit for the remaining 20 steps; the final weights are compared (optimizer state is restored by parameter
   position, so a reordering would show here);
4. ``transformer-benchmark``'s training speed (its default model), OLD and NEW alternating ``--pairs`` times, back to back.

Needs ``MULTI30K_DIR`` (the corpus). The corpus cache and tokenizer are shared between the commits, so both
train on the same ids. Prints one table; exits 1 if any equality fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

COMMON = ["training.max_minutes=null", "training.progress_bar=false", "training.seed=1234", "device=cpu",
          "training.threads=2"]


def worktree(rev: str, work: Path) -> Path:
    """A checkout of ``rev`` under ``work``, named by its commit (so ``HEAD`` after a new commit is a new one), made
    once and reused; worktrees whose folders were deleted are forgotten first."""
    commit = subprocess.run(["git", "rev-parse", "--short=12", f"{rev}^{{commit}}"], check=True, capture_output=True,
                            text=True).stdout.strip()
    path = work / f"tree_{commit}"
    if not path.exists():
        subprocess.run(["git", "worktree", "prune"], check=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], check=True)
    return path


def run(tree: Path, script: str, args: list[str], cache: Path | None) -> str:
    """``python scripts/SCRIPT`` of ``tree`` with ``args`` (and ``data.cache_dir=cache``); its console output."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, str(tree / "scripts" / script), *args]
    command += [] if cache is None else [f"data.cache_dir={cache}"]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def model_digest(checkpoint: Path) -> str:
    """SHA-256 over every weight of a checkpoint's model, by name."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    digest = hashlib.sha256()
    for name, tensor in sorted(state["model"].items()):
        digest.update(name.encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def train(tree: Path, run_dir: Path, cache: Path, extra: list[str]) -> Path:
    """Train in ``run_dir`` (unless already there); the path of its ``last.pt``."""
    last = run_dir / "checkpoints" / "last.pt"
    if not last.exists():
        run(tree, "train.py", [*COMMON, *extra, f"hydra.run.dir={run_dir}"], cache)
    return last


def greedy_bleu(tree: Path, checkpoint: Path, out: Path) -> float:
    """Greedy sacreBLEU of ``checkpoint`` on the validation set."""
    text = run(tree, "evaluate.py", [f"checkpoint={checkpoint}", "eval=greedy", "split=val", "device=cpu",
                                     f"hydra.run.dir={out}"], None)
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").exists() else None
    if metrics and "bleu" in metrics:
        return float(metrics["bleu"])
    return float(re.search(r"BLEU\D*([0-9.]+)", text).group(1))


def benchmark_speed(tree: Path, out: Path, cache: Path) -> float:
    """Target tokens/s of ``transformer-benchmark``'s timed training steps (its default model)."""
    run(tree, "benchmark.py", ["device=cpu", "training.threads=2", "train_steps=40", "untimed_steps=5",
                               "decode_sentences=1", f"hydra.run.dir={out}"], cache)
    return float(json.loads((out / "benchmark.json").read_text())["training"]["tgt_tokens_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--work", type=Path, default=Path("/tmp/same_results"))
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cache = args.work / "cache"
    trees = {"old": worktree(args.old, args.work), "new": worktree(args.new, args.work)}
    rows, same = [], True

    digests, bleus = {}, {}
    for name, tree in trees.items():
        last = train(tree, args.work / f"{name}_50", cache, ["training.max_steps=50"])
        digests[name] = model_digest(last)
        bleus[name] = greedy_bleu(tree, last, args.work / f"{name}_50_eval")
    rows += [("weights after 50 steps", digests["old"], digests["new"]),
             ("greedy BLEU, validation", f"{bleus['old']:.2f}", f"{bleus['new']:.2f}")]
    same &= digests["old"] == digests["new"] and bleus["old"] == bleus["new"]

    # A run of 70 steps stopped at 50: last.pt at step 50, written by the old code; both resume it.
    mid = train(trees["old"], args.work / "old_mid", cache, ["training.max_steps=70", "training.validate_every_steps=50",
                                                                "training.valid_max_sentences=100"])
    resumed = {}
    for name, tree in trees.items():
        run_dir = args.work / f"{name}_resumed"
        if not run_dir.exists():
            shutil.copytree(mid.parent.parent, run_dir)
            run(tree, "train.py", [*COMMON, f"resume={run_dir / 'checkpoints' / 'step_50.pt'}"], cache)
        resumed[name] = model_digest(run_dir / "checkpoints" / "last.pt")
    uninterrupted = model_digest(mid)
    rows.append(("old step-50 last.pt resumed to 70", resumed["old"], resumed["new"]))
    rows.append(("  (the uninterrupted 70-step run)", uninterrupted, ""))
    same &= resumed["old"] == resumed["new"]

    speeds: dict[str, list[float]] = {"old": [], "new": []}
    for pair in range(args.pairs):
        for name, tree in trees.items():
            speeds[name].append(benchmark_speed(tree, args.work / f"bench_{name}_{pair}", cache))
    for pair in range(args.pairs):
        old, new = speeds["old"][pair], speeds["new"][pair]
        rows.append((f"benchmark tok/s, pair {pair + 1}", f"{old:,.0f}", f"{new:,.0f}  (new/old {new / old:.3f})"))

    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  {'old ' + args.old:>20}  new {args.new}")
    for label, old, new in rows:
        print(f"{label:{width}}  {old:>20}  {new}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
