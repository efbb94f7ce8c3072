"""End to end: training on a toy corpus (its files, resume, refusals), and the smoke run on Multi30k."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO, TOY, train_toy
from omegaconf import OmegaConf

from transformer.app import pipeline, use
from transformer.app.curves import Curve, plot_curves, read_curve
from transformer.checkpoint import CheckpointError, RunDir, load_checkpoint
from transformer.config import ConfigError
from transformer.data.corpus import DataError
from transformer.inference.loading import load_trained
from transformer.inference.metrics import corpus_scores
from transformer.training.run_lock import LOCK_FILE

_train = train_toy


def test_final_weights_are_chosen_with_the_test_search_on_the_validated_sentences(compose_config, toy_corpus,
                                                                                tmp_path, monkeypatch):
    decoded = []  # (sentences, beam size) of every scoring the final evaluation asks for

    def recording_score_texts(model, src, refs, *args, **kwargs):
        decoded.append((len(src), args[2].beam_size))
        return score_texts(model, src, refs, *args, **kwargs)

    score_texts = pipeline.score_texts
    monkeypatch.setattr(pipeline, "score_texts", recording_score_texts)
    metrics = _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=6",
                     "training.validate_every_steps=2", "training.valid_max_sentences=7", "eval.beam_size=2")
    test_sentences = len(RunDir(tmp_path / "run").test_hypotheses.read_text().splitlines())
    # best.pt, then the average of the last checkpoints, on the first 7 validation sentences; then the test set
    assert decoded == [(7, 2), (7, 2), (test_sentences, 2)]
    assert metrics["final_weights"].startswith(("best", "average of the last"))


def test_training_run_writes_everything(trained_run):
    run_dir, metrics = trained_run
    run = RunDir(run_dir)
    for path in (run.last, run.best, run.final):
        assert path.is_file(), path
    assert list(run.tensorboard.glob("events.out.tfevents.*"))
    assert metrics["final_weights"].startswith(("best", "average of the last"))
    saved = json.loads(run.metrics.read_text())
    assert saved["test_bleu"] == pytest.approx(metrics["test_bleu"])
    assert "nrefs:1" in saved["test"]["bleu_signature"]
    rebuilt = load_trained(run.final, torch.device("cpu")).model  # from the checkpoint's config
    assert saved["parameters"] == sum(p.numel() for p in rebuilt.parameters()) > 0
    hypotheses = run.test_hypotheses.read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 40


def test_toy_copy_is_learned(trained_run):
    _, metrics = trained_run
    assert metrics["test_bleu"] > 60.0, metrics


def test_training_curve_is_read_back_and_plotted(trained_run, tmp_path, saved_figures):
    run_dir, metrics = trained_run
    curve = read_curve(run_dir)
    assert max(curve.values) == pytest.approx(metrics["train"]["best_bleu"], abs=1e-4)
    assert curve.steps == sorted(curve.steps) and all(m >= 0 for m in curve.minutes)
    png = plot_curves([curve], tmp_path / "curve.png", reference=Curve("ref", [0.1, 0.2], [0, 0], [1.0, 2.0]))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [axes] = saved_figures[0].axes
    lines = [(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in axes.get_lines()]
    assert lines == [("out", curve.minutes, curve.values), ("ref", [0.1, 0.2], [1.0, 2.0])]
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["out", "ref"]


def test_a_run_records_its_corpus_folder_absolute_so_it_is_found_from_anywhere(compose_config, toy_corpus, tmp_path,
                                                                                monkeypatch):
    monkeypatch.chdir(toy_corpus.parent)
    cfg = compose_config("train", [*TOY, f"data.dir={toy_corpus.name}", "data.cache_dir=cache",  # relative folders
                                   f"output_dir={tmp_path / 'run'}", "training.max_steps=3"])
    pipeline.train(OmegaConf.to_object(cfg))
    recorded = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["config"]["data"]["dir"]
    assert recorded == str(toy_corpus)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # evaluating and resuming from another folder find the same corpus
    metrics = use.evaluate(OmegaConf.to_object(compose_config("evaluate", [
        f"run_dir={tmp_path / 'run'}", "eval=greedy", "device=cpu", f"output_dir={tmp_path / 'ev'}"])))
    assert metrics["test_set"] == "test.src-tgt"
    resumed = compose_config("train", [*TOY, f"data.dir={toy_corpus}", "data.cache_dir=cache",
                                       f"output_dir={tmp_path / 'run'}", "training.max_steps=4",
                                       f"resume={tmp_path / 'run'}"])
    assert pipeline.train(OmegaConf.to_object(resumed))["train"]["steps"] == 4


def test_a_new_run_never_overwrites_an_earlier_runs_checkpoints(compose_config, toy_corpus, tmp_path):
    _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=1")
    run = RunDir(tmp_path / "run")
    before = {path.name: path.read_bytes() for path in run.checkpoints.glob("*.pt")}
    with pytest.raises(ConfigError, match=rf"^output_dir: {run.root} already holds a run's checkpoints.*resume="):
        _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=2")
    assert {path.name: path.read_bytes() for path in run.checkpoints.glob("*.pt")} == before


HOLDER = """import sys
from pathlib import Path
from transformer.training.run_lock import hold_run
with hold_run(Path(sys.argv[1]), "output_dir"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_run_folder_another_process_trains_in_is_refused_until_it_ends(compose_config, toy_corpus, tmp_path):
    _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=1")
    run = RunDir(tmp_path / "run")
    before = {path.name: path.read_bytes() for path in run.checkpoints.glob("*.pt")}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run.root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline() == "held\n"
        in_use = (rf"another transformer-train \(process {holder.pid}\) is training in {run.root}; "
                  rf".*\(kill -INT {holder.pid}\)")
        with pytest.raises(ConfigError, match=rf"^resume: {in_use}"):
            _train(compose_config, toy_corpus, tmp_path / "elsewhere", "training.max_steps=2", f"resume={run.root}")
        with pytest.raises(ConfigError, match=rf"^output_dir: {in_use}"):
            _train(compose_config, toy_corpus, run.root, "training.max_steps=2")
        assert {path.name: path.read_bytes() for path in run.checkpoints.glob("*.pt")} == before
        log = (run.root / "train.log").read_bytes() if (run.root / "train.log").exists() else None
        hydra_record = {p.name: p.read_bytes() for p in (run.root / ".hydra").glob("*")}
        for args in ([f"resume={run.root}"], ["resume=auto", f"hydra.run.dir={run.root}"]):  # from the command line
            done = subprocess.run([sys.executable, "-m", "transformer", "train", *args], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120)
            refused = rf"^transformer-train: (resume|hydra.run.dir): {in_use}"  # before Hydra: named by the command
            assert done.returncode == 1 and re.search(refused, done.stderr, re.M)
        # refused before Hydra wrote into the folder
        assert ((run.root / "train.log").read_bytes() if (run.root / "train.log").exists() else None) == log
        assert {p.name: p.read_bytes() for p in (run.root / ".hydra").glob("*")} == hydra_record
    finally:
        holder.kill()  # ended as by a crash: the system lets go of the folder
        holder.wait()
    resumed = _train(compose_config, toy_corpus, tmp_path / "elsewhere", "training.max_steps=2", f"resume={run.root}")
    assert resumed["train"]["steps"] == 2 and (run.root / LOCK_FILE).read_text() == ""  # held, then let go


def test_resuming_from_final_weights_says_which_file_to_use(compose_config, toy_corpus, tmp_path):
    _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=1")
    run = RunDir(tmp_path / "run")
    with pytest.raises(CheckpointError, match=rf"final.pt: holds model weights only .*resume from {run.last}"):
        _train(compose_config, toy_corpus, tmp_path / "other", "training.max_steps=2", f"resume={run.final}")


def test_a_missing_test_split_stops_the_run_before_training(compose_config, toy_corpus, tmp_path):
    (toy_corpus / "test.tgt").unlink()
    with pytest.raises(DataError, match="test.tgt"):
        _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=1")
    assert not RunDir(tmp_path / "run").checkpoints.exists()


def test_prepared_data_is_what_training_reads(compose_config, toy_corpus, tmp_path, caplog):
    cache = tmp_path / "cache"
    prepare = compose_config("prepare_data", ["data=toy_copy", f"data.dir={toy_corpus}", f"data.cache_dir={cache}"])
    with caplog.at_level("INFO"):
        pipeline.prepare_data(OmegaConf.to_object(prepare))
    assert "training data: encoded 400 pairs" in caplog.text
    assert sorted(p.parent.parent.name for p in cache.glob("*/*/meta.json")) == ["corpus", "tokenizers"]
    caplog.clear()
    with caplog.at_level("INFO"):
        _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=1")
    assert "tokenizers: cache hit" in caplog.text and "training data: cache hit, 400 pairs" in caplog.text
    assert not (tmp_path / "run" / "tokenizer").exists()


def test_average_last_zero_keeps_the_best_checkpoint(compose_config, toy_corpus, tmp_path):
    metrics = _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=2", "training.average_last=0")
    assert metrics["final_weights"].startswith("best (step 2)")


def test_a_missing_corpus_folder_is_refused_naming_the_key_and_the_folder(compose_config, tmp_path):
    cfg = compose_config("train", [*TOY, f"data.dir={tmp_path / 'nowhere'}", f"output_dir={tmp_path / 'out'}"])
    with pytest.raises(DataError, match=rf"^data\.dir={re.escape(str(tmp_path / 'nowhere'))}: directory not found "
                                        r"\(data\.corpus=custom\)$"):
        pipeline.train(OmegaConf.to_object(cfg))


def test_glove_of_the_wrong_size_stops_before_training(compose_config, toy_corpus, tmp_path):
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("a 0.1 0.2 0.3 0.4\nb 0.5 0.6 0.7 0.8\n", encoding="utf-8")
    cfg = compose_config("train", [*TOY, f"data.dir={toy_corpus}", f"output_dir={tmp_path / 'out'}",
                                   f"model.glove.path={vectors}"])
    with pytest.raises(ConfigError, match=r"holds 4-dimensional vectors but model.d_model=32"):
        pipeline.train(OmegaConf.to_object(cfg))
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_glove_initialises_the_source_embeddings_frozen_also_after_a_resume(compose_config, toy_corpus, tmp_path):
    vectors = tmp_path / "vectors.txt"
    rows = {word: [float(i + 1)] * 32 for i, word in enumerate("abcdefgh")}
    vectors.write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in rows.items()), encoding="utf-8")
    glove = [f"model.glove.path={vectors}", "model.glove.freeze=true", "model.glove.rescale=false",
             "model.share_embeddings=false", "model.tie_output=false"]
    metrics = _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=1", *glove)
    assert metrics["train"]["steps"] == 1
    resumed = _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=2", *glove,
                     f"resume={tmp_path / 'run'}")  # the optimizer must get the same (unfrozen) parameters
    assert resumed["train"]["steps"] == 2
    trained = load_trained(RunDir(tmp_path / "run").last, torch.device("cpu"))
    weight = trained.model.src_token_embedding.weight
    for word, vector in rows.items():
        assert torch.equal(weight[trained.src_tok.encode(word)[0]], torch.tensor(vector))  # frozen: unchanged


def test_a_validation_split_that_begins_with_a_blank_source_trains_and_is_warned_of_once(compose_config, toy_corpus,
                                                                                         tmp_path, caplog):
    lines = (toy_corpus / "val.src").read_text(encoding="utf-8").splitlines(keepends=True)
    (toy_corpus / "val.src").write_text("\n" + "".join(lines[1:]), encoding="utf-8")
    for side in ("src", "tgt"):
        with open(toy_corpus / f"train.{side}", "a", encoding="utf-8") as train:
            train.write("a b c d e f g h a b\n" * 2)
    with caplog.at_level("WARNING"):
        metrics = _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=4",
                         "training.validate_every_steps=2")
    assert metrics["train"]["steps"] == 4 and "test_bleu" in metrics  # validated twice, drew the alignment figure
    warned = [r.getMessage() for r in caplog.records if "with an empty side" in r.getMessage()]
    assert not any("each gets a batch of its own" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING"):
        _train(compose_config, toy_corpus, tmp_path / "small", "training.max_steps=1", "training.max_tokens=16")
    assert "2 of 402 training pairs need more than training.max_tokens=16 padded positions on their own: each gets a " \
           "batch of its own" in caplog.text  # the two of 10 words: 10 + 10 + 1 positions
    assert len(warned) == 1 and warned[0].endswith("val.tgt: 1 line(s) with an empty side (1), scored as they are "
                                                   "(an empty source translates to an empty line; an empty reference "
                                                   "is scored as empty)")


def test_resume_continues_in_its_run_directory_and_refuses_other_batches(compose_config, toy_corpus, tmp_path,
                                                                          caplog):
    first = _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=10")
    assert first["train"]["steps"] == 10
    run = RunDir(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"training\.max_tokens: the checkpoint .*last\.pt was trained with 512, "
                                          r"the config says 256; resume with the same value"):
        _train(compose_config, toy_corpus, tmp_path / "elsewhere", "training.max_steps=20", "training.max_tokens=256",
               f"resume={run.root}")
    run.log_file.write_text("the first run's log\n", encoding="utf-8")  # what Hydra wrote for the first run
    with caplog.at_level("INFO"):  # a longer max_steps is allowed: it changes when to stop, not the batches
        resumed = _train(compose_config, toy_corpus, tmp_path / "elsewhere", "training.max_steps=20",
                         f"resume={run.root}")
    assert resumed["train"]["steps"] == 20
    assert run.metrics.is_file() and not (tmp_path / "elsewhere").exists()  # checkpoints and metrics: the run's dir
    log_lines = run.log_file.read_text(encoding="utf-8").splitlines()
    assert log_lines[0] == "the first run's log"  # appended
    assert any("resuming the run in" in line for line in log_lines) and any("test (" in line for line in log_lines)


def test_a_mid_epoch_checkpoint_of_two_processes_is_refused_before_any_work(compose_config, toy_corpus, tmp_path,
                                                                            monkeypatch):
    from transformer.training.checkpoints import save_checkpoint

    _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=3")  # stops inside epoch 1
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    by_two = load_checkpoint(last)
    by_two["rng"] = by_two["rng"] * 2  # as two processes write it: one RNG state each
    last.unlink()
    save_checkpoint(by_two, last)
    before = sorted(path.relative_to(tmp_path) for path in (tmp_path / "run").rglob("*"))
    monkeypatch.setattr(pipeline, "build_training_data", lambda *args: pytest.fail("data was read before the refusal"))
    with pytest.raises(CheckpointError, match=r"written by 2 process\(es\) in the middle of epoch 1, this run has 1"):
        _train(compose_config, toy_corpus, tmp_path / "x", "training.max_steps=6", f"resume={tmp_path / 'run'}")
    assert sorted(path.relative_to(tmp_path) for path in (tmp_path / "run").rglob("*")) == before  # no new events


def test_resuming_on_changed_training_files_is_refused_mid_epoch_and_warned_at_an_epochs_end(compose_config,
                                                                                            toy_corpus, tmp_path,
                                                                                            caplog, monkeypatch):
    _train(compose_config, toy_corpus, tmp_path / "mid", "training.max_steps=3",  # stops inside epoch 1
           "training.validate_every_steps=2")  # with step_2.pt, an earlier checkpoint to resume
    _train(compose_config, toy_corpus, tmp_path / "end", "training.max_epochs=1")
    mid = load_checkpoint(tmp_path / "mid" / "checkpoints" / "last.pt")
    monkeypatch.setattr(pipeline, "build_model", lambda *args: pytest.fail("a model was built before the refusal"))
    original = (toy_corpus / "train.src").read_text(encoding="utf-8")
    (toy_corpus / "train.src").write_text(original.replace("\n", " a\n", 1), encoding="utf-8")  # one line edited
    with pytest.raises(CheckpointError, match=r"resume: the training split \(train\.src / train\.tgt\) holds other "
                                              r"pairs than the run trained on \(as many: 400\); the checkpoint was "
                                              r"written in the middle of epoch 1:"):
        _train(compose_config, toy_corpus, tmp_path / "x", "training.max_steps=6", f"resume={tmp_path / 'mid'}")
    with pytest.raises(CheckpointError, match=r"resume: the training split .* holds other pairs"):
        _train(compose_config, toy_corpus, tmp_path / "x", "training.max_steps=6", "training.validate_every_steps=2",
               f"resume={tmp_path / 'mid' / 'checkpoints' / 'step_2.pt'}")
    assert not list((tmp_path / "mid" / "checkpoints").glob("abandoned*"))  # the later steps' checkpoints stay
    (toy_corpus / "train.src").write_text(original, encoding="utf-8")
    for side in ("src", "tgt"):  # 20 more pairs
        with open(toy_corpus / f"train.{side}", "a", encoding="utf-8") as lines:
            lines.write("a b c\n" * 20)
    with pytest.raises(CheckpointError, match=r"resume: the training split \(train\.src / train\.tgt\) now has 420 "
                                              r"pairs, the run trained on 400; the checkpoint was written in the "
                                              r"middle of epoch 1:"):
        _train(compose_config, toy_corpus, tmp_path / "x", "training.max_steps=6", f"resume={tmp_path / 'mid'}")
    assert load_checkpoint(tmp_path / "mid" / "checkpoints" / "last.pt")["step"] == mid["step"]  # nothing changed
    monkeypatch.undo()
    with caplog.at_level("WARNING"):
        resumed = _train(compose_config, toy_corpus, tmp_path / "x", "training.max_epochs=2",
                         f"resume={tmp_path / 'end'}")
    assert resumed["train"]["epochs"] == 2
    assert any("now has 420 pairs, the run trained on 400: the batches from here on are not those of the "
               "uninterrupted run" in record.getMessage() for record in caplog.records)


def test_a_run_whose_corpus_moved_resumes_from_the_new_folder_mid_epoch(compose_config, toy_corpus, tmp_path, caplog):
    straight = _train(compose_config, toy_corpus, tmp_path / "straight", "training.max_steps=6")
    _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=3")  # stops inside epoch 1
    _train(compose_config, toy_corpus, tmp_path / "end", "training.max_epochs=1")
    moved = toy_corpus.rename(tmp_path / "moved")
    with pytest.raises(DataError, match=r"data\.dir=.*toy: directory not found"):
        _train(compose_config, moved, tmp_path / "x", "training.max_steps=6", f"data.dir={toy_corpus}",
               f"resume={tmp_path / 'run'}")
    with caplog.at_level("WARNING"):
        resumed = _train(compose_config, moved, tmp_path / "x", "training.max_steps=6", f"resume={tmp_path / 'run'}")
    assert any("data.dir: the checkpoint" in r.getMessage() and "this run reads" in r.getMessage()
               for r in caplog.records)
    assert resumed["train"]["steps"] == 6 and resumed["test_bleu"] == straight["test_bleu"]  # the same run
    (moved / "train.src").write_text("a b\n" + (moved / "train.src").read_text(encoding="utf-8").split("\n", 1)[1])
    for run in ("straight", "end"):  # its content is checked, at an epoch's end too: other pairs are another corpus
        with pytest.raises(CheckpointError, match=r"holds other pairs than the run trained on \(as many: 400\), in "
                                                  r".*toy: a moved corpus must hold the pairs the run trained on"):
            _train(compose_config, moved, tmp_path / "y", "training.max_epochs=2", f"resume={tmp_path / run}")


def test_resuming_an_earlier_checkpoint_retrains_the_same_steps(compose_config, toy_corpus, tmp_path):
    """Back to step 4 of a finished 8-step run: the later checkpoints move aside and the same 4 steps come again."""
    steps = ["training.max_steps=8", "training.validate_every_steps=4", "training.average_last=0"]
    _train(compose_config, toy_corpus, tmp_path / "run", *steps)
    run = RunDir(tmp_path / "run")
    first = torch.load(run.last, weights_only=True)["model"]
    again = _train(compose_config, toy_corpus, tmp_path / "elsewhere", *steps,
                   f"resume={run.checkpoints / 'step_4.pt'}")
    assert again["train"]["steps"] == 8
    for name, weight in torch.load(run.last, weights_only=True)["model"].items():
        assert torch.equal(weight, first[name]), name  # exact resume, from an earlier checkpoint too
    aside = sorted(p.name for p in (run.checkpoints / "abandoned_after_step_4").iterdir())
    assert aside[-2:] == ["last.pt", "step_8.pt"] and set(aside) <= {"best.pt", "final.pt", "last.pt", "step_8.pt"}
    at_4 = _train(compose_config, toy_corpus, tmp_path / "elsewhere", *steps[1:], "training.max_steps=4",
                  f"resume={run.checkpoints / 'step_4.pt'}")  # nothing left to train: final weights and test only
    assert at_4["train"]["steps"] == 4 and "test_bleu" in at_4
    assert torch.load(run.last, weights_only=True)["step"] == 4 and (run.checkpoints / "abandoned_after_step_4.2").is_dir()


def test_a_torn_last_checkpoint_names_the_way_back_and_is_set_aside_by_resuming_an_earlier_one(compose_config,
                                                                                             toy_corpus, tmp_path):
    steps = ["training.max_steps=8", "training.validate_every_steps=4", "training.average_last=0"]
    _train(compose_config, toy_corpus, tmp_path / "run", *steps)
    run = RunDir(tmp_path / "run")
    torn = run.last.read_bytes()[:1000]
    run.last.unlink()  # last.pt is a hard link to step_8.pt: tear a copy of its own, as a crash mid-write would
    run.last.write_bytes(torn)
    with pytest.raises(CheckpointError, match=r"last\.pt: not a readable checkpoint .*checkpoints/step_8\.pt is the "
                                              r"newest step checkpoint of the same run \(resume=.*step_8\.pt\)"):  # whole
        _train(compose_config, toy_corpus, tmp_path / "x", *steps, f"resume={run.root}")
    again = _train(compose_config, toy_corpus, tmp_path / "x", *steps, f"resume={run.checkpoints / 'step_4.pt'}")
    assert again["train"]["steps"] == 8
    assert (run.checkpoints / "abandoned_after_step_4" / "last.pt").read_bytes() == torn  # kept, not lost


@pytest.mark.slow
def test_readme_smoke_run_on_multi30k(multi30k, tmp_path):
    """The README's smoke command, as a user types it (the run directory goes under tmp_path)."""
    env = {**os.environ, "MULTI30K_DIR": str(multi30k)}
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), "model=tiny", "training.max_steps=50",
         "data.max_pairs=2000", f"hydra.run.dir={tmp_path / 'run'}", f"data.dir={tmp_path / 'multi30k'}",
         "training.progress_bar=false"],
        check=True, env=env, cwd=tmp_path, capture_output=True, text=True,
    )
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 50
    hypotheses = (tmp_path / "run" / "test.hyp.txt").read_text(encoding="utf-8").splitlines()
    with gzip.open(multi30k / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as references:
        scored = corpus_scores(hypotheses, [line.rstrip("\n") for line in references])
    assert len(hypotheses) == metrics["test"]["n_sentences"] == 1000
    assert scored.bleu == pytest.approx(metrics["test_bleu"]) and scored.chrf == pytest.approx(metrics["test_chrf"])


@pytest.mark.slow
@pytest.mark.parametrize("named", [False, True])
def test_train_script_under_torchrun_with_two_processes(toy_corpus, tmp_path, named):
    """The README's multi-device command on CPU (gloo; also on a one-GPU machine): 2 ranks train, rank 0 writes
    the run directory, the only one made (Hydra's own or ``hydra.run.dir``), and logs each line once; the other
    rank writes nothing and logs nothing but errors."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
         str(REPO / "scripts" / "train.py"), *TOY, f"data.dir={toy_corpus}", "training.max_steps=6",
         "training.threads=1", "device=cpu", *([f"hydra.run.dir={tmp_path / 'outputs' / 'train' / 'run'}"] * named)],
        check=True, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    [run] = (tmp_path / "outputs" / "train").iterdir()
    assert not (tmp_path / ".hydra").exists() and not list(tmp_path.glob("*.log"))  # the current folder: rank 1's
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 6
    assert (run / "checkpoints" / "final.pt").is_file()
    lines = [line.split(" - ", 1)[1] for line in (run / "train.log").read_text().splitlines() if " - " in line]
    assert sum(line.startswith("training stopped") for line in lines) == 1
    assert len(lines) == len(set(lines))
    console = done.stdout + done.stderr
    assert console.count("training stopped (max_steps) at step 6") == 1 and "[rank 1]" not in console
    if named:  # a new run into it (output_dir, past the command line's own check): refused on both ranks alike
        again = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
             str(REPO / "scripts" / "train.py"), *TOY, f"data.dir={toy_corpus}", "training.max_steps=6",
             "training.threads=1", "device=cpu", f"output_dir={run}", f"hydra.run.dir={tmp_path / 'again'}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )
        console = again.stdout + again.stderr
        assert again.returncode != 0 and "[rank 1][ERROR] transformer-train: output_dir:" in console
        assert "Error executing job" not in console  # rank 1 refused too: it did not fail waiting for rank 0


@pytest.mark.parametrize("bad, message", [
    ("model.d_model=abc", "model.d_model=abc: Value 'abc' of type 'str' could not be converted to Integer"),  # before Hydra
    ("training.lr=-1", "training.lr: must be > 0, got -1.0"),  # the composed config's checks
])
def test_a_bad_config_under_torchrun_is_said_once(toy_corpus, tmp_path, bad, message):
    """Every rank checks the same command line: rank 0 says what is wrong, once and on a line of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
         str(REPO / "scripts" / "train.py"), *TOY, f"data.dir={toy_corpus}", "training.threads=1", "device=cpu", bad,
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    console = done.stdout + done.stderr
    assert done.returncode != 0 and console.count(message) == 1
    assert [line for line in console.splitlines() if message in line][0].endswith(message)
    assert "[rank 1]" not in console


def test_cli_reports_a_bad_config_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), "data=custom", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert out.returncode == 1
    assert "data.dir: is required with data=custom" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_resuming_a_finished_run_redoes_only_the_final_evaluation(compose_config, toy_corpus, tmp_path):
    first = _train(compose_config, toy_corpus, tmp_path / "run", "training.max_steps=6")
    again = _train(compose_config, toy_corpus, tmp_path / "elsewhere", "training.max_steps=6",
                   f"resume={tmp_path / 'run'}")
    assert again["train"]["steps"] == first["train"]["steps"] == 6
    assert again["train"]["last_metrics"] == first["train"]["last_metrics"] != {}
    # the time the checkpoint recorded at its final save, plus nearly none
    recorded = torch.load(RunDir(tmp_path / "run").last, weights_only=True)["train_seconds"]
    assert recorded <= again["train"]["train_seconds"] < recorded + 0.5
    assert again["train"]["train_seconds"] > 2 * again["train"]["wall_seconds"]  # this call trained nothing
    assert again["test_bleu"] == first["test_bleu"]  # the same final weights, scored again
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["train"]["train_seconds"] == again["train"]["train_seconds"]
