"""The encoder-decoder Transformer (Vaswani et al., 2017): Encoder, Decoder, ``Transformer``, ``build_model``.

``model(src, tgt_in)`` returns logits. Training wraps the model in its objective
(:mod:`transformer.training.objective`), which takes ``hidden_states`` and ``output_layer`` to fuse the output
projection into the loss; decoding calls ``encode`` / ``init_cache`` / ``decode``. Nothing is stored on modules
between calls: attention weights and the KV cache are returned explicitly.

Shape legend: batch, src_len, tgt_len, d_model, heads, d_head, vocab (src_vocab / tgt_vocab).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.config import ConfigError, ModelConfig, NormPosition, PositionKind
from transformer.model.attention import KVCache, SlotCache
from transformer.model.embeddings import Embeddings, TokenEmbedding
from transformer.model.layers import DecoderLayer, EncoderLayer, LayerSizes
from transformer.model.masks import KeyMask, cached_decoder_self_mask, decoder_self_mask, key_mask, padding_mask


@dataclass
class EncoderOutput:
    """What :meth:`Transformer.encode` returns."""

    memory: Tensor  # (batch, src_len, d_model)
    src_mask: Tensor  # (batch, 1, 1, src_len) bool, True = real token
    attentions: list[Tensor] | None  # per encoder layer (batch, heads, src_len, src_len) when need_weights


def select_encoder_output(enc: EncoderOutput, indices: Tensor) -> EncoderOutput:
    """Rows ``indices`` of the batch (reorder, repeat for beams, drop finished rows)."""
    attentions = None if enc.attentions is None else [a.index_select(0, indices) for a in enc.attentions]
    return EncoderOutput(enc.memory.index_select(0, indices), enc.src_mask.index_select(0, indices), attentions)


@dataclass
class DecoderCache:
    """Everything incremental decoding carries from step to step; passed in and returned.

    ``self_attn[l]`` grows by the new positions at each step; ``cross_attn[l]`` holds the source's
    projected K/V, computed once in :meth:`Transformer.init_cache`; ``tgt_valid`` marks which cached
    target positions are real (not padding) so the cached pass masks exactly like the full one.
    """

    self_attn: list[KVCache]  # per decoder layer, (batch, heads, length, d_head)
    cross_attn: list[KVCache]  # per decoder layer, (batch, heads, src_len, d_head), static
    tgt_valid: Tensor  # (batch, length) bool

    @property
    def length(self) -> int:
        """Number of target positions already cached."""
        return self.tgt_valid.size(1)

    def select(self, indices: Tensor, *, keep_static: bool = False) -> DecoderCache:
        """Rows ``indices`` of the batch (reorder/repeat/shrink; beam search, finished rows).

        ``keep_static`` leaves the cross-attention K/V as they are: right when every row moves within its own
        sentence's rows (a beam reorder), which all hold the same source, and it saves copying them each step.
        """
        return DecoderCache(
            [c.select(indices) for c in self.self_attn],
            self.cross_attn if keep_static else [c.select(indices) for c in self.cross_attn],
            self.tgt_valid.index_select(0, indices),
        )


@dataclass
class SlotDecoderCache:
    """The fixed-shape counterpart of :class:`DecoderCache` (see :class:`~transformer.model.attention.SlotCache`):
    K/V slots for ``max_len`` target positions per row, written in place; ``position`` is the slot of the token
    fed next, on the device, advanced by each :meth:`Transformer.decode`. Every step has the same shapes and
    reads nothing back to the host, so a search can replay it as a CUDA graph. Padding is not masked here: a row
    fed PAD attends to it (fine for rows whose output is ignored, as finished ones are).
    """

    self_attn: list[SlotCache]  # per decoder layer, (batch, heads, max_len, d_head) views of ``slots_kv``
    cross_attn: list[KVCache]  # per decoder layer, (batch, heads, src_len, d_head), static
    position: Tensor  # (1,) long
    slots: Tensor  # (max_len,) long: 0 … max_len - 1, to mask the slots not written yet
    slots_kv: Tensor  # (layers, 2, batch, heads, max_len, d_head): every layer's self-attention K and V, one block
    src_mask: KeyMask  # the cross-attention mask, readied once

    def reorder_(self, rows: Tensor, at_once: bool | None = None) -> None:
        """Give row ``i`` the self-attention K/V of row ``rows[i]``, in place (beam search's reordering; the
        cross-attention K/V are the same for every row of a sentence and stay). ``at_once`` (None: on a GPU) gathers
        every layer at once (two kernels); else one layer's K or V at a time, which stays in the processor's cache
        (the reorder alone 5× faster on a 2-core CPU than the whole block at once; a whole beam step 2.3×)."""
        if at_once or (at_once is None and self.slots_kv.device.type == "cuda"):
            self.slots_kv.copy_(self.slots_kv.index_select(2, rows))
            return
        for part in self.slots_kv.flatten(0, 1):  # (batch, heads, max_len, d_head) each
            part.copy_(part.index_select(0, rows))


@dataclass
class DecoderOutput:
    """What :meth:`Transformer.decode` returns."""

    logits: Tensor  # (batch, tgt_len, tgt_vocab)
    cache: DecoderCache | SlotDecoderCache | None
    self_attentions: list[Tensor] | None  # per layer (batch, heads, tgt_len, total_tgt_len)
    cross_attentions: list[Tensor] | None  # per layer (batch, heads, tgt_len, src_len)


def _sizes(cfg: ModelConfig) -> LayerSizes:
    return LayerSizes(cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                      cfg.hidden_dropout, cfg.activation, cfg.norm, score=cfg.attention.score,
                      rope_base=cfg.rope_base if cfg.positions is PositionKind.rope else None,
                      max_positions=cfg.max_positions,
                      max_relative_distance=cfg.max_relative_distance if cfg.positions is PositionKind.relative else None)


class Encoder(nn.Module):
    """Embeddings, N encoder layers and (with pre-norm) a final LayerNorm."""

    def __init__(self, cfg: ModelConfig, embed: Embeddings) -> None:
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(EncoderLayer(_sizes(cfg)) for _ in range(cfg.n_encoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model) if cfg.norm is NormPosition.pre else None

    def forward(self, src: Tensor, src_mask: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """src (batch, src_len), src_mask (batch, 1, 1, src_len) -> memory (batch, src_len, d_model), weights."""
        x = self.embed(src)  # (batch, src_len, d_model)
        weights: list[Tensor] = []
        mask = key_mask(src_mask)  # readied once for every layer
        for layer in self.layers:
            x, w = layer(x, mask, need_weights)
            if w is not None:
                weights.append(w)
        return (self.norm(x) if self.norm is not None else x), weights


@dataclass
class DecoderStates:
    """What :class:`Decoder` returns."""

    hidden: Tensor  # (batch, tgt_len, d_model), before the output projection
    self_caches: list[KVCache] | None  # per layer, extended by the new positions, when caches were given
    self_attentions: list[Tensor]  # per layer (batch, heads, tgt_len, total_tgt_len) when need_weights, else []
    cross_attentions: list[Tensor]  # per layer (batch, heads, tgt_len, src_len) when need_weights, else []


class Decoder(nn.Module):
    """Embeddings, N decoder layers and (with pre-norm) a final LayerNorm; returns hidden states."""

    def __init__(self, cfg: ModelConfig, embed: Embeddings) -> None:
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(DecoderLayer(_sizes(cfg)) for _ in range(cfg.n_decoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model) if cfg.norm is NormPosition.pre else None

    def forward(self, tgt_in: Tensor, memory: Tensor, self_mask: Tensor | KeyMask | None, src_mask: Tensor | KeyMask, *,
                offset: int | Tensor = 0, caches: DecoderCache | SlotDecoderCache | None = None,
                need_weights: bool = False,
                causal: bool = False) -> DecoderStates:
        """tgt_in (batch, tgt_len) at positions ``offset…`` -> :class:`DecoderStates`.

        Args:
            memory: (batch, src_len, d_model) encoder output (unused by layers with a cross cache).
            self_mask: (batch, 1, tgt_len, total_tgt_len) bool (or its :class:`~transformer.model.masks.KeyMask`),
                or None with ``causal``.
            src_mask: (batch, 1, 1, src_len) bool, True = real source token (or its ``KeyMask``).
            caches: the self- and cross-attention caches of every layer (incremental decoding).
            causal: plain causal self-attention (training on right-padded targets; see ``Transformer.forward``).
        """
        x = self.embed(tgt_in, offset)  # (batch, tgt_len, d_model)
        self_mask = None if self_mask is None else key_mask(self_mask)  # each readied once for every layer
        src_mask = key_mask(src_mask)
        self_caches: list[KVCache] = []
        self_w: list[Tensor] = []
        cross_w: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            out = layer(x, memory, self_mask, src_mask, self_cache=None if caches is None else caches.self_attn[i],
                        cross_cache=None if caches is None else caches.cross_attn[i], need_weights=need_weights,
                        causal=causal)
            x = out.x
            if out.self_cache is not None:
                self_caches.append(out.self_cache)
            if need_weights:
                self_w.append(out.self_weights)
                cross_w.append(out.cross_weights)
        hidden = self.norm(x) if self.norm is not None else x
        return DecoderStates(hidden, self_caches if caches is not None else None, self_w, cross_w)


class Transformer(nn.Module):
    """Encoder-decoder Transformer for translation.

    Args:
        cfg: the architecture.
        src_vocab_size: the source vocabulary's size.
        tgt_vocab_size: the target vocabulary's size (equal to the source's when ``cfg.share_embeddings``).
        pad_id: the padding id of both vocabularies (its embedding row is zero; masks come from it).
    """

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> None:
        super().__init__()
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ConfigError(
                f"model.share_embeddings: needs one joint vocabulary, but the source vocabulary has "
                f"{src_vocab_size} entries and the target {tgt_vocab_size} (set data.tokenizer.joint=true)"
            )
        self.cfg, self.pad_id = cfg, pad_id
        src_token = TokenEmbedding(src_vocab_size, cfg.d_model, pad_id)
        tgt_token = src_token if cfg.share_embeddings else TokenEmbedding(tgt_vocab_size, cfg.d_model, pad_id)
        self.encoder = Encoder(cfg, Embeddings(src_token, cfg.positions, cfg.max_positions, cfg.dropout))
        self.decoder = Decoder(cfg, Embeddings(tgt_token, cfg.positions, cfg.max_positions, cfg.dropout))
        # With tie_output the pre-softmax projection reuses the target embedding matrix (§3.4).
        self.output_proj = None if cfg.tie_output else nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        self._reset_linear()

    def _reset_linear(self) -> None:
        """Xavier-uniform for every nn.Linear weight, zero biases (attention in-projections init themselves)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @property
    def max_positions(self) -> int:
        """The longest sequence the position table covers (inputs and hypotheses must fit)."""
        return self.cfg.max_positions

    @property
    def src_token_embedding(self) -> nn.Embedding:
        """The source nn.Embedding (for GloVe initialisation)."""
        return self.encoder.embed.token.embedding

    @property
    def tgt_token_embedding(self) -> nn.Embedding:
        """The target nn.Embedding (the same object as the source one with ``share_embeddings``)."""
        return self.decoder.embed.token.embedding

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (batch, src_len), tgt_in (batch, tgt_len, right-padded) -> logits (batch, tgt_len, tgt_vocab)."""
        return self.project(self.hidden_states(src, tgt_in))

    def hidden_states(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The decoder's final states (batch, tgt_len, d_model) before the output projection: what the training
        objective projects itself, fused with the loss (:meth:`output_layer`), so the logits are never held whole.

        ``tgt_in`` must be right-padded (as ``collate`` makes it): decoder self-attention is plainly causal,
        with no padding mask, which is exact at every real position and lets the fused kernels run flash
        attention; rows at padding positions are not meaningful.
        """
        encoded = self.encode(src)
        return self.decoder(tgt_in, encoded.memory, None, encoded.src_mask, causal=True).hidden

    def encode(self, src: Tensor, need_weights: bool = False) -> EncoderOutput:
        """src (batch, src_len) ids -> :class:`EncoderOutput` (memory, padding mask, optional weights)."""
        src_mask = padding_mask(src, self.pad_id)  # (batch, 1, 1, src_len)
        memory, weights = self.encoder(src, src_mask, need_weights)
        return EncoderOutput(memory, src_mask, weights if need_weights else None)

    def init_cache(self, encoder_out: EncoderOutput) -> DecoderCache:
        """An empty cache whose cross-attention K/V are the source memory, projected once per layer."""
        memory = encoder_out.memory
        cross = [layer.cross_attn.project_key_value(memory) for layer in self.decoder.layers]
        empty = memory.new_zeros(memory.size(0), 0, 0, 0)  # a zero-length cache: the first step adds nothing
        self_attn = [KVCache(empty, empty) for _ in self.decoder.layers]
        tgt_valid = torch.zeros(memory.size(0), 0, dtype=torch.bool, device=memory.device)
        return DecoderCache(self_attn, cross, tgt_valid)

    def init_slot_cache(self, encoder_out: EncoderOutput, max_len: int) -> SlotDecoderCache:
        """A :class:`SlotDecoderCache` for hypotheses of up to ``max_len`` tokens (BOS included), at position 0."""
        if max_len > self.max_positions:
            raise ValueError(f"init_slot_cache: max_len={max_len} is beyond model.max_positions={self.max_positions}")
        memory = encoder_out.memory
        cross = [layer.cross_attn.project_key_value(memory) for layer in self.decoder.layers]
        position = torch.zeros(1, dtype=torch.long, device=memory.device)
        attn = self.decoder.layers[0].self_attn  # every decoder layer has the same sizes
        slots_kv = cross[0].key.new_zeros(len(cross), 2, memory.size(0), attn.n_heads, max_len, attn.d_head)
        self_attn = [SlotCache(layer[0], layer[1], position) for layer in slots_kv]
        src_mask = key_mask(encoder_out.src_mask)
        if src_mask.has_key is not None and bool(src_mask.has_key.all()):  # read once here, to spare every step
            src_mask = KeyMask.with_a_key_in_every_row(src_mask.allowed)
        return SlotDecoderCache(self_attn, cross, position, torch.arange(max_len, device=memory.device), slots_kv,
                                src_mask)

    def decode(self, tgt_in: Tensor, encoder_out: EncoderOutput, cache: DecoderCache | SlotDecoderCache | None = None,
               need_weights: bool = False) -> DecoderOutput:
        """Decoder pass over ``tgt_in`` and the output projection.

        Args:
            tgt_in: (batch, tgt_len) ids. Without ``cache``: the whole teacher-forced input (causal and
                padding masks from pad_id). With ``cache``: only the new tokens (usually tgt_len = 1),
                at positions ``cache.length …``.
            encoder_out: from :meth:`encode` (selected to the same rows as ``cache``).
            cache: from :meth:`init_cache` or a previous ``decode``; None for a full pass. Or a
                :class:`SlotDecoderCache` from :meth:`init_slot_cache` (one token a step, written in place and
                the position advanced; the same cache object is returned; self-attention weights cover every slot).
            need_weights: return self- and cross-attention weights of every layer.

        Returns:
            :class:`DecoderOutput`; its ``cache`` is the extended cache (None when none was given).
        """
        if isinstance(cache, SlotDecoderCache):
            written = (cache.slots <= cache.position)[None, None, None, :]  # (1, 1, 1, max_len); slot 0 always is
            states = self.decoder(tgt_in, encoder_out.memory, KeyMask.with_a_key_in_every_row(written), cache.src_mask,
                                  offset=cache.position, caches=cache, need_weights=need_weights)
            cache.position.add_(1)
            return DecoderOutput(self.project(states.hidden), cache, states.self_attentions or None,
                                 states.cross_attentions or None)
        if cache is None:
            offset, tgt_valid = 0, None
            self_mask = decoder_self_mask(tgt_in, self.pad_id)  # (batch, 1, tgt_len, tgt_len)
        else:
            offset = cache.length
            tgt_valid = torch.cat([cache.tgt_valid, tgt_in != self.pad_id], dim=1)  # (batch, total_tgt_len)
            self_mask = cached_decoder_self_mask(tgt_in.size(1), tgt_valid)  # (batch, 1, tgt_len, total_tgt_len)
        states = self.decoder(tgt_in, encoder_out.memory, self_mask, encoder_out.src_mask, offset=offset, caches=cache,
                              need_weights=need_weights)
        new_cache = None if cache is None else DecoderCache(states.self_caches, cache.cross_attn, tgt_valid)
        return DecoderOutput(self.project(states.hidden), new_cache,
                             states.self_attentions if need_weights else None,
                             states.cross_attentions if need_weights else None)

    def output_layer(self) -> tuple[Tensor, Tensor | None]:
        """The pre-softmax projection's weight (tgt_vocab, d_model) and bias (None here)."""
        if self.output_proj is None:
            return self.decoder.embed.token.weight, None
        return self.output_proj.weight, self.output_proj.bias

    def project(self, hidden: Tensor) -> Tensor:
        """Decoder states (batch, tgt_len, d_model) -> logits (batch, tgt_len, tgt_vocab)."""
        return F.linear(hidden, *self.output_layer())


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> Transformer:
    """Build a freshly initialised :class:`Transformer` from its config (GloVe is applied by the caller)."""
    return Transformer(cfg, src_vocab_size, tgt_vocab_size, pad_id)
