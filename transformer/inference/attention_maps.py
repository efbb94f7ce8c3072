"""Attention maps of one sentence pair: raw arrays (.npz), PNG heat-maps and TensorBoard images.

The maps are computed teacher-forced: the decoder reads BOS + the given target (usually the model's
own translation, optionally the reference), so the query at position ``t`` is the one that predicts
target piece ``t`` (and the last one predicts ``</s>``). Axis labels follow that: decoder queries are
labelled with the piece they predict, decoder self-attention keys with the piece they read.

Figures are drawn with matplotlib's object API (``Figure`` + the Agg canvas), never ``pyplot``, so
nothing touches global state or needs a display. Figure size grows with sentence length and the
labels are small and rotated, so 40-piece sentences stay readable.

:func:`dump_attention` is what ``transformer-evaluate`` calls: the maps of chosen test sentences and given
texts, written as files and TensorBoard images.

Shape names: layers, heads, src_len (S), tgt_len (T = target pieces + 1).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from transformer import files
from transformer.config import AttentionDumpConfig, ConfigError, EvalConfig
from transformer.data.tokenizer import BOS_PIECE, EOS_PIECE, Tokenizer
from transformer.inference.explorer import attention_json, standalone_page
from transformer.inference.translation import translate_hypotheses

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from transformer.inference.loading import TrainedModel

log = logging.getLogger(__name__)

_CELL_INCHES = 0.17  # per token on each axis
_MIN_PANEL_INCHES = 2.4
_DPI = 110


@dataclass
class AttentionMaps:
    """Attention weights of every layer and head for one sentence pair (numpy float32)."""

    src_pieces: list[str]  # S source pieces: encoder queries/keys, cross-attention keys
    tgt_pieces: list[str]  # T pieces predicted at each decoder position: target pieces + "</s>"
    encoder: np.ndarray  # (layers, heads, S, S)
    decoder_self: np.ndarray  # (layers, heads, T, T)
    cross: np.ndarray  # (layers, heads, T, S)
    tgt_input_pieces: list[str]  # T pieces the decoder reads: "<s>" + target pieces (self-attention keys)

    def alignment(self) -> np.ndarray:
        """(T, S) last-layer cross-attention averaged over heads: a soft source-target alignment."""
        return self.cross[-1].mean(axis=0)


class ImageWriter(Protocol):
    """The part of ``torch.utils.tensorboard.SummaryWriter`` used here."""

    def add_image(self, tag: str, img_tensor: np.ndarray, global_step: int, dataformats: str) -> None: ...


# --------------------------------------------------------------------------------------------------
# Computing
# --------------------------------------------------------------------------------------------------


def compute_attention_maps(model: nn.Module, src_ids: Sequence[int], tgt_ids: Sequence[int], *,
                           src_pieces: Sequence[str], tgt_pieces: Sequence[str], bos_id: int, eos_id: int,
                           pad_id: int) -> AttentionMaps:
    """Run one teacher-forced pass with ``need_weights=True`` and collect every attention map.

    Args:
        model: a ``Transformer`` (the unwrapped module); left in the train/eval mode it had.
        src_ids: the source ids (no BOS/EOS); ``pad_id`` entries are dropped.
        tgt_ids: the target ids (no BOS); a trailing ``eos_id`` and ``pad_id`` entries are dropped.
        src_pieces, tgt_pieces: one label per id of ``src_ids`` / ``tgt_ids`` (dropped with their ids).

    Returns:
        :class:`AttentionMaps` with S the source ids kept and T the target ids kept + 1 (BOS).
    """
    src_keep = [i for i, t in enumerate(src_ids) if t != pad_id]
    tgt_keep = [i for i, t in enumerate(tgt_ids) if t != pad_id]
    if tgt_keep and tgt_ids[tgt_keep[-1]] == eos_id:
        tgt_keep = tgt_keep[:-1]
    if len(src_pieces) != len(src_ids) or len(tgt_pieces) != len(tgt_ids):
        raise ValueError(f"compute_attention_maps: {len(src_ids)} source ids but {len(src_pieces)} pieces, "
                         f"{len(tgt_ids)} target ids but {len(tgt_pieces)} pieces")
    if not src_keep:
        raise ValueError("compute_attention_maps: the source has no tokens")
    device = next(model.parameters()).device
    src = torch.tensor([[src_ids[i] for i in src_keep]], device=device)  # (1, S)
    tgt_in = torch.tensor([[bos_id] + [tgt_ids[i] for i in tgt_keep]], device=device)  # (1, T)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            enc = model.encode(src, need_weights=True)
            dec = model.decode(tgt_in, enc, need_weights=True)
    finally:
        model.train(was_training)

    def stack(weights: list[torch.Tensor]) -> np.ndarray:
        return torch.stack([w[0] for w in weights]).float().cpu().numpy()  # (layers, heads, q_len, k_len)

    pieces = [tgt_pieces[i] for i in tgt_keep]
    return AttentionMaps(
        src_pieces=[src_pieces[i] for i in src_keep],
        tgt_pieces=pieces + [EOS_PIECE],
        encoder=stack(enc.attentions),
        decoder_self=stack(dec.self_attentions),
        cross=stack(dec.cross_attentions),
        tgt_input_pieces=[BOS_PIECE] + pieces,
    )


# --------------------------------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------------------------------


def _font_size(n_labels: int) -> float:
    return 7.0 if n_labels <= 30 else 6.0


def _new_figure(size: tuple[float, float]) -> Figure:
    """An empty figure of ``size`` inches on its own Agg canvas. matplotlib is imported here, on the first figure,
    so that the commands which draw none (translate, serve, evaluate without maps) start without it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _draw_heatmap(ax, weights: np.ndarray, query_labels: Sequence[str], key_labels: Sequence[str],
                  vmax: float, title: str):
    """One (queries, keys) heat-map with every label; returns the image for the colorbar."""
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest", aspect="auto")
    ax.set_xticks(range(len(key_labels)))
    ax.set_xticklabels(key_labels, rotation=90, fontsize=_font_size(len(key_labels)))
    ax.set_yticks(range(len(query_labels)))
    ax.set_yticklabels(query_labels, fontsize=_font_size(len(query_labels)))
    ax.tick_params(length=1.5, pad=1.5)
    ax.set_title(title, fontsize=8)
    return image


def head_grid_figure(weights: np.ndarray, query_labels: Sequence[str], key_labels: Sequence[str],
                     title: str) -> Figure:
    """A grid with one heat-map per head, a shared colour scale and a colorbar.

    Args:
        weights: (heads, queries, keys) attention weights.
    """
    n_heads, n_queries, n_keys = weights.shape
    ncols = math.ceil(math.sqrt(n_heads))  # a near-square grid: 4 heads 2x2, 8 heads 3x3
    nrows = math.ceil(n_heads / ncols)
    panel_w = max(_MIN_PANEL_INCHES, n_keys * _CELL_INCHES + 0.9)
    panel_h = max(_MIN_PANEL_INCHES, n_queries * _CELL_INCHES + 0.9)
    fig = _new_figure((ncols * panel_w + 0.9, nrows * panel_h + 0.5))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    vmax = float(weights.max()) if weights.size and weights.max() > 0 else 1.0
    image = None
    for head, ax in enumerate(axes.flat):
        if head >= n_heads:
            ax.set_axis_off()
            continue
        image = _draw_heatmap(ax, weights[head], query_labels, key_labels, vmax, f"head {head}")
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, aspect=30)
    fig.suptitle(title, fontsize=10)
    return fig


def alignment_figure(maps: AttentionMaps) -> Figure:
    """The head-averaged last-layer cross-attention as a target (rows) x source (columns) picture."""
    n_queries, n_keys = len(maps.tgt_pieces), len(maps.src_pieces)
    fig = _new_figure((max(_MIN_PANEL_INCHES, n_keys * _CELL_INCHES + 1.6),
                       max(_MIN_PANEL_INCHES, n_queries * _CELL_INCHES + 1.2)))
    ax = fig.subplots()
    weights = maps.alignment()
    image = _draw_heatmap(ax, weights, maps.tgt_pieces, maps.src_pieces, max(float(weights.max()), 1e-9),
                          f"alignment: last-layer cross-attention, mean of {maps.cross.shape[1]} heads")
    ax.set_xlabel("source", fontsize=8)
    ax.set_ylabel("target (predicted piece)", fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.8, aspect=30)
    return fig


def attention_figures(maps: AttentionMaps) -> Iterator[tuple[str, Figure]]:
    """``(suffix, figure)`` for every layer and kind, then the alignment picture.

    Suffixes: ``encoder_layer{i}``, ``decoder_self_layer{i}``, ``cross_layer{i}``, ``alignment``.
    """
    for i in range(maps.encoder.shape[0]):
        yield f"encoder_layer{i}", head_grid_figure(
            maps.encoder[i], maps.src_pieces, maps.src_pieces, f"encoder self-attention, layer {i}")
    for i in range(maps.decoder_self.shape[0]):
        yield f"decoder_self_layer{i}", head_grid_figure(
            maps.decoder_self[i], maps.tgt_pieces, maps.tgt_input_pieces,
            f"decoder self-attention, layer {i} (rows: predicted piece, columns: piece read)")
        yield f"cross_layer{i}", head_grid_figure(
            maps.cross[i], maps.tgt_pieces, maps.src_pieces, f"cross-attention, layer {i}")
    yield "alignment", alignment_figure(maps)


def figure_to_array(fig: Figure) -> np.ndarray:
    """Render a figure to an (height, width, 3) uint8 RGB array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()  # (height, width, 3)


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def save_attention_maps(maps: AttentionMaps, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``{name}_{suffix}.png`` for every figure of :func:`attention_figures` and ``{name}.npz``.

    The .npz holds ``encoder``, ``decoder_self``, ``cross`` (float32) and ``src_pieces``, ``tgt_pieces``,
    ``tgt_input_pieces`` (string arrays); :func:`load_attention_maps` reads it back.

    Returns:
        The written paths (PNGs in figure order, then the .npz).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for suffix, fig in attention_figures(maps):
        path = out / f"{name}_{suffix}.png"
        fig.savefig(path)
        paths.append(path)
    path = out / f"{name}.npz"
    np.savez_compressed(
        path, encoder=maps.encoder, decoder_self=maps.decoder_self, cross=maps.cross,
        src_pieces=np.array(maps.src_pieces, dtype=str), tgt_pieces=np.array(maps.tgt_pieces, dtype=str),
        tgt_input_pieces=np.array(maps.tgt_input_pieces, dtype=str),
    )
    paths.append(path)
    return paths


def load_attention_maps(path: str | Path) -> AttentionMaps:
    """Read an .npz written by :func:`save_attention_maps`."""
    with np.load(path, allow_pickle=False) as data:
        return AttentionMaps(
            src_pieces=[str(p) for p in data["src_pieces"]], tgt_pieces=[str(p) for p in data["tgt_pieces"]],
            encoder=data["encoder"], decoder_self=data["decoder_self"], cross=data["cross"],
            tgt_input_pieces=[str(p) for p in data["tgt_input_pieces"]],
        )


def log_attention_maps(writer: ImageWriter | None, maps: AttentionMaps, tag: str, step: int) -> None:
    """Add every figure of :func:`attention_figures` to TensorBoard as ``{tag}/{suffix}`` (no-op for None)."""
    if writer is None:
        return
    for suffix, fig in attention_figures(maps):
        writer.add_image(f"{tag}/{suffix}", figure_to_array(fig), step, dataformats="HWC")


# --------------------------------------------------------------------------------------------------
# A trained model's sentences (transformer-evaluate)
# --------------------------------------------------------------------------------------------------


def pair_attention_maps(trained: TrainedModel, source: str, target_ids: Sequence[int],
                        max_tokens: int) -> AttentionMaps:
    """All attention weights of one sentence pair, teacher-forced on the target ids (both sides cut to
    ``max_tokens``, and to what the model's positions hold: the decoder reads BOS before the target).

    Give the model's own translation as the ids it generated (:func:`translation_ids`), not as its text encoded
    again: a SentencePiece model may generate a segmentation that its tokenizer would not choose (``▁Kunst erin``
    for ``▁K un ster in``), and a word-level ``<unk>`` reads back as three words."""
    src_ids = trained.src_tok.encode(source)[:min(max_tokens, trained.model.max_positions)]
    tgt_ids = list(target_ids)[:min(max_tokens, trained.model.max_positions - 1)]
    return compute_attention_maps(
        trained.model, src_ids, tgt_ids,
        src_pieces=[trained.src_tok.id_to_piece(i) for i in src_ids],
        tgt_pieces=[trained.tgt_tok.id_to_piece(i) for i in tgt_ids],
        bos_id=trained.tgt_tok.bos_id, eos_id=trained.tgt_tok.eos_id, pad_id=trained.src_tok.pad_id,
    )


def translation_ids(trained: TrainedModel, sources: list[str], eval_cfg: EvalConfig) -> list[list[int]]:
    """The ids of the model's best translation of each source, with the search ``eval_cfg`` gives."""
    found = translate_hypotheses(trained.model, sources, trained.src_tok, trained.tgt_tok,
                                 replace(eval_cfg, n_best=1), next(trained.model.parameters()).device,
                                 trained.model.max_positions)
    return [nbest[0].tokens for nbest in found]


def check_indices(cfg: AttentionDumpConfig, sources: list[str], src_tok: Tokenizer, scored: str = "") -> None:
    """Refuse ``attention.indices`` outside the sentences scored, ``sources`` (named ``scored``: a split, a file),
    and a chosen sentence or text whose source has no token (blank, or only characters the tokenizer drops): there is
    nothing to attend to. Before decoding."""
    for index in cfg.indices:
        if not 0 <= index < len(sources):
            named = f", {scored}" if scored else ""
            raise ConfigError(f"attention.indices: {index} is outside the sentences scored{named} "
                              f"(0..{len(sources) - 1})")
        if not src_tok.encode(sources[index]):
            raise ConfigError(f"attention.indices: {index} is a sentence whose source has no token "
                              f"({sources[index]!r}): there is nothing to attend to")
    for i, text in enumerate(cfg.texts):
        if not src_tok.encode(text):
            raise ConfigError(f"attention.texts[{i}]: {text!r} has no token the model reads: there is nothing to "
                              "attend to")


def _chosen_sentences(cfg: AttentionDumpConfig, trained: TrainedModel, eval_cfg: EvalConfig, src: list[str],
                      refs: list[str]) -> list[tuple[str, str, list[int], str | None]]:
    """``(name, source, the ids of its translation, reference or None)`` for the test indices and texts ``cfg``
    names."""
    check_indices(cfg, src, trained.src_tok)
    named = ([(f"test{index}", src[index], refs[index]) for index in cfg.indices]
             + [(f"text{i}", text, None) for i, text in enumerate(cfg.texts)])
    found = translation_ids(trained, [source for _, source, _ in named], eval_cfg) if named else []
    return [(name, source, ids, reference) for (name, source, reference), ids in zip(named, found)]


def dump_attention(cfg: AttentionDumpConfig, trained: TrainedModel, eval_cfg: EvalConfig, src: list[str],
                   refs: list[str], out: str | Path, writer: ImageWriter | None) -> list[Path]:
    """Attention maps of the chosen test sentences and given texts, on the model's translation (the ids it
    generates) and on the reference.

    Files go to ``out`` as ``{name}_{hyp|ref}_*.png`` and ``.npz`` (names: ``test{index}``, ``text{i}``);
    the same figures go to TensorBoard as ``attention/{name}_{hyp|ref}/*``. With ``attention.format=html``
    ``out/explorer.html`` holds them all in the interactive explorer (:mod:`transformer.inference.explorer`).

    Args:
        cfg: which sentences (``attention.indices`` into ``src``, ``attention.texts``) and how long.
        eval_cfg: the search that translates the chosen sentences.
        src, refs: the test set.

    Returns:
        Every written path.
    """
    written: list[Path] = []
    entries = []  # for attention.format=html
    for name, source, hypothesis, reference in _chosen_sentences(cfg, trained, eval_cfg, src, refs):
        targets = [("hyp", trained.tgt_tok.decode(hypothesis), hypothesis)]
        if cfg.on_reference and reference is not None:
            targets.append(("ref", reference, trained.tgt_tok.encode(reference)))
        for kind, target, target_ids in targets:
            maps = pair_attention_maps(trained, source, target_ids, cfg.max_tokens)
            lengths = len(trained.src_tok.encode(source)), len(target_ids)
            if (len(maps.src_pieces), len(maps.tgt_pieces) - 1) != lengths:  # tgt_pieces end in EOS
                log.warning("attention maps for %s (%s): %d source and %d target tokens cut to %d and %d "
                            "(attention.max_tokens, the model's positions)", name, kind, *lengths,
                            len(maps.src_pieces), len(maps.tgt_pieces) - 1)
            paths = save_attention_maps(maps, out, f"{name}_{kind}")
            log_attention_maps(writer, maps, f"attention/{name}_{kind}", step=0)
            log.info("attention maps for %s (%s): %d files in %s", name, kind, len(paths), out)
            written += paths
            entries.append({"name": f"{name}_{kind}", "source": source, "target": target, "maps": attention_json(maps)})
    if cfg.format == "html" and entries:
        page = Path(out) / "explorer.html"
        files.write_text(page, standalone_page(entries, info=f"{trained.path}"))
        log.info("attention explorer of %d sentence pairs: %s", len(entries), page)
        written.append(page)
    return written
