"""``hub.coref(text)``: coreference clusters of raw text with a coreference checkpoint."""
import torch

from ..model.hub_interface import check_text, register_hub_feature
from .predict import resolve_text, text_line_breaks


@register_hub_feature("coref")
def hub_coref(hub, text: str, genre=None, join_wrapped_lines: bool = False):
    """Clusters of ``text`` in the order of their first mentions, each a list of ``{text, start, end}`` (character
    offsets, end exclusive), as ``spanbert-predict-coref --text`` gives them: each line a sentence, or with
    ``join_wrapped_lines`` (its ``--join-wrapped-lines``) only blank lines end paragraphs. ``genre``: an OntoNotes
    genre (bc bn mz nw pt tc wb) or ``other``, by default ``task.raw_text_genre()`` (one the checkpoint trained;
    ``other`` for a checkpoint that does not record its genres)."""
    if getattr(hub.model, "coref_head", None) is None:
        raise ValueError("this checkpoint has no coreference head; fine-tune it with --task coreference first")
    check_text("coref", "text", text)
    with torch.no_grad():
        return resolve_text(hub.model, hub.task, hub.tokenizer, text, text_line_breaks(join_wrapped_lines),
                            genre=genre)
