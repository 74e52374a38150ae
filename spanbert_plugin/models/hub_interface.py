"""A fairseq-style hub interface for spanbert checkpoints (like ``RobertaHubInterface``)."""
import os
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..tokenization import load_tokenizer

USER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "user_dir")
MASK_PLACEHOLDER = "<mask>"


def load_hub_model(model_dir, checkpoint_file="checkpoint_best.pt", data_name_or_path=None, **overrides):
    """Load a spanbert checkpoint and its task; the data folder holds dict.txt and the tokenizer files."""
    from fairseq import checkpoint_utils

    path = checkpoint_file if os.path.isabs(checkpoint_file) else os.path.join(model_dir, checkpoint_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such checkpoint")
    if data_name_or_path is None:
        if os.path.isfile(os.path.join(model_dir, "dict.txt")):
            data_name_or_path = model_dir
        else:  # the data folder recorded at training time
            state = checkpoint_utils.load_checkpoint_to_cpu(path, {"user_dir": USER_DIR})
            data_name_or_path = state["cfg"]["task"]["data"].split(":")[0]
    elif not os.path.isabs(data_name_or_path):
        data_name_or_path = os.path.join(model_dir, data_name_or_path)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data_name_or_path, "user_dir": USER_DIR, **overrides}
    )
    return SpanBertHubInterface(cfg, task, models[0], data_name_or_path)


class SpanBertHubInterface(nn.Module):
    """encode/decode text, extract features, fill masks and run classification heads."""

    def __init__(self, cfg, task, model, data_dir):
        super().__init__()
        self.cfg, self.task, self.model = cfg, task, model
        self.dictionary = task.source_dictionary
        self.tokenizer = load_tokenizer(data_dir)
        self.register_buffer("_float_tensor", torch.tensor([0], dtype=torch.float))
        self.eval()

    @property
    def device(self):
        return self._float_tensor.device

    def encode(self, text: str, *addl_texts: str) -> torch.LongTensor:
        """``[CLS] text [SEP] (addl [SEP])*`` as token ids of the training dictionary."""
        d = self.dictionary
        ids = [d.bos()] + self.tokenizer.encode(text).ids.tolist() + [d.eos()]
        for extra in addl_texts:
            ids += self.tokenizer.encode(extra).ids.tolist() + [d.eos()]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, tokens: torch.LongTensor) -> str:
        """Text of token ids, without the begin/end tokens and padding."""
        d = self.dictionary
        drop = {d.bos(), d.eos(), d.pad()}
        return self.tokenizer.decode([t for t in tokens.tolist() if t not in drop])

    def _batch(self, tokens):
        tokens = tokens.unsqueeze(0) if tokens.dim() == 1 else tokens
        if tokens.size(-1) > self.model.max_positions():
            raise ValueError(f"{tokens.size(-1)} tokens exceed the model's {self.model.max_positions()} positions")
        return tokens.to(self.device)

    def extract_features(self, tokens: torch.LongTensor, segment_labels=None) -> torch.Tensor:
        """Final hidden states, B x T x H."""
        features, _ = self.model(self._batch(tokens), segment_labels=segment_labels, features_only=True)
        return features

    @torch.no_grad()
    def fill_mask(self, masked_input: str, topk: int = 5):
        """Fill the single ``<mask>`` in the text: [(filled text, probability, predicted token)]."""
        if masked_input.count(MASK_PLACEHOLDER) != 1:
            raise ValueError(f"fill_mask needs exactly one {MASK_PLACEHOLDER} in the input")
        before, after = masked_input.split(MASK_PLACEHOLDER)
        d = self.dictionary
        ids = ([d.bos()] + self.tokenizer.encode(before.rstrip()).ids.tolist() + [d.mask_index]
               + self.tokenizer.encode(after).ids.tolist() + [d.eos()])
        tokens = torch.tensor(ids, dtype=torch.long)
        masked = (tokens == d.mask_index).unsqueeze(0).to(self.device)
        out, _ = self.model(self._batch(tokens), masked_tokens=masked)
        probs = F.softmax(out["mlm_logits"][0].float(), dim=-1)
        values, indices = probs.topk(topk)
        results = []
        for p, idx in zip(values.tolist(), indices.tolist()):
            filled = tokens.clone()
            filled[tokens == d.mask_index] = idx
            results.append((self.decode(filled), p, d[idx]))
        return results

    def register_classification_head(self, name: str, num_classes: Optional[int] = None, **kwargs):
        self.model.register_classification_head(name, num_classes=num_classes, **kwargs)

    def predict(self, head: str, tokens: torch.LongTensor, return_logits: bool = False):
        """Log-probabilities (or logits) of a classification head on [CLS]."""
        logits, _ = self.model(self._batch(tokens), classification_head_name=head)
        return logits if return_logits else F.log_softmax(logits, dim=-1)
