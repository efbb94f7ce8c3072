"""The training objective, wrapped around the model as fairseq's criteria wrap theirs.

:class:`TranslationObjective` is what a training step calls (and what DDP, ``torch.compile`` and CUDA graphs wrap,
so that their hooks run): the model's decoder states, then the label-smoothed loss with the output projection
fused into it (:func:`transformer.training.loss.projected_label_smoothed_sums`: the logits are never held whole),
over the real target positions or, for a CUDA graph, densely with the padding weighted by zero; with R-Drop the
batch runs twice and the loss adds the two predictions' symmetric KL divergence.

It holds no parameters of its own: its state dict is the model's under ``model.``, and its parameters are the
model's in the model's order (an optimizer built on the model pairs its moments with the same tensors).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer.model.transformer import Transformer
from transformer.training.loss import CPU_LOSS_CHUNK, projected_label_smoothed_sums


class TranslationObjective(nn.Module):
    """Label-smoothed cross-entropy of a :class:`Transformer`'s next-token predictions (and R-Drop).

    Args:
        model: the network.
        label_smoothing: eps of the label-smoothed loss.
        r_drop: > 0: R-Drop with this weight (Liang et al., 2021): two passes with independent dropout.
        loss_chunk: positions per chunk of the fused projection and loss.
    """

    def __init__(self, model: Transformer, *, label_smoothing: float, r_drop: float = 0.0,
                 loss_chunk: int = CPU_LOSS_CHUNK) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing, self.r_drop, self.loss_chunk = label_smoothing, r_drop, loss_chunk

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, target_positions: Tensor | None = None, *,
                dense: bool = False) -> tuple[Tensor, Tensor]:
        """The summed loss and NLL of a batch.

        Args:
            src: (batch, src_len) ids; tgt_in: (batch, tgt_len) BOS + target ids, right-padded.
            tgt_out: (batch, tgt_len) target + EOS ids.
            target_positions: (n,) flat indices of the real positions of ``tgt_out`` (``Batch.target_positions``;
                without them the padding is found by ``pad_id``, which waits for the device).
            dense: project every position, padding weighted by 0 (``target_positions`` unused): shapes that depend
                only on the batch's shape, for a CUDA graph.

        Returns:
            ``(loss_sum, nll_sum)``, float32 scalars summed over the real positions (only ``loss_sum`` carries a
            gradient).
        """
        if self.r_drop > 0:  # the batch twice, as (2 * batch) rows
            if target_positions is not None:
                target_positions = torch.cat([target_positions, target_positions + tgt_out.numel()])
            src, tgt_in, tgt_out = (torch.cat([t, t]) for t in (src, tgt_in, tgt_out))
        hidden = self.model.hidden_states(src, tgt_in)  # (batch, tgt_len, d_model)
        return projected_label_smoothed_sums(hidden, *self.model.output_layer(), tgt_out,
                                             smoothing=self.label_smoothing, pad_id=self.model.pad_id,
                                             chunk_size=self.loss_chunk, positions=target_positions, dense=dense,
                                             consistency=self.r_drop)
