"""``transformer-benchmark``: how fast training and decoding run here, and how close to the machine's limit.

Measured in one process, written as ``benchmark.json`` and ``benchmark.md`` in the run directory:

- training throughput on the configured corpus and model: real source+target and target tokens/s over
  ``train_steps`` optimizer steps after ``untimed_steps`` warm-up steps, through ``Trainer.train_step``
  (collation, forward, backward, clipping and the optimizer step included);
- the machine's sustained matmul FLOP/s (fp32 on CPU, bf16 on CUDA) at the same thread count, the model's
  training FLOPs per target token, and so the model FLOP utilisation (useful FLOPs on real tokens only);
- decoding of the test split: sentences/s and tokens/s for greedy and beam search, with and without the
  KV cache and in fixed shapes (``eval.fixed_shape``), on a GPU each timed on a second pass over the sentences
  (``checkpoint=`` decodes with a trained model; otherwise a random one, whose hypotheses run to the maximum
  length);
- peak memory (RSS on CPU, ``torch.cuda.max_memory_allocated`` on CUDA);
- with ``profile_steps``, a ``torch.profiler`` table of a few more training steps (``profile.txt``): operator
  calls and GPU kernels per step, where the host time goes and how long the GPU is busy (for steps replayed from
  CUDA graphs, the operators are the replay's few and the kernels those of the graph); and one more pass of each
  decoding measurement, the same per sentence (``profile_decoding.txt``).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import platform
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from transformer import files
from transformer.app import pipeline
from transformer.app.schemas import BenchmarkConfig
from transformer.config import ModelConfig, TrainConfig, to_plain_dict
from transformer.data.batching import TokenBucketSampler
from transformer.data.prefetch import prefetched
from transformer.data.splits import load_split, with_local_copy
from transformer.inference.loading import TrainedModel, load_trained
from transformer.inference.translation import decodes_in_bf16, decoding_model, translate
from transformer.interrupts import Interrupted, signal_of
from transformer.model.transformer import build_model
from transformer.runtime import choose_device, configure_threads, resolve_training, seed_everything
from transformer.tracking import Tracker
from transformer.training.distributed import DistContext
from transformer.training.trainer import Trainer

log = logging.getLogger(__name__)


def training_flops(cfg: ModelConfig, src_len: Any, tgt_len: Any, tgt_vocab: int) -> Any:
    """Useful training FLOPs (forward + backward = 3 x forward) of one sentence pair (or, given numpy arrays of
    lengths, of each pair).

    Counts every matrix multiply on real positions: projections, attention scores and mixing (causal:
    half the square), the feed-forward blocks and the output projection. ``tgt_len`` counts BOS..last.
    """
    d, a, f = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.d_ff
    encoder = cfg.n_encoder_layers * src_len * (2 * (4 * d * a + 2 * d * f) + 4 * src_len * a)
    decoder_self = tgt_len * (2 * 4 * d * a + 2 * tgt_len * a)  # 4*T*a halved by the causal mask
    decoder_cross = tgt_len * (2 * 2 * d * a + 4 * src_len * a) + src_len * 2 * 2 * d * a  # K, V per source token
    decoder = cfg.n_decoder_layers * (decoder_self + decoder_cross + tgt_len * 2 * 2 * d * f)
    output = tgt_len * 2 * d * tgt_vocab
    return 3.0 * (encoder + decoder + output)


def matmul_peak(device: torch.device, size: int, repeats: int = 10) -> float:
    """Sustained FLOP/s of square matmuls (fp32 on CPU, bf16 on CUDA), best of three timed rounds."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for round_ in range(4):
        _sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        _sync(device)
        elapsed = time.perf_counter() - start
        if round_:  # the first round only warms up
            best = min(best, elapsed)
    return 2.0 * size**3 * repeats / best


# Dense bf16 tensor-core FLOP/s from the vendors' data sheets, by a part of the GPU's name; the first match counts,
# so the more specific names come first. MFU against these is the figure papers quote; against the measured matmul
# peak (``matmul_peak``) it is against what the card sustains (an H100: about 790 of its 989 TFLOP/s at 8192³).
DATASHEET_BF16_FLOPS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
                        ("A100", 312e12))


def datasheet_flops(name: str) -> float | None:
    """The data sheet's dense bf16 FLOP/s of a GPU named ``name``, or None when it is not in the table."""
    return next((flops for part, flops in DATASHEET_BF16_FLOPS if part in name), None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model from /proc/cpuinfo (else the platform's processor string)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@dataclass
class TrainingSpeed:
    steps: int
    seconds: float
    src_tgt_tokens_per_s: float
    tgt_tokens_per_s: float
    padded_positions_per_s: float
    flops_per_tgt_token: float
    achieved_flops: float


def benchmark_training(cfg: BenchmarkConfig, device: torch.device, work_dir: Path) -> TrainingSpeed:
    """Time ``train_steps`` real optimizer steps (after ``untimed_steps``) on the configured data and model.

    Batches come as ``Trainer.fit`` gets them: collated with numpy, on CUDA ahead of the step by a thread into
    pinned memory. With ``profile_steps``, that many further steps run under ``torch.profiler`` and the
    operator tables go to ``profile.txt`` in the output directory.
    """
    train_cfg = TrainConfig(data=cfg.data, model=cfg.model, training=cfg.training, eval=cfg.eval,
                            output_dir=str(work_dir), device=str(device))
    dist = DistContext.single(device)
    src_tok, tgt_tok, train_set = pipeline.build_training_data(train_cfg, dist)
    seed_everything(cfg.training.seed)
    model = build_model(cfg.model, src_tok.vocab_size, tgt_tok.vocab_size, src_tok.pad_id).to(device)
    trainer = pipeline.build_trainer(train_cfg, model, src_tok, tgt_tok, train_set, dist,
                                     Tracker(work_dir, enabled=False), work_dir, lambda m, s: {"bleu": 0.0})
    if trainer.graphs is not None:  # compiled too, with training.compile
        start = time.perf_counter()
        shapes = _one_step_per_shape(trainer)
        log.info("CUDA graphs: recorded for the %d batch shapes of an epoch before the timed steps%s: %.1f s", shapes,
                 " (compiling first)" if cfg.training.compile else "", time.perf_counter() - start)
    groups = _endless_groups(trainer.sampler, cfg.training.accumulate)
    with prefetched((_collated(trainer, group) for group in groups), device) as batches:
        start = time.perf_counter()
        for _ in range(cfg.untimed_steps):
            trainer.train_step(next(batches))
        _sync(device)
        done = ", compilation" if cfg.training.compile and trainer.graphs is None else ""
        log.info("%d untimed steps (warm-up%s): %.1f s", cfg.untimed_steps, done, time.perf_counter() - start)
        src_tokens = tgt_tokens = flops = 0.0
        padded = 0
        passes = 2 if cfg.training.r_drop > 0 else 1  # R-Drop runs every pair twice
        start = time.perf_counter()
        for _ in range(cfg.train_steps):
            step_batches = next(batches)
            trainer.train_step(step_batches)
            for batch in step_batches:  # lengths from the batch itself (with BPE-dropout, not the cached ones)
                pairs = len(batch.indices)  # the rows after them, if any, fill the shape of a CUDA graph
                src_lens = batch.src[:pairs].ne(src_tok.pad_id).sum(1).numpy().astype(np.float64)
                tgt_lens = batch.tgt_out[:pairs].ne(tgt_tok.pad_id).sum(1).numpy().astype(np.float64)  # EOS too
                src_tokens, tgt_tokens = src_tokens + src_lens.sum(), tgt_tokens + tgt_lens.sum()
                padded += batch.src.numel() + batch.tgt_out.numel()
                flops += passes * training_flops(cfg.model, src_lens, tgt_lens, tgt_tok.vocab_size).sum()
        _sync(device)
        seconds = time.perf_counter() - start
        if trainer.graphs is not None:
            log.info("CUDA graphs: %d batch shapes recorded in all", trainer.graphs.n_shapes)
        if cfg.profile_steps:
            profile_steps(trainer, batches, cfg.profile_steps, device, Path(cfg.output_dir) / "profile.txt")
    return TrainingSpeed(cfg.train_steps, seconds, float(src_tokens + tgt_tokens) / seconds,
                         float(tgt_tokens) / seconds, padded / seconds, float(flops / tgt_tokens), float(flops) / seconds)


def _one_step_per_shape(trainer: Trainer, max_batches: int = 2000) -> int:
    """A training step on one batch of each shape among the first epoch's first ``max_batches`` (a CUDA graph is
    recorded at a shape's first step, which must not fall into the timed steps); the number of shapes. These are
    real steps: they update the weights and AdamW's state before the timed ones."""
    trainer.sampler.set_epoch(0)
    seen: set[tuple[tuple[int, ...], ...]] = set()
    for indices in itertools.islice(trainer.sampler, max_batches):
        (batch,) = _collated(trainer, [indices])
        shape = (tuple(batch.src.shape), tuple(batch.tgt_in.shape))
        if shape not in seen:
            seen.add(shape)
            trainer.train_step([batch])
    return len(seen)


def _endless_groups(sampler: TokenBucketSampler, size: int) -> Iterator[list[list[int]]]:
    """Groups of ``size`` index lists, epoch after epoch (a long benchmark outlasts one epoch)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        batches = iter(sampler)
        while group := list(itertools.islice(batches, size)):
            yield group
        epoch += 1


def _collated(trainer: Trainer, group: list[list[int]]) -> list[Any]:
    batches = [trainer.collate_fn(indices) for indices in group]
    return [batch.pin_memory() for batch in batches] if trainer.device.type == "cuda" else batches


def profile_steps(trainer: Trainer, batches: Iterator[list[Any]], steps: int, device: torch.device,
                  path: Path) -> None:
    """Run ``steps`` training steps under ``torch.profiler``; write per-step totals and the operator tables."""
    what = f"{steps} profiled steps" + (" (replayed from CUDA graphs: the operators are the replays')"
                                        if trainer.graphs is not None else "")
    summary, tables = _profiled(lambda: [trainer.train_step(next(batches)) for _ in range(steps)], device, what,
                                steps, "step")
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(path, "\n\n".join([summary, *tables]) + "\n")
    log.info("%s; tables in %s", summary, path)


def _profiled(work: Callable[[], Any], device: torch.device, what: str, units: int,
              unit: str) -> tuple[str, list[str]]:
    """Run ``work`` under ``torch.profiler``: a summary per ``unit`` (wall time, aten operator calls, GPU
    kernels and busy time) and the operator tables by host time (and by device time on CUDA)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _sync(device)
        start = time.perf_counter()
        work()
        _sync(device)
        seconds = time.perf_counter() - start
    events = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_ms = sum(e.device_time for e in kernels) / 1000  # microseconds -> ms
    aten_calls = sum(e.count for e in events if e.key.startswith("aten::"))
    summary = (f"{what}: {1000 * seconds / units:.2f} ms per {unit} (with profiler overhead), "
               f"{aten_calls / units:.0f} aten operator calls per {unit}, {len(kernels) / units:.0f} GPU kernels "
               f"per {unit}, GPU busy {kernel_ms / units:.2f} ms per {unit}")
    sort_keys = ["self_cpu_time_total"] + (["self_device_time_total"] if device.type == "cuda" else [])
    return summary, [events.table(sort_by=key, row_limit=30, max_name_column_width=70) for key in sort_keys]


def benchmark_decoding(cfg: BenchmarkConfig, device: torch.device, work_dir: Path,
                       trained: TrainedModel | None = None) -> Iterator[dict[str, Any]]:
    """Sentences/s and tokens/s on the test split: greedy and beam, each with and without the KV cache; with the
    ``trained`` model (``cfg.checkpoint`` loaded), else a random one of ``cfg.model``. Yields each search's row as
    it is measured."""
    if trained is not None:
        model, src_tok, tgt_tok = trained.model.to(device), trained.src_tok, trained.tgt_tok
        data = with_local_copy(trained.config.data)
    else:
        train_cfg = TrainConfig(data=cfg.data, model=cfg.model, output_dir=str(work_dir))
        dist = DistContext.single(device)
        src_tok, tgt_tok, _ = pipeline.build_training_data(train_cfg, dist)
        model = build_model(cfg.model, src_tok.vocab_size, tgt_tok.vocab_size, src_tok.pad_id).to(device).eval()
        data = cfg.data
    src, _ = load_split(data, data.test_split)
    src = src[: cfg.decode_sentences] if cfg.decode_sentences is not None else src
    profiles = []
    model = decoding_model(model, cfg.eval.precision, device)  # once: the bfloat16 copy is not timed
    ordinary: dict[int, list[str]] = {}  # each width's lines from the ordinary cached search, which comes first
    widths = sorted({1, cfg.eval.beam_size})
    settings = [(width, use_cache, False) for width in widths for use_cache in (True, False)]
    settings += [(width, True, True) for width in widths]  # and in fixed shapes
    for beam, use_cache, fixed_shape in settings:
        eval_cfg = replace(cfg.eval, beam_size=beam, n_best=1, use_cache=use_cache, fixed_shape=fixed_shape)
        search = ("greedy" if beam == 1 else f"beam {beam}") + (", fixed shapes" if fixed_shape else "")
        decode = functools.partial(translate, model, src, src_tok, tgt_tok, eval_cfg, device, model.max_positions)
        if device.type == "cuda":
            decode()  # untimed: a GPU sets up its kernels (cuDNN plans, cuBLAS handles) per new shape once
        start = time.perf_counter()
        hypotheses = decode()
        _sync(device)
        seconds = time.perf_counter() - start
        tokens = sum(len(tgt_tok.encode(h[0])) + 1 for h in hypotheses)
        lines = [h[0] for h in hypotheses]
        reference = ordinary.setdefault(beam, lines)
        log.info("decoding %s cache=%s: %.1f sentences/s", search, use_cache, len(src) / seconds)
        yield {"search": search, "cache": use_cache, "sentences": len(src), "seconds": seconds,
               "sentences_per_s": len(src) / seconds, "tokens_per_s": tokens / seconds,
               "same_lines": None if lines is reference else sum(a == b for a, b in zip(lines, reference))}
        if cfg.profile_steps:
            summary, tables = _profiled(decode, device, f"decoding {search}, cache={use_cache}", len(src),
                                        "sentence")
            log.info(summary)
            profiles += [summary, *tables]
    if profiles:
        path = Path(cfg.output_dir) / "profile_decoding.txt"
        files.write_text(path, "\n\n".join(profiles) + "\n")
        log.info("decoding profiles in %s", path)


def run(cfg: BenchmarkConfig) -> dict[str, Any]:
    """Run every measurement and write ``benchmark.json`` and ``benchmark.md`` into ``cfg.output_dir``; interrupted
    after the training measurement, write what was measured (``"interrupted": true``) and raise ``Interrupted``."""
    device = choose_device(cfg.device)
    cfg = replace(cfg, training=resolve_training(cfg.training, device))
    configure_threads(cfg.training.threads)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # checked before minutes of timing: a missing or damaged checkpoint is refused at once
    trained = load_trained(cfg.checkpoint, torch.device("cpu")) if cfg.checkpoint is not None else None
    result: dict[str, Any] = {
        "device": str(device), "device_name": device_name(device), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "model": to_plain_dict(cfg.model), "max_tokens": cfg.training.max_tokens,
        "decoding": [],
        "decoding_precision": "bf16" if decodes_in_bf16(cfg.eval.precision, device) else "fp32",  # auto resolved
    }
    try:
        with tempfile.TemporaryDirectory() as scratch:
            speed = benchmark_training(cfg, device, Path(scratch))
            result["training"] = asdict(speed)
            peak = matmul_peak(device, cfg.matmul_size)
            result.update(matmul_flops=peak, mfu=speed.achieved_flops / peak)
            sheet = datasheet_flops(result["device_name"]) if device.type == "cuda" else None
            if sheet is not None:
                result.update(datasheet_flops=sheet, mfu_datasheet=speed.achieved_flops / sheet)
            result["decoding"].extend(benchmark_decoding(cfg, device, Path(scratch), trained))
    except KeyboardInterrupt as interrupt:
        if "training" not in result:  # nothing measured yet
            raise
        result.update(interrupted=True, peak_memory_mb=peak_memory_mb(device))
        _write(out, result)
        raise Interrupted(f"interrupted; what was measured ({_measured(result)}) is in {out / 'benchmark.json'} "
                          "and benchmark.md", signal_of(interrupt)) from None
    result["peak_memory_mb"] = peak_memory_mb(device)
    _write(out, result)
    print(markdown_report(result))
    return result


def _write(out: Path, result: dict[str, Any]) -> None:
    files.write_text(out / "benchmark.json", json.dumps(result, indent=2) + "\n")
    files.write_text(out / "benchmark.md", markdown_report(result))


def _measured(result: dict[str, Any]) -> str:
    """What an interrupted benchmark measured, in words: "training, the matmul peak, 2 decoding searches"."""
    parts = ["training"] + (["the matmul peak"] if "matmul_flops" in result else [])
    if searches := len(result["decoding"]):
        parts.append(f"{searches} decoding " + ("search" if searches == 1 else "searches"))
    return ", ".join(parts)


def markdown_report(result: dict[str, Any]) -> str:
    """The benchmark as markdown tables."""
    t = result["training"]
    lines = [
        f"Device {result['device']} ({result['device_name']}), {result['threads']} threads, torch {result['torch']}, "
        f"max_tokens {result['max_tokens']}, peak memory {result['peak_memory_mb']:.0f} MiB",
        "",
        "| training | value |", "| --- | --- |",
        f"| target tokens/s | {t['tgt_tokens_per_s']:,.0f} |",
        f"| source+target tokens/s | {t['src_tgt_tokens_per_s']:,.0f} |",
        f"| milliseconds per step | {1000 * t['seconds'] / t['steps']:.1f} |",
        f"| training FLOPs per target token | {t['flops_per_tgt_token'] / 1e6:.1f} M |",
        f"| achieved | {t['achieved_flops'] / 1e9:.1f} GFLOP/s |",
    ]
    if "matmul_flops" in result:
        lines += [f"| matmul peak | {result['matmul_flops'] / 1e9:.1f} GFLOP/s |",
                  f"| model FLOP utilisation | {100 * result['mfu']:.1f} % |"]
    if "datasheet_flops" in result:
        lines += [f"| data-sheet peak (dense bf16) | {result['datasheet_flops'] / 1e9:.1f} GFLOP/s |",
                  f"| model FLOP utilisation, against the data sheet | {100 * result['mfu_datasheet']:.1f} % |"]
    if result["decoding"]:
        precision = result.get("decoding_precision", "fp32")  # eval.precision
        lines += ["", f"| decoding ({precision}) | KV cache | sentences/s | tokens/s | lines as the cached search |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['search']} | {'yes' if r['cache'] else 'no'} | {r['sentences_per_s']:.1f} | "
                  f"{r['tokens_per_s']:,.0f} | {_same(r)} |" for r in result["decoding"]]
    if result.get("interrupted"):
        lines += ["", f"Interrupted: only {_measured(result)} measured."]
    return "\n".join(lines) + "\n"


def _same(row: dict[str, Any]) -> str:
    """How many of a decoding row's lines equal the ordinary cached search's of its width ("—" for that one)."""
    return "—" if row.get("same_lines") is None else f"{row['same_lines']} of {row['sentences']}"
