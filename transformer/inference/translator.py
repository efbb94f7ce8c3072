"""``Translator``: text in, text out, from a run, a checkpoint or a CTranslate2 export, for programs that use a
trained model.

    from transformer import Translator
    translator = Translator.load("outputs/train/<run>")            # this app's PyTorch search
    translator = Translator.load("exports/en_de")                  # CTranslate2 (transformer-export)
    translator.translate(["A man rides a bike."], beam_size=1)      # -> [["Ein Mann fährt Fahrrad."]]
    translator.translate_scored(["A man rides a bike."], beam_size=4, n_best=2)
    # -> [[Translation(text="Ein Mann fährt auf einem Fahrrad.", score=-0.269, pieces=("▁Ein", ...)), ...]]

Both backends search with the ``eval`` settings given to :meth:`Translator.load` (default: ``EvalConfig``'s beam
search for a run or checkpoint, the settings it was exported with for an export); a call may change ``beam_size``
and ``n_best``. In fp32 both give the same hypotheses and scores (to float rounding): greedy search with every
``length_norm``, beam search with average, and with none its best hypothesis (CTranslate2 then stops once its best
beam ends, so the rest of an n-best list may differ). CTranslate2's beam search has no GNMT length normalisation:
with ``length_norm=gnmt`` it normalises by length instead (average). The ctranslate2 backend says so once.

A score is the hypothesis's summed log-probability (EOS included) divided as ``length_norm`` says: by
``((5 + length) / 6) ** length_penalty`` (gnmt), by its length in tokens with EOS (average) or by 1 (none).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import torch

from transformer.config import ConfigError, DataConfig, EvalConfig, LengthNorm, Precision, from_plain_dict
from transformer.data.tokenizer import SentencePieceTokenizer, Tokenizer, WordTokenizer
from transformer.inference.export import EXPORT_FILE, check_export_files, read_export_record
from transformer.inference.loading import TrainedModel, load_model
from transformer.inference.sampling import generator
from transformer.inference.search import length_penalty, max_length
from transformer.inference.translation import (
    decodes_in_bf16,
    decoding_model,
    encode_sources,
    progress_bar,
    searches_in_fixed_shapes,
    translate_hypotheses,
)
from transformer.runtime import choose_device, decode_batch_size

log = logging.getLogger(__name__)

BACKENDS = ("torch", "ctranslate2")


@dataclass(frozen=True)
class Translation:
    """One hypothesis: its detokenized text, its length-normalized log-probability (the n-best order) and the target
    pieces the model generated (without BOS and EOS: what its attention maps are drawn on)."""

    text: str
    score: float
    pieces: tuple[str, ...] = ()


class Translator:
    """A trained model with its tokenizers and search settings (build it with :meth:`load`)."""

    def __init__(self, backend: str, src_tok: Tokenizer, tgt_tok: Tokenizer, eval_cfg: EvalConfig,
                 max_positions: int, data: DataConfig | None, languages: tuple[str, str], source: Path, *,
                 trained: TrainedModel | None = None, ct2: Any = None, device: str = "cpu") -> None:
        self.backend, self.src_tok, self.tgt_tok, self.eval = backend, src_tok, tgt_tok, eval_cfg
        self.max_positions, self.device = max_positions, device
        self.data = data  # the corpus the model was trained on (None: an export that does not record it)
        self.languages = languages  # (source, target)
        self.source = source  # the checkpoint file, or the export directory
        self._trained, self._ct2 = trained, ct2
        self._decoding: tuple[Precision, torch.nn.Module] | None = None  # the model the searches run, per precision
        self._target_ids = {piece: i for i, piece in enumerate(tgt_tok.pieces())}
        self._warned_gnmt = self._warned_nbest = False
        self._random = generator(eval_cfg, device) if trained is not None else None  # sampling: the calls' draws

    @property
    def trained(self) -> TrainedModel | None:
        """The PyTorch model (backend ``torch``), else None."""
        return self._trained

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu", backend: str | None = None,
             eval_cfg: EvalConfig | None = None, threads: int = 0) -> Translator:
        """A translator for ``path``: a run directory or a checkpoint file (backend ``torch``) or an export
        directory (backend ``ctranslate2``; its ``export.json`` gives the search when ``eval_cfg`` is None).
        ``device``: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA where there is one). ``threads``: CTranslate2's
        CPU threads, each decoding batches of its own on one core (0: up to 4, as many as there are cores); with the
        torch backend, above 0 it sets PyTorch's threads, for the whole process (``torch.set_num_threads``)."""
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads: must be an integer, got {threads!r}")
        if threads < 0:
            raise ConfigError(f"threads: must be >= 0 (0: up to 4, as many as there are cores), got {threads}")
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist; give a training run's folder, a checkpoint file or an "
                                    "export's folder")
        device = choose_device(str(device))  # cuda:N that this machine lacks: refused by key
        is_export = (path / EXPORT_FILE).is_file()
        backend = backend or ("ctranslate2" if is_export else "torch")
        if backend not in BACKENDS:
            raise ConfigError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
        if is_export and backend == "torch":
            raise ConfigError(f"backend: {path} is a CTranslate2 export; the torch backend needs the run or checkpoint "
                              "it was exported from (export.json names it)")
        if not is_export and backend == "ctranslate2":
            raise ConfigError(f"backend: ctranslate2 runs an export; make one with transformer-export "
                              f"{'run_dir' if path.is_dir() else 'checkpoint'}={path} out_dir=DIR")
        if is_export and device.type not in ("cpu", "cuda"):
            raise ConfigError(f"device: CTranslate2 decodes on cpu or cuda, not {device.type}; give device=cpu, or "
                              "decode the run or checkpoint it was exported from")
        if is_export:
            return cls._load_export(path, device, eval_cfg, threads)
        trained = load_model(path if path.is_dir() else None, None if path.is_dir() else path, [], device)
        if threads:
            torch.set_num_threads(threads)
        return cls.from_trained(trained, eval_cfg)

    @classmethod
    def from_trained(cls, trained: TrainedModel, eval_cfg: EvalConfig | None = None) -> Translator:
        """A translator (backend ``torch``) for a model already loaded, on the device its weights are on
        (``load_model`` finds a run's checkpoint and refuses a path given under the wrong key); ``eval_cfg`` None:
        ``EvalConfig``'s search."""
        data = trained.config.data
        device = next(trained.model.parameters()).device
        return cls("torch", trained.src_tok, trained.tgt_tok, eval_cfg or EvalConfig(), trained.model.max_positions,
                   data, (data.src, data.tgt), trained.path, trained=trained, device=str(device))

    @classmethod
    def _load_export(cls, path: Path, device: torch.device, eval_cfg: EvalConfig | None,
                     threads: int) -> Translator:
        if importlib.util.find_spec("ctranslate2") is None:
            raise ConfigError(f"export_dir: {path} is a CTranslate2 export, and decoding it needs CTranslate2: "
                              "pip install ctranslate2")
        import ctranslate2

        info = read_export_record(path)
        check_export_files(path, info)
        src_tok, tgt_tok = (_tokenizer(path, info[key]) for key in ("source_tokenizer", "target_tokenizer"))
        if eval_cfg is None:
            decoding = dict(info.get("decoding", {}))
            try:
                if "length_norm" in decoding:
                    decoding["length_norm"] = LengthNorm(decoding["length_norm"])
                eval_cfg = EvalConfig(**decoding)
            except (TypeError, ValueError) as error:
                raise ConfigError(f"export_dir: {path / EXPORT_FILE}: decoding: {error}") from None
        # On a CPU, batches side by side, one core each (inter_threads), decode a small model faster than each batch
        # split across the cores (intra_threads): 1.8x for the default model's beam 5 on 2 cores (docs/guide/export.md).
        workers = threads or min(4, os.cpu_count() or 1)
        try:
            ct2 = (ctranslate2.Translator(str(path), device="cpu", inter_threads=workers, intra_threads=1)
                   if device.type == "cpu" else ctranslate2.Translator(
                       str(path), device=device.type,
                       device_index=torch.cuda.current_device() if device.index is None else device.index))
        except (RuntimeError, ValueError) as error:  # a build without CUDA, a device it cannot use, a damaged model
            raise ConfigError(f"export_dir: CTranslate2 cannot load {path} on {device}: {error}") from None
        # An export of format 1 records only the languages: no corpus to evaluate on.
        data = from_plain_dict(DataConfig, info["data"]) if "corpus" in info["data"] else None
        languages = (info["data"]["src"], info["data"]["tgt"])
        return cls("ctranslate2", src_tok, tgt_tok, eval_cfg, int(info["model"]["max_positions"]), data, languages,
                   path, ct2=ct2, device=str(device))

    def translate(self, sentences: Iterable[str], beam_size: int | None = None, n_best: int | None = None, *,
                  progress: bool = False) -> list[list[str]]:
        """``n_best`` translations of each sentence, best first (a blank sentence gives empty strings)."""
        return [[t.text for t in nbest] for nbest in self.translate_scored(sentences, beam_size, n_best,
                                                                           progress=progress)]

    def translate_scored(self, sentences: Iterable[str], beam_size: int | None = None, n_best: int | None = None, *,
                         progress: bool = False) -> list[list[Translation]]:
        """``n_best`` :class:`Translation` s of each sentence, best first (a blank sentence: empty, score 0).
        ``beam_size`` and ``n_best`` not given: the translator's (``eval``), ``n_best`` at most ``beam_size``.
        A translator whose ``eval`` samples (``sampling_topk`` other than 1) gives ``n_best`` samples, best first:
        from a run, drawn from one generator seeded with ``eval.sampling_seed`` when the translator loads (each
        call goes on from the last; a new translator repeats them); from an export, CTranslate2's own draws.
        ``progress``: a bar counting the translated sentences on stderr, when it is a terminal.

        Sentences are sorted by length and decoded ``eval.batch_size`` at a time (64 on a CPU, 512 on a GPU).
        """
        if isinstance(sentences, str):  # a string is a sequence too: each character would be a sentence
            raise TypeError(f"sentences: a list of sentences, got one string {sentences[:40]!r}; "
                            "translate([sentence]) translates one")
        sentences = list(sentences)  # a generator or any other iterable, read once
        if (bad := next((i for i, s in enumerate(sentences) if not isinstance(s, str)), None)) is not None:
            raise TypeError(f"sentences[{bad}]: must be a string, got {type(sentences[bad]).__name__}")
        for i, sentence in enumerate(sentences):
            try:
                sentence.encode("utf-8")
            except UnicodeEncodeError as error:  # a lone surrogate, e.g. from bytes decoded with surrogateescape
                raise ValueError(f"sentences[{i}]: not valid Unicode text ({error.reason} at character "
                                 f"{error.start})") from None
        for key, value in (("beam_size", beam_size), ("n_best", n_best)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{key}: must be an integer, got {value!r}")
            if value is not None and value < 1:
                raise ConfigError(f"{key}: must be >= 1, got {value}")
        sampling = self.eval.sampling_topk != 1  # n_best samples, each from a beam of one
        if sampling and beam_size not in (None, 1):
            raise ConfigError(f"beam_size: this translator samples (eval.sampling_topk={self.eval.sampling_topk}): "
                              f"give no beam_size, or 1; got {beam_size}")
        beam_size = beam_size or self.eval.beam_size
        if n_best is None:  # not given: the translator's n_best, as many as this call's beam holds
            n_best = self.eval.n_best if sampling else min(self.eval.n_best, beam_size)
        if n_best > beam_size and not sampling:
            raise ConfigError(f"n_best: {n_best} translations need beam_size >= {n_best}, got {beam_size}")
        cfg = replace(self.eval, beam_size=beam_size, n_best=n_best)
        if self._trained is not None:
            if self._decoding is None or self._decoding[0] is not cfg.precision:  # made once per eval.precision
                self._decoding = cfg.precision, decoding_model(self._trained.model, cfg.precision, self.device)
            found = translate_hypotheses(self._decoding[1], sentences, self.src_tok, self.tgt_tok, cfg,
                                         self.device, self.max_positions, progress, self._random)
            return [[self._translation(h.tokens, h.score) for h in nbest] for nbest in found]
        return self._translate_ct2(sentences, cfg, progress)

    def _translation(self, ids: list[int], score: float) -> Translation:
        return Translation(self.tgt_tok.decode(ids), score, tuple(self.tgt_tok.id_to_piece(i) for i in ids))

    def _translate_ct2(self, sentences: list[str], cfg: EvalConfig, progress: bool) -> list[list[Translation]]:
        """Sentences grouped by their hypothesis length limit (CTranslate2 takes one per call)."""
        greedy = cfg.beam_size == 1  # sampling too: one token at a time
        if not greedy:
            self._warn_once(cfg)
        # Greedy and sampling: normalisation picks no token, so CTranslate2 returns the raw sum and the score is
        # divided here, exactly as this app's search divides it (GNMT included).
        penalty = 0.0 if greedy or cfg.length_norm is LengthNorm.none else 1.0
        tokens = [[self.src_tok.id_to_piece(i) for i in ids]  # cut to the model's positions, with a warning
                  for ids in encode_sources(sentences, self.src_tok, self.max_positions)]
        out = [[Translation("", 0.0)] * cfg.n_best for _ in sentences]
        groups: dict[int, list[int]] = {}
        for i, source in enumerate(tokens):
            if source:
                limit = max_length(len(source), cfg.max_len_a, cfg.max_len_b, self.max_positions)
                groups.setdefault(limit, []).append(i)
        pending = [(indices, self._ct2.translate_batch(  # every group queued at once: the workers share them out
            [tokens[i] for i in indices], beam_size=cfg.beam_size, num_hypotheses=cfg.n_best, length_penalty=penalty,
            max_decoding_length=limit, min_decoding_length=0,  # 0: EOS may come first, as in this app's search
            max_input_length=0,  # sources are already cut to the model's positions (CTranslate2 would cut at 1024)
            return_end_token=True, return_scores=True, max_batch_size=decode_batch_size(cfg, self.device),
            sampling_topk=min(cfg.sampling_topk, len(self._target_ids)), sampling_topp=cfg.sampling_topp,
            sampling_temperature=cfg.sampling_temperature, asynchronous=True)) for limit, indices in groups.items()]
        eos = self.tgt_tok.id_to_piece(self.tgt_tok.eos_id)
        with progress_bar(sum(len(indices) for indices, _ in pending), progress) as bar:
            for indices, results in pending:
                for i, result in zip(indices, (r.result() for r in results)):
                    out[i] = self._hypotheses(result, eos, greedy, cfg)
                    bar.update()
        return out

    def _hypotheses(self, result: Any, eos: str, greedy: bool, cfg: EvalConfig) -> list[Translation]:
        """The :class:`Translation` s of one CTranslate2 result (its end token dropped, a greedy score divided
        here as this app's search divides it)."""
        hypotheses = []
        for hypothesis, score in zip(result.hypotheses, result.scores):
            ended = bool(hypothesis) and hypothesis[-1] == eos
            pieces = hypothesis[:-1] if ended else hypothesis
            if greedy:
                score /= length_penalty(max(len(pieces) + ended, 1), cfg.length_penalty, cfg.length_norm)
            hypotheses.append(self._translation([self._target_ids[p] for p in pieces], score))
        return sorted(hypotheses, key=lambda t: -t.score) if cfg.sampling_topk != 1 else hypotheses

    def search_differences(self, cfg: EvalConfig | None = None) -> list[str]:
        """Where a beam search with ``cfg`` (default: the translator's) differs from this app's own: nothing for
        the torch backend; for CTranslate2, GNMT length normalisation done as average, and an n-best list without
        normalisation of which only the best is this app's."""
        cfg = cfg or self.eval
        if self.backend != "ctranslate2" or cfg.sampling_topk != 1:  # sampling: no beam, and scores divided here
            return []
        differences = []
        if cfg.length_norm is LengthNorm.gnmt:
            differences.append("eval.length_norm=gnmt has no CTranslate2 counterpart: its beam search (beam_size > 1) "
                               "normalises by length (average) instead")
        if cfg.length_norm is LengthNorm.none and cfg.n_best > 1:
            differences.append("eval.length_norm=none: CTranslate2's beam search stops once its best hypothesis ends, "
                               "so only the best of the n_best is this app's")
        return differences

    def search_settings(self) -> EvalConfig:
        """The translator's ``eval`` with what depends on the device settled: ``batch_size`` (unset: 64 on a CPU,
        512 on a GPU) and, for the torch backend, ``fixed_shape`` (unset: on for a cached search on a GPU) and
        ``precision`` (``auto``: bf16 on a GPU that has it, else fp32). CTranslate2 decodes in the export's own
        type with its own search, so for it those two stay as given."""
        cfg = replace(self.eval, batch_size=decode_batch_size(self.eval, self.device))
        if self._trained is None:
            return cfg
        bf16 = decodes_in_bf16(cfg.precision, self.device)
        return replace(cfg, fixed_shape=searches_in_fixed_shapes(cfg, self._trained.model, self.device),
                       precision=Precision.bf16 if bf16 else Precision.fp32)

    def _warn_once(self, cfg: EvalConfig) -> None:
        """Where CTranslate2's beam search differs from this app's, said once per translator (for the default GNMT
        normalisation as information: every export of a default run decodes so)."""
        for difference in self.search_differences(cfg):
            gnmt = difference.startswith("eval.length_norm=gnmt")
            if gnmt and not self._warned_gnmt:
                log.info("%s", difference)  # the default: said, but not as a warning each time an export is used
                self._warned_gnmt = True
            elif not gnmt and not self._warned_nbest:
                log.warning("%s", difference)
                self._warned_nbest = True


def _tokenizer(folder: Path, entry: dict[str, Any]) -> Tokenizer:
    """A tokenizer as ``export.json`` records it."""
    path = folder / entry["path"]
    try:
        if entry["kind"] == "sentencepiece":
            return SentencePieceTokenizer(path.read_bytes())
        return WordTokenizer(path.read_text(encoding="utf-8").splitlines(), lowercase=bool(entry.get("lowercase")))
    except FileNotFoundError:
        raise ConfigError(f"export_dir: {path} is missing; export the model again") from None
    except (RuntimeError, UnicodeDecodeError) as error:  # SentencePiece cannot parse it; not UTF-8
        raise ConfigError(f"export_dir: {path} is not a readable tokenizer ({str(error).splitlines()[0]}); "
                          "export the model again") from None
