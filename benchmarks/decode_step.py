"""Operators and milliseconds per decoding step: the ordinary greedy and beam searches against the same searches in
fixed shapes (eager, and replayed as CUDA graphs on a GPU).

    python benchmarks/decode_step.py [--device cpu|cuda] [--d-model 16] [--rows 64] [--threads 2]

A model of the default architecture at width ``--d-model`` (untrained, so every hypothesis runs to its length
limit and every step decodes every row) translates ``--rows`` random 12-token sources twice, once limited to 10
target tokens and once to 40; the difference between the two, divided by 30, is the cost of one step, free of
the encoder and the set-up. Operators are counted at PyTorch's dispatcher (every aten call, views included); on
a GPU that count is what the host launches each step, unless the step is a CUDA-graph replay. Milliseconds are
the best of ``--repeats`` timings. Prints a Markdown table.

``--bf16`` decodes with a bfloat16 copy of the model (``eval.precision=bf16``). ``--profile`` then prints where the
time of the fixed-shape searches' eager steps goes, operator by operator (on a GPU by the device's time: the
kernels a CUDA graph replays are these).
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from transformer.config import LengthNorm, ModelConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.inference.fixed_shape import fixed_shape_beam, fixed_shape_greedy
from transformer.inference.search import beam_search, greedy_hypotheses
from transformer.model.transformer import build_model

SHORT, LONG = 10, 40  # target-token limits of the two runs


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def per_step(run: Callable[[int], object], device: torch.device, repeats: int) -> tuple[float, float]:
    """(operators, milliseconds) of one step of ``run(limit)``, from the runs at the two limits."""
    ops = []
    for limit in (SHORT, LONG):
        counter = _Count()
        with counter:
            run(limit)
        ops.append(counter.ops)
    seconds = []
    for limit in (SHORT, LONG):
        best = float("inf")
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            run(limit)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - began)
        seconds.append(best)
    steps = LONG - SHORT
    return (ops[1] - ops[0]) / steps, (seconds[1] - seconds[0]) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bf16", action="store_true", help="decode with a bfloat16 copy of the model")
    parser.add_argument("--profile", action="store_true", help="also profile the fixed-shape searches' eager steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=args.d_model, d_ff=4 * args.d_model, dropout=0.0, attention_dropout=0.0)
    model = build_model(cfg, 1000, 1000, PAD_ID).eval()
    with torch.no_grad():  # EOS's logit 0, below the best of 997 others: no hypothesis ends early
        model.tgt_token_embedding.weight[EOS_ID] = 0.0
    model = model.to(device, torch.bfloat16 if args.bf16 else torch.float32)
    src = torch.randint(4, 1000, (args.rows, 12), device=device)
    special = dict(pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=0.0)
    searches: dict[str, Callable[[int], object]] = {
        "greedy": lambda limit: greedy_hypotheses(model, src, max_len_b=limit, **special),
        "greedy, fixed shapes, eager": lambda limit: fixed_shape_greedy(model, src, max_len_b=limit,
                                                                        check_every=LONG, cuda_graph=False, **special),
        "beam 5": lambda limit: beam_search(model, src, beam_size=5, n_best=1, length_penalty=1.5,
                                            length_norm=LengthNorm.gnmt, max_len_b=limit,
                                            **special),
        "beam 5, fixed shapes, eager": lambda limit: fixed_shape_beam(model, src, beam_size=5, n_best=1,
                                                                      length_penalty=1.5, length_norm=LengthNorm.gnmt,
                                                                      max_len_b=limit, check_every=LONG,
                                                                      cuda_graph=False, **special),
    }
    if device.type == "cuda":
        searches["greedy, fixed shapes, CUDA graph"] = lambda limit: fixed_shape_greedy(
            model, src, max_len_b=limit, check_every=LONG, cuda_graph=True, **special)
        searches["beam 5, fixed shapes, CUDA graph"] = lambda limit: fixed_shape_beam(
            model, src, beam_size=5, n_best=1, length_penalty=1.5, length_norm=LengthNorm.gnmt, max_len_b=limit,
            check_every=LONG, cuda_graph=True, **special)
    print(f"d_model {cfg.d_model}, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, {args.rows} sentences, "
          f"{device.type}" + (f", {args.threads} threads" if device.type == "cpu" else "")
          + (", bfloat16" if args.bf16 else ", float32"))
    print("\n| search | operators a step | ms a step |\n| --- | --- | --- |")
    for name, run in searches.items():
        run(SHORT)  # warm-up
        ops, ms = per_step(run, device, args.repeats)
        print(f"| {name} | {ops:.0f} | {ms:.3f} |")
    if args.profile:
        for name in ("greedy, fixed shapes, eager", "beam 5, fixed shapes, eager"):
            print_profile(name, searches[name], device)


def print_profile(name: str, run: Callable[[int], object], device: torch.device) -> None:
    """The operators of ``run(LONG)`` by their own time (the device's on a GPU), per step."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run(LONG)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    total = sum(getattr(event, key) for event in prof.key_averages())
    print(f"\n{name}, a whole search of {LONG} steps (encoder, set-up and read-back included): "
          f"{total / LONG / 1000:.3f} ms of {key.replace('_', ' ')} per step")
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
