"""transformer-diversify: a training split extended with its own translations, and training on it with
data.train_dir while validating and testing on the corpus's own splits."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from conftest import write_toy_corpus
from omegaconf import OmegaConf

from transformer.app import diversify, pipeline, use
from transformer.app.diversify import diversified_pairs
from transformer.config import ConfigError
from transformer.data.corpus import DataError, read_lines, read_parallel

TOY = ["data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false", "training.warmup_steps=20",
       "training.lr=3e-3", "model.dropout=0.0", "training.max_tokens=512", "device=cpu"]


def test_diversified_pairs_are_the_original_then_the_forward_then_the_backward_pairs():
    src, tgt, forward, backward = ["a", "b"], ["A", "B"], ["A'", "B'"], ["a'", "b'"]
    assert diversified_pairs(src, tgt, forward, backward) == (["a", "b", "a", "b", "a'", "b'"],
                                                              ["A", "B", "A'", "B'", "A", "B"])
    assert diversified_pairs(src, tgt, forward, None) == (["a", "b", "a", "b"], ["A", "B", "A'", "B'"])
    with pytest.raises(ValueError, match="2 sources, 2 targets, 1 forward and 2 backward"):
        diversified_pairs(src, tgt, forward[:1], backward)


@pytest.fixture(scope="module")
def toy_runs(compose_config, tmp_path_factory) -> dict[str, Path]:
    """A toy corpus whose targets are the sources upper-cased (so the sides cannot be mixed up unnoticed), a short
    run in its direction (src->tgt) and one in the other (tgt->src)."""
    root = tmp_path_factory.mktemp("diversify")
    corpus = write_toy_corpus(root / "toy", n_train=80)
    for split in ("train", "val", "test"):
        (corpus / f"{split}.tgt").write_text((corpus / f"{split}.src").read_text().upper())
    runs = {"root": root, "corpus": corpus}
    for name, direction in (("forward", []), ("backward", ["data.src=tgt", "data.tgt=src"])):
        cfg = compose_config("train", [*TOY, f"data.dir={corpus}", f"data.cache_dir={root / 'cache'}",
                                       f"output_dir={root / name}", "training.max_steps=30", *direction])
        pipeline.train(OmegaConf.to_object(cfg))
        runs[name] = root / name
    return runs


def _translated(compose_config, run: Path, lines: Path, out: Path) -> list[str]:
    """``transformer-translate``'s output for a file: the independent path to what diversify must write."""
    cfg = compose_config("translate", [f"run_dir={run}", "eval=greedy", "device=cpu", f"input={lines}",
                                       f"output={out}"])
    use.translate(OmegaConf.to_object(cfg))
    return read_lines(out)


def test_diversify_writes_the_split_translated_both_ways_and_never_overwrites(compose_config, toy_runs, monkeypatch):
    root, corpus = toy_runs["root"], toy_runs["corpus"]
    out = root / "diversified"
    monkeypatch.chdir(root)  # out_dir given relative: the record still names every file absolutely

    def run(*overrides: str) -> dict:
        cfg = compose_config("diversify", [f"forward=[{toy_runs['forward']}]", "eval=greedy", "device=cpu",
                                           "out_dir=diversified", *overrides])
        return diversify.run(OmegaConf.to_object(cfg))

    record = run(f"backward=[{toy_runs['backward']}]")
    src, tgt = read_parallel(corpus / "train.src", corpus / "train.tgt")
    forward = _translated(compose_config, toy_runs["forward"], corpus / "train.src", root / "forward.txt")
    backward = _translated(compose_config, toy_runs["backward"], corpus / "train.tgt", root / "backward.txt")
    assert forward != tgt and backward != src  # 30 steps do not learn the task: the translations are the models'
    assert read_parallel(out / "train.src.gz", out / "train.tgt.gz") == (src + src + backward, tgt + forward + tgt)
    assert record["pairs"] == 80 and record["written_pairs"] == 240
    assert json.loads((out / "diversify.json").read_text()) == record
    assert record["backward"] == [str(toy_runs["backward"] / "checkpoints" / "final.pt")]
    assert record["written"] == [str(out / "train.src.gz"), str(out / "train.tgt.gz")]

    before = (out / "train.src.gz").read_bytes()
    with pytest.raises(DataError, match=r"^out_dir: .*train\.src\.gz exists; choose a new folder"):
        run()
    assert (out / "train.src.gz").read_bytes() == before
    with pytest.raises(ConfigError, match=r"^backward: .*forward.* translates src->tgt; the forward models' corpus "
                                          r"needs tgt->src"):
        run(f"out_dir={root / 'other'}", f"backward=[{toy_runs['forward']}]")
    assert not (root / "other").exists()
    (root / "a_file").write_text("not a folder\n")
    for folder in ("a_file", "a_file/below"):  # refused by key before any model loads (nothing is translated)
        with pytest.raises(ConfigError, match=rf"^out_dir: {root / 'a_file'} is a file, not a folder"):
            run(f"out_dir={root / folder}", "forward=[nowhere]")


def test_training_on_the_diversified_split_validates_and_tests_on_the_corpus(compose_config, toy_runs, caplog):
    root, corpus = toy_runs["root"], toy_runs["corpus"]
    cfg = compose_config("diversify", [f"forward=[{toy_runs['forward']}]", "eval=greedy", "device=cpu",
                                       f"out_dir={root / 'forward_only'}"])
    diversify.run(OmegaConf.to_object(cfg))
    cfg = compose_config("train", [*TOY, f"data.dir={corpus}", f"data.cache_dir={root / 'cache'}",
                                   f"data.train_dir={root / 'forward_only'}", f"output_dir={root / 'student'}",
                                   "training.max_steps=4"])
    with caplog.at_level(logging.INFO):
        metrics = pipeline.train(OmegaConf.to_object(cfg))
    assert any(re.search(r"training pairs: kept \d+ of 160 pairs", r.getMessage()) for r in caplog.records)
    assert metrics["test"]["n_sentences"] == len(read_lines(corpus / "test.src"))


def test_diversify_names_the_missing_keys(compose_config):
    with pytest.raises(ConfigError, match="^forward: give the forward models"):
        OmegaConf.to_object(compose_config("diversify", ["out_dir=x"]))
    with pytest.raises(ConfigError, match="^out_dir: give the folder"):
        OmegaConf.to_object(compose_config("diversify", ["forward=[run]"]))


def test_diversify_takes_checkpoint_files_and_names_a_missing_model_by_key(compose_config, toy_runs, tmp_path):
    final = toy_runs["forward"] / "checkpoints" / "final.pt"

    def run(*overrides: str) -> dict:
        cfg = compose_config("diversify", ["eval=greedy", "device=cpu", f"out_dir={tmp_path / 'out'}", *overrides])
        return diversify.run(OmegaConf.to_object(cfg))

    with pytest.raises(ConfigError, match=r"^backward\[1\]: .*nowhere does not exist"):
        run(f"forward=[{final}]", f"backward=[{toy_runs['backward']},{tmp_path / 'nowhere'}]")
    with pytest.raises(ConfigError, match=r"^forward: no checkpoint in .*empty"):
        (tmp_path / "empty").mkdir()
        run(f"forward=[{tmp_path / 'empty'}]")
    torn = tmp_path / "torn.pt"
    torn.write_bytes(final.read_bytes()[:1000])
    with pytest.raises(ConfigError, match=r"^forward: .*torn\.pt: not a readable checkpoint \(truncated"):
        run(f"forward=[{torn}]")  # by its key, and no other command's key suggested
    assert run(f"forward=[{final}]")["forward"] == [str(final)]
