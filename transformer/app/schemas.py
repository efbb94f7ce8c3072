"""The root schema of each command but training's (``config.TrainConfig``, which every checkpoint stores): what
``transformer-evaluate``, ``-translate``, ``-serve``, ``-export``, ``-prepare-data``, ``-diversify`` and ``-benchmark`` compose from
the config groups in ``config``, with the checks that span groups, and ``register_configs`` to store them all in
Hydra's ConfigStore under the names the YAML roots start from; and where those YAML files are (``CONFIG_PATH``).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Optional

from hydra.core.config_store import ConfigStore

from transformer.config import (
    AttentionDumpConfig,
    ConfigError,
    DataConfig,
    EvalConfig,
    ModelConfig,
    TrainConfig,
    TrainingConfig,
    check,
)


def shipped_folder(name: str, marker: str) -> Path:
    """The source tree's top-level folder ``name`` (holding ``marker``) when the package runs from a source tree (an
    editable install, or ``PYTHONPATH``), else the copy of it a wheel installs inside the package."""
    package = Path(__file__).resolve().parents[1]
    source_tree = package.parent
    if (source_tree / name / marker).exists() and (source_tree / "pyproject.toml").is_file():
        return source_tree / name
    return package / name


def config_root() -> Path:
    """The folder of the YAML configs: the source tree's ``configs/``, else the wheel's packaged copy."""
    return shipped_folder("configs", "train.yaml")


# An absolute path: Hydra would otherwise look for a Python package named ``configs``.
CONFIG_PATH = str(config_root())


def _check_one_model(run_dir: Optional[str], checkpoint: Optional[str], export_dir: Optional[str],
                     ensemble: list[str], fixed_shape: bool | None) -> None:
    """Exactly one model source; an export decodes alone, and so does the fixed-shape search."""
    given = [key for key, value in (("run_dir", run_dir), ("checkpoint", checkpoint), ("export_dir", export_dir))
             if value is not None]
    check(len(given) == 1, "run_dir", "give exactly one of run_dir=..., checkpoint=... or export_dir=..."
          + (f" (got {', '.join(given)})" if given else ""))
    check(export_dir is None or not ensemble, "ensemble", "an export decodes alone: leave out ensemble=... with "
          "export_dir=...")
    check(not (fixed_shape and ensemble), "eval.fixed_shape", "decodes a single Transformer, not an ensemble; "
          "set eval.fixed_shape=false or leave out ensemble=...")


@dataclass
class EvaluateConfig:
    """``transformer-evaluate``: score a trained model on a test set with sacreBLEU."""

    run_dir: Optional[str] = None  # a training run directory (its final.pt, else best.pt, else last.pt)
    checkpoint: Optional[str] = None  # or a checkpoint file
    export_dir: Optional[str] = None  # or a CTranslate2 export (transformer-export), decoded by CTranslate2
    # More models to decode with it, each a run directory or a checkpoint file: an ensemble, whose next-token
    # probabilities are the mean of its models' (transformer/inference/ensemble.py). They must share its tokenizers.
    ensemble: list[str] = field(default_factory=list)
    # What to score: a split of the run's corpus (default: its data.test_split), e.g. val or, for Multi30k, the
    # later test sets test_2017_flickr, test_2017_mscoco and test_2018_flickr (fetched and verified on demand);
    # or a pair of files.
    split: Optional[str] = None
    src_file: Optional[str] = None  # a source file to score instead of a split
    ref_file: Optional[str] = None  # its reference translations, line by line
    # Score only the pairs with more than this many tokens on a side (in the model's own tokens). With the
    # data.max_len a model was trained with, that is the sentences longer than any it saw: its extrapolation.
    longer_than: Optional[int] = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    attention: AttentionDumpConfig = field(default_factory=AttentionDumpConfig)
    output_dir: str = "outputs/evaluate"  # where hypotheses.txt, metrics.json and attention maps go
    overwrite: bool = False  # write into a folder that already holds a run's or an evaluation's results
    device: str = "auto"  # auto (a GPU when there is one) | cpu | cuda | cuda:N

    def __post_init__(self) -> None:
        _check_one_model(self.run_dir, self.checkpoint, self.export_dir, self.ensemble, self.eval.fixed_shape)
        check(self.export_dir is None or not (self.attention.indices or self.attention.texts), "attention",
              "attention maps are drawn from this app's model, not an export: give run_dir=... or checkpoint=...")
        check((self.src_file is None) == (self.ref_file is None), "ref_file",
              "src_file and ref_file go together")
        check(self.split is None or self.src_file is None, "split", "give split=... or src_file/ref_file, not both")
        check(self.longer_than is None or self.longer_than >= 0, "longer_than",
              f"must be >= 0 or null, got {self.longer_than}")
        check(not self.ensemble or not (self.attention.indices or self.attention.texts), "attention",
              "attention maps are drawn for one model, not an ensemble: leave out ensemble=... to draw them")


@dataclass
class TranslateConfig:
    """``transformer-translate``: translate lines from stdin or a file, one line out per line in."""

    run_dir: Optional[str] = None  # a training run directory (its final.pt, else best.pt, else last.pt)
    checkpoint: Optional[str] = None  # or a checkpoint file
    export_dir: Optional[str] = None  # or a CTranslate2 export (transformer-export), decoded by CTranslate2
    ensemble: list[str] = field(default_factory=list)  # more models to decode with it (see EvaluateConfig)
    input: Optional[str] = None  # default (or "-"): stdin
    output: Optional[str] = None  # default (or "-"): stdout; a device or named pipe is written to, not replaced
    overwrite: bool = False  # replace an existing output file
    eval: EvalConfig = field(default_factory=EvalConfig)
    device: str = "auto"  # auto (a GPU when there is one) | cpu | cuda | cuda:N

    def __post_init__(self) -> None:
        _check_one_model(self.run_dir, self.checkpoint, self.export_dir, self.ensemble, self.eval.fixed_shape)
        for key, stream in (("input", "stdin"), ("output", "stdout")):
            check(getattr(self, key) != "", key, f"is empty; give a file, or leave {key} out (or {key}=-) for {stream}")
        self.input = None if self.input in ("-", "/dev/stdin") else self.input  # the standard streams' names
        self.output = None if self.output in ("-", "/dev/stdout") else self.output  # also when stdout is a file



class Quantization(enum.Enum):
    """How an export stores its weights (CTranslate2's names; ``inference.export.QUANTIZATIONS`` lists the same)."""

    none = "none"  # as trained, float32
    int8 = "int8"
    int8_float32 = "int8_float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


@dataclass
class ExportConfig:
    """``transformer-export``: a trained model as a CTranslate2 model directory (transformer/inference/export.py)."""

    run_dir: Optional[str] = None  # a training run directory (its final.pt, else best.pt, else last.pt)
    checkpoint: Optional[str] = None  # or a checkpoint file
    out_dir: Optional[str] = None  # a new folder: an export never overwrites
    quantization: Quantization = Quantization.none  # how the weights are stored
    eval: EvalConfig = field(default_factory=EvalConfig)  # the decoding settings export.json records

    def __post_init__(self) -> None:
        check((self.run_dir is None) != (self.checkpoint is None), "run_dir",
              "give exactly one of run_dir=... or checkpoint=...")
        check(self.out_dir is not None, "out_dir", "give the folder to create, e.g. out_dir=exports/en_de")


@dataclass
class ServeConfig:
    """``transformer-serve``: a REST API and the attention explorer for one model (transformer/app/server.py)."""

    run_dir: Optional[str] = None  # a training run directory (its final.pt, else best.pt, else last.pt)
    checkpoint: Optional[str] = None  # or a checkpoint file
    export_dir: Optional[str] = None  # or a CTranslate2 export; /attention then needs its source checkpoint
    host: str = "127.0.0.1"  # loopback: other machines reach the server only when told, e.g. host=0.0.0.0
    port: int = 8000  # 0: any free port
    eval: EvalConfig = field(default_factory=EvalConfig)  # a request may change beam_size and n_best
    batching: bool = True  # decode requests with equal settings together; false: each alone, as it arrives
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for others
    batch_tokens: int = 4096  # source tokens decoded together at most (a batch grows until this)
    max_sentences: int = 64  # per request
    max_request_tokens: int = 2048  # source tokens per request
    max_attention_tokens: int = 128  # /attention cuts source and target to this many tokens (and says so)
    device: str = "auto"  # auto (a GPU when there is one) | cpu | cuda | cuda:N

    def __post_init__(self) -> None:
        _check_one_model(self.run_dir, self.checkpoint, self.export_dir, [], fixed_shape=False)
        check(0 <= self.port <= 65535, "port", f"must be in 0..65535, got {self.port}")
        check(self.max_wait_ms >= 0, "max_wait_ms", f"must be >= 0, got {self.max_wait_ms}")
        for key in ("batch_tokens", "max_sentences", "max_request_tokens", "max_attention_tokens"):
            check(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")


@dataclass
class DiversifyConfig:
    """``transformer-diversify``: extend a corpus's training split with its own translations (transformer/app/diversify.py)
    into a new folder, which ``transformer-train data.train_dir=<out_dir>`` then trains on."""

    # Models (run directories or checkpoint files) trained in the corpus's direction: they translate the training
    # sources, decoded together as one ensemble when there are several. Their data config names the corpus.
    forward: list[str] = field(default_factory=list)
    # Models trained in the other direction, on the same corpus: they translate the training targets (none: only
    # the forward translations are added).
    backward: list[str] = field(default_factory=list)
    out_dir: Optional[str] = None  # a new folder (existing split files there are never overwritten)
    eval: EvalConfig = field(default_factory=EvalConfig)  # the search that translates
    device: str = "auto"  # auto (a GPU when there is one) | cpu | cuda | cuda:N

    def __post_init__(self) -> None:
        check(len(self.forward) > 0, "forward", "give the forward models, e.g. forward=[outputs/train/<run>]")
        check(self.out_dir is not None, "out_dir", "give the folder for the new training split, e.g. "
              "out_dir=data/diversified")
        check(self.eval.n_best == 1, "eval.n_best", f"one translation per sentence is kept: must be 1, got "
              f"{self.eval.n_best}")


@dataclass
class PrepareDataConfig:
    """``transformer-prepare-data``: make a corpus ready: fetch and verify it, check every split, and build
    the tokenizers and the encoded training split in ``data.cache_dir`` so training starts from the cache."""

    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class BenchmarkConfig:
    """``transformer-benchmark``: training throughput, machine peak, MFU, decoding speed and memory."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = "outputs/benchmark"  # where the report goes
    device: str = "auto"  # auto (a GPU when there is one) | cpu | cuda | cuda:N
    train_steps: int = 20  # timed optimizer steps
    untimed_steps: int = 3  # warm-up steps before timing
    decode_sentences: Optional[int] = None  # None: the whole test set
    matmul_size: int = 2048  # the square matmul that measures the machine's peak
    checkpoint: Optional[str] = None  # decode with a trained model (else a randomly initialised one)
    profile_steps: int = 0  # > 0: profile that many more training steps into profile.txt

    def __post_init__(self) -> None:
        check(self.profile_steps >= 0, "profile_steps", f"must be >= 0, got {self.profile_steps}")
        check(self.train_steps > 0, "train_steps", f"must be > 0, got {self.train_steps}")
        check(self.untimed_steps >= 0, "untimed_steps", f"must be >= 0, got {self.untimed_steps}")
        check(self.decode_sentences is None or self.decode_sentences >= 1, "decode_sentences",
              f"must be >= 1 or null (the whole test set), got {self.decode_sentences}")
        refuse_benchmarked_sampling(self.eval.sampling_topk)


def refuse_benchmarked_sampling(sampling_topk: int) -> None:
    """The benchmark's refusal of ``eval.sampling_topk`` other than 1; ``transformer-benchmark`` checks it before the
    eval group's own checks, which would otherwise first refuse sampling in the benchmark's beam of 5."""
    check(sampling_topk == 1, "eval.sampling_topk", "the benchmark times the searches (greedy and beam, cached, "
          "uncached and in fixed shapes), not sampling: leave it at 1")


def refuse_unknown_keys(config: Any, prefix: str = "") -> None:
    """Refuse a setting no schema has, naming the nearest one: Hydra's ``+group.key=value`` adds a key to a
    structured config, and the typed config would carry it, unread (``+group=option`` adding a whole config group
    is unaffected: its keys are the schema's)."""
    if not dataclasses.is_dataclass(config):
        return
    known = [f.name for f in dataclasses.fields(config)]
    for name in vars(config):
        if name not in known:
            nearest = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {prefix}{nearest[0]}?" if nearest else f"; the settings here: {', '.join(known)}"
            raise ConfigError(f"{prefix}{name}: no such setting{hint}")
    for name in known:
        refuse_unknown_keys(getattr(config, name), f"{prefix}{name}.")


# What other toolkits (OpenNMT-py, fairseq, Hugging Face) call a setting, by the names here: a key refused for its
# name is answered with the setting meant (training.batch_size: training.max_tokens, as training batches by tokens).
NAMES_ELSEWHERE = {
    "batch_size": ("max_tokens",),
    "learning_rate": ("lr",),
    "epochs": ("max_epochs",),
    "train_steps": ("max_steps",),
    "max_update": ("max_steps",),
    "warmup": ("warmup_steps",),
    "hidden_size": ("d_model",),
    "embed_dim": ("d_model",),
    "heads": ("n_heads",),
    "num_heads": ("n_heads",),
    "transformer_ff": ("d_ff",),
    "ffn_dim": ("d_ff",),
    "dim_feedforward": ("d_ff",),
    "layers": ("n_encoder_layers", "n_decoder_layers"),
    "num_layers": ("n_encoder_layers", "n_decoder_layers"),
    "fp16": ("precision",),
    "bf16": ("precision",),
    "amp": ("precision",),
    "beam": ("beam_size",),
}

# The value another toolkit's switch (``--fp16``, given without one) means here.
VALUES_ELSEWHERE = {"fp16": "bf16", "bf16": "bf16", "amp": "bf16"}


def settings_named(schema: type, tail: list[str]) -> list[str]:
    """The dotted keys of ``schema`` that end in ``tail`` (``["max_steps"]``: ``training.max_steps``) or in what
    ``tail``'s last name is called here (``NAMES_ELSEWHERE``): where a setting typed without its group, under another
    one, or by another toolkit's name, lives. In the order of ``schema``'s groups, so the command's own comes first
    (transformer-train's ``batch_size``: ``training.max_tokens``, then ``eval.batch_size``)."""
    ours = [[*tail[:-1], name] for name in NAMES_ELSEWHERE.get(tail[-1], ())]
    found = dict.fromkeys(key for wanted in (tail, *ours) for key in _keys_ending_in(schema, wanted))
    groups = [f.name for f in dataclasses.fields(schema)]
    return sorted(found, key=lambda key: groups.index(key.split(".")[0]))


def _keys_ending_in(schema: type, tail: list[str], prefix: str = "") -> list[str]:
    found = []
    for name, kind in typing.get_type_hints(schema).items():
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # Optional[SomeConfig], SomeConfig | None
            kind = next((option for option in typing.get_args(kind) if option is not type(None)), kind)
        if dataclasses.is_dataclass(kind):
            found += _keys_ending_in(kind, tail, f"{prefix}{name}.")
        elif f"{prefix}{name}".split(".")[-len(tail):] == tail:
            found.append(f"{prefix}{name}")
    return found


def refuse_unknown_overrides(schema: type, argv: list[str], groups: Collection[str]) -> None:
    """Before Hydra composes: refuse a ``key=value`` (or ``+key=value``) argument whose key names no setting of
    ``schema`` (or of its config ``groups``: ``experiment=...``), naming the nearest one. Hydra itself would say only
    that the key is not in the struct and suggest adding it with ``+key=value``, which ``refuse_unknown_keys`` refuses
    in turn, after composing. A value that cannot become its setting's type is refused here too, in one line."""
    from hydra.conf import HydraConf

    for arg in argv:
        key = arg.partition("=")[0].lstrip("+")  # +key=value adds a key: one the schema has, or it is refused later
        if "=" not in arg or arg.startswith(("-", "~")) or not all(part.isidentifier() for part in key.split(".")):
            continue  # flags, deletions, group paths (a/b) and packages (a@b)
        node, prefix, parts = schema, "", key.split(".")
        if key.startswith("hydra."):  # Hydra's own settings, by its schema
            node, prefix, parts = HydraConf, "hydra.", parts[1:]
        for depth, part in enumerate(parts):
            hints = typing.get_type_hints(node)
            known = [f.name for f in dataclasses.fields(node)]
            if part not in known:
                if depth == 0 and part in groups and not prefix:
                    break
                names = known + sorted(set(groups) - set(known)) if depth == 0 and not prefix else known
                nearest = [f"{prefix}{name}" for name in difflib.get_close_matches(part, names, n=1)]
                # and the setting under another group, or typed without one (max_steps: training.max_steps)
                elsewhere = [] if prefix.startswith("hydra.") else settings_named(schema, parts[depth:])
                elsewhere.sort(key=lambda found: not found.startswith(prefix))  # the group typed first
                if meant := list(dict.fromkeys(nearest + elsewhere)):
                    hint = f"did you mean {' or '.join(meant[:3])}?"
                else:
                    hint = f"the settings here: {', '.join(names)}"
                raise ConfigError(f"{prefix}{part}: no such setting; {hint}")
            kind = hints[part]
            if typing.get_origin(kind) is typing.Union:  # Optional[SomeConfig]
                kind = next((option for option in typing.get_args(kind) if option is not type(None)), kind)
            if not dataclasses.is_dataclass(kind):
                if depth == len(parts) - 1:
                    _refuse_a_mistyped_value(node, part, arg, f"{prefix}{part}")
                break  # a mapping, whose keys are free
            node, prefix = kind, f"{prefix}{part}."


def _refuse_a_mistyped_value(node: type, name: str, arg: str, key: str) -> None:
    """Raise ``ConfigError`` in one line when the value of the override ``arg`` cannot become the type of ``node``'s
    field ``name`` (``model.d_model=abc``, ``model.norm=middle``): Hydra says so in a paragraph, after composing.
    Sweeps (``a,b``), interpolations and what Hydra cannot parse are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    try:
        (override,) = OverridesParser.create().parse_overrides([arg])
    except HydraException:
        return
    if override.is_sweep_override():
        return
    fields = OmegaConf.structured(node)
    try:
        fields[name] = override.value()
    except ValidationError as error:
        value = arg.partition("=")[2]  # as typed: Hydra's rendering of true is True
        hint = ""
        if "is not a ListConfig" in str(error):  # a list of one, if that one would do
            try:
                fields[name] = [override.value()]
                hint = f"; give a list: {key}=[{value}]"
            except ValidationError:
                hint = f"; give a list: {key}=[...]"
        raise ConfigError(f"{key}={value}: {str(error).splitlines()[0].rstrip('.')}{hint}") from None


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (the YAML defaults lists start with these names)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="serve_schema", node=ServeConfig)
    cs.store(name="prepare_data_schema", node=PrepareDataConfig)
    cs.store(name="diversify_schema", node=DiversifyConfig)
    cs.store(name="export_schema", node=ExportConfig)
    cs.store(name="benchmark_schema", node=BenchmarkConfig)
