"""A BERT encoder whose parameter names and shapes mirror HuggingFace ``BertModel``.

Post-LayerNorm blocks, exact (erf) GeLU, learned absolute positions counted from
0, token-type embeddings, embedding LayerNorm, LayerNorm eps 1e-12: state dict
keys map one-to-one onto ``transformers.BertModel`` (``embeddings.*`` and
``encoder.layer.N.*``), which the HuggingFace export and import rely on.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..core.cpu_paths import cpu_path
from ..core.errors import UsageError
from .dropout import Dropout, dropout


class BertEmbeddings(nn.Module):
    """Word + position (from 0) + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size, hidden, max_positions, type_vocab_size, pad_index, eps, dropout):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden, padding_idx=pad_index)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = Dropout(dropout)

    def forward(self, tokens, token_types=None):
        # the first T rows of the position table: a view, where a lookup of arange(T) costs two operators
        x = self.word_embeddings(tokens) + self.position_embeddings.weight[: tokens.size(1)]
        if token_types is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_types)
        return self.dropout(self.LayerNorm(x))


class _SelfAttention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)


class _DenseNorm(nn.Module):
    def __init__(self, d_in, d_out, eps):
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=eps)


class _Attention(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.self = _SelfAttention(hidden)
        self.output = _DenseNorm(hidden, hidden, eps)


class _Intermediate(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.dense = nn.Linear(hidden, ffn)


class BertLayer(nn.Module):
    """Post-LN transformer block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, hidden, heads, ffn, eps, dropout, attention_dropout):
        super().__init__()
        if hidden % heads:
            raise UsageError(f"--encoder-embed-dim {hidden} must be divisible by --encoder-attention-heads {heads}")
        self.heads = heads
        self.attention = _Attention(hidden, eps)
        self.intermediate = _Intermediate(hidden, ffn)
        self.output = _DenseNorm(ffn, hidden, eps)
        self.dropout = dropout
        self.attention_dropout = attention_dropout

    def forward(self, x, attn_mask=None, drop_mask=None, return_probs=False):
        """``attn_mask``: B x 1 x 1 x T, True = may attend (or additive: 0 or -inf); ``drop_mask``: B x heads x T x T,
        True = drop (AD-DROP).

        Returns the new hidden states, and with ``return_probs`` also the post-softmax
        attention probabilities (B x heads x T x T), computed explicitly so that
        gradients can be taken with respect to them; otherwise the fused
        ``scaled_dot_product_attention`` runs.
        """
        B, T, H = x.shape
        sa = self.attention.self

        def split(t):
            return t.view(B, T, self.heads, H // self.heads).transpose(1, 2)

        q, k, v = split(sa.query(x)), split(sa.key(x)), split(sa.value(x))
        dropout_p = self.attention_dropout if self.training else 0.0
        if drop_mask is not None:
            attn_mask = additive_drop_mask(drop_mask, attn_mask, q.dtype)
        probs = None
        # on a CPU, attention dropout costs less as our dropout on explicit probabilities than inside the fused kernel
        if return_probs or (dropout_p > 0 and cpu_path(q)):
            scores = torch.matmul(q * (q.size(-1) ** -0.5), k.transpose(-1, -2))
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            elif attn_mask is not None:
                scores = scores + attn_mask
            # softmax in the scores' dtype (its kernels accumulate in fp32), not in autocast's fp32 copy of them
            with torch.autocast(q.device.type, enabled=False):
                probs = torch.softmax(scores, dim=-1)
            ctx = torch.matmul(dropout(probs, dropout_p, self.training), v)
        else:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        ctx = ctx.transpose(1, 2).reshape(B, T, H)
        out = self.attention.output
        x = out.LayerNorm(x + dropout(out.dense(ctx), self.dropout, self.training))
        h = F.gelu(self.intermediate.dense(x))
        x = self.output.LayerNorm(x + dropout(self.output.dense(h), self.dropout, self.training))
        return (x, probs) if return_probs else x


def additive_drop_mask(drop_mask, attn_mask, dtype):
    """Float attention mask: the dtype's most negative finite value on dropped keys, -inf on padding, 0 elsewhere.

    Finite on dropped keys so that a row whose every real key is dropped still has
    a finite softmax (uniform over its real keys); padding stays excluded.
    """
    additive = torch.zeros(drop_mask.shape, dtype=dtype, device=drop_mask.device)
    additive.masked_fill_(drop_mask, torch.finfo(dtype).min)
    if attn_mask is not None:
        additive.masked_fill_(~attn_mask, float("-inf"))
    return additive


def padding_mask_of(tokens, padding_idx, has_padding=None):
    """B x T, True on padding, or None where there is none. ``has_padding`` as the data loader says; unsaid, a CPU
    is asked (a GPU is not: the host would wait for it, and the mask applied to a batch without padding gives the
    same result)."""
    if has_padding is False:
        return None
    padding_mask = tokens.eq(padding_idx)
    if has_padding is None and cpu_path(padding_mask) and not padding_mask.any():
        return None
    return padding_mask


def additive_padding_mask(padding_mask, x):
    """``padding_mask`` (B x T, True = padding) as the additive B x 1 x 1 x T mask attention would make of it: 0
    where a key may be attended, -inf on padding, in the dtype of the layers' queries (autocast's where it is on)."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    batch, length = padding_mask.shape
    return torch.zeros((batch, 1, 1, length), dtype=dtype, device=x.device).masked_fill_(
        padding_mask[:, None, None, :], float("-inf"))


class BertStack(nn.Module):
    """``encoder.layer.N`` as in HuggingFace."""

    def __init__(self, layers, **layer_args):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(**layer_args) for _ in range(layers)])

    def forward(self, x, padding_mask=None, attention_probs_out=None, attention_drop_masks=None):
        """``attention_probs_out``: a dict whose keys are layer indices, filled with those layers' attention
        probabilities; ``attention_drop_masks``: {layer index: B x heads x T x T bool, True = drop}."""
        # ``padding_mask`` None: no padding, the fused attention runs unmasked (SpanBertEncoder.forward decides)
        if not attention_probs_out and not attention_drop_masks:  # the plain, fused path
            # additive once here, where attention would convert a boolean one in every layer
            attn_mask = None if padding_mask is None else additive_padding_mask(padding_mask, x)
            for layer in self.layer:
                x = layer(x, attn_mask)
            return x
        attn_mask = None if padding_mask is None else ~padding_mask[:, None, None, :]  # True = may attend
        drop_masks = attention_drop_masks or {}
        for index, layer in enumerate(self.layer):
            if attention_probs_out is not None and index in attention_probs_out:
                # eager even under --compile: a compiled layer returns its probabilities beside its output, not on the
                # path to it, and AD-DROP's gradient with respect to them would find them unused
                x, attention_probs_out[index] = layer.forward(x, attn_mask, return_probs=True)
            else:
                x = layer(x, attn_mask, drop_mask=drop_masks.get(index))
        return x


class MaskedLMHead(nn.Module):
    """dense -> GeLU -> LayerNorm -> decoder tied to the input embeddings (+ own bias)."""

    def __init__(self, hidden, embed_weight, eps):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.weight = embed_weight
        self.bias = nn.Parameter(torch.zeros(embed_weight.size(0)))

    def forward(self, x):
        x = self.LayerNorm(F.gelu(self.dense(x)))
        return F.linear(x, self.weight, self.bias)


class SpanBoundaryHead(nn.Module):
    """SBO (SPEC §1.2): [x_left; x_right; p_offset] -> 2 x (Linear, GeLU, LayerNorm) -> tied decoder."""

    def __init__(self, hidden, embed_weight, position_slots, position_dim, eps):
        super().__init__()
        self.position_slots = position_slots
        self.position_embeddings = nn.Embedding(position_slots, position_dim)
        self.dense1 = nn.Linear(2 * hidden + position_dim, hidden)
        self.LayerNorm1 = nn.LayerNorm(hidden, eps=eps)
        self.dense2 = nn.Linear(hidden, hidden)
        self.LayerNorm2 = nn.LayerNorm(hidden, eps=eps)
        self.weight = embed_weight
        self.bias = nn.Parameter(torch.zeros(embed_weight.size(0)))

    def forward(self, left, right, offset):
        """``offset`` is 1-based (p_1 is the slot of the token right after the left boundary)."""
        h = torch.cat([left, right, self.position_embeddings(offset - 1)], dim=-1)
        h = self.LayerNorm1(F.gelu(self.dense1(h)))
        h = self.LayerNorm2(F.gelu(self.dense2(h)))
        return F.linear(h, self.weight, self.bias)


class ClassificationHead(nn.Module):
    """BERT-style sentence classifier on the first token: dense -> tanh -> dropout -> out_proj."""

    def __init__(self, hidden, inner_dim, num_classes, dropout):
        super().__init__()
        self.dense = nn.Linear(hidden, inner_dim)
        self.dropout = Dropout(dropout)
        self.out_proj = nn.Linear(inner_dim, num_classes)

    def forward(self, features):
        x = torch.tanh(self.dense(features[:, 0]))
        return self.out_proj(self.dropout(x))


def init_bert_weights(module, std=0.02):
    """BERT initialisation: N(0, std) weights, zero biases, unit LayerNorms, zero pad embedding."""
    if isinstance(module, nn.Linear):
        module.weight.data.normal_(0.0, std)
        if module.bias is not None:
            module.bias.data.zero_()
    elif isinstance(module, nn.Embedding):
        module.weight.data.normal_(0.0, std)
        if module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        module.weight.data.fill_(1.0)
        module.bias.data.zero_()
