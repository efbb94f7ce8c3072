"""Every config composes and validates; bad keys and values fail at start-up naming the key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import CONFIG_DIR
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from transformer.app.schemas import EvaluateConfig
from transformer.config import (
    AttentionScore,
    ConfigError,
    EvalConfig,
    ModelConfig,
    NormPosition,
    PositionKind,
    TrainConfig,
    flatten,
    from_plain_dict,
    to_plain_dict,
)

RUN = ["output_dir=/tmp/unused"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_every_experiment_composes(compose_config, experiment, monkeypatch):
    monkeypatch.setenv("GLOVE_PATH", "/some/glove.txt")
    cfg = OmegaConf.to_object(compose_config("train", [f"experiment={experiment}", *RUN]))
    assert isinstance(cfg, TrainConfig)
    bench = OmegaConf.to_object(compose_config("benchmark", [f"experiment={experiment}", "output_dir=x"]))
    assert (bench.model, bench.training) == (cfg.model, cfg.training)  # the recipe's model and batches, benchmarked


@pytest.mark.parametrize("debug", _options("debug"))
def test_every_debug_preset_composes(compose_config, debug):
    cfg = OmegaConf.to_object(compose_config("train", [f"debug={debug}", *RUN]))
    assert cfg.model.d_model == 32  # both presets use the tiny model


def _set_values(path: Path) -> dict[str, object]:
    """The dotted keys a config file sets and their values: its ``defaults`` list, the ``hydra`` settings and
    interpolations (resolved only when composed) left out."""
    tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    return {key: value for key, value in flatten(tree).items()
            if key != "defaults" and not key.startswith("hydra.") and not (isinstance(value, str) and "${" in value)}


@pytest.mark.parametrize("group", ["model", "training", "eval", "data"])
def test_every_group_option_composes_with_the_values_it_sets(compose_config, group):
    extra = {"glove300": ["model.glove.path=x.txt"], "glove50": ["model.glove.path=x.txt"],
             "custom": ["data.dir=d", "data.src=xx", "data.tgt=yy"], "toy_copy": ["data.dir=d"]}
    for option in _options(group):
        if group == "eval":  # decoding settings: sampling is refused in training, so composed for translating
            cfg = OmegaConf.to_object(compose_config("translate", [f"eval={option}", "checkpoint=x.pt"]))
        else:
            cfg = OmegaConf.to_object(compose_config("train", [f"{group}={option}", *extra.get(option, []), *RUN]))
            assert isinstance(cfg, TrainConfig)
        composed = flatten(to_plain_dict(cfg))
        own = _set_values(CONFIG_DIR / group / f"{option}.yaml")
        expected = {f"{group}.{key}": value for key, value in own.items()}
        expected |= dict(override.split("=") for override in extra.get(option, []))
        assert {key: composed[key] for key in expected} == expected, option


ROOTS = {  # the overrides each root config is composed with, and values they must give
    "prepare_data": ([], {"data.corpus": "multi30k", "data.src": "en", "data.tgt": "de"}),
    "benchmark": (["output_dir=/tmp/x"], {"output_dir": "/tmp/x", "eval.beam_size": 5, "eval.length_penalty": 1.5}),
    "evaluate": (["run_dir=outputs/train/x", *RUN], {"run_dir": "outputs/train/x", "output_dir": "/tmp/unused"}),
    "translate": (["checkpoint=x.pt", "eval=greedy"], {"checkpoint": "x.pt", "eval.beam_size": 1}),
    "export": (["run_dir=r", "out_dir=e", "quantization=int8"], {"out_dir": "e", "quantization": "int8"}),
    "serve": (["run_dir=r", "port=0"], {"run_dir": "r", "port": 0, "eval.beam_size": 8}),
    "diversify": (["forward=[r]", "out_dir=d"], {"forward": ["r"], "out_dir": "d", "eval.beam_size": 5}),
}


@pytest.mark.parametrize("name", ROOTS)
def test_root_configs_compose_with_their_own_values_and_the_overrides(compose_config, name):
    overrides, expected = ROOTS[name]
    composed = flatten(to_plain_dict(OmegaConf.to_object(compose_config(name, overrides))))
    own = _set_values(CONFIG_DIR / f"{name}.yaml")
    assert {key: composed[key] for key in own} == own
    assert {key: composed[key] for key in expected} == expected


def test_evaluate_searches_with_the_eval_config_defaults(compose_config):
    cfg = OmegaConf.to_object(compose_config("evaluate", ["run_dir=outputs/train/x", *RUN]))
    assert isinstance(cfg, EvaluateConfig) and cfg.eval == EvalConfig()  # eval=beam is EvalConfig's defaults


def test_defaults_are_the_dataclass_defaults(compose_config):
    cfg = OmegaConf.to_object(compose_config("train", RUN))
    assert cfg.model == ModelConfig()  # model=half names ModelConfig's defaults
    assert cfg.training == TrainConfig().training
    assert replace(cfg.data, source_dir=None) == TrainConfig().data  # source_dir comes from $MULTI30K_DIR


def test_the_measured_recipes_compose_as_documented(compose_config):
    # multi30k_cpu pins version 0.6's default, as its seeds were measured: since version 0.7 the defaults add the
    # 58-minute limit, and every pinned recipe trains all its epochs
    cpu = OmegaConf.to_object(compose_config("train", ["experiment=multi30k_cpu", *RUN]))
    model, training = cpu.model, cpu.training
    assert (model.d_model, model.n_heads, model.d_ff, model.n_encoder_layers, model.n_decoder_layers) == (128, 4, 512, 4, 4)
    assert (model.dropout, model.attention_dropout) == (0.2, 0.1)
    assert (training.lr, training.max_epochs, training.max_tokens, training.accumulate) == (2e-3, 46, 2048, 1)
    assert training.weight_decay == 0.05 and training.patience is None and training.max_minutes is None
    default = OmegaConf.to_object(compose_config("train", RUN))
    assert default.training.max_minutes == 58.0
    assert cpu == replace(default, training=replace(default.training, max_minutes=None))
    # multi30k_v04 is the default of versions 0.4 - 0.5: the same without weight decay
    v04 = OmegaConf.to_object(compose_config("train", ["experiment=multi30k_v04", *RUN]))
    assert v04.training == replace(cpu.training, weight_decay=0.0) and v04.model == cpu.model
    # multi30k_v03 is version 0.3's default: version 0.4's in 4096-position batches, stopped by patience 8
    v03 = OmegaConf.to_object(compose_config("train", ["experiment=multi30k_v03", *RUN]))
    assert v03.training == replace(v04.training, max_tokens=4096, patience=8) and v03.model == cpu.model
    # multi30k_half is version 0.2's default: version 0.3's for 38 epochs
    half = OmegaConf.to_object(compose_config("train", ["experiment=multi30k_half", *RUN]))
    assert half.training == replace(v03.training, max_epochs=38) and half.model == cpu.model
    # multi30k_small is the default before version 0.2, as its RESULTS rows were trained
    small = OmegaConf.to_object(compose_config("train", ["experiment=multi30k_small", *RUN]))
    model, training = small.model, small.training
    assert (model.d_model, model.n_heads, model.d_ff, model.n_encoder_layers, model.n_decoder_layers) == (256, 4, 1024, 3, 3)
    assert (model.dropout, model.attention_dropout) == (0.2, 0.0)
    assert (training.lr, training.max_epochs, training.max_tokens, training.accumulate) == (1e-3, 19, 2048, 2)
    assert training.weight_decay == 0.0 and training.patience == 8 and training.max_minutes is None


@pytest.mark.parametrize("option", ["model/half.yaml", "training/default.yaml", "eval/beam.yaml"])
def test_the_default_options_only_name_the_dataclass_defaults(option):
    # the values live once, in transformer/config.py; a value here would be a second copy that can drift
    assert OmegaConf.load(CONFIG_DIR / option) == OmegaConf.create()


def test_glove300_is_300_wide_with_8_heads_of_64(compose_config):
    cfg = OmegaConf.to_object(compose_config("train", ["model=glove300", "model.glove.path=v.txt", *RUN]))
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.head_dim) == (300, 8, 64)


def test_misspelt_key_names_the_key(compose_config):
    with pytest.raises(ConfigCompositionException, match="model.n_head"):
        compose_config("train", ["model.n_head=3", *RUN])


def test_wrong_type_names_the_key(compose_config):
    with pytest.raises(ConfigCompositionException, match="model.d_model=abc"):
        compose_config("train", ["model.d_model=abc", *RUN])


def test_bad_choice_lists_valid_values(compose_config):
    with pytest.raises(ConfigCompositionException) as error:
        compose_config("train", ["model.norm=middle", *RUN])
    assert "pre" in str(error.value.__cause__) and "post" in str(error.value.__cause__)


@pytest.mark.parametrize("override, key", [
    ("training.lr=-1", "training.lr"),
    ("model.dropout=1.5", "model.dropout"),
    ("eval.n_best=9", "eval.n_best"),
    ("data.tgt=en", "data.src"),
    ("model.max_relative_distance=0", "model.max_relative_distance"),
    ("training.validate_every_steps=0", "training.validate_every_steps"),
    ("training.valid_max_sentences=0", "training.valid_max_sentences"),
    ("training.threads=0", "training.threads"),
    ("training.n_samples=-1", "training.n_samples"),
    ("training.bpe_dropout=1.0", "training.bpe_dropout"),
    ("training.r_drop=-1", "training.r_drop"),
    ("training.min_lr=-1e-5", "training.min_lr"),
    ("training.min_lr=0.1", "training.min_lr"),  # above training.lr: the cosine "decay" would climb
    ("training.eps=0", "training.eps"),
    ("training.weight_decay=-0.01", "training.weight_decay"),
    ("eval.max_len_b=-1", "eval.max_len_b"),
    ("model.max_positions=100", "model.max_positions"),  # data.max_len is 128
    ("training.lr=inf", "training.lr"),  # passes "> 0", then trains into NaN
    ("training.max_minutes=inf", "training.max_minutes"),  # null is no limit
])
def test_bad_value_names_the_key(compose_config, override, key):
    with pytest.raises(ConfigError, match=f"^{key}:"):
        OmegaConf.to_object(compose_config("train", [override, *RUN]))


def test_max_positions_must_hold_the_longest_padded_batch(compose_config):
    fits = OmegaConf.to_object(compose_config("train", ["data.max_len=127", "model.max_positions=128", *RUN]))
    assert fits.model.max_positions == 128
    with pytest.raises(ConfigError, match=r"batches can be 136 positions long \(data.max_len=128, \+ 1 .*multiple of 8"):
        OmegaConf.to_object(compose_config("train", ["data.max_len=128", "model.max_positions=128", *RUN]))


def test_r_drop_needs_dropout(compose_config):
    with pytest.raises(ConfigError, match=r"^training.r_drop: needs dropout"):
        OmegaConf.to_object(compose_config("train", ["training.r_drop=5", "model.dropout=0", "model.attention_dropout=0", *RUN]))
    with_attention_dropout = ["training.r_drop=5", "model.dropout=0", "model.attention_dropout=0.1", *RUN]
    assert OmegaConf.to_object(compose_config("train", with_attention_dropout)).training.r_drop == 5
    with_hidden_dropout = ["training.r_drop=5", "model.dropout=0", "model.attention_dropout=0",
                           "model.activation_dropout=0.1", *RUN]
    assert OmegaConf.to_object(compose_config("train", with_hidden_dropout)).training.r_drop == 5


@pytest.mark.parametrize("value", [1.0, -0.1])
def test_activation_dropout_out_of_range_names_the_key(compose_config, value):
    with pytest.raises(ConfigError, match=r"^model.activation_dropout: must be in \[0, 1\) or null"):
        OmegaConf.to_object(compose_config("train", [f"model.activation_dropout={value}", *RUN]))


def test_indivisible_heads_require_d_head():
    with pytest.raises(ConfigError, match=r"model.d_head: .*set model.d_head \(e.g. model.d_head=37: heads need not"):
        ModelConfig(d_model=300, n_heads=8)  # the hint keeps about d_model's width: 8 x 37
    assert ModelConfig(d_model=300, n_heads=8, d_head=64).head_dim == 64


def test_custom_data_needs_its_folder(compose_config):
    with pytest.raises(ConfigError, match="^data.dir: is required"):
        OmegaConf.to_object(compose_config("train", ["data=custom", "data.src=a", "data.tgt=b", *RUN]))


def test_evaluate_needs_exactly_one_model_source(compose_config):
    with pytest.raises(ConfigError, match="run_dir"):
        OmegaConf.to_object(compose_config("evaluate", RUN))


@pytest.mark.parametrize("override, key", [("attention.max_tokens=0", "attention.max_tokens"),
                                           ("attention.indices=[3,-1]", "attention.indices"),
                                           ("attention.texts=['a dog .',' ']", r"attention.texts\[1\]"),
                                           ("attention.format=html", "attention.format")])  # html of nothing
def test_bad_attention_dump_value_names_the_key(compose_config, override, key):
    with pytest.raises(ConfigError, match=f"^{key}:"):
        OmegaConf.to_object(compose_config("evaluate", ["run_dir=outputs/train/x", override, *RUN]))


def test_plain_dict_round_trip():
    cfg = TrainConfig(model=ModelConfig(d_model=300, n_heads=8, d_head=64, norm=NormPosition.post))
    plain = to_plain_dict(cfg)
    assert plain["model"]["norm"] == "post"
    assert from_plain_dict(TrainConfig, plain) == cfg


def test_attention_options_compose_and_old_model_configs_get_todays_behaviour(compose_config):
    cfg = OmegaConf.to_object(compose_config("train", ["model.attention.score=additive", "model.positions=relative",
                                                        "model.max_relative_distance=8", *RUN]))
    assert (cfg.model.attention.score, cfg.model.positions) == (AttentionScore.additive, PositionKind.relative)
    with pytest.raises(ConfigCompositionException) as error:
        compose_config("train", ["model.attention.score=cosine", *RUN])
    assert "multiplicative" in str(error.value.__cause__)
    # a checkpoint written before these options existed records neither key: it rebuilds today's model
    old = to_plain_dict(ModelConfig())
    del old["attention"], old["max_relative_distance"], old["rope_base"]
    assert from_plain_dict(ModelConfig, old) == ModelConfig()


def test_glove_model_without_a_vector_file_says_how_to_give_one(compose_config, monkeypatch):
    monkeypatch.delenv("GLOVE_PATH", raising=False)
    with pytest.raises(InterpolationResolutionError, match="GLOVE_PATH"):
        OmegaConf.to_object(compose_config("train", ["model=glove300", *RUN]))
