"""Character offsets of both tokenizers on text that normalisation changes: the spans cut by them are whole characters.

WordPiece's accent stripping drops combining marks (decomposed accents, Devanagari vowel signs) and sentencepiece's
NFKC turns zero-width characters into the space its '▁' stands for; answer texts are cut from the context by these
offsets (extractive QA), and entity words are found by them (relation extraction).
"""

import numpy as np
import pytest

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "we", "ate", "at", "the", "cafe", "today", ".", "what", "?",
         "म", "##झ", "ह", "##ि", "##न", "##द", "##ी", "ง", "##า", "##ย", "हा", "ल", "##ो", "##ग"]


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    from spanbert_plugin.core.tokenization import WordPieceTokenizer

    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return WordPieceTokenizer(str(path), lowercase=True)


def test_wordpiece_offsets_keep_the_combining_marks_accent_stripping_drops(wordpiece):
    text = "we ate at the cafe\u0301 today. मुझे हिन्दी ง่าย"
    enc = wordpiece.encode(text)
    pieces = {token: text[start:end] for token, (start, end) in zip(enc.tokens, enc.offsets)}
    assert pieces["cafe"] == "cafe\u0301"  # was "cafe": the accent cut off
    assert pieces["##झ"] == "झे" and pieces["म"] == "मु"  # was "झ" and "म": the vowel signs no token holds
    assert pieces["ง"] == "ง\u0e48"  # Thai tone mark
    assert pieces["##ि"] == "ि"  # a spacing mark a token keeps stays that token's
    ends = [end for _, end in enc.offsets]
    starts = [start for start, _ in enc.offsets]
    assert all(end <= following for end, following in zip(ends, starts[1:]))  # never overlapping


def test_wordpiece_offsets_cover_a_dropped_mark_after_a_kept_spacing_mark(wordpiece):
    """Hindi "हाँ" and "लोगों": the token keeps the spacing vowel sign (category Mc) and accent stripping drops the
    candrabindu or anusvara (Mn) after it; the token's end is inside the run of marks, not at its start."""
    text = "हाँ लोगों"
    enc = wordpiece.encode(text)
    assert enc.tokens == ["हा", "ल", "##ो", "##ग", "##ो"]
    assert [text[start:end] for start, end in enc.offsets] == ["हाँ", "ल", "ो", "ग", "ों"]  # were "हा" and "ो"

def test_qa_answer_with_a_decomposed_accent_comes_back_whole(wordpiece):
    """Oracle round trip: the gold token span put in as logits gives back the gold text, accent included."""
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.qa.postprocess import postprocess
    from spanbert_plugin.qa.prepare import QAConfig, QAFile, featurize

    context = "we ate at the cafe\u0301 today. मुझे"
    golds = ["cafe\u0301", "मुझे"]
    questions = [{"id": str(i), "question": "what ?", "context_index": 0, "answers": [g], "is_impossible": False}
                 for i, g in enumerate(golds)]
    starts = np.array([context.index(g) for g in golds])
    qa = QAFile("<test>", "squad1", False, [context], questions, ["<test>"] * 2, starts, starts + [len(g) for g in golds])
    dictionary = SpanBertDictionary.from_tokenizer(wordpiece)
    features = featurize(qa, wordpiece, dictionary.bos(), dictionary.eos(), QAConfig(64, 16, 8), training=False)
    split = features.split
    assert features.stats["answers_not_aligned"] == 0
    width = int(np.diff(features.window_offsets).max())
    start, end = np.zeros((split.num_windows, width)), np.zeros((split.num_windows, width))
    rows = np.arange(split.num_windows)
    start[rows, split.start_positions] = 10
    end[rows, split.end_positions] = 10
    result = postprocess(split, rows, start, end)
    assert [result.predictions[str(i)] for i in range(2)] == golds
    for i, gold in enumerate(golds):
        best = result.nbest[str(i)][0]
        assert (best["start"], best["end"]) == (context.index(gold), context.index(gold) + len(gold))


def test_sentencepiece_offsets_leave_out_the_zero_width_characters_before_a_word(spm_data):
    from spanbert_plugin.core.tokenization import SPM_WORD_PREFIX, load_tokenizer

    tokenizer = load_tokenizer(spm_data)
    text = "the value\u200b of a\u200bb and \ufeffthe list\u200b \u200bis"
    enc = tokenizer.encode(text)
    for token, (start, end) in zip(enc.tokens, enc.offsets):
        if token.startswith(SPM_WORD_PREFIX) and start < end:
            assert text[start] not in "\u200b\ufeff ", (token, text[start:end])
    starts = {start for start, end in enc.offsets if start < end}
    # each word starts a token at its first letter (was: at the zero-width character, or the space, before it)
    for word in ("of", "b", "the list", "is"):
        assert text.rindex(word) in starts, word



def test_sentencepiece_piece_of_an_invisible_character_inside_a_word_keeps_it(spm_data):
    """Only a word-initial piece's '\u2581' stands for the invisible characters before it: a piece inside a word that
    stands for an invisible character normalisation keeps (U+2060 WORD JOINER, U+00AD SOFT HYPHEN) spans that
    character, so every character of the text but the spaces lies in exactly one token, none empty."""
    from spanbert_plugin.core.tokenization import load_tokenizer

    tokenizer = load_tokenizer(spm_data)
    for text in ("value\u2060list", "the value\u00adof"):
        enc = tokenizer.encode(text)
        covered = [i for start, end in enc.offsets for i in range(start, end)]
        assert all(start < end for start, end in enc.offsets), (enc.tokens, enc.offsets)
        assert sorted(covered) == [i for i, c in enumerate(text) if c != " "], (enc.tokens, enc.offsets)


def test_relation_entity_after_a_zero_width_word_keeps_its_own_tokens(spm_data):
    """A TACRED word of a zero-width space before the object: the marker wraps the object's tokens, not the word
    before it (the zero-width character used to pull the next word's first piece into the word before it)."""
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.tokenization import load_tokenizer
    from spanbert_plugin.relation.prepare import RelationEncoder, RelationExample

    tokenizer = load_tokenizer(spm_data)
    dictionary = SpanBertDictionary.from_tokenizer(tokenizer)
    encoder = RelationEncoder(tokenizer, dictionary, "typed_marker", 64)
    for marker in encoder.markers.appended:
        dictionary.add_symbol(marker, n=0)
    words = ["value", "\u200b", "list", "of", "the", "value"]
    example = RelationExample("x", words, {"SUBJ": (0, 0), "OBJ": (2, 2)}, {"SUBJ": "PERSON", "OBJ": "CITY"}, "r")
    ids, _, _, _, _ = encoder.encode(example, "test")
    symbols = [dictionary[i] for i in ids]
    inside = symbols[symbols.index("[OBJ-CITY]") + 1: symbols.index("[/OBJ-CITY]")]
    assert tokenizer.sp.decode([dictionary.index(s) for s in inside]).strip() == "list"


@pytest.mark.parametrize("mode", ["typed_marker", "typed_marker_punct"])
def test_relation_mentions_without_tokens_are_counted_and_warned_about(spm_data, mode, caplog):
    """A mention of only zero-width or space characters has no token: its markers enclose nothing. That is said in
    one warning naming the first such example and counted in the split's statistics, not passed over in silence."""
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.tokenization import load_tokenizer
    from spanbert_plugin.relation.prepare import RelationEncoder, RelationExample, encode_split

    tokenizer = load_tokenizer(spm_data)
    dictionary = SpanBertDictionary.from_tokenizer(tokenizer)
    encoder = RelationEncoder(tokenizer, dictionary, mode, 64)
    words = ["the", "\u200b", "value", "of", "\u00a0", "list"]
    examples = [RelationExample("fine", words, {"SUBJ": (2, 2), "OBJ": (5, 5)}, {"SUBJ": "PERSON", "OBJ": "CITY"}, "r"),
                RelationExample("empty", words, {"SUBJ": (1, 1), "OBJ": (4, 4)}, {"SUBJ": "PERSON", "OBJ": "CITY"}, "r")]
    with caplog.at_level("WARNING"):
        *_, stats = encode_split(encoder, examples, "train.json")
    assert stats["mentions_without_tokens"] == 2
    assert len(caplog.records) == 1
    assert ("train.json: 2 entity mention(s) have no token the tokenizer keeps, so their markers enclose nothing "
            "(the first: example empty's subject ['\\u200b'])") in caplog.records[0].getMessage()


def test_relation_ner_markers_replace_a_mention_without_tokens_unremarked(spm_data, caplog):
    """--entity-marker ner (the default) puts one marker in place of the mention's words: a mention the tokenizer
    keeps no token of changes nothing there, so it is neither warned about nor counted."""
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.tokenization import load_tokenizer
    from spanbert_plugin.relation.prepare import RelationEncoder, RelationExample, encode_split

    tokenizer = load_tokenizer(spm_data)
    encoder = RelationEncoder(tokenizer, SpanBertDictionary.from_tokenizer(tokenizer), "ner", 64)
    words = ["the", "\u200b", "value", "of", "\u00a0", "list"]
    example = RelationExample("empty", words, {"SUBJ": (1, 1), "OBJ": (4, 4)}, {"SUBJ": "PERSON", "OBJ": "CITY"}, "r")
    with caplog.at_level("WARNING"):
        *_, stats = encode_split(encoder, [example], "train.json")
    assert stats["mentions_without_tokens"] == 0 and not caplog.records

def test_raw_text_coreference_words_are_whole_characters_of_any_script():
    """hub.coref / spanbert-predict-coref --text words: vowel signs of Devanagari and Thai stay with their letters
    (they were words of their own, so a mention could be a lone vowel sign), an emoji keeps its skin tone and ZWJ
    sequence, zero-width and bidirectional marks are no words, and a lone CR or a danda ends a sentence."""
    from spanbert_plugin.coref.predict import split_words

    text = "मुझे हिन्दी पसंद है। ภาษาไทย ง่าย\r👍🏽 and 👨\u200d👩\u200d👧 met\u200b Ada\u200f مصر \ufeffBob."
    words, offsets, sentences = split_words(text, "sentence")
    assert [text[a:b] for a, b in offsets] == words
    assert words == ["मुझे", "हिन्दी", "पसंद", "है", "।", "ภาษาไทย", "ง่าย", "👍🏽", "and", "👨\u200d👩\u200d👧", "met",
                     "Ada", "مصر", "Bob", "."]
    assert sentences.tolist() == [0] * 5 + [1] * 2 + [2] * 8
    assert split_words("one\r\n\r\ntwo\rthree", "paragraph")[2].tolist() == [0, 1, 1]
    # CJK ideographs are words of their own, as BERT's tokenizer splits them (Chinese has no spaces); kana and Hangul
    # runs are not split, by BERT either
    text = "北京是中国的首都。東京タワー 서울 abc漢字def"
    words, offsets, sentences = split_words(text, "sentence")
    assert words == ["北", "京", "是", "中", "国", "的", "首", "都", "。", "東", "京", "タワー", "서울", "abc", "漢", "字", "def"]
    assert [text[a:b] for a, b in offsets] == words and sentences.tolist() == [0] * 9 + [1] * 8
    # superscripts, subscripts and fractions are digits of the word, as in Python's \w and for BERT's tokenizer
    assert split_words("5 km² of H₂O, 10½ each")[0] == ["5", "km²", "of", "H₂O", ",", "10½", "each"]
