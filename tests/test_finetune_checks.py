"""Fine-tuning safeguards: vocabulary checks on loading, scores that agree with predictions, resumable randomness."""
import os

import pytest
import torch

from spanbert_plugin.data.dictionary import SpanBertDictionary
from spanbert_plugin.errors import UsageError


def _tiny_model(dictionary):
    from spanbert_plugin.models.spanbert import SpanBertConfig, SpanBertEncoder, SpanBertModel

    cfg = SpanBertConfig(encoder_layers=1, encoder_embed_dim=32, encoder_ffn_embed_dim=64,
                         encoder_attention_heads=2, max_positions=64)
    return SpanBertModel(cfg, SpanBertEncoder(cfg, dictionary))


# --- checkpoint vocabulary against the data's dict.txt -------------------------------------------------------------

def test_checkpoint_from_another_tokenizer_is_refused_naming_both(spm_data, wordpiece_data):
    """A sentencepiece checkpoint over WordPiece data (more symbols): one line naming both tokenizers and files."""
    spm_dict = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt"))
    wp_dict = SpanBertDictionary.load(os.path.join(wordpiece_data, "dict.txt"))
    assert len(wp_dict) > len(spm_dict)
    with pytest.raises(UsageError) as err:
        _tiny_model(wp_dict).load_state_dict(_tiny_model(spm_dict).state_dict())
    message = str(err.value)
    assert "\n" not in message and "does not start with the checkpoint's vocabulary" in message
    assert f"sentencepiece ({os.path.join(spm_data, 'spm.model')}); {len(spm_dict)} symbols" in message
    assert f"wordpiece ({os.path.join(wordpiece_data, 'vocab.txt')}); {len(wp_dict)} symbols" in message


def test_same_size_vocabulary_with_other_symbols_is_refused(spm_data):
    """Equal sizes are not enough: two symbols swapped is another vocabulary."""
    symbols = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt")).symbols
    swapped = list(symbols)
    swapped[10], swapped[11] = swapped[11], swapped[10]
    with pytest.raises(UsageError, match="symbol 10 is"):
        _tiny_model(SpanBertDictionary(swapped)).load_state_dict(_tiny_model(SpanBertDictionary(symbols)).state_dict())


def test_appended_symbols_grow_and_the_record_follows(spm_data):
    """Symbols appended (entity markers) extend the checkpoint's vocabulary; the new model records the grown one."""
    symbols = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt")).symbols
    grown = SpanBertDictionary(symbols + ["[SUBJ-PERSON]", "[OBJ-CITY]"])
    model = _tiny_model(grown)
    model.load_state_dict(_tiny_model(SpanBertDictionary(symbols)).state_dict())
    assert model.vocabulary.symbol_hashes.shape == (len(grown),)
    assert model.encoder.embeddings.word_embeddings.weight.shape[0] == len(grown)
    # the grown checkpoint loads into a model over the same dictionary, and refuses the shorter one
    _tiny_model(grown).load_state_dict(model.state_dict())
    with pytest.raises(UsageError, match=f"has {len(grown)} symbols but the data's dict.txt has {len(symbols)}: "
                                         "the checkpoint was trained with"):
        _tiny_model(SpanBertDictionary(symbols)).load_state_dict(model.state_dict())


def test_checkpoint_without_vocabulary_record_is_checked_by_size(spm_data, wordpiece_data):
    """Checkpoints written before the record: a larger data vocabulary still loads (grown), a smaller one is refused."""
    spm_dict = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt"))
    wp_dict = SpanBertDictionary.load(os.path.join(wordpiece_data, "dict.txt"))
    old_style = {k: v for k, v in _tiny_model(spm_dict).state_dict().items() if not k.startswith("vocabulary.")}
    model = _tiny_model(wp_dict)
    model.load_state_dict(dict(old_style))
    assert torch.equal(model.encoder.embeddings.word_embeddings.weight[: len(spm_dict)],
                       old_style["encoder.embeddings.word_embeddings.weight"])
    smaller = SpanBertDictionary(spm_dict.symbols[:-5])
    with pytest.raises(UsageError, match=f"has {len(spm_dict)} symbols but the data's dict.txt has {len(smaller)}"):
        _tiny_model(smaller).load_state_dict(dict(old_style))
