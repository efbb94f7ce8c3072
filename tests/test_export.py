"""CTranslate2 export: a small trained model of each exportable option, exported in fp32, gives the same greedy
translations in plain CTranslate2 as this app's own search; what it cannot run is refused by key, before anything
is written; an export never overwrites and appears whole or not at all."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from transformer.app import pipeline
from transformer.app.schemas import Quantization
from transformer.config import ConfigError, EvalConfig, LengthNorm, Precision
from transformer.inference.export import EXPORT_FILE, QUANTIZATIONS, export
from transformer.inference.loading import load_model, load_trained
from transformer.inference.translation import translate_scored
from transformer.inference.translator import Translator

ctranslate2 = pytest.importorskip("ctranslate2")

TOY = ["data=toy_copy", "model=tiny", "eval=greedy", "training.max_tokens=512", "training.max_epochs=100",
       "training.max_steps=150", "training.validate_every_steps=150", "training.lr=3e-3", "training.warmup_steps=30",
       "training.progress_bar=false", "training.average_last=0", "device=cpu", "model.dropout=0.0"]
OPTIONS = {
    "default": [],
    "free_head_size": ["model.d_model=50", "model.n_heads=4", "model.d_head=32"],
    "post_norm": ["model.norm=post"],
    "gelu": ["model.activation=gelu"],
    "learned": ["model.positions=learned"],
    "relative": ["model.positions=relative", "model.max_relative_distance=4"],
    "rope": ["model.positions=rope"],
    "no_positions": ["model.positions=none"],
    "sentencepiece_shared": ["data.tokenizer.kind=sentencepiece", "data.tokenizer.vocab_size=20",
                             "model.share_embeddings=true"],
}


def _trained(compose_config, toy_corpus: Path, run: Path, overrides: list[str]) -> Path:
    cfg = compose_config("train", [*TOY, *overrides, f"data.dir={toy_corpus}",
                                   f"data.cache_dir={toy_corpus.parent / 'cache'}", f"output_dir={run}"])
    pipeline.train(OmegaConf.to_object(cfg))
    return run / "checkpoints" / "final.pt"


def _ct2_search(export_dir: Path, trained, sentences: list[str], beam_size: int = 1, n_best: int = 1,
                length_penalty: float = 1.0) -> list[list[tuple[str, float]]]:
    """Translate with plain CTranslate2, tokens in and out through the model's own vocabularies: n-best (text,
    score) lists."""
    translator = ctranslate2.Translator(str(export_dir), device="cpu", intra_threads=1)
    index = {piece: i for i, piece in enumerate(trained.tgt_tok.pieces())}
    out = []
    for sentence in sentences:
        tokens = [trained.src_tok.id_to_piece(i) for i in trained.src_tok.encode(sentence)]
        limit = max(1, math.floor(1.5 * len(tokens) + 10))  # eval.max_len_a, max_len_b
        result = translator.translate_batch([tokens], beam_size=beam_size, num_hypotheses=n_best,
                                            length_penalty=length_penalty, max_decoding_length=limit,
                                            min_decoding_length=0, return_scores=True)[0]
        out.append([(trained.tgt_tok.decode([index[piece] for piece in hypothesis]), score)
                    for hypothesis, score in zip(result.hypotheses, result.scores)])
    return out


def _same(ours: list[list[tuple[str, float]]], theirs: list[list[tuple[str, float]]]) -> None:
    """The same hypotheses in the same order, scores within 1e-3."""
    assert [[text for text, _ in nbest] for nbest in theirs] == [[text for text, _ in nbest] for nbest in ours]
    for mine, other in zip(ours, theirs):
        assert [score for _, score in other] == pytest.approx([score for _, score in mine], abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPTIONS))
def test_an_export_searches_as_this_app_greedy_and_beam(name, compose_config, toy_corpus, tmp_path):
    checkpoint = _trained(compose_config, toy_corpus, tmp_path / "run", OPTIONS[name])
    trained = load_trained(checkpoint, torch.device("cpu"))
    sentences = [line for split in ("val", "test") for line in (toy_corpus / f"{split}.src").read_text().splitlines()]

    def ours(**search) -> list[list[tuple[str, float]]]:
        return translate_scored(trained.model, sentences, trained.src_tok, trained.tgt_tok, EvalConfig(**search),
                                "cpu", trained.model.max_positions)

    greedy = ours(beam_size=1, length_norm=LengthNorm.average)
    assert len({nbest[0][0] for nbest in greedy}) >= len(sentences) // 4  # a model that learned: outputs differ
    out = export(trained, tmp_path / "exported", "none", {"beam_size": 1})
    _same(greedy, _ct2_search(out, trained, sentences))
    # beam search: CTranslate2's length_penalty=1 is eval.length_norm=average, 0 is none. Without normalization
    # CTranslate2 stops once its best beam ends, so only its best hypothesis is this app's.
    _same(ours(beam_size=4, n_best=3, length_norm=LengthNorm.average),
          _ct2_search(out, trained, sentences, beam_size=4, n_best=3, length_penalty=1.0))
    _same(ours(beam_size=4, length_norm=LengthNorm.none), _ct2_search(out, trained, sentences, 4, 1, 0.0))

    record = json.loads((out / EXPORT_FILE).read_text())
    assert record["source_checkpoint"]["path"] == str(checkpoint) and len(record["source_checkpoint"]["sha256"]) == 64
    assert record["model"]["positions"] == trained.config.model.positions.value
    assert (out / record["source_tokenizer"]["path"]).is_file() and (out / record["target_tokenizer"]["path"]).is_file()


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    from conftest import write_toy_corpus

    from transformer.app.schemas import register_configs

    register_configs()
    from hydra import compose, initialize_config_dir

    from transformer.app.schemas import CONFIG_PATH

    folder = tmp_path_factory.mktemp("export")
    corpus = write_toy_corpus(folder / "toy")
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        cfg = compose("train", [*TOY, "training.max_steps=10", "training.validate_every_steps=10",
                                f"data.dir={corpus}", f"data.cache_dir={folder / 'cache'}", f"output_dir={folder / 'run'}"])
    pipeline.train(OmegaConf.to_object(cfg))
    return folder / "run" / "checkpoints" / "final.pt"


def test_an_export_never_overwrites_and_leaves_nothing_on_failure(one_run, tmp_path, monkeypatch):
    trained = load_trained(one_run, torch.device("cpu"))
    taken = tmp_path / "taken"
    taken.mkdir()
    with pytest.raises(ConfigError, match="out_dir: .*taken exists"):
        export(trained, taken, "none", {})
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")  # a link to nothing is no folder to write, and no place for one
    with pytest.raises(ConfigError, match=r"^out_dir: .*dangling exists \(a symbolic link\); an export never"):
        export(trained, dangling, "none", {})
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()
    with pytest.raises(ConfigError, match="quantization: 'int3'"):
        export(trained, tmp_path / "new", "int3", {})
    if Path("/proc/self").is_dir():  # Linux: a folder no one can make folders in, root included
        with pytest.raises(ConfigError, match=r"^out_dir: cannot write in /proc \(.+\); choose another folder$"):
            export(trained, "/proc/exported", "none", {})

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformer.files.atomic_write", broken)
    with pytest.raises(OSError, match="No space left"):
        export(trained, tmp_path / "new", "none", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "taken"]  # no export, no temporary folder
    monkeypatch.undo()
    previous = os.umask(0o022)
    try:
        made = export(trained, tmp_path / "shared", "none", {})
    finally:
        os.umask(previous)
    assert stat.S_IMODE(made.stat().st_mode) == 0o755  # readable by a server run by another account


@pytest.mark.parametrize("score", ["additive", "multiplicative"])
def test_scores_ctranslate2_cannot_run_are_refused_by_key(one_run, tmp_path, score):
    trained = load_trained(one_run, torch.device("cpu"))
    trained.config.model.attention.score = type(trained.config.model.attention.score)[score]
    with pytest.raises(ConfigError, match=f"model.attention.score: {score} scores have no CTranslate2"):
        export(trained, tmp_path / "out", "none", {})
    assert not (tmp_path / "out").exists()


def test_the_command_offers_the_quantizations_the_export_takes():
    assert tuple(choice.value for choice in Quantization) == QUANTIZATIONS


@pytest.mark.parametrize("quantization", ["int8", "int8_float32"])
def test_an_int8_export_is_smaller_translates_as_the_float_one_and_leaves_the_model_as_it_was(
        trained_run, tmp_path, quantization):
    run_dir, _ = trained_run  # a model that has learnt the toy task: its translations are worth comparing
    trained = load_model(str(run_dir), None, [], torch.device("cpu"))
    weights = {name: tensor.clone() for name, tensor in trained.model.state_dict().items()}
    small = export(trained, tmp_path / quantization, quantization, {})
    # CTranslate2 quantizes the arrays it is given in place: the model exported from must not change
    assert all(torch.equal(tensor, weights[name]) for name, tensor in trained.model.state_dict().items())
    plain = export(trained, tmp_path / "float32", "none", {})
    assert json.loads((small / EXPORT_FILE).read_text())["quantization"] == quantization
    assert (small / "model.bin").stat().st_size < 0.8 * (plain / "model.bin").stat().st_size
    lines = (run_dir.parent / "toy" / "test.src").read_text().splitlines()
    greedy = EvalConfig(beam_size=1)
    quantized, exact = (Translator.load(path, eval_cfg=greedy).translate(lines) for path in (small, plain))
    assert exact == Translator.load(run_dir, eval_cfg=greedy).translate(lines)
    assert sum(a == b for a, b in zip(quantized, exact)) >= 0.9 * len(lines)


@pytest.mark.slow
def test_the_command_exports_what_plain_ctranslate2_translates_as_transformer_translate(toy_corpus, tmp_path):
    """From the command line: train, ``transformer-export``, then a Python that imports only ctranslate2 and
    sentencepiece writes what ``transformer-translate eval=greedy`` writes."""
    import subprocess
    import sys

    from conftest import REPO

    def command(*args: str, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              **kwargs)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done

    command("-m", "transformer", "train", *TOY, *OPTIONS["sentencepiece_shared"], f"data.dir={toy_corpus}",
            "data.cache_dir=cache", "hydra.run.dir=run")
    said = command("-m", "transformer", "export", "run_dir=run", "out_dir=exported", "eval=greedy").stdout
    assert said == ("exported run/checkpoints/final.pt to exported (quantization=none); "
                    "transformer-translate export_dir=exported uses it\n")
    source = (toy_corpus / "test.src").read_text() + "\n"  # and a blank line
    ours = command("-m", "transformer", "translate", "run_dir=run", "eval=greedy", input=source).stdout
    plain = command(str(REPO / "scripts" / "translate_with_ctranslate2.py"), "exported", input=source).stdout
    assert plain == ours and len(ours.splitlines()) == 41
    record = json.loads((tmp_path / "exported" / EXPORT_FILE).read_text())
    record["source_tokenizer"]["kind"] = record["target_tokenizer"]["kind"] = "word"  # a GloVe model's export
    (tmp_path / "word_level").mkdir()
    (tmp_path / "word_level" / EXPORT_FILE).write_text(json.dumps(record))
    refused = subprocess.run([sys.executable, str(REPO / "scripts" / "translate_with_ctranslate2.py"), "word_level"],
                             cwd=tmp_path, capture_output=True, text=True, input="a b\n", timeout=60)
    assert (refused.returncode, refused.stderr) == (1, "word_level: its tokenizers are word; this script reads "
                                                       "SentencePiece exports only: translate this one with "
                                                       "transformer-translate export_dir=word_level\n")
    via_export = command("-m", "transformer", "translate", "export_dir=exported", "eval=greedy", input=source).stdout
    assert via_export == ours
    decoding = json.loads((tmp_path / "exported" / EXPORT_FILE).read_text())["decoding"]
    assert decoding["beam_size"] == 1 and decoding["length_norm"] == "gnmt"
    # transformer-evaluate scores an export on the run's own test split as it scores the run
    for name, source in (("run", "run_dir=run"), ("export", "export_dir=exported")):
        command("-m", "transformer", "evaluate", source, "eval=greedy", f"hydra.run.dir=eval_{name}")
    on_run, on_export = (json.loads((tmp_path / f"eval_{name}" / "metrics.json").read_text())
                         for name in ("run", "export"))
    assert on_export["test_set"] == on_run["test_set"] == "test.src-tgt"
    assert on_export["export"] == str(tmp_path / "exported")  # named as given (relative), recorded absolute
    assert on_run["checkpoint"] == str(tmp_path / "run" / "checkpoints" / "final.pt")
    assert on_export["bleu"] == on_run["bleu"] > 0
    hypotheses = [(tmp_path / f"eval_{name}" / "hypotheses.txt").read_text() for name in ("run", "export")]
    assert hypotheses[0] == hypotheses[1]


def test_the_translator_gives_one_text_from_a_run_and_from_its_export(compose_config, toy_corpus, tmp_path):
    from transformer import Translator

    checkpoint = _trained(compose_config, toy_corpus, tmp_path / "run", [])
    export(load_trained(checkpoint, torch.device("cpu")), tmp_path / "exported", "none", {"beam_size": 1})
    from_run, from_export = Translator.load(tmp_path / "run"), Translator.load(tmp_path / "exported")
    assert (from_run.backend, from_export.backend) == ("torch", "ctranslate2")
    sentences = (toy_corpus / "test.src").read_text().splitlines() + ["   "]
    greedy = from_run.translate(sentences, beam_size=1)
    assert from_export.translate(sentences) == greedy and greedy[-1] == [""]  # the export's own search: greedy
    fixed_shape = Translator.load(tmp_path / "run", eval_cfg=EvalConfig(beam_size=1, fixed_shape=True))
    assert fixed_shape.translate(sentences) == greedy
    settled = [(t.batch_size, t.fixed_shape, t.precision) for t in (  # what the device decides, settled for a CPU
        from_run.search_settings(), fixed_shape.search_settings(), from_export.search_settings())]
    assert settled == [(64, False, Precision.fp32), (64, True, Precision.fp32), (64, None, Precision.fp32)]
    for norm, cut in itertools.product(LengthNorm, (False, True)):  # greedy: the same scores, normalised as here
        search = EvalConfig(beam_size=1, length_norm=norm, **({"max_len_a": 0.0, "max_len_b": 2} if cut else {}))
        _same([[(t.text, t.score) for t in nbest] for nbest in
               Translator.load(tmp_path / "run", eval_cfg=search).translate_scored(sentences)],
              [[(t.text, t.score) for t in nbest] for nbest in
               Translator.load(tmp_path / "exported", eval_cfg=search).translate_scored(sentences)])
    for norm in (LengthNorm.average, LengthNorm.none):  # beam search: the same hypotheses and scores
        search = EvalConfig(beam_size=4, n_best=1 if norm is LengthNorm.none else 3, length_norm=norm)
        on_run = Translator.load(tmp_path / "run", eval_cfg=search).translate_scored(sentences)
        on_export = Translator.load(tmp_path / "exported", eval_cfg=search).translate_scored(sentences)
        fixed_shape = EvalConfig(**{**search.__dict__, "fixed_shape": True})
        _same([[(t.text, t.score) for t in nbest] for nbest in on_run],
              [[(t.text, t.score) for t in nbest] for nbest in
               Translator.load(tmp_path / "run", eval_cfg=fixed_shape).translate_scored(sentences)])
        _same([[(t.text, t.score) for t in nbest] for nbest in on_run],
              [[(t.text, t.score) for t in nbest] for nbest in on_export])
        assert [len(nbest) for nbest in on_run] == [search.n_best] * len(sentences)
        assert on_run[-1][0].score == 0.0 and all(nbest[0].score < 0 for nbest in on_run[:-1])


def test_both_backends_sample_n_best_best_first_and_a_near_zero_temperature_is_greedy(one_run, tmp_path):
    from transformer import Translator

    hot = EvalConfig(beam_size=1, sampling_topk=0, sampling_temperature=3.0, n_best=4)
    export(load_trained(one_run, torch.device("cpu")), tmp_path / "exported", "none",
           {key: getattr(hot, key) for key in ("beam_size", "sampling_topk", "sampling_temperature")})
    sentences = (one_run.parents[2] / "toy" / "test.src").read_text().splitlines()[:12]
    for source in (one_run, tmp_path / "exported"):
        greedy = Translator.load(source, eval_cfg=EvalConfig(beam_size=1)).translate(sentences)
        cold = EvalConfig(beam_size=1, sampling_topk=0, sampling_temperature=1e-4, n_best=3)
        assert Translator.load(source, eval_cfg=cold).translate(sentences) == [line * 3 for line in greedy]
        translator = Translator.load(source, eval_cfg=hot)
        samples = translator.translate_scored(sentences)
        assert all(len(nbest) == 4 for nbest in samples)
        assert all([t.score for t in nbest] == sorted((t.score for t in nbest), reverse=True) for nbest in samples)
        assert sum(len({t.text for t in nbest}) for nbest in samples) > len(sentences)  # not one text repeated
        with pytest.raises(ConfigError, match=r"^beam_size: this translator samples \(eval.sampling_topk=0\): give "
                                              r"no beam_size, or 1; got 4$"):
            translator.translate(sentences, beam_size=4)
    export_default = Translator.load(tmp_path / "exported")  # the sampling the export records
    assert export_default.eval.sampling_topk == 0 and export_default.eval.sampling_temperature == 3.0
    assert export_default.search_differences() == []


def test_a_run_s_samples_go_on_from_call_to_call_and_a_new_translator_repeats_them(one_run):
    from transformer import Translator

    hot = EvalConfig(beam_size=1, sampling_topk=0, sampling_temperature=3.0, n_best=2)
    sentences = (one_run.parents[2] / "toy" / "test.src").read_text().splitlines()[:12]
    first = Translator.load(one_run, eval_cfg=hot)
    calls = [first.translate(sentences), first.translate(sentences)]
    assert calls[0] != calls[1]  # one seed for the translator, not one per call: the draws go on
    again = Translator.load(one_run, eval_cfg=hot)
    assert [again.translate(sentences), again.translate(sentences)] == calls


def test_a_translator_decodes_in_the_precision_its_eval_holds_now(one_run):
    from dataclasses import replace

    from transformer import Translator

    sentences = (one_run.parents[2] / "toy" / "test.src").read_text().splitlines()[:12]
    translator = Translator.load(one_run, eval_cfg=EvalConfig(beam_size=3))
    fp32 = translator.translate_scored(sentences)
    translator.eval = replace(translator.eval, precision=Precision.bf16)  # its bfloat16 copy is made now
    bf16 = translator.translate_scored(sentences)
    assert bf16 == Translator.load(one_run, eval_cfg=translator.eval).translate_scored(sentences)
    assert [t.score for nbest in bf16 for t in nbest] != [t.score for nbest in fp32 for t in nbest]
    translator.eval = replace(translator.eval, precision=Precision.fp32)  # and back: the model itself again
    assert translator.translate_scored(sentences) == fp32


def test_gnmt_normalisation_on_ctranslate2_is_average_and_said_once(one_run, tmp_path, caplog):
    from transformer import Translator

    trained = load_trained(one_run, torch.device("cpu"))
    out = export(trained, tmp_path / "exported", "none", {"beam_size": 3})
    translator = Translator.load(out)
    assert translator.eval.length_norm is LengthNorm.gnmt  # the app's default, recorded by the export
    sentences = ["a b c", "d e"]
    with caplog.at_level("INFO", logger="transformer.inference.translator"):
        first = translator.translate_scored(sentences)
        translator.translate_scored(sentences)
    assert [r.message for r in caplog.records].count(
        "eval.length_norm=gnmt has no CTranslate2 counterpart: its beam search (beam_size > 1) normalises by length "
        "(average) instead") == 1
    assert translator.search_differences() == [
        "eval.length_norm=gnmt has no CTranslate2 counterpart: its beam search (beam_size > 1) normalises by length "
        "(average) instead"]
    assert Translator.load(one_run).search_differences() == []  # this app's own search
    average = Translator.load(out, eval_cfg=EvalConfig(beam_size=3, length_norm=LengthNorm.average))
    assert average.translate_scored(sentences) == first
    with caplog.at_level("WARNING", logger="transformer.inference.translator"):
        Translator.load(out, eval_cfg=EvalConfig(beam_size=1)).translate_scored(sentences)  # greedy: exact, unsaid
        unnormalised = Translator.load(out, eval_cfg=EvalConfig(beam_size=3, n_best=2, length_norm=LengthNorm.none))
        unnormalised.translate_scored(sentences)
        unnormalised.translate_scored(sentences)
    messages = [r.message for r in caplog.records]
    assert sum("length_norm=gnmt" in m for m in messages) == 1
    assert messages.count("eval.length_norm=none: CTranslate2's beam search stops once its best hypothesis ends, so "
                          "only the best of the n_best is this app's") == 1
    for either in (translator, Translator.load(one_run)):  # one string is refused, not read as its characters
        with pytest.raises(TypeError, match=r"sentences: a list of sentences, got one string 'a b c'; "
                                            r"translate\(\[sentence\]\) translates one"):
            either.translate("a b c")
        with pytest.raises(TypeError, match=r"^sentences\[1\]: must be a string, got NoneType$"):
            either.translate(["a b", None])
        with pytest.raises(TypeError, match=r"^beam_size: must be an integer, got '4'$"):
            either.translate(["a b"], beam_size="4")
        with pytest.raises(ConfigError, match=r"^n_best: 3 translations need beam_size >= 3, got 2$"):
            either.translate(["a b"], beam_size=2, n_best=3)
        with pytest.raises(ConfigError, match=r"^beam_size: must be >= 1, got 0$"):
            either.translate(["a b"], beam_size=0)
        with pytest.raises(ValueError, match=r"^sentences\[1\]: not valid Unicode text \(surrogates not allowed at "
                                             r"character 2\)$"):
            either.translate(["a b", "a \ud800"])
        assert either.translate(s for s in ("a b", "c")) == either.translate(["a b", "c"])  # any iterable, read once
        assert len(either.translate(iter(["a b", "c"]))) == 2
    # n_best not given: the translator's, as many as the call's beam holds (as a server request without it)
    three = Translator.load(one_run, eval_cfg=EvalConfig(beam_size=3, n_best=3))
    greedy = Translator.load(one_run, eval_cfg=EvalConfig(beam_size=1))
    assert three.translate(["a b"], beam_size=1) == greedy.translate(["a b"])
    assert [len(nbest) for nbest in three.translate(["a b"], beam_size=2)] == [2]
    with pytest.raises(ConfigError, match=r"^device: CTranslate2 decodes on cpu or cuda, not meta; give device=cpu"):
        Translator.load(out, device="meta")
    with pytest.raises(ConfigError, match="backend: ctranslate2 runs an export; make one with transformer-export"):
        Translator.load(one_run.parents[1], backend="ctranslate2")
    with pytest.raises(ConfigError, match="backend: .*exported is a CTranslate2 export"):
        Translator.load(tmp_path / "exported", backend="torch")
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(str(tmp_path / 'nothere'))} does not exist; give a "
                                                "training run's folder, a checkpoint file or an export's folder$"):
        Translator.load(tmp_path / "nothere")
    for threads, error, message in ((-3, ConfigError, r"^threads: must be >= 0 \(0: up to 4, as many as there are "
                                                      r"cores\), got -3$"),
                                    ("2", TypeError, r"^threads: must be an integer, got '2'$"),
                                    (2.0, TypeError, r"^threads: must be an integer, got 2\.0$"),
                                    (True, TypeError, r"^threads: must be an integer, got True$")):
        for path in (out, one_run):  # refused alike by either backend, before anything loads
            with pytest.raises(error, match=message):
                Translator.load(path, threads=threads)
    assert Translator.load(out, threads=1).translate_scored(sentences) == first  # one worker: the same answers
    threads = torch.get_num_threads()
    try:
        Translator.load(one_run, threads=threads + 1)  # the torch backend: PyTorch's threads
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def test_a_damaged_export_or_a_missing_ctranslate2_is_refused_in_one_line(one_run, tmp_path, monkeypatch):
    import importlib.util

    from transformer import Translator

    out = export(load_trained(one_run, torch.device("cpu")), tmp_path / "exported", "none", {"beam_size": 1})
    assert Translator.load(out, device="auto").device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert Translator.load(out, device=torch.device("cpu")).device == "cpu"
    with pytest.raises(ConfigError, match=r"^device: 'gpu' is not a device"):
        Translator.load(out, device="gpu")
    record = json.loads((out / "export.json").read_text())
    (out / "export.json").write_text(json.dumps({**record, "decoding": {"length_norm": "sideways"}}))
    with pytest.raises(ConfigError, match=r"export\.json: decoding: length_norm: Invalid value 'sideways', expected "
                                          r"one of \[gnmt, average, none\]; export the model again$"):
        Translator.load(out)
    tokenizer = {**record["source_tokenizer"], "kind": "bogus"}
    for damaged, message in (({**record, "decoding": [1]}, r"decoding must be an object; export the model again"),
                             ({**record, "data": {"src": "src"}}, r"data must be an object with src, tgt;"),
                             ({**record, "format": 99}, r"format 99 is not one this version reads \(1 to 3\)"),
                             ({**record, "source_tokenizer": tokenizer},
                              r"source_tokenizer\.kind 'bogus' is none of sentencepiece, word;"),
                             ({**record, "decoding": {"beam_size": "x"}},
                              r"decoding: beam_size: Value 'x' of type 'str' could not be converted to Integer;"),
                             ({**record, "decoding": {"beam_size": 0}}, r"decoding: eval\.beam_size: must be >= 1")):
        (out / "export.json").write_text(json.dumps(damaged))
        with pytest.raises(ConfigError, match=rf"^export_dir: .*export\.json: {message}"):
            Translator.load(out)
    (out / "export.json").write_text(json.dumps(record)[:-20])  # cut short
    with pytest.raises(ConfigError, match=r"^export_dir: .*export\.json is not valid JSON \(.*line 1 column"):
        Translator.load(out)
    completed = subprocess.run([sys.executable, "-m", "transformer", "translate", f"export_dir={out}"], cwd=tmp_path,
                               input="a b\n", capture_output=True, text=True)
    assert completed.returncode == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert "export.json is not valid JSON" in completed.stdout + completed.stderr
    (out / "export.json").write_text(json.dumps(record))
    assert sorted(record["files"]) == sorted(p.name for p in out.iterdir() if p.name != "export.json")
    model_bin = (out / "model.bin").read_bytes()
    flipped = len(model_bin) // 2  # a flip inside the weights: CTranslate2 would load it and decode NaN scores
    (out / "model.bin").write_bytes(model_bin[:flipped] + bytes([model_bin[flipped] ^ 0xFF]) + model_bin[flipped + 1:])
    with pytest.raises(ConfigError, match=r"^export_dir: .*model\.bin is damaged: its bytes are not those exported"):
        Translator.load(out)
    (out / "model.bin").write_bytes(model_bin)
    target = out / record["target_tokenizer"]["path"]
    tokenizer = target.read_bytes()
    target.unlink()
    with pytest.raises(ConfigError, match=rf"^export_dir: .*{target.name} is missing; export the model again$"):
        Translator.load(out)
    target.write_bytes(b"\xff: neither a SentencePiece model nor UTF-8 text")
    (out / "export.json").write_text(json.dumps({key: value for key, value in record.items() if key != "files"}))
    with pytest.raises(ConfigError, match=rf"^export_dir: .*{target.name} is not a readable tokenizer"):
        Translator.load(out)  # an export of format 2 records no digests: the tokenizer's own parse fails, in a line
    target.write_bytes(tokenizer)
    (out / "export.json").write_text(json.dumps(record))
    assert Translator.load(out).translate(["a b"])
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "ctranslate2" else real_find_spec(name, *a, **k))
    with pytest.raises(ConfigError, match=r"is a CTranslate2 export, and decoding it needs CTranslate2: pip install"):
        Translator.load(out)


def test_translate_and_evaluate_take_one_model_source_and_no_ensemble_with_an_export():
    from transformer.app.schemas import EvaluateConfig, TranslateConfig
    from transformer.config import AttentionDumpConfig

    with pytest.raises(ConfigError, match=r"run_dir: give exactly one of .* \(got checkpoint, export_dir\)"):
        EvaluateConfig(checkpoint="best.pt", export_dir="exported")
    with pytest.raises(ConfigError, match="attention: attention maps are drawn from this app's model, not an export"):
        EvaluateConfig(export_dir="exported", attention=AttentionDumpConfig(indices=[0]))
    with pytest.raises(ConfigError, match="ensemble: an export decodes alone"):
        EvaluateConfig(export_dir="exported", ensemble=["other_run"])

    with pytest.raises(ConfigError, match=r"run_dir: give exactly one of .* \(got run_dir, export_dir\)"):
        TranslateConfig(run_dir="run", export_dir="exported")
    with pytest.raises(ConfigError, match="ensemble: an export decodes alone"):
        TranslateConfig(export_dir="exported", ensemble=["other_run"])
    assert TranslateConfig(export_dir="exported").export_dir == "exported"


def test_the_readme_translator_example_runs_on_an_export(one_run, tmp_path, capsys):
    import re

    from conftest import REPO

    from transformer import Translator

    (block,) = [b for b in re.findall(r"```py\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
                if "Translator.load" in b]
    assert len(block.strip().splitlines()) <= 6  # a few lines, as the README promises
    out = export(load_trained(one_run, torch.device("cpu")), tmp_path / "exported", "none", {"beam_size": 1})
    exec(compile(block.replace('"exports/en_de"', repr(str(out))), "README Translator example", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    translator = Translator.load(out)
    assert printed[0] == str(translator.translate(["A man rides a bike."]))
    best = translator.translate_scored(["Two dogs play."], beam_size=4, n_best=2)[0]
    assert printed[1:] == [f"{h.score:.3f} {h.text}" for h in best] and len(best) == 2


def test_the_commands_decode_an_export_with_its_search_and_take_it_only_as_export_dir(one_run, tmp_path):
    import subprocess
    import sys

    out = export(load_trained(one_run, torch.device("cpu")), tmp_path / "exported", "none",
                 {"beam_size": 3, "length_norm": "average"})
    (tmp_path / "in.txt").write_text("a b c\nd e\n")

    def translate_command(*overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "transformer", "translate", f"input={tmp_path / 'in.txt'}",
                               *overrides], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    gnmt = "eval.length_norm=gnmt has no CTranslate2 counterpart"
    recorded = translate_command(f"export_dir={out}", "eval.n_best=2")  # the export's beam 3, average; 2 of them
    assert recorded.returncode == 0 and gnmt not in recorded.stderr
    assert [line.count("\t") for line in recorded.stdout.splitlines()] == [1, 1]
    assert gnmt in translate_command(f"export_dir={out}", "eval.length_norm=gnmt").stderr  # the command line wins
    wrong_key = translate_command(f"checkpoint={out}")
    assert wrong_key.returncode == 1 and f"checkpoint: {out} is a CTranslate2 export; give it as export_dir={out}" \
        in wrong_key.stderr
    not_an_export = translate_command(f"export_dir={one_run}")
    assert not_an_export.returncode == 1 and f"export_dir: {one_run} is not an export (no export.json" \
        in not_an_export.stderr


def test_an_export_cuts_an_over_long_line_with_the_warning_the_torch_backend_gives(one_run, tmp_path):
    from transformer import Translator

    out = export(load_trained(one_run, torch.device("cpu")), tmp_path / "exported", "none", {"beam_size": 1})
    for path in (one_run, out):
        translator = Translator.load(path, eval_cfg=EvalConfig(beam_size=1))
        limit = translator.max_positions
        lines = ["a b", " ".join(["a"] * (limit + 6))]
        cut = rf"1 input line\(s\) longer than {limit} source tokens were truncated: line 2 \({limit + 6} tokens\)"
        with pytest.warns(UserWarning, match=cut) as warned:
            translator.translate(lines)
        assert warned[0].filename == __file__, f"{translator.backend}: the warning points into the library"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_both_backends_count_the_sentences_on_a_progress_bar_when_asked(one_run, tmp_path, monkeypatch):
    from transformer import Translator

    out = export(load_trained(one_run, torch.device("cpu")), tmp_path / "exported", "none", {"beam_size": 1})
    for path in (one_run, out):
        translator = Translator.load(path, eval_cfg=EvalConfig(beam_size=1))
        for progress in (False, True):
            monkeypatch.setattr(sys, "stderr", terminal := _Terminal())
            translator.translate(["a b", "", "c d e"], progress=progress)
            drawn = terminal.getvalue()
            assert ("translating:" in drawn and "/2 [" in drawn) if progress else drawn == "", (path, drawn)
