"""A trained model as a CTranslate2 model: the specs built from this app's weights, written whole or not at all.

CTranslate2 (``pip install ctranslate2``) runs Transformers with fused CPU and GPU kernels and int8 / float16
weights. Its converters for other toolkits assume ``d_head = d_model / n_heads``; this app's heads may be any size,
so the encoder and decoder specs are built here directly, with ``head_dim`` set (CTranslate2 scales queries by
1/√head_dim, so a forgotten ``head_dim`` would give a silently wrong model).

How this app's options map (everything else is refused by key before anything is written):

- pre- or post-norm, relu or gelu (exact, erf), the embedding scale √d_model, LayerNorm eps 1e-5;
- positions: sinusoidal as this app's own table (CTranslate2's built-in sinusoid is laid out differently), learned
  as their table, none as a zero table, rotary in self-attention (halves, not interleaved), relative as the keys
  table of Shaw et al. with zero values (CTranslate2 then has no absolute positions, as this app);
- shared source/target embeddings and a tied output projection are copied into both places;
- the output projection gets a bias of -10⁴ on PAD and BOS, which this app's searches never generate;
- sources carry no BOS/EOS (as this app encodes them); the decoder starts from BOS.

Additive attention scores, and multiplicative ones (a d_head x d_head matrix per head), have no CTranslate2
counterpart; neither have ensembles.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from omegaconf.errors import OmegaConfBaseException

from transformer import files
from transformer.config import (
    Activation,
    AttentionScore,
    ConfigError,
    EvalConfig,
    NormPosition,
    PositionKind,
    TokenizerKind,
    from_plain_dict,
    to_plain_dict,
)
from transformer.data.tokenizer import Tokenizer
from transformer.inference.loading import TrainedModel
from transformer.model.embeddings import sinusoidal_positions
from transformer.model.transformer import Transformer

QUANTIZATIONS = ("none", "int8", "int8_float32", "float16", "bfloat16")
BANNED_BIAS = -1.0e4  # on the output rows of PAD and BOS: far below any logit, and finite in float16
EXPORT_FILE = "export.json"


EXPORT_FORMAT = 3  # 3: the files' SHA-256; 2: the whole data config (1: its languages only)
TOKENIZER_KINDS = tuple(kind.value for kind in TokenizerKind)
RECORDED = {"model": ("max_positions",), "data": ("src", "tgt"), "source_tokenizer": ("kind", "path"),
            "target_tokenizer": ("kind", "path"), "source_checkpoint": ("path", "sha256")}  # what a reader needs


def read_export_record(folder: str | Path) -> dict[str, Any]:
    """An export's ``export.json``, or a :class:`ConfigError` naming the file and what is wrong with it."""
    path = Path(folder) / EXPORT_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"export_dir: {path} is not valid JSON ({error}); export the model again") from None
    if not isinstance(record, dict):
        raise ConfigError(f"export_dir: {path} is not a JSON object; export the model again")
    written = record.get("format", 1)
    if not isinstance(written, int) or not 1 <= written <= EXPORT_FORMAT:
        raise ConfigError(f"export_dir: {path}: format {written!r} is not one this version reads (1 to "
                          f"{EXPORT_FORMAT}); export the model again with this version, or update transformer")
    for key, fields in {**RECORDED, "decoding": ()}.items():
        value = record.get(key, {} if key == "decoding" else None)
        if not isinstance(value, dict) or any(name not in value for name in fields):
            what = f"an object with {', '.join(fields)}" if fields else "an object"
            raise ConfigError(f"export_dir: {path}: {key} must be {what}; export the model again")
    for key in ("source_tokenizer", "target_tokenizer"):
        if record[key]["kind"] not in TOKENIZER_KINDS:
            raise ConfigError(f"export_dir: {path}: {key}.kind {record[key]['kind']!r} is none of "
                              f"{', '.join(TOKENIZER_KINDS)}; export the model again")
    try:
        from_plain_dict(EvalConfig, record.get("decoding", {}))  # the types and ranges of a composed eval config
    except (ConfigError, OmegaConfBaseException) as error:
        key = getattr(error, "full_key", None)
        reason = str(getattr(error, "msg", error)).strip().splitlines()[0]
        raise ConfigError(f"export_dir: {path}: decoding: {f'{key}: ' if key else ''}{reason}; export the model "
                          "again") from None
    return record


def check_export_files(folder: str | Path, record: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` naming a file of the export that is missing, or whose bytes differ from the
    SHA-256 that ``export.json`` recorded (exports of format 3 on; earlier ones record none)."""
    recorded = record.get("files", {})
    if not isinstance(recorded, dict):
        raise ConfigError(f"export_dir: {Path(folder) / EXPORT_FILE}: files must be an object; export the model again")
    for name, digest in recorded.items():
        path = Path(folder) / name
        if not path.is_file():
            raise ConfigError(f"export_dir: {path} is missing; export the model again")
        if files.sha256(path) != digest:
            raise ConfigError(f"export_dir: {path} is damaged: its bytes are not those exported (SHA-256 differs "
                              f"from {EXPORT_FILE}'s); export the model again")


def check_exportable(trained: TrainedModel) -> None:
    """Refuse, naming the key, what CTranslate2 cannot run exactly."""
    if trained.ensemble_paths:
        raise ConfigError("ensemble: an ensemble cannot be exported; export its models one at a time")
    score = trained.config.model.attention.score
    if score is not AttentionScore.scaled_dot:
        raise ConfigError(f"model.attention.score: {score.value} scores have no CTranslate2 counterpart; only "
                          "scaled_dot models can be exported")


def _numpy(tensor: torch.Tensor) -> Any:
    """A float32 copy: the spec's optimize quantizes its arrays in place, which must not reach the model."""
    return tensor.detach().to("cpu", torch.float32, copy=True).contiguous().numpy()


def _linear(spec: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _numpy(weight)
    if bias is not None:
        spec.bias = _numpy(bias)


def _layer_norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _numpy(norm.weight), _numpy(norm.bias)


def _attention(spec: Any, attention: Any, norm: torch.nn.LayerNorm, self_attention: bool) -> None:
    """One attention block: its LayerNorm, the projections (fused QKV for self-attention, Q and fused KV for
    cross-attention), the output projection and, with relative positions, the keys table."""
    _layer_norm(spec.layer_norm, norm)
    weight, bias = attention.in_proj_weight, attention.in_proj_bias  # rows [W_Q; W_K; W_V]
    inner = weight.size(0) // 3
    if self_attention:
        _linear(spec.linear[0], weight, bias)
    else:
        _linear(spec.linear[0], weight[:inner], None if bias is None else bias[:inner])
        _linear(spec.linear[1], weight[inner:], None if bias is None else bias[inner:])
    _linear(spec.linear[-1], attention.out_proj.weight, attention.out_proj.bias)
    if getattr(attention, "relative", None) is not None:
        table = attention.relative.table  # (2 * max_distance + 1, d_head)
        spec.relative_position_keys = _numpy(table)
        spec.relative_position_values = _numpy(torch.zeros_like(table))


def _feed_forward(spec: Any, block: Any, norm: torch.nn.LayerNorm) -> None:
    _layer_norm(spec.layer_norm, norm)
    _linear(spec.linear_0, block.linear1.weight, block.linear1.bias)
    _linear(spec.linear_1, block.linear2.weight, block.linear2.bias)


def _position_table(model: Transformer, embeddings: Any) -> Any:
    """The absolute positions CTranslate2 adds: this app's sinusoid or learned table, zeros for none or rope."""
    cfg = model.cfg
    if cfg.positions is PositionKind.learned:
        return _numpy(embeddings.learned.weight)
    if cfg.positions is PositionKind.sinusoidal:
        return _numpy(sinusoidal_positions(cfg.max_positions, cfg.d_model))
    return _numpy(torch.zeros(cfg.max_positions, cfg.d_model))


def build_spec(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer) -> Any:
    """The CTranslate2 ``TransformerSpec`` of ``model``, weights and vocabularies filled in."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    rope, relative = cfg.positions is PositionKind.rope, cfg.positions is PositionKind.relative
    common = dict(num_heads=cfg.n_heads, pre_norm=cfg.norm is NormPosition.pre, head_dim=cfg.head_dim,
                  activation=common_spec.Activation.RELU if cfg.activation is Activation.relu
                  else common_spec.Activation.GELU, relative_position=relative,
                  rotary_dim=0 if rope else None, rotary_interleave=False, rotary_base=cfg.rope_base)
    encoder = transformer_spec.TransformerEncoderSpec(cfg.n_encoder_layers, **common)
    decoder = transformer_spec.TransformerDecoderSpec(cfg.n_decoder_layers, **common)
    if rope:  # the encoder keeps an absolute table with rotary: zeros, as this app adds none
        encoder.position_encodings.encodings = _position_table(model, model.encoder.embed)

    encoder.embeddings[0].weight = _numpy(model.encoder.embed.token.weight)
    if not relative and not rope:
        encoder.position_encodings.encodings = _position_table(model, model.encoder.embed)
        decoder.position_encodings.encodings = _position_table(model, model.decoder.embed)
    for spec, layer in zip(encoder.layer, model.encoder.layers):
        _attention(spec.self_attention, layer.self_attn, layer.attn_block.norm, self_attention=True)
        _feed_forward(spec.ffn, layer.feed_forward, layer.ff_block.norm)
    if model.encoder.norm is not None:
        _layer_norm(encoder.layer_norm, model.encoder.norm)

    decoder.embeddings.weight = _numpy(model.decoder.embed.token.weight)
    for spec, layer in zip(decoder.layer, model.decoder.layers):
        _attention(spec.self_attention, layer.self_attn, layer.self_block.norm, self_attention=True)
        _attention(spec.attention, layer.cross_attn, layer.cross_block.norm, self_attention=False)
        _feed_forward(spec.ffn, layer.feed_forward, layer.ff_block.norm)
    if model.decoder.norm is not None:
        _layer_norm(decoder.layer_norm, model.decoder.norm)
    weight, bias = model.output_layer()
    bias = torch.zeros(weight.size(0)) if bias is None else bias.detach().float().clone()
    bias[[tgt_tok.pad_id, tgt_tok.bos_id]] = BANNED_BIAS
    _linear(decoder.projection, weight, bias)

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = model.encoder.layers[0].attn_block.norm.eps
    for name, token in (("unk_token", tgt_tok.unk_id), ("bos_token", tgt_tok.bos_id),
                        ("eos_token", tgt_tok.eos_id), ("decoder_start_token", tgt_tok.bos_id)):
        setattr(spec.config, name, tgt_tok.id_to_piece(token))
    spec.register_source_vocabulary(src_tok.pieces())
    spec.register_target_vocabulary(tgt_tok.pieces())
    return spec


def export(trained: TrainedModel, out_dir: str | Path, quantization: str, decoding: dict[str, Any]) -> Path:
    """Write ``trained`` as a CTranslate2 model directory with its tokenizers and ``export.json``.

    ``out_dir`` must not exist: the directory is written under a temporary name beside it and renamed into place,
    so it appears whole or not at all.
    """
    check_exportable(trained)
    if importlib.util.find_spec("ctranslate2") is None:
        raise ConfigError("exporting needs CTranslate2: pip install ctranslate2 (or this package's [export] extra)")
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization: {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    out = Path(out_dir)
    if os.path.lexists(out):  # a symbolic link too, also one to nothing
        raise ConfigError(f"out_dir: {out} exists{' (a symbolic link)' if out.is_symlink() else ''}; an export never "
                          "overwrites: choose a new folder")
    if out.parent.exists() and not out.parent.is_dir():
        raise ConfigError(f"out_dir: {out.parent} is a file, not a folder")
    try:  # before the model is converted: a folder that cannot be written is refused at once, by its key
        out.parent.mkdir(parents=True, exist_ok=True)  # exports/en_de: the folder of exports is made as needed
        tmp = files.temporary_folder(out.parent, f".{out.name}.")
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise ConfigError(f"out_dir: cannot write in {out.parent} ({(error.strerror or str(error)).lower()}); "
                          "choose another folder") from None
    try:
        spec = build_spec(trained.model, trained.src_tok, trained.tgt_tok)
        spec.validate()
        spec.optimize(quantization=None if quantization == "none" else quantization)
        spec.save(str(tmp))
        tokenizers = {side: _save_tokenizer(tok, tmp, side) for side, tok in
                      (("source", trained.src_tok), ("target", trained.tgt_tok))}
        files.write_json(tmp / EXPORT_FILE, {
            "format": EXPORT_FORMAT,
            "files": {path.name: files.sha256(path) for path in sorted(tmp.iterdir())},
            "source_checkpoint": {"path": str(trained.path.resolve()), "sha256": files.sha256(trained.path)},
            "model": to_plain_dict(trained.config.model),
            "data": to_plain_dict(trained.config.data),  # the languages, and the corpus to evaluate on
            "source_tokenizer": tokenizers["source"], "target_tokenizer": tokenizers["target"],
            "quantization": quantization,
            "decoding": decoding,
        })
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files.fsync_directory(out.parent)
    return out


def _save_tokenizer(tok: Tokenizer, folder: Path, side: str) -> dict[str, Any]:
    """The tokenizer's state beside the model (a SentencePiece model file, or the word list); what export.json
    records of it (paths relative to the export)."""
    from transformer.data.tokenizer import SentencePieceTokenizer

    if isinstance(tok, SentencePieceTokenizer):
        path = folder / f"{side}.spm.model"
        path.write_bytes(tok.model_proto)
        return {"kind": "sentencepiece", "path": path.name}
    path = folder / f"{side}.vocab.txt"
    path.write_text("\n".join(tok.pieces()) + "\n", encoding="utf-8")
    return {"kind": "word", "path": path.name, "lowercase": bool(getattr(tok, "lowercase", False))}
