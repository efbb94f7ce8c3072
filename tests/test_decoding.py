"""Decoding: beam search against a scripted decoder with hand-set probabilities, length penalties,
finished rows leaving the batch, and on a tiny real model: beam 1 == greedy, cached == uncached,
batched == one at a time, beam search == exhaustive search."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from transformer.config import LengthNorm, ModelConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.inference.search import (
    Hypothesis,
    beam_search,
    greedy_hypotheses,
    greedy_search,
    length_penalty,
    max_lengths,
)
from transformer.model.transformer import build_model

from toy_training import reversal_batch

A, B, C, D = 4, 5, 6, 7  # ordinary token ids of the scripted vocabulary
VOCAB = 8
SPECIAL = dict(pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)

# --------------------------------------------------------------------------------------------------
# A scripted decoder: next-token probabilities are looked up from (first source token, prefix)
# --------------------------------------------------------------------------------------------------

Script = dict[tuple[int, ...], dict[int, float]]  # prefix (without BOS) -> {token: probability}


@dataclass
class FakeEncoded:
    src: Tensor  # (batch, src_len)
    src_mask: Tensor  # (batch, 1, 1, src_len)


def select_fake(enc: FakeEncoded, indices: Tensor) -> FakeEncoded:
    return FakeEncoded(enc.src.index_select(0, indices), enc.src_mask.index_select(0, indices))


@dataclass
class FakeCache:
    inputs: list[tuple[int, ...]]  # decoder input so far (BOS + tokens) per row

    def select(self, indices: Tensor, keep_static: bool = False) -> FakeCache:  # nothing static to keep
        return FakeCache([self.inputs[i] for i in indices.tolist()])


@dataclass
class FakeOutput:
    logits: Tensor
    cache: FakeCache | None


class ScriptedDecoder:
    """Each sentence follows ``scripts[first source token]``; unknown prefixes get ``default``."""

    def __init__(self, scripts: dict[int, Script], default: dict[int, float] | None = None) -> None:
        self.scripts = scripts
        self.default = default or {EOS_ID: 1.0}
        self.batch_sizes: list[int] = []  # rows of every decode call

    def encode(self, src: Tensor) -> FakeEncoded:
        return FakeEncoded(src, (src != PAD_ID)[:, None, None, :])

    def init_cache(self, enc: FakeEncoded) -> FakeCache:
        return FakeCache([() for _ in range(enc.src.size(0))])

    def _logits(self, script: Script, prefix: tuple[int, ...]) -> list[float]:
        probs = script.get(prefix, self.default)
        assert sum(probs.values()) == pytest.approx(1.0)
        return [math.log(probs[t]) if probs.get(t, 0.0) > 0 else -math.inf for t in range(VOCAB)]

    def decode(self, tgt_in: Tensor, enc: FakeEncoded, cache: FakeCache | None = None) -> FakeOutput:
        assert tgt_in.size(0) == enc.src.size(0), "encoder output and decoder rows out of step"
        self.batch_sizes.append(tgt_in.size(0))
        if cache is None:
            inputs = [tuple(row) for row in tgt_in.tolist()]
        else:
            assert tgt_in.size(1) == 1, "with a cache only the new token is fed"
            inputs = [old + tuple(new) for old, new in zip(cache.inputs, tgt_in.tolist())]
        logits = []
        for row, full in enumerate(inputs):
            assert full[0] == BOS_ID
            script = self.scripts[int(enc.src[row, 0])]
            positions = range(len(full) - tgt_in.size(1), len(full))  # the positions fed this call
            logits.append([self._logits(script, full[1:p + 1]) for p in positions])
        return FakeOutput(torch.tensor(logits), None if cache is None else FakeCache(inputs))


def run_beam(model: ScriptedDecoder, src: list[list[int]], *, use_cache: bool, beam_size: int = 2, n_best: int = 1,
             alpha: float = 0.0, norm: LengthNorm = LengthNorm.none, max_len_a: float = 0.0,
             max_len_b: float = 10, max_tgt_len: int | None = None) -> list[list[Hypothesis]]:
    return beam_search(model, torch.tensor(src), beam_size=beam_size, n_best=n_best, length_penalty=alpha,
                       length_norm=norm, max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache,
                       max_tgt_len=max_tgt_len, select_encoder=select_fake, **SPECIAL)


def run_greedy(model: ScriptedDecoder, src: list[list[int]], *, use_cache: bool, max_len_a: float = 0.0,
               max_len_b: float = 10, max_tgt_len: int | None = None) -> list[list[int]]:
    return greedy_search(model, torch.tensor(src), max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache,
                         max_tgt_len=max_tgt_len, select_encoder=select_fake, **SPECIAL)


# greedy takes A (0.5) then A (0.4): p = 0.2; beam 2 also keeps B (0.4), whose EOS (0.9) gives p = 0.36.
GREEDY_TRAP: Script = {
    (): {A: 0.5, B: 0.4, EOS_ID: 0.1},
    (A,): {A: 0.4, B: 0.35, EOS_ID: 0.25},
    (B,): {EOS_ID: 0.9, A: 0.1},
}
# "A" (p 0.55, length 2 with EOS) against "B B B" (p 0.45 * 0.95, length 4).
SHORT_OR_LONG: Script = {
    (): {A: 0.55, B: 0.45},
    (A,): {EOS_ID: 1.0},
    (B,): {B: 0.95, EOS_ID: 0.05},
    (B, B): {B: 1.0},
}

use_cache_modes = pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])


@use_cache_modes
def test_beam_beats_greedy_on_scripted_decoder(use_cache: bool) -> None:
    model = ScriptedDecoder({A: GREEDY_TRAP})
    assert run_greedy(model, [[A, C]], use_cache=use_cache) == [[A, A]]
    (best,) = run_beam(model, [[A, C]], use_cache=use_cache)[0]
    assert best.tokens == [B]
    assert best.log_prob == pytest.approx(math.log(0.4 * 0.9), abs=1e-6)
    assert best.score == pytest.approx(best.log_prob, abs=1e-6)  # LengthNorm.none
    # n-best: the B EOS hypothesis, then A A EOS (0.5 * 0.4); A B EOS (0.175) and A EOS (0.125) lose
    nbest = run_beam(model, [[A, C]], use_cache=use_cache, n_best=2)[0]
    assert [h.tokens for h in nbest] == [[B], [A, A]]
    assert [h.log_prob for h in nbest] == pytest.approx([math.log(0.36), math.log(0.2)], abs=1e-6)


@use_cache_modes
def test_beam_size_one_is_greedy_on_scripted_decoder(use_cache: bool) -> None:
    model = ScriptedDecoder({A: GREEDY_TRAP})
    (only,) = run_beam(model, [[A]], use_cache=use_cache, beam_size=1)[0]
    assert only.tokens == [A, A] and only.log_prob == pytest.approx(math.log(0.2), abs=1e-6)


@use_cache_modes
def test_length_penalty_changes_the_ranking_as_the_formula_says(use_cache: bool) -> None:
    model = ScriptedDecoder({A: SHORT_OR_LONG})
    short_lp, long_lp = math.log(0.55), math.log(0.45 * 0.95)
    # alpha = 0: lp = 1, the raw log-probs decide, and "A" (-0.598) beats "B B B" (-0.850)
    (best,) = run_beam(model, [[A]], use_cache=use_cache, norm=LengthNorm.gnmt, alpha=0.0)[0]
    assert best.tokens == [A] and best.score == pytest.approx(short_lp, abs=1e-6)
    # alpha = 2: A -> -0.598 / (7/6)**2 = -0.439 ; B B B -> -0.850 / (9/6)**2 = -0.378
    nbest = run_beam(model, [[A]], use_cache=use_cache, norm=LengthNorm.gnmt, alpha=2.0, n_best=2)[0]
    assert [h.tokens for h in nbest] == [[B, B, B], [A]]
    assert [h.score for h in nbest] == pytest.approx([long_lp / 1.5**2, short_lp / (7 / 6) ** 2], abs=1e-6)
    assert [h.log_prob for h in nbest] == pytest.approx([long_lp, short_lp], abs=1e-6)
    # average: A -> -0.598 / 2 = -0.299 ; B B B -> -0.850 / 4 = -0.212
    (best,) = run_beam(model, [[A]], use_cache=use_cache, norm=LengthNorm.average)[0]
    assert best.tokens == [B, B, B] and best.score == pytest.approx(long_lp / 4, abs=1e-6)


def test_length_penalty_formula() -> None:
    assert length_penalty(4, 0.6, LengthNorm.gnmt) == pytest.approx((9 / 6) ** 0.6)
    assert length_penalty(1, 0.6, LengthNorm.gnmt) == pytest.approx(1.0)
    assert length_penalty(4, 0.0, LengthNorm.gnmt) == 1.0
    assert length_penalty(7, 0.6, LengthNorm.average) == 7.0
    assert length_penalty(7, 0.6, LengthNorm.none) == 1.0


def test_early_stop_when_finished_hypothesis_cannot_be_beaten() -> None:
    # With lp = 1 the finished "A" (-0.598) already beats the best alive prefix "B B" (-0.850) after two steps
    # (log-probs only fall), so the search stops there; with alpha = 2 it must go on until "B B B" ends.
    model = ScriptedDecoder({A: SHORT_OR_LONG})
    run_beam(model, [[A]], use_cache=True, norm=LengthNorm.gnmt, alpha=0.0)
    assert model.batch_sizes == [2, 2]
    model.batch_sizes.clear()
    run_beam(model, [[A]], use_cache=True, norm=LengthNorm.gnmt, alpha=2.0)
    assert model.batch_sizes == [2, 2, 2, 2]


# Beam 2. Step 1 finishes "A" (0.6 * 0.52 = 0.312) and keeps "B B" (0.38) and "A C" (0.288); step 2 finishes
# "A C" (0.288): two finished hypotheses fill the beam while "B B B" (0.361) is alive, and ends at step 3 (0.361).
LATE_WINNER: Script = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS_ID: 0.52, C: 0.48},
    (B,): {B: 0.95, EOS_ID: 0.05},
    (A, C): {EOS_ID: 1.0},
    (B, B): {B: 0.95, EOS_ID: 0.05},
}


def test_without_length_normalization_the_search_runs_until_no_alive_hypothesis_can_win() -> None:
    # A full beam of finished hypotheses stops a normalized search after step 2 (fairseq's rule): "A C" wins
    # (log 0.288 / 3), though "B B B" would score log 0.361 / 4. Without normalization the bound is exact, so
    # the search goes on while "B B B" can still win, as CTranslate2's does.
    model = ScriptedDecoder({A: LATE_WINNER})
    assert run_beam(model, [[A]], use_cache=True, norm=LengthNorm.average)[0][0].tokens == [A, C]
    (best,) = run_beam(model, [[A]], use_cache=True, norm=LengthNorm.none)[0]
    assert best.tokens == [B, B, B]
    assert best.log_prob == pytest.approx(math.log(0.4 * 0.95 * 0.95), abs=1e-6)


@use_cache_modes
def test_finished_sentences_leave_the_batch(use_cache: bool) -> None:
    # sentence 0 (source starts with A) ends at once; sentence 1 (B) writes C C and ends at step 3.
    scripts = {A: {(): {EOS_ID: 1.0}}, B: {(): {C: 1.0}, (C,): {C: 1.0}, (C, C): {EOS_ID: 1.0}}}
    model = ScriptedDecoder(scripts)
    assert run_greedy(model, [[A, D], [B, D]], use_cache=use_cache) == [[], [C, C]]
    assert model.batch_sizes == [2, 1, 1]
    model.batch_sizes.clear()
    result = run_beam(model, [[A, D], [B, D]], use_cache=use_cache, beam_size=3)
    assert [[h.tokens for h in hyps] for hyps in result] == [[[]], [[C, C]]]
    assert result[0][0].log_prob == pytest.approx(0.0)
    assert model.batch_sizes == [6, 3, 3]  # 2 sentences x 3 beams, then only the second sentence


@use_cache_modes
def test_max_length_follows_source_length(use_cache: bool) -> None:
    # never EOS: C (0.6) or D (0.4) forever; limits are 1 * real source tokens + 0 -> 2 and 4
    model = ScriptedDecoder({A: {}}, default={C: 0.6, D: 0.4})
    src = [[A, D, PAD_ID, PAD_ID], [A, D, D, D]]
    assert max_lengths(torch.tensor(src), PAD_ID, 1.0, 0.0) == [2, 4]
    assert run_greedy(model, src, use_cache=use_cache, max_len_a=1.0, max_len_b=0) == [[C, C], [C, C, C, C]]
    assert run_greedy(model, src, use_cache=use_cache, max_len_a=1.0, max_len_b=0, max_tgt_len=3) == [
        [C, C], [C, C, C]]
    result = run_beam(model, src, use_cache=use_cache, max_len_a=1.0, max_len_b=0, norm=LengthNorm.gnmt, alpha=1.0)
    # unfinished hypotheses are finalized at the limit; their length has no EOS in it
    assert [hyps[0].tokens for hyps in result] == [[C, C], [C, C, C, C]]
    assert result[0][0].score == pytest.approx(2 * math.log(0.6) / (7 / 6), abs=1e-6)
    assert result[1][0].score == pytest.approx(4 * math.log(0.6) / (9 / 6), abs=1e-6)


def test_beam_search_rejects_bad_n_best() -> None:
    with pytest.raises(ValueError, match="n_best"):
        run_beam(ScriptedDecoder({A: {}}), [[A]], use_cache=True, beam_size=2, n_best=3)


# --------------------------------------------------------------------------------------------------
# A tiny real model
# --------------------------------------------------------------------------------------------------


def tiny_model(src_vocab: int = 24, tgt_vocab: int = 24, seed: int = 2) -> nn.Module:
    """A random tiny model whose outputs are peaky and end with EOS at different steps (some never)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, max_positions=64, tie_output=False, share_embeddings=False)
    model = build_model(cfg, src_vocab, tgt_vocab, PAD_ID)
    with torch.no_grad():
        model.output_proj.weight.mul_(3.0)
        model.output_proj.weight[EOS_ID].mul_(2.0)
    return model.eval()


def varied_sources(vocab: int = 24, seed: int = 1) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    lengths = [5, 1, 9, 3, 7, 2]
    src = torch.full((len(lengths), max(lengths)), PAD_ID)
    for row, n in enumerate(lengths):
        src[row, :n] = torch.randint(4, vocab, (n,), generator=gen)
    return src


REAL = dict(max_len_a=1.0, max_len_b=4, **SPECIAL)


def test_real_model_beam_one_equals_greedy() -> None:
    model, src = tiny_model(), varied_sources()
    greedy = greedy_search(model, src, **REAL)
    limits = max_lengths(src, PAD_ID, REAL["max_len_a"], REAL["max_len_b"])
    ended = [len(t) < limit for t, limit in zip(greedy, limits)]
    assert len({len(t) for t in greedy}) > 3 and any(ended) and not all(ended), "needs varied output lengths"
    for norm, alpha in ((LengthNorm.gnmt, 0.6), (LengthNorm.average, 0.0), (LengthNorm.none, 0.0)):
        beam = beam_search(model, src, beam_size=1, n_best=1, length_penalty=alpha, length_norm=norm, **REAL)
        assert [hyps[0].tokens for hyps in beam] == greedy
        scored = greedy_hypotheses(model, src, length_penalty=alpha, length_norm=norm, **REAL)
        assert [h.tokens for h in scored] == greedy
        assert [h.score for h in scored] == pytest.approx([hyps[0].score for hyps in beam], abs=1e-5)
    for row, (h, end) in enumerate(zip(scored, ended)):  # and by teacher forcing, an independent path
        one = src[row : row + 1, : int((src[row] != PAD_ID).sum())]
        assert h.log_prob == pytest.approx(_sequence_log_prob(model, one, h.tokens, end), abs=1e-4)


def test_real_model_cached_equals_uncached() -> None:
    model, src = tiny_model(), varied_sources()
    assert greedy_search(model, src, use_cache=True, **REAL) == greedy_search(model, src, use_cache=False, **REAL)
    kwargs = dict(beam_size=3, n_best=2, length_penalty=0.6, length_norm=LengthNorm.gnmt, **REAL)
    cached = beam_search(model, src, use_cache=True, **kwargs)
    uncached = beam_search(model, src, use_cache=False, **kwargs)
    assert [[h.tokens for h in hyps] for hyps in cached] == [[h.tokens for h in hyps] for hyps in uncached]
    for c, u in zip(cached, uncached):
        assert [h.score for h in c] == pytest.approx([h.score for h in u], abs=1e-4)


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_gives_the_same_tokens_however_late_finished_rows_leave(use_cache: bool) -> None:
    """Finished rows kept in the batch (computed and ignored) change nothing: compare with one sentence at a time."""
    model, src = tiny_model(), varied_sources()
    alone = [greedy_search(model, src[row : row + 1], use_cache=use_cache, **REAL)[0] for row in range(src.size(0))]
    for fraction in (0.0, 0.25, 0.5, 1.0):
        assert greedy_search(model, src, use_cache=use_cache, drop_finished_at=fraction, **REAL) == alone, fraction


def test_real_model_batched_equals_one_sentence_at_a_time() -> None:
    model, src = tiny_model(), varied_sources()
    kwargs = dict(beam_size=4, n_best=2, length_penalty=0.6, length_norm=LengthNorm.gnmt, **REAL)
    batched = beam_search(model, src, **kwargs)
    for row in range(src.size(0)):
        one = src[row : row + 1, : int((src[row] != PAD_ID).sum())]
        single = beam_search(model, one, **kwargs)[0]
        assert [h.tokens for h in single] == [h.tokens for h in batched[row]]
        assert [h.score for h in single] == pytest.approx([h.score for h in batched[row]], abs=1e-4)


def _sequence_log_prob(model: nn.Module, src: Tensor, tokens: list[int], ended: bool) -> float:
    """Independent scoring: one teacher-forced forward pass over BOS + tokens, PAD and BOS excluded from the
    distribution (they are never generated)."""
    tgt_in = torch.tensor([[BOS_ID, *tokens]])
    logits = model(src, tgt_in)[0].float()  # (len + 1, vocab)
    logits[:, [PAD_ID, BOS_ID]] = -math.inf
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = tokens + [EOS_ID] if ended else tokens
    return sum(float(log_probs[t, tok].detach()) for t, tok in enumerate(targets))


@pytest.mark.parametrize("seed", [1, 2])
def test_real_model_wide_beam_equals_exhaustive_search(seed: int) -> None:
    # target vocabulary: 4 specials + 2 words; PAD and BOS are never generated, so the candidates are all
    # sequences over {UNK, 4, 5} of length 0..2 followed by EOS, and all of length 3 (the limit) without EOS.
    # A beam of 40 holds every prefix (at most 27) and every EOS candidate (at most 9 + 27 candidates).
    model, src = tiny_model(tgt_vocab=6, seed=seed), torch.tensor([[7, 9, 11]])
    words = [1, 4, 5]
    candidates = [(list(seq), True) for n in range(3) for seq in itertools.product(words, repeat=n)]
    candidates += [(list(seq), False) for seq in itertools.product(words, repeat=3)]
    for norm, alpha in ((LengthNorm.gnmt, 1.0), (LengthNorm.none, 0.0), (LengthNorm.average, 0.0)):
        scored = []
        for tokens, ended in candidates:
            log_prob = _sequence_log_prob(model, src, tokens, ended)
            scored.append((log_prob / length_penalty(len(tokens) + ended, alpha, norm), tokens))
        scored.sort(key=lambda pair: pair[0], reverse=True)
        found = beam_search(model, src, beam_size=40, n_best=5, length_penalty=alpha, length_norm=norm,
                            max_len_a=0.0, max_len_b=3, **SPECIAL)[0]
        assert [h.tokens for h in found] == [tokens for _, tokens in scored[:5]]
        assert [h.score for h in found] == pytest.approx([score for score, _ in scored[:5]], abs=1e-5)


# --------------------------------------------------------------------------------------------------
# A trained model (conftest.reversal_model): the searches reproduce the learned digit reversal
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_trained_model_decodes_reversal_task(reversal_model) -> None:
    src, _, _ = reversal_batch(torch.Generator().manual_seed(7), 50)  # held-out strings
    expected = [row[row != PAD_ID].flip(0).tolist() for row in src]
    kwargs = dict(max_len_a=1.0, max_len_b=3, **SPECIAL)
    greedy = greedy_search(reversal_model, src, **kwargs)
    beams = beam_search(reversal_model, src, beam_size=4, n_best=2, length_penalty=0.6, length_norm=LengthNorm.gnmt,
                        **kwargs)
    assert sum(g == e for g, e in zip(greedy, expected)) >= 49  # 50 of 50 when written
    assert sum(b[0].tokens == e for b, e in zip(beams, expected)) >= 49
    # the runner-up is a different, less probable hypothesis
    assert all(b[1].tokens != b[0].tokens and b[1].score <= b[0].score for b in beams)
