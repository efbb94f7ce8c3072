"""Typed configuration of the config groups (data, model, training, eval, attention): their defaults live here.

Hydra composes YAML (which only overrides) on top of these dataclass schemas, so a misspelt key or a
wrong type fails at compose time naming the key. Range checks live in ``__post_init__``, which
``OmegaConf.to_object`` runs, and name the dotted key. Choices are ``Enum`` fields (``transformer.choices``, named
here too), so Hydra lists the valid values when given another. ``TrainConfig`` (a run, as every checkpoint stores
it) is here; the other commands' root schemas are in ``transformer.app.schemas``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from omegaconf import OmegaConf

from transformer.choices import (
    Activation,
    AttentionScore,
    CorpusKind,
    GloveSide,
    LengthNorm,
    NormPosition,
    PositionKind,
    Precision,
    Schedule,
    SentencePieceModel,
    TokenizerKind,
)

T = TypeVar("T")
GPU_PAD_MULTIPLE = 8  # training.pad_to_multiple when unset on a GPU (tensor cores like multiples of 8); 1 on a CPU


class ConfigError(ValueError):
    """A configuration value is out of range or inconsistent; the message names the dotted key."""


def check(condition: bool, key: str, message: str) -> None:
    """Raise ``ConfigError("{key}: {message}")`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


# --------------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------------


@dataclass
class TokenizerConfig:
    """How text becomes ids. ``vocab_size`` caps the word-level vocabulary too."""

    kind: TokenizerKind = TokenizerKind.sentencepiece  # subwords (SentencePiece) or whole words
    vocab_size: int = 8000  # pieces per vocabulary
    model_type: SentencePieceModel = SentencePieceModel.bpe  # SentencePiece's algorithm
    character_coverage: float = 1.0  # share of characters SentencePiece must cover
    joint: bool = True  # one vocabulary for source and target
    lowercase: bool = False  # word-level only
    min_freq: int = 1  # word-level only
    # Tokenizers learn from a seeded random sample of at most this many training sentences (both sides
    # together when joint). 1M is where SentencePiece itself warns that more input only slows training
    # and points to its own sampling (input_sentence_size); Multi30k (58k sentences) is used whole.
    max_sentences: int = 1_000_000

    def __post_init__(self) -> None:
        check(self.vocab_size >= 8, "data.tokenizer.vocab_size", f"must be >= 8, got {self.vocab_size}")
        check(self.max_sentences >= 1, "data.tokenizer.max_sentences", f"must be >= 1, got {self.max_sentences}")
        check(
            0.9 <= self.character_coverage <= 1.0,
            "data.tokenizer.character_coverage",
            f"must be in [0.9, 1.0], got {self.character_coverage}",
        )
        check(self.min_freq >= 1, "data.tokenizer.min_freq", f"must be >= 1, got {self.min_freq}")


@dataclass
class DataConfig:
    """Which parallel corpus, which direction, and how it is cleaned and tokenized."""

    corpus: CorpusKind = CorpusKind.multi30k  # multi30k (downloaded) or custom files
    dir: Optional[str] = None  # where the {split}.{lang}[.gz] files are; multi30k: data/multi30k
    source_dir: Optional[str] = None  # a local copy of Multi30k to use instead of downloading
    src: str = "en"  # source language: the file suffix
    tgt: str = "de"  # target language: the file suffix
    train_split: str = "train"  # the split trained on
    # Read the training split from this folder ({train_split}.{lang}[.gz]) instead of the corpus's: e.g. the corpus
    # extended with translated copies by transformer-diversify. Validation and test stay the corpus's own.
    train_dir: Optional[str] = None
    valid_split: str = "val"  # the split validated on
    test_split: str = "test_2016_flickr"  # the split the finished run is scored on
    max_pairs: Optional[int] = None  # keep only the first N training pairs (smoke runs)
    max_len: int = 128  # drop training pairs with more tokens than this on either side
    max_len_ratio: float = 3.0  # drop training pairs whose token-length ratio exceeds this
    # Tokenizers and the encoded training split are cached here (relative to the working directory),
    # keyed by the corpus files, settings and tokenizers; see transformer/data/cache.py.
    cache_dir: str = "data/cache"
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)

    def __post_init__(self) -> None:
        check(self.corpus is not CorpusKind.custom or self.dir is not None, "data.dir",
              "is required with data=custom, e.g. data.dir=/path/to/corpus")
        check(self.src != self.tgt, "data.src", f"source and target language are both {self.src!r}")
        check(self.max_pairs is None or self.max_pairs > 0, "data.max_pairs", f"must be > 0, got {self.max_pairs}")
        check(self.max_len >= 2, "data.max_len", f"must be >= 2, got {self.max_len}")
        check(self.max_len_ratio >= 1.0, "data.max_len_ratio", f"must be >= 1, got {self.max_len_ratio}")

    @property
    def corpus_dir(self) -> Path:
        """The folder holding the corpus files (for Multi30k also the download target)."""
        return Path(self.dir if self.dir is not None else "data/multi30k")


@dataclass
class AttentionConfig:
    """How every attention layer (encoder self, decoder self, cross) scores a query against a key."""

    score: AttentionScore = AttentionScore.scaled_dot  # how a query scores a key


@dataclass
class GloveConfig:
    """Initialise embeddings from a GloVe-format vector file (text, .gz, .zip member, word2vec header)."""

    path: Optional[str] = None  # the GloVe-format vector file (None: no GloVe)
    side: GloveSide = GloveSide.src  # which embeddings start from it
    freeze: bool = False  # keep the GloVe rows fixed in training
    rescale: bool = True  # scale vectors to the random init's std (GloVe rows are ~3x larger otherwise)


@dataclass
class ModelConfig:
    """Architecture. Stored in every checkpoint so the model can be rebuilt without YAML.

    The defaults are the CPU-sized model ``transformer-train`` trains (``model=half`` names it), so
    ``build_model(ModelConfig(), ...)`` builds that model: 4+4 layers at d_model 128, 2.88M parameters with
    an 8k joint vocabulary. In the same CPU time it beats the 3+3-layer d_model 256 ``model=small`` (0.8 BLEU
    on Multi30k en->de, two seeds against one): it costs less than half as much per token, so it trains twice the
    epochs.
    """

    d_model: int = 128  # width of the embeddings and every layer
    n_heads: int = 4  # attention heads per layer
    d_head: Optional[int] = None  # defaults to d_model // n_heads when that divides
    d_ff: int = 512  # hidden width of the feed-forward layers
    n_encoder_layers: int = 4  # encoder layers
    n_decoder_layers: int = 4  # decoder layers
    dropout: float = 0.2  # 0.1 let Multi30k's validation loss rise after ~13 epochs (29k training pairs)
    attention_dropout: float = 0.1  # dropout on the attention weights
    activation_dropout: Optional[float] = None  # on the feed-forward hidden layer (None: model.dropout)
    activation: Activation = Activation.relu  # the feed-forward non-linearity
    norm: NormPosition = NormPosition.pre  # LayerNorm before (pre) or after (post) each sublayer
    positions: PositionKind = PositionKind.sinusoidal  # how the model knows token order
    max_positions: int = 1024  # the longest sequence the model takes
    rope_base: float = 10000.0  # positions=rope: the rotation of pair i turns by base^(-2i/d_head) per position
    max_relative_distance: int = 16  # positions=relative: distances j - i are clipped to [-this, this]
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    tie_output: bool = True  # decoder output projection shares the target embedding matrix
    share_embeddings: bool = True  # one embedding for source and target (needs a joint vocabulary; §3.4)
    glove: GloveConfig = field(default_factory=GloveConfig)

    def __post_init__(self) -> None:
        for key in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers", "max_positions"):
            value = getattr(self, key)
            check(value > 0, f"model.{key}", f"must be > 0, got {value}")
        if self.d_head is None:
            check(
                self.d_model % self.n_heads == 0,
                "model.d_head",
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; set model.d_head (e.g. "
                f"model.d_head={max(1, self.d_model // self.n_heads)}: heads need not add up to d_model)",
            )
        else:
            check(self.d_head > 0, "model.d_head", f"must be > 0, got {self.d_head}")
        for key in ("dropout", "attention_dropout"):
            value = getattr(self, key)
            check(0.0 <= value < 1.0, f"model.{key}", f"must be in [0, 1), got {value}")
        check(self.activation_dropout is None or 0.0 <= self.activation_dropout < 1.0, "model.activation_dropout",
              f"must be in [0, 1) or null (model.dropout), got {self.activation_dropout}")
        check(self.positions is not PositionKind.rope or self.head_dim % 2 == 0, "model.positions",
              f"rope rotates pairs of coordinates and needs an even head size, got {self.head_dim}")
        check(self.rope_base > 1.0, "model.rope_base", f"must be > 1, got {self.rope_base}")
        check(self.max_relative_distance >= 1, "model.max_relative_distance",
              f"must be >= 1, got {self.max_relative_distance}")

    @property
    def head_dim(self) -> int:
        """The per-head size actually used."""
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    @property
    def hidden_dropout(self) -> float:
        """The dropout rate actually used on the feed-forward hidden layer."""
        return self.dropout if self.activation_dropout is None else self.activation_dropout


@dataclass
class TrainingConfig:
    """The optimisation loop. ``max_epochs``/``max_steps``/``max_minutes``: whichever comes first."""

    seed: int = 1234  # seeds Python, NumPy and torch
    max_epochs: int = 46  # the default model on Multi30k: 52 - 67 min on the 2-core CPUs measured (see max_minutes)
    max_steps: Optional[int] = None  # stop after this many optimizer steps (None: no limit)
    # Training time of the whole run (validation included; a resumed run counts its earlier time). Where it runs out
    # before max_epochs / max_steps, projected from the pace so far, the cosine schedule ends there (Trainer), so a
    # slower machine trains fewer steps but still anneals; null: every epoch, however long it takes.
    max_minutes: Optional[float] = 58.0
    max_tokens: int = 2048  # padded source+target positions per batch, per process
    accumulate: int = 1  # batches per optimizer step
    pad_to_multiple: Optional[int] = None  # batch lengths rounded up to this; None: 1 on a CPU, 8 on a GPU
    lr: float = 2e-3  # peak learning rate, reached at the end of warm-up
    warmup_steps: int = 1000  # linear warm-up to training.lr
    schedule: Schedule = Schedule.cosine  # decays to min_lr where training ends: max_steps / max_epochs / max_minutes
    min_lr: float = 0.0  # floor for the cosine schedule
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # AdamW's betas
    eps: float = 1e-9  # AdamW's epsilon
    weight_decay: float = 0.05  # AdamW's decoupled decay; not on biases, norms or embeddings (transformer/training/optim.py)
    label_smoothing: float = 0.1  # probability mass spread over the vocabulary
    # R-Drop (Liang et al., 2021): > 0 runs each batch twice with independent dropout and adds the two predictions'
    # symmetric KL divergence, weighted as the paper's alpha (5 in its translation runs); twice the compute and
    # activation memory per step
    r_drop: float = 0.0
    bpe_dropout: float = 0.0  # > 0: each epoch segments the training pairs anew, dropping BPE merges at this rate
    clip_grad_norm: Optional[float] = 1.0  # gradient norm clipped to this (None: no clipping)
    precision: Precision = Precision.auto  # auto: bf16 on GPUs that have it, fp32 elsewhere
    # torch.compile the objective (fused elementwise kernels); with cuda_graphs=true the compiled step is what the
    # graphs record (compiled once, in the first shape's warm-up: the sizes are symbolic)
    compile: bool = False
    # CUDA only: replay the whole step (forward, backward, clipping, AdamW) from one recorded CUDA graph per batch
    # shape, batches filled to a fixed shape per padded length (transformer/training/cuda_graphs.py); one process, accumulate 1.
    # None: on where it can run (one CUDA process, accumulate 1, not compiled), off elsewhere (runtime.resolve_training)
    cuda_graphs: Optional[bool] = None
    threads: Optional[int] = None  # torch intra-op threads on CPU (None: torch's default)
    deterministic: bool = False  # deterministic kernels (slower)
    patience: Optional[int] = None  # validations without a greedy-BLEU gain before stopping (None: never)
    validate_every_steps: Optional[int] = None  # None: validate once per epoch
    valid_max_sentences: Optional[int] = None  # translate only the first N validation sentences for BLEU
    log_every_steps: int = 50  # a log line every N steps
    keep_last: int = 5  # periodic checkpoints to keep besides best.pt
    save_every_steps: Optional[int] = None  # also write last.pt every N steps, without validating
    save_every_minutes: Optional[float] = None  # also write last.pt every N minutes, without validating
    average_last: int = 5  # final.pt: best.pt or the average of the last N, the better under eval's search (0/1: best)
    n_samples: int = 3  # sample translations logged at each validation
    progress_bar: bool = True  # a tqdm bar on a terminal

    def __post_init__(self) -> None:
        for key in ("lr", "min_lr", "eps", "weight_decay", "r_drop", "max_minutes", "save_every_minutes",
                    "clip_grad_norm"):  # inf passes "> 0" and trains into NaN (null: no limit, where there is one)
            value = getattr(self, key)
            check(value is None or math.isfinite(value), f"training.{key}", f"must be a finite number, got {value}")
        check(self.max_epochs > 0, "training.max_epochs", f"must be > 0, got {self.max_epochs}")
        check(self.max_steps is None or self.max_steps > 0, "training.max_steps", f"must be > 0, got {self.max_steps}")
        check(
            self.max_minutes is None or self.max_minutes > 0,
            "training.max_minutes",
            f"must be > 0, got {self.max_minutes}",
        )
        check(self.max_tokens >= 16, "training.max_tokens", f"must be >= 16, got {self.max_tokens}")
        check(self.accumulate >= 1, "training.accumulate", f"must be >= 1, got {self.accumulate}")
        check(self.pad_to_multiple is None or self.pad_to_multiple >= 1, "training.pad_to_multiple",
              f"must be >= 1 or null, got {self.pad_to_multiple}")
        check(self.save_every_steps is None or self.save_every_steps > 0, "training.save_every_steps",
              f"must be > 0 or null, got {self.save_every_steps}")
        check(self.save_every_minutes is None or self.save_every_minutes > 0, "training.save_every_minutes",
              f"must be > 0 or null, got {self.save_every_minutes}")
        check(self.lr > 0, "training.lr", f"must be > 0, got {self.lr}")
        check(self.warmup_steps >= 0, "training.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        check(0.0 <= self.min_lr <= self.lr, "training.min_lr", f"must be in [0, training.lr={self.lr}], got {self.min_lr}")
        check(self.eps > 0, "training.eps", f"must be > 0, got {self.eps}")
        check(self.weight_decay >= 0, "training.weight_decay", f"must be >= 0, got {self.weight_decay}")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "training.betas",
              f"must be two numbers in [0, 1), got {list(self.betas)}")
        check(0.0 <= self.label_smoothing < 1.0, "training.label_smoothing",
              f"must be in [0, 1), got {self.label_smoothing}")
        check(self.r_drop >= 0.0, "training.r_drop", f"must be >= 0, got {self.r_drop}")
        check(0.0 <= self.bpe_dropout < 1.0, "training.bpe_dropout", f"must be in [0, 1), got {self.bpe_dropout}")
        check(self.clip_grad_norm is None or self.clip_grad_norm > 0, "training.clip_grad_norm",
              f"must be > 0 or null, got {self.clip_grad_norm}")
        check(self.patience is None or self.patience > 0, "training.patience", f"must be > 0 or null, got {self.patience}")
        for key in ("validate_every_steps", "valid_max_sentences", "threads"):
            value = getattr(self, key)
            check(value is None or value > 0, f"training.{key}", f"must be > 0 or null, got {value}")
        check(self.n_samples >= 0, "training.n_samples", f"must be >= 0, got {self.n_samples}")
        check(self.log_every_steps > 0, "training.log_every_steps", f"must be > 0, got {self.log_every_steps}")
        check(self.keep_last >= 1, "training.keep_last", f"must be >= 1, got {self.keep_last}")
        check(self.average_last >= 0, "training.average_last", f"must be >= 0, got {self.average_last}")
        check(self.average_last <= self.keep_last, "training.average_last",
              f"averages kept checkpoints only: raise training.keep_last to >= {self.average_last}")
        if self.cuda_graphs:  # the device and the number of processes are checked where they are known
            check(self.accumulate == 1, "training.accumulate",
                  f"training.cuda_graphs records one batch per step: must be 1, got {self.accumulate}")


@dataclass
class EvalConfig:
    """Decoding and scoring. ``beam_size: 1`` is greedy search; ``sampling_topk`` other than 1 samples instead."""

    beam_size: int = 8  # 1: greedy. The test search's 8 with alpha 1.5 scored best on Multi30k validation (beams 4-8)
    length_penalty: float = 1.5  # GNMT alpha (length_norm=gnmt)
    length_norm: LengthNorm = LengthNorm.gnmt  # how beam search normalizes scores by length
    n_best: int = 1  # translations per sentence
    max_len_a: float = 1.5  # hypotheses stop at max_len_a * source length + max_len_b tokens
    max_len_b: int = 10  # see max_len_a
    batch_size: Optional[int] = None  # sentences decoded together; None: 64 on a CPU, 512 on a GPU
    use_cache: bool = True  # the decoder's key/value cache (same output, faster)
    # Search in fixed shapes, no host work a step; on a GPU a CUDA-graph replay a step. None: on a GPU, for one model's
    # cached search (the same translations, faster there: docs/RESULTS.md); off elsewhere (slower on a CPU)
    fixed_shape: Optional[bool] = None
    # The searches' arithmetic. bf16: a bfloat16 copy of the model decodes (on a GPU half the memory traffic; the
    # translations may differ a little from fp32's; slow on most CPUs); auto: bf16 on GPUs that have it, else fp32.
    precision: Precision = Precision.fp32
    # Random sampling (with beam_size 1; n_best: samples per sentence). 1: search, no sampling; 0: draw each token
    # from the whole distribution; k >= 2: from the k likeliest tokens.
    sampling_topk: int = 1
    sampling_topp: float = 1.0  # Sampling: from the likeliest tokens whose probabilities sum to this (nucleus)
    sampling_temperature: float = 1.0  # Sampling: log-probabilities divided by it (< 1 sharper, > 1 flatter)
    sampling_seed: int = 1234  # Sampling: the seed of each call's draws
    # Also report BLEU in the Multi30k papers' flavour (lowercased, Moses-normalised and -tokenised; see
    # transformer/inference/metrics.py) next to the cased sacreBLEU, which stays the headline.
    report_tokenized_bleu: bool = True

    def __post_init__(self) -> None:
        check(self.beam_size >= 1, "eval.beam_size", f"must be >= 1, got {self.beam_size}")
        check(self.sampling_topk >= 0, "eval.sampling_topk", f"must be >= 0, got {self.sampling_topk}")
        check(0 < self.sampling_topp <= 1, "eval.sampling_topp", f"must be in (0, 1], got {self.sampling_topp}")
        check(self.sampling_temperature > 0, "eval.sampling_temperature",
              f"must be > 0, got {self.sampling_temperature}")
        if self.sampling_topk == 1:
            check(1 <= self.n_best <= self.beam_size, "eval.n_best",
                  f"must be in [1, eval.beam_size={self.beam_size}], got {self.n_best}")
            for key in ("sampling_topp", "sampling_temperature"):
                value = getattr(self, key)
                check(value == 1, f"eval.{key}={value}", "applies to sampling, which eval.sampling_topk=1 turns off: "
                      "set eval.sampling_topk=0 (or k >= 2) and eval.beam_size=1 to sample")
        else:
            check(self.n_best >= 1, "eval.n_best", f"must be >= 1 (samples per sentence), got {self.n_best}")
            check(self.beam_size == 1, f"eval.sampling_topk={self.sampling_topk}", "samples one token at a time, not "
                  f"in a beam: set eval.beam_size=1 too (eval.beam_size is {self.beam_size})")
            check(not self.fixed_shape, "eval.fixed_shape", "searches; it does not sample: set eval.fixed_shape=false "
                  "(or eval.sampling_topk=1)")
        check(self.length_penalty >= 0, "eval.length_penalty", f"must be >= 0, got {self.length_penalty}")
        check(self.max_len_a >= 0, "eval.max_len_a", f"must be >= 0, got {self.max_len_a}")
        check(self.max_len_b >= 0, "eval.max_len_b", f"must be >= 0, got {self.max_len_b}")
        check(self.max_len_a > 0 or self.max_len_b > 0, "eval.max_len_b",
              "eval.max_len_a and eval.max_len_b are both 0: no hypothesis could hold a token")
        check(self.batch_size is None or self.batch_size >= 1, "eval.batch_size",
              f"must be >= 1 or null, got {self.batch_size}")
        check(not self.fixed_shape or self.use_cache, "eval.fixed_shape",
              "runs on the decoder's cache: set eval.use_cache=true (or eval.fixed_shape=false)")


@dataclass
class AttentionDumpConfig:
    """Which sentences to draw attention maps for (test-set indices and/or given source texts)."""

    indices: list[int] = field(default_factory=list)  # test-set sentences to draw
    texts: list[str] = field(default_factory=list)  # source texts to translate and draw
    on_reference: bool = False  # also teacher-force on the reference translation
    max_tokens: int = 48  # longer sentences are cut for the figures
    format: str = "png"  # png: PNGs, .npz and TensorBoard; html: those and one self-contained explorer.html

    def __post_init__(self) -> None:
        check(self.max_tokens >= 1, "attention.max_tokens", f"must be >= 1, got {self.max_tokens}")
        check(self.format in ("png", "html"), "attention.format", f"must be png or html, got {self.format!r}")
        check(self.format == "png" or bool(self.indices or self.texts), "attention.format",
              "html draws the sentences of attention.indices=[...] or attention.texts=[...]: give one of them")
        check(all(i >= 0 for i in self.indices), "attention.indices", f"must be >= 0, got {list(self.indices)}")
        for i, text in enumerate(self.texts):
            check(bool(text.strip()), f"attention.texts[{i}]", "is empty: there is nothing to draw attention for")


@dataclass
class TrainConfig:
    """A training run (``transformer-train``'s root): what every checkpoint stores to rebuild its model and data."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = "outputs/train"  # train.yaml sets it to Hydra's run directory
    resume: Optional[str] = None  # a run directory or a checkpoint file to continue from; auto: hydra.run.dir's
    device: str = "auto"  # auto | cpu | cuda | cuda:N

    def __post_init__(self) -> None:
        if self.model.share_embeddings:
            check(self.data.tokenizer.joint, "model.share_embeddings",
                  "needs one joint vocabulary (data.tokenizer.joint=true)")
        check(self.eval.sampling_topk == 1, "eval.sampling_topk", "a training run chooses and scores its model with "
              "a search, not samples: set eval.sampling_topk=1 (sample with transformer-translate eval=sampling)")
        multiple = self.training.pad_to_multiple or GPU_PAD_MULTIPLE  # unset: the larger of the two defaults
        longest = -(-(self.data.max_len + 1) // multiple) * multiple  # BOS or EOS added, rounded up to the multiple
        check(longest <= self.model.max_positions, "model.max_positions",
              f"is {self.model.max_positions}, but training batches can be {longest} positions long "
              f"(data.max_len={self.data.max_len}, + 1 for BOS/EOS, padded to a multiple of {multiple}); raise "
              "model.max_positions or lower data.max_len")
        if self.training.bpe_dropout > 0:
            tokenizer = self.data.tokenizer
            check(tokenizer.kind is TokenizerKind.sentencepiece and tokenizer.model_type is SentencePieceModel.bpe,
                  "training.bpe_dropout", "needs SentencePiece BPE tokenizers (data.tokenizer.kind=sentencepiece, "
                  f"data.tokenizer.model_type=bpe); this run has {tokenizer.kind.value}"
                  + (f" ({tokenizer.model_type.value})" if tokenizer.kind is TokenizerKind.sentencepiece else ""))
        model = self.model
        check(self.training.r_drop == 0 or max(model.dropout, model.attention_dropout, model.hidden_dropout) > 0,
              "training.r_drop", "needs dropout (model.dropout, model.attention_dropout or model.activation_dropout "
              "> 0): without it both passes agree, and the step would cost twice as much for nothing")


def to_plain_dict(cfg: Any) -> dict[str, Any]:
    """A config dataclass as plain Python values (enums as their names), e.g. for checkpoints and JSON."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True, resolve=True)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested plain values as dotted keys: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def from_plain_dict(schema: type[T], values: dict[str, Any]) -> T:
    """Rebuild a config dataclass from ``to_plain_dict`` output, validating it like a composed config."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
