"""The relation-classification head: [CLS] pooling (SpanBERT) or entity-start pooling."""
import torch
from torch import nn

from .dropout import Dropout

RE_POOLINGS = ("cls", "entity_start")


class RelationHead(nn.Module):
    """dense -> tanh -> dropout -> out_proj over [CLS], or over [subject start; object start] (2H).

    ``entity_start`` concatenates the encoder outputs at the subject and object
    start markers (Baldini Soares et al. 2019; Zhou & Chen 2021).
    """

    def __init__(self, hidden, num_classes, pooling, dropout):
        super().__init__()
        if pooling not in RE_POOLINGS:
            raise ValueError(f"unknown relation pooling {pooling!r}; expected one of {', '.join(RE_POOLINGS)}")
        self.pooling = pooling
        self.dense = nn.Linear(2 * hidden if pooling == "entity_start" else hidden, hidden)
        self.dropout = Dropout(dropout)
        self.out_proj = nn.Linear(hidden, num_classes)

    def forward(self, features, entity_positions=None):
        """``features`` B x T x H; ``entity_positions`` B x 2 (subject, object start markers)."""
        if self.pooling == "cls":
            pooled = features[:, 0]
        else:
            if entity_positions is None:
                raise ValueError("entity_start pooling needs entity_positions (B x 2)")
            rows = torch.arange(features.size(0), device=features.device).unsqueeze(1)
            pooled = features[rows, entity_positions].flatten(1)
        return self.out_proj(self.dropout(torch.tanh(self.dense(pooled))))

    @staticmethod
    def pooling_of(dense_weight: torch.Tensor) -> str:
        """The pooling of a saved head, from its dense layer's input width."""
        out_dim, in_dim = dense_weight.shape
        return "entity_start" if in_dim == 2 * out_dim else "cls"
