"""The choices of the configuration: one ``Enum`` per setting that takes a name, so that Hydra lists the valid
values when given another. The dataclass schemas that use them are in ``transformer.config``, which names them too.
"""

import enum


class CorpusKind(enum.Enum):
    multi30k = "multi30k"  # downloaded (or copied from data.source_dir) and checksum-verified
    custom = "custom"  # any folder of {split}.{lang}[.gz] files


class TokenizerKind(enum.Enum):
    sentencepiece = "sentencepiece"
    word = "word"


class SentencePieceModel(enum.Enum):
    bpe = "bpe"
    unigram = "unigram"


class NormPosition(enum.Enum):
    pre = "pre"  # LayerNorm before each sub-layer (stable without long warm-up)
    post = "post"  # LayerNorm after the residual add, as in Vaswani et al. (2017)


class PositionKind(enum.Enum):
    sinusoidal = "sinusoidal"  # fixed absolute positions added to the embeddings (the paper's §3.5)
    learned = "learned"  # a trained absolute position table added to the embeddings
    relative = "relative"  # learned vectors per clipped distance j - i in self-attention scores (Shaw et al., 2018)
    rope = "rope"  # rotary: self-attention queries and keys rotated by their positions (Su et al., 2021)
    none = "none"  # no position information (the decoder's causal mask still orders the target)


class AttentionScore(enum.Enum):
    scaled_dot = "scaled_dot"  # q·k / √d_head (the paper's §3.2.1)
    additive = "additive"  # vᵀ tanh(W_q x + W_k y) (Bahdanau et al., 2015)
    multiplicative = "multiplicative"  # qᵀ W k (Luong et al., 2015, "general")


class Activation(enum.Enum):
    relu = "relu"
    gelu = "gelu"


class GloveSide(enum.Enum):
    src = "src"
    tgt = "tgt"
    both = "both"


class Schedule(enum.Enum):
    inverse_sqrt = "inverse_sqrt"  # linear warm-up, then lr * sqrt(warmup / step) (the paper's shape)
    cosine = "cosine"  # linear warm-up, then cosine decay to min_lr at max_steps
    constant = "constant"  # linear warm-up, then flat


class Precision(enum.Enum):
    auto = "auto"  # bf16 autocast on CUDA, fp32 on CPU
    fp32 = "fp32"
    bf16 = "bf16"


class LengthNorm(enum.Enum):
    gnmt = "gnmt"  # score / ((5 + len) / 6) ** alpha  (Wu et al., 2016)
    average = "average"  # score / len
    none = "none"
