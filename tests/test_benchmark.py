"""The benchmark's FLOP model against PyTorch's own counter, and a tiny end-to-end benchmark run."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from transformer.app import benchmark
from transformer.config import ModelConfig
from transformer.data.batching import TokenBucketSampler
from transformer.interrupts import Interrupted
from transformer.model.transformer import build_model

from toy_training import copy_pairs, make_trainer, training_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("d_head", [None, 24])
def test_training_flops_match_pytorchs_counter(d_head):
    cfg = ModelConfig(d_model=64, n_heads=4, d_head=d_head, d_ff=256, n_encoder_layers=2, n_decoder_layers=2,
                      dropout=0.0, attention_dropout=0.0, share_embeddings=False)
    model = build_model(cfg, 500, 600, pad_id=0)
    src_len, tgt_len = 12, 9
    src, tgt = torch.randint(4, 500, (1, src_len)), torch.randint(4, 600, (1, tgt_len))
    with FlopCounterMode(display=False) as counter:
        model(src, tgt).sum().backward()
    # PyTorch's counter sees the projections, feed-forward blocks and output layer but not the fused CPU
    # attention kernel: add scores + mixing by hand (4*q*k*a each; the causal square counts half).
    a, layers_e, layers_d = cfg.n_heads * cfg.head_dim, cfg.n_encoder_layers, cfg.n_decoder_layers
    attention = layers_e * 4 * src_len**2 * a + layers_d * (4 * tgt_len * src_len * a + 2 * tgt_len**2 * a)
    counted = counter.get_total_flops() + 3 * attention
    assert benchmark.training_flops(cfg, src_len, tgt_len, 600) == pytest.approx(counted, rel=1e-9)


def test_matmul_peak_is_a_plausible_rate():
    flops = benchmark.matmul_peak(torch.device("cpu"), size=128, repeats=2)
    assert 1e6 < flops < 1e14


def test_matmul_peak_is_the_flops_of_the_fastest_timed_round(monkeypatch):
    clock = iter([0.0, 1.0, 10.0, 14.0, 20.0, 22.0, 30.0, 33.0])  # rounds of 1 (warm-up, not counted), 4, 2 and 3 s
    monkeypatch.setattr(benchmark, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    flops = benchmark.matmul_peak(torch.device("cpu"), size=16, repeats=5)
    assert flops == 2 * 16**3 * 5 / 2.0 and next(clock, None) is None


def test_tiny_benchmark_run_writes_json_and_markdown(compose_config, toy_corpus, tmp_path):
    cfg = compose_config("benchmark", [
        "data=toy_copy", f"data.dir={toy_corpus}", "model=tiny", "train_steps=2", "untimed_steps=1",
        "decode_sentences=5", "training.max_tokens=256", "matmul_size=64", "eval.max_len_b=5", "profile_steps=2",
        f"output_dir={tmp_path}", f"data.cache_dir={tmp_path / 'cache'}",
        "device=cpu",  # a GPU replays its steps from CUDA graphs: their profile counts the replays' few operators
        "eval.precision=auto",  # float32 on a CPU, and recorded so
    ])
    result = benchmark.run(OmegaConf.to_object(cfg))
    saved = json.loads((tmp_path / "benchmark.json").read_text())
    assert saved["training"]["steps"] == 2 and saved["training"]["tgt_tokens_per_s"] > 0
    assert saved["mfu"] == pytest.approx(result["training"]["achieved_flops"] / result["matmul_flops"])
    assert {(row["search"], row["cache"]) for row in saved["decoding"]} == {
        ("greedy", True), ("greedy", False), ("beam 5", True), ("beam 5", False), ("greedy, fixed shapes", True),
        ("beam 5, fixed shapes", True)}
    same = {(row["search"], row["cache"]): row["same_lines"] for row in saved["decoding"]}
    # the ordinary cached searches are the references; the others give the same lines (the cache and the fixed
    # shapes change how, not what, is decoded), counted out of 5
    assert same[("greedy", True)] is None and same[("beam 5", True)] is None
    assert [same[key] for key in same if same[key] is not None] == [5, 5, 5, 5]
    table = (tmp_path / "benchmark.md").read_text()
    assert "model FLOP utilisation" in table and "| beam 5 | no |" in table and "| 5 of 5 |" in table
    assert saved["decoding_precision"] == "fp32" and "| decoding (fp32) |" in table
    assert "data sheet" not in table and "datasheet_flops" not in saved  # a CPU has no data-sheet peak here
    profile = (tmp_path / "profile.txt").read_text()
    per_step = int(re.search(r"2 profiled steps: [\d.]+ ms per step .*?, (\d+) aten operator calls per step", profile)[1])
    assert per_step > 100 and "aten::mm" in profile  # a real step's operators, tabled
    decoding = (tmp_path / "profile_decoding.txt").read_text()
    profiled = re.findall(r"decoding (greedy|beam 5)(, fixed shapes)?, cache=(True|False): [\d.]+ ms per sentence",
                          decoding)
    searches = [(search, "", cache) for search in ("greedy", "beam 5") for cache in ("True", "False")]
    searches += [(search, ", fixed shapes", "True") for search in ("greedy", "beam 5")]
    assert sorted(profiled) == sorted(searches)


def test_an_interrupted_benchmark_keeps_what_it_measured(compose_config, toy_corpus, tmp_path, monkeypatch):
    measured = benchmark.benchmark_decoding

    def interrupted_after_one_search(*args):
        searches = measured(*args)
        yield next(searches)
        raise Interrupted(signum=signal.SIGTERM)  # a scheduler's stop, during the second search

    monkeypatch.setattr(benchmark, "benchmark_decoding", interrupted_after_one_search)
    cfg = compose_config("benchmark", [
        "data=toy_copy", f"data.dir={toy_corpus}", "model=tiny", "train_steps=2", "untimed_steps=1",
        "decode_sentences=3", "training.max_tokens=256", "matmul_size=64", "eval.max_len_b=5", "device=cpu",
        f"output_dir={tmp_path}", f"data.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(Interrupted) as raised:
        benchmark.run(OmegaConf.to_object(cfg))
    assert raised.value.signum == signal.SIGTERM
    assert str(raised.value) == (f"interrupted; what was measured (training, the matmul peak, 1 decoding search) is "
                                 f"in {tmp_path / 'benchmark.json'} and benchmark.md")
    saved = json.loads((tmp_path / "benchmark.json").read_text())
    assert saved["interrupted"] is True and saved["training"]["steps"] == 2 and saved["matmul_flops"] > 0
    assert [(row["search"], row["cache"], row["sentences"]) for row in saved["decoding"]] == [("greedy", True, 3)]
    table = (tmp_path / "benchmark.md").read_text()
    assert "| greedy | yes |" in table and table.endswith("Interrupted: only training, the matmul peak, 1 decoding "
                                                           "search measured.\n")


def test_a_benchmark_interrupted_before_anything_was_measured_writes_no_result(compose_config, tmp_path, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmark, "benchmark_training", interrupted)
    cfg = compose_config("benchmark", [f"output_dir={tmp_path}", "device=cpu"])
    with pytest.raises(KeyboardInterrupt):
        benchmark.run(OmegaConf.to_object(cfg))
    assert not (tmp_path / "benchmark.json").exists() and not (tmp_path / "benchmark.md").exists()


def test_a_checkpoint_that_cannot_be_loaded_is_refused_before_any_timing(compose_config, tmp_path, monkeypatch):
    from transformer.checkpoint import CheckpointError

    monkeypatch.setattr(benchmark, "benchmark_training", lambda *args: pytest.fail("timed before checking"))
    (tmp_path / "empty.pt").write_bytes(b"")
    cfg = compose_config("benchmark", [f"checkpoint={tmp_path / 'empty.pt'}", f"output_dir={tmp_path / 'out'}",
                                       "device=cpu"])
    with pytest.raises(CheckpointError, match="empty.pt"):
        benchmark.run(OmegaConf.to_object(cfg))


def test_datasheet_peaks_match_the_most_specific_name():
    assert benchmark.datasheet_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert benchmark.datasheet_flops("NVIDIA H100 PCIe") == 756e12
    assert benchmark.datasheet_flops("NVIDIA H200") == 989e12
    assert benchmark.datasheet_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert benchmark.datasheet_flops("NVIDIA GeForce RTX 4090") is None


def test_the_report_gives_mfu_against_the_data_sheet_when_the_gpu_is_known():
    result = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "threads": 16, "torch": "2.11.0",
              "max_tokens": 16384, "matmul_flops": 790e12, "mfu": 0.25, "datasheet_flops": 989e12,
              "mfu_datasheet": 0.2, "peak_memory_mb": 1000.0, "decoding": [],
              "training": {"tgt_tokens_per_s": 1.0, "src_tgt_tokens_per_s": 2.0, "seconds": 1.0, "steps": 10,
                           "flops_per_tgt_token": 1e6, "achieved_flops": 197.5e12}}
    table = benchmark.markdown_report(result)
    assert "| model FLOP utilisation | 25.0 % |" in table
    assert "| model FLOP utilisation, against the data sheet | 20.0 % |" in table


def test_training_flops_of_length_arrays_are_per_pair():
    cfg = ModelConfig(d_model=64, n_heads=4, d_ff=256, n_encoder_layers=2, n_decoder_layers=2)
    src, tgt = np.array([12.0, 5.0, 30.0]), np.array([9.0, 3.0, 31.0])
    per_pair = benchmark.training_flops(cfg, src, tgt, 600)
    assert per_pair.tolist() == [benchmark.training_flops(cfg, int(s), int(t), 600) for s, t in zip(src, tgt)]


def test_benchmark_steps_run_on_past_the_end_of_an_epoch():
    sampler = TokenBucketSampler([3] * 10, [3] * 10, 40, seed=0)  # 5 pairs (8 positions each) per batch
    assert len(sampler) == 2
    groups = benchmark._endless_groups(sampler, 1)
    epochs = [[next(groups)[0] for _ in range(2)] for _ in range(3)]  # six steps: three epochs
    for epoch, batches in enumerate(epochs):
        assert sorted(i for batch in batches for i in batch) == list(range(10))
        sampler.set_epoch(epoch)
        assert batches == sampler.batches()


def test_one_step_per_batch_shape_before_timing(tmp_path):
    """What the benchmark runs first with CUDA graphs (here on the CPU, where it only trains): one step per shape."""
    pairs = copy_pairs(40, seed=2)
    trainer = make_trainer(tmp_path, training_config(max_tokens=40), pairs)
    def shape(batch):
        return tuple(batch.src.shape), tuple(batch.tgt_in.shape)

    shapes = {shape(trainer.collate_fn(indices)) for indices in trainer.sampler.batches()}
    steps = []
    trainer.train_step = lambda batches: steps.append(shape(batches[0]))
    assert benchmark._one_step_per_shape(trainer) == len(shapes) == len(steps) > 1
    assert set(steps) == shapes


def _peer_script():
    import importlib.util

    path = ROOT / "benchmarks" / "peer_opennmt.py"
    spec = importlib.util.spec_from_file_location("peer_opennmt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_peer_comparison_reads_opennmts_report_lines(tmp_path):
    peer = _peer_script()
    line = ("[2026-11-27 04:22:55,000 INFO] Step {step}/  200; acc: 10.0; ppl: 900.1; xent: 6.8; lr: 0.00001; "
            "sents:    1750; bsz:  {src}/ {tgt}/35; {src_rate}/{tgt_rate} tok/s;     {sec} sec;")
    rows = [(50, 900, 800, 9000, 8000, 5), (100, 900, 1000, 9000, 10000, 10), (150, 950, 1000, 4750, 5000, 20),
            (200, 900, 600, 9000, 6000, 25)]
    log = tmp_path / "train.log"
    log.write_text("[... INFO] * number of parameters: 7581184\n" + "\n".join(
        line.format(step=step, src=src, tgt=tgt, src_rate=src_rate, tgt_rate=tgt_rate, sec=sec)
        for step, src, tgt, src_rate, tgt_rate, sec in rows) + "\n")
    speed = peer.opennmt_speed(log, from_step=100)
    # steps 101-200: 50 * 1000 target tokens in 50 * 1000 / 5000 = 10 s, then 50 * 600 in 50 * 600 / 6000 = 5 s
    assert speed["tgt_tokens_per_s"] == pytest.approx((50_000 + 30_000) / 15)
    assert speed["median_interval"] == pytest.approx(5500)
    assert speed["tgt_tokens_per_step"] == pytest.approx(800)
    assert (speed["intervals"], speed["parameters"]) == (2, 7_581_184)


def test_the_peer_comparison_gives_opennmt_this_projects_model(tmp_path):
    import argparse

    peer = _peer_script()
    cfg = peer.project_config("small", 8192)
    assert cfg.training.max_tokens == 8192
    args = argparse.Namespace(steps=600, batch=4096)
    options = json.loads(peer.opennmt_config(cfg, (tmp_path / "s", tmp_path / "t"), tmp_path, args, cuda=True).read_text())
    assert (options["enc_layers"], options["dec_layers"], options["hidden_size"], options["heads"],
            options["transformer_ff"]) == (3, 3, 256, 4, 1024)
    assert (options["dropout"], options["attention_dropout"], options["batch_size"]) == ([0.2], [0.0], 4096)
    assert options["share_embeddings"] and options["share_decoder_embeddings"] and options["model_dtype"] == "fp16"
    tiny = peer.opennmt_config(peer.project_config("tiny", 2048), (tmp_path / "s", tmp_path / "t"), tmp_path, args,
                               cuda=False)
    assert not json.loads(tiny.read_text())["share_embeddings"]


def test_every_gpu_check_mode_is_in_its_usage_line_and_the_maintainers_page():
    script = ROOT / "benchmarks" / "gpu_checks.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0  # the script parses
    text = script.read_text()
    modes = re.findall(r"^(\w+)\)$", text, flags=re.M)
    assert modes[0] == "targets" and len(modes) >= 10
    assert re.search(r"usage: \$0 ([\w|]+)", text)[1].split("|") == modes
    page = (ROOT / "docs" / "maintainers.md").read_text()
    assert [mode for mode in modes if f"`{mode}" not in page] == []
