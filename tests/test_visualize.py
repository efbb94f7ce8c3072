"""Attention maps: shapes and normalisation of the arrays, one PNG per layer and kind, .npz round trip,
figures that grow with the sentence, TensorBoard images."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from torch import nn

from transformer.config import AttentionDumpConfig, ConfigError, EvalConfig, ModelConfig, TrainConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_PIECES, UNK_ID, WordTokenizer
from transformer.inference import attention_maps as visualize
from transformer.inference.attention_maps import (
    AttentionMaps,
    compute_attention_maps,
    dump_attention,
    load_attention_maps,
    log_attention_maps,
    save_attention_maps,
)
from transformer.inference.loading import TrainedModel
from transformer.inference.search import beam_search
from transformer.model.transformer import build_model

N_ENC, N_DEC, HEADS = 2, 3, 2
IDS = dict(bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=HEADS, d_ff=32, n_encoder_layers=N_ENC, n_decoder_layers=N_DEC,
                      dropout=0.0, attention_dropout=0.0, max_positions=64)
    return build_model(cfg, 30, 30, PAD_ID)


def maps_for(model: nn.Module, n_src: int, n_tgt: int) -> AttentionMaps:
    src_ids = [4 + i % 26 for i in range(n_src)]
    tgt_ids = [5 + (7 * i) % 25 for i in range(n_tgt)]
    return compute_attention_maps(model, src_ids, tgt_ids, src_pieces=[f"s{i}" for i in range(n_src)],
                                  tgt_pieces=[f"t{i}" for i in range(n_tgt)], **IDS)


def test_arrays_have_the_right_shapes_and_are_distributions(model: nn.Module) -> None:
    model.train()
    maps = maps_for(model, n_src=6, n_tgt=3)
    assert model.training, "the caller's mode is restored"
    assert maps.src_pieces == [f"s{i}" for i in range(6)]
    assert maps.tgt_pieces == ["t0", "t1", "t2", "</s>"]  # queries: the piece each position predicts
    assert maps.tgt_input_pieces == ["<s>", "t0", "t1", "t2"]  # self-attention keys: the piece read
    assert maps.encoder.shape == (N_ENC, HEADS, 6, 6)
    assert maps.decoder_self.shape == (N_DEC, HEADS, 4, 4)
    assert maps.cross.shape == (N_DEC, HEADS, 4, 6)
    for weights in (maps.encoder, maps.decoder_self, maps.cross):
        assert weights.dtype == np.float32
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-5)  # every query row over real keys
    future = np.triu(np.ones((4, 4), dtype=bool), k=1)
    assert np.all(maps.decoder_self[..., future] == 0.0)  # masked (future) keys get exactly zero
    assert np.all(maps.decoder_self[..., ~future] > 0.0)
    np.testing.assert_allclose(maps.alignment(), maps.cross[-1].mean(axis=0))


def test_padding_and_trailing_eos_are_dropped(model: nn.Module) -> None:
    plain = maps_for(model, n_src=5, n_tgt=3)
    src_ids = [4 + i for i in range(5)] + [PAD_ID, PAD_ID]
    tgt_ids = [5 + (7 * i) % 25 for i in range(3)] + [EOS_ID]
    padded = compute_attention_maps(model, src_ids, tgt_ids, src_pieces=[f"s{i}" for i in range(5)] + ["<pad>"] * 2,
                                    tgt_pieces=["t0", "t1", "t2", "</s>"], **IDS)
    assert padded.src_pieces == plain.src_pieces and padded.tgt_pieces == plain.tgt_pieces
    np.testing.assert_allclose(padded.cross, plain.cross, atol=1e-6)
    np.testing.assert_allclose(padded.encoder, plain.encoder, atol=1e-6)


def test_bad_inputs_are_rejected(model: nn.Module) -> None:
    with pytest.raises(ValueError, match="3 source ids but 2 pieces"):
        compute_attention_maps(model, [4, 5, 6], [7], src_pieces=["a", "b"], tgt_pieces=["x"], **IDS)
    with pytest.raises(ValueError, match="no tokens"):
        compute_attention_maps(model, [PAD_ID], [7], src_pieces=["<pad>"], tgt_pieces=["x"], **IDS)


def test_save_writes_one_png_per_layer_and_kind_and_the_arrays(model: nn.Module, tmp_path: Path) -> None:
    maps = maps_for(model, n_src=6, n_tgt=3)
    paths = save_attention_maps(maps, tmp_path / "attention", "test7_hyp")
    expected = ([f"test7_hyp_encoder_layer{i}.png" for i in range(N_ENC)]
                + [f"test7_hyp_{kind}_layer{i}.png" for i in range(N_DEC) for kind in ("decoder_self", "cross")]
                + ["test7_hyp_alignment.png", "test7_hyp.npz"])
    assert [p.name for p in paths] == expected
    assert sorted(p.name for p in (tmp_path / "attention").iterdir()) == sorted(expected)
    for path in paths[:-1]:
        image = matplotlib.image.imread(path)  # a real PNG
        assert image.ndim == 3 and min(image.shape[:2]) > 100
        assert image[..., :3].std() > 0.05  # not blank
    with np.load(paths[-1]) as data:
        assert {"encoder", "decoder_self", "cross", "src_pieces", "tgt_pieces"} <= set(data.files)
    loaded = load_attention_maps(paths[-1])
    assert loaded.src_pieces == maps.src_pieces and loaded.tgt_pieces == maps.tgt_pieces
    assert loaded.tgt_input_pieces == maps.tgt_input_pieces
    for key in ("encoder", "decoder_self", "cross"):
        np.testing.assert_array_equal(getattr(loaded, key), getattr(maps, key))


@pytest.mark.slow
def test_figures_grow_with_sentence_length(model: nn.Module, tmp_path: Path) -> None:
    short = save_attention_maps(maps_for(model, n_src=5, n_tgt=4), tmp_path, "short")
    long = save_attention_maps(maps_for(model, n_src=40, n_tgt=38), tmp_path, "long")
    for s, l in zip(short[:-1], long[:-1]):
        small, big = matplotlib.image.imread(s).shape, matplotlib.image.imread(l).shape
        assert big[0] > 1.5 * small[0] and big[1] > 1.5 * small[1], (s.name, small, big)


class RecordingWriter:
    def __init__(self) -> None:
        self.images: list[tuple[str, tuple[int, ...], int, str]] = []

    def add_image(self, tag: str, img_tensor: np.ndarray, global_step: int, dataformats: str) -> None:
        self.images.append((tag, img_tensor.shape, global_step, dataformats))
        assert img_tensor.dtype == np.uint8


def test_log_attention_maps_adds_every_figure(model: nn.Module, tmp_path: Path) -> None:
    maps = maps_for(model, n_src=4, n_tgt=2)
    writer = RecordingWriter()
    log_attention_maps(writer, maps, "valid/attention", step=12)
    tags = [tag for tag, *_ in writer.images]
    assert tags == ([f"valid/attention/encoder_layer{i}" for i in range(N_ENC)]
                    + [f"valid/attention/{k}_layer{i}" for i in range(N_DEC) for k in ("decoder_self", "cross")]
                    + ["valid/attention/alignment"])
    assert all(shape[2] == 3 and step == 12 and fmt == "HWC" for _, shape, step, fmt in writer.images)
    log_attention_maps(None, maps, "valid/attention", step=12)  # no writer (not rank 0): nothing happens

    from torch.utils.tensorboard import SummaryWriter

    real = SummaryWriter(log_dir=str(tmp_path / "tb"))
    log_attention_maps(real, maps, "attention/x", step=0)
    real.close()
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 10_000  # the PNG-encoded images are in it


def _trained(model: nn.Module) -> TrainedModel:
    tok = WordTokenizer([*SPECIAL_PIECES, *"abcdefghijklmnopqrstuvwxyz"])  # 30 ids, like the model fixture
    return TrainedModel(model, tok, tok, TrainConfig(), Path("final.pt"))


def test_dump_attention_writes_chosen_sentences_and_texts(model: nn.Module, tmp_path: Path, monkeypatch) -> None:
    saved, logged = {}, []  # drawing is tested above; here only what is drawn, and under which names

    def save(maps: AttentionMaps, out: Path, name: str) -> list[Path]:
        saved[name] = maps
        return [Path(out) / f"{name}.npz"]

    monkeypatch.setattr(visualize, "save_attention_maps", save)
    monkeypatch.setattr(visualize, "log_attention_maps", lambda writer, maps, tag, step: logged.append((writer, tag)))
    # The translations as the search generates them: "<unk>" is one id, which its text would read back as three.
    asked = []

    def translation_ids(trained: TrainedModel, sources: list[str], eval_cfg: EvalConfig) -> list[list[int]]:
        asked.append(sources)
        return [[UNK_ID, 20], [21, 22, 23, 24]]

    monkeypatch.setattr(visualize, "translation_ids", translation_ids)
    cfg = AttentionDumpConfig(indices=[1], texts=["c d e"], on_reference=True, max_tokens=3)
    writer = RecordingWriter()
    paths = dump_attention(cfg, _trained(model), EvalConfig(beam_size=1), ["a b", "b c d e f"], ["x", "y z"],
                           tmp_path, writer)
    assert asked == [["b c d e f", "c d e"]]  # one search for every chosen sentence
    assert list(saved) == ["test1_hyp", "test1_ref", "text0_hyp"]  # a given text has no reference
    assert paths == [tmp_path / f"{name}.npz" for name in saved]
    assert saved["test1_hyp"].src_pieces == ["b", "c", "d"]
    assert saved["test1_hyp"].tgt_pieces == ["<unk>", "q", "</s>"]
    assert saved["test1_ref"].tgt_pieces == ["y", "z", "</s>"] and saved["text0_hyp"].src_pieces == ["c", "d", "e"]
    assert saved["text0_hyp"].tgt_pieces == ["r", "s", "t", "</s>"]  # cut to max_tokens
    assert logged == [(writer, f"attention/{name}") for name in saved]


def test_translation_ids_are_the_searchs_best_hypotheses(model: nn.Module) -> None:
    trained, sources, cfg = _trained(model), ["a b c", "d e", "f"], EvalConfig(beam_size=2, n_best=2)
    # each sentence alone, without the cache: another path to the same hypotheses than the batched, cached search
    alone = [beam_search(model.eval(), torch.tensor([trained.src_tok.encode(source)]), beam_size=2, n_best=1,
                         length_penalty=cfg.length_penalty, length_norm=cfg.length_norm, pad_id=PAD_ID,
                         bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=cfg.max_len_a, max_len_b=cfg.max_len_b,
                         use_cache=False, max_tgt_len=64)[0][0].tokens for source in sources]
    assert visualize.translation_ids(trained, sources, cfg) == alone
    assert any(alone)


def test_dump_attention_rejects_an_index_outside_the_test_set(model: nn.Module, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^attention.indices: 2 is outside the sentences scored \(0\.\.1\)$"):
        dump_attention(AttentionDumpConfig(indices=[2]), _trained(model), EvalConfig(beam_size=1), ["a", "b"],
                       ["a", "b"], tmp_path, None)


def test_dump_attention_rejects_a_chosen_sentence_without_source_tokens(model: nn.Module, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^attention.indices: 1 is a sentence whose source has no token "
                                          r"\(' '\): there is nothing to attend to$"):
        dump_attention(AttentionDumpConfig(indices=[0, 1]), _trained(model), EvalConfig(beam_size=1), ["a", " "],
                       ["a", "b"], tmp_path, None)
    assert list(tmp_path.iterdir()) == []
