"""SpanDrop on sentence-classification items: every token but [CLS]/[SEP] may go; segment A's length follows."""
import numpy as np

from ..spandrop.finetune import SpanDropWrapper


class ClassificationSpanDropDataset(SpanDropWrapper):
    """SpanDrop on ``ClassificationDataset`` items: every token but [CLS]/[SEP] may go; segment A's length follows."""

    def drop(self, item, index, rng):
        tokens = item["source"].numpy()
        keep = self.dropper.token_keep(tokens, ~self.dropper.special[tokens], np.zeros(len(tokens), bool), rng)
        out = self.dropper.apply(item["source"], keep)
        # the token closing segment A is [SEP], always kept
        return dict(item, source=out.source, segment_a=int(out.new_position[item["segment_a"] - 1]) + 1)
