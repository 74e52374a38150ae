"""Tokenizer files between spanbert and ``transformers``: the export writes ``AutoTokenizer``'s files with the
fairseq dictionary's ids (a sentencepiece model as a Unigram ``tokenizer.json``); the import reads a folder's WordPiece
``vocab.txt`` or ``tokenizer.json`` (or rebuilds a sentencepiece model from a Unigram one) as transformers reads it:
its normalisation settings, its declared special tokens, its ``model_max_length``."""
import json
import os
import re

from ..relation.markers import MARKER_TABLE
from .files import InteropError, read_json


def unigram_tokenizer_from_spm(model_file):
    """A ``tokenizers`` Unigram tokenizer equivalent to a sentencepiece unigram model (same ids)."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    proto = sentencepiece_model_pb2.ModelProto()
    with open(model_file, "rb") as f:
        proto.ParseFromString(f.read())
    if proto.trainer_spec.model_type != 1:  # 1 = UNIGRAM
        raise InteropError(f"{model_file}: only sentencepiece unigram models can be exported")
    tok = Tokenizer(Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=proto.trainer_spec.unk_id,
                            byte_fallback=proto.trainer_spec.byte_fallback))
    spec = proto.normalizer_spec
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        # sentencepiece drops leading and trailing spaces and collapses runs (after its charsmap,
        # which turns tabs, newlines and other spaces into ' '); a kept trailing space would become a final '▁'
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex("^ | $"), "")]
    tok.normalizer = normalizers.Sequence(steps)
    prepend = "always" if spec.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    return tok


def spm_model_from_unigram_json(path, model_file):
    """Write to ``model_file`` the sentencepiece unigram model a ``tokenizer.json`` describes (the inverse of
    ``unigram_tokenizer_from_spm``, so that import reads what export writes: the mask token, appended after the
    unigram vocabulary, is the dictionary's). InteropError for anything it could not reproduce."""
    import base64

    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Tokenizer

    spec = read_json(path)
    model, normalizer = spec.get("model") or {}, spec.get("normalizer") or {}
    pre_tokenizer = spec.get("pre_tokenizer") or {}
    pieces = model.get("vocab")
    if not isinstance(pieces, list) or not all(isinstance(p, list) and len(p) == 2 for p in pieces):
        raise InteropError(f"{path}: a Unigram model without its [piece, score] list")
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    charsmaps = [step.get("precompiled_charsmap") for step in steps if step.get("type") == "Precompiled"]
    replaces = [step for step in steps if step.get("type") == "Replace"]
    if (len(charsmaps) + len(replaces) != len(steps) or len(replaces) not in (0, 2)
            or pre_tokenizer.get("type") != "Metaspace" or pre_tokenizer.get("replacement") != "\u2581"):
        raise InteropError(f"{path}: a Unigram tokenizer that is not a sentencepiece model's (normaliser "
                           f"{json.dumps(normalizer)[:80]}, pre-tokenizer {pre_tokenizer.get('type')!r})")
    by_content = {t.get("content"): t for t in spec.get("added_tokens") or []}
    outside = sorted((t for t in by_content.values() if t.get("id", -1) >= len(pieces)), key=lambda t: t["id"])
    # a mask token appended after the pieces, then the symbols a fine-tuning folder added (entity markers)
    if [t["id"] for t in outside] != list(range(len(pieces), len(pieces) + len(outside))):
        raise InteropError(f"{path}: added tokens outside the unigram vocabulary ({', '.join(t['content'] for t in outside)}); "
                           "only tokens appended after it without gaps (a mask token first) can be read")
    proto = sentencepiece_model_pb2.ModelProto()
    Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
    unk_id = model.get("unk_id")
    byte_fallback = bool(model.get("byte_fallback"))
    roles = {}
    for index, (piece, score) in enumerate(pieces):
        kind = Piece.NORMAL
        if index == unk_id:
            kind = Piece.UNKNOWN
        elif by_content.get(piece, {}).get("special"):
            kind = Piece.CONTROL
        elif byte_fallback and re.fullmatch(r"<0x[0-9A-F]{2}>", piece):
            kind = Piece.BYTE
        proto.pieces.add(piece=piece, score=float(score), type=kind)
        roles[piece] = index
    trainer = proto.trainer_spec
    trainer.model_type, trainer.vocab_size, trainer.byte_fallback = 1, len(pieces), byte_fallback  # 1 = UNIGRAM
    trainer.unk_id = unk_id if unk_id is not None else -1
    for role, piece in (("bos", "<s>"), ("eos", "</s>"), ("pad", "<pad>")):
        setattr(trainer, f"{role}_id", roles.get(piece, -1))
    spec_out = proto.normalizer_spec
    spec_out.precompiled_charsmap = base64.b64decode(charsmaps[0]) if charsmaps and charsmaps[0] else b""
    spec_out.add_dummy_prefix = pre_tokenizer.get("prepend_scheme", "always") != "never"
    spec_out.remove_extra_whitespaces = bool(replaces)
    spec_out.escape_whitespaces = True
    # the charsmap carries the normalisation; its name says whether it folds case (read by the tokenizer's lowercase)
    folds_case = Tokenizer.from_file(path).normalizer.normalize_str("ABC") == "abc" if steps else False
    spec_out.name = "nmt_nfkc_cf" if folds_case else "nmt_nfkc"
    with open(model_file, "wb") as f:
        f.write(proto.SerializeToString())


# the class name of a tokenizer read from its tokenizer.json as it is, in transformers 4.x and 5.x alike (5.x writes
# "TokenizersBackend", which 4.x's AutoTokenizer does not know)
GENERIC_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
GENERIC_TOKENIZER_CLASSES = (GENERIC_TOKENIZER_CLASS, "TokenizersBackend")


def save_hf_tokenizer(tokenizer, dictionary, out_dir, max_length, type_vocab_size=2):
    """Tokenizer files ``AutoTokenizer`` loads, with ids equal to the fairseq dictionary's.

    A pair's token types are BERT's (0 up to the first separator, 1 after), as the fine-tuning tasks give them; a
    model with one token type gets 0 throughout (type 1 would be out of its embeddings' range). transformers 5.x's
    ``BertTokenizer`` always types pairs 0/1, so such a WordPiece tokenizer is written as the generic class.
    """
    from tokenizers import processors
    from transformers import BertTokenizerFast, PreTrainedTokenizerFast

    bos, eos = dictionary.bos_word, dictionary.eos_word
    second = 1 if type_vocab_size > 1 else 0
    pair_types = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B:{second} {eos}:{second}",
        special_tokens=[(bos, dictionary.bos()), (eos, dictionary.eos())],
    )
    if tokenizer.kind == "wordpiece":
        appended = list(dictionary.symbols[len(tokenizer.vocab):])
        if appended:  # written at their ids; entity markers (a vocabulary without free [unusedN]) kept whole
            tokenizer = tokenizer.with_appended_tokens(appended, special=MARKER_TABLE)
        hf = BertTokenizerFast(vocab={piece: i for i, piece in enumerate(tokenizer.vocab)},
                               do_lower_case=tokenizer.lowercase, strip_accents=tokenizer.strip_accents,
                               tokenize_chinese_chars=tokenizer.tokenize_chinese_chars,
                               additional_special_tokens=tokenizer.extra_special_tokens)
        tokenizer.save(out_dir)  # vocab.txt too: BERT directories carry it (and import reads it)
        os.remove(os.path.join(out_dir, "spanbert_tokenizer.json"))
        inner, special = (hf.backend_tokenizer, {"additional_special_tokens": tokenizer.extra_special_tokens}) \
            if second == 0 else (None, {})
    else:
        inner = unigram_tokenizer_from_spm(tokenizer.model_file)
        # appended in the dictionary's order: <mask>, then any symbols a fine-tuning folder added (entity markers)
        inner.add_special_tokens(list(dictionary.symbols[len(tokenizer.vocab):]))
        special = {"bos_token": bos, "eos_token": eos}
    if inner is not None:
        inner.post_processor = pair_types
        hf = PreTrainedTokenizerFast(
            tokenizer_object=inner, cls_token=bos, sep_token=eos, unk_token=dictionary.unk_word,
            pad_token=dictionary.pad_word, mask_token=dictionary.mask_word,
            model_input_names=["input_ids", "token_type_ids", "attention_mask"], **special,
        )
    # the model's positions (longer inputs would fail in transformers), or less where the imported tokenizer said so
    hf.model_max_length = min(max_length, tokenizer.model_max_length or max_length)
    hf.save_pretrained(out_dir)
    if inner is not None:
        config_path = os.path.join(out_dir, "tokenizer_config.json")
        config = read_json(config_path)
        config["tokenizer_class"] = GENERIC_TOKENIZER_CLASS
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
    return hf


def read_hf_tokenizer(hf_dir, vocab_path, scratch_dir):
    """(tokenizer, dictionary, a warning or None) of a HuggingFace folder, ids as its vocabulary's. A sentencepiece
    model rebuilt from a Unigram ``tokenizer.json`` is written to ``scratch_dir``, which must outlive the tokenizer."""
    from ..core.dictionary import SpanBertDictionary
    from ..core.tokenization import SentencePieceTokenizer, TokenizerError

    case_note = None
    try:
        if vocab_path.endswith("tokenizer.json") and _tokenizer_json_model(vocab_path) == "Unigram":
            model_file = os.path.join(scratch_dir, "spm.model")  # what spanbert-export-hf writes for sentencepiece
            spm_model_from_unigram_json(vocab_path, model_file)
            tokenizer = SentencePieceTokenizer(model_file)
        else:
            tokenizer, case_note = _wordpiece_tokenizer(hf_dir, vocab_path)
    except TokenizerError as err:
        raise InteropError(str(err)) from None
    tokenizer.model_max_length = _model_max_length(hf_dir)
    dictionary = SpanBertDictionary.from_tokenizer(tokenizer)  # sentencepiece: its pieces + <mask>
    if tokenizer.kind == "sentencepiece":  # symbols an export appended after <mask> (a relation folder's markers)
        appended = _appended_tokens(vocab_path, len(dictionary))
        if appended:
            dictionary = SpanBertDictionary(list(dictionary.symbols) + appended)
    return tokenizer, dictionary, case_note


def _tokenizer_json_model(path):
    """The model type a tokenizer.json names (WordPiece, Unigram, ...), or None."""
    spec = read_json(path)
    model = spec.get("model") if isinstance(spec, dict) else None
    return model.get("type") if isinstance(model, dict) else None


# what transformers writes for a tokenizer without a length of its own (int(1e30)): no length
UNSET_MAX_LENGTH = 10 ** 29


def _model_max_length(hf_dir):
    """``model_max_length`` of the folder's ``tokenizer_config.json``, or None where it sets none."""
    path = os.path.join(hf_dir, "tokenizer_config.json")
    value = read_json(path).get("model_max_length") if os.path.isfile(path) else None
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0 or value != int(value):
        raise InteropError(f"{path}: model_max_length must be a positive integer, found {value!r}")
    return int(value) if value < UNSET_MAX_LENGTH else None


def _appended_tokens(tokenizer_json, first_id):
    """The added tokens of ``tokenizer_json`` from id ``first_id`` on, in id order, where they follow without gaps."""
    added = {t.get("id"): t.get("content") for t in read_json(tokenizer_json).get("added_tokens") or []
             if isinstance(t, dict)}
    appended = []
    while isinstance(added.get(first_id + len(appended)), str):
        appended.append(added[first_id + len(appended)])
    return appended


def _wordpiece_tokenizer(hf_dir, vocab_path):
    """(the folder's WordPiece tokenizer, a warning or None), normalised as transformers reads the folder, where it can.

    transformers' BertTokenizer (4.x and 5.x) takes ``do_lower_case``, ``strip_accents`` and
    ``tokenize_chinese_chars`` from ``tokenizer_config.json``, each on its own, and puts its defaults (lower-case,
    accents stripped with lower-casing, CJK characters split) over a ``tokenizer.json``'s normaliser for any it lacks.
    Here a missing setting comes from that normaliser, which says what the folder's tokenizer was built with, or for
    a ``vocab.txt`` alone lower-casing follows the vocabulary: cased models published without the setting (SpanBERT's,
    BioBERT's) are lower-cased wrongly by transformers. Where this departs from transformers' reading, the warning
    says so; the export writes every setting, so it tokenizes as imported. A folder whose ``tokenizer_class`` is
    the generic one is read by transformers from its ``tokenizer.json`` alone, and so here.
    """
    from ..core.tokenization import WordPieceTokenizer, lowercase_vocabulary, read_wordpiece_vocab

    tok_cfg_path = os.path.join(hf_dir, "tokenizer_config.json")
    tok_cfg = read_json(tok_cfg_path) if os.path.isfile(tok_cfg_path) else {}
    tokenizer_json = os.path.join(hf_dir, "tokenizer.json")
    normaliser = WordPieceTokenizer.normaliser_settings(tokenizer_json) if os.path.isfile(tokenizer_json) else None
    theirs = _bert_settings(tok_cfg, (True, None, True))
    if normaliser is not None:
        ours = _bert_settings(tok_cfg, normaliser)
    elif vocab_path.endswith("tokenizer.json"):  # not BERT's normaliser: from_tokenizer_json refuses it
        ours = theirs
    else:  # vocab.txt alone
        ours = _bert_settings(tok_cfg, (lowercase_vocabulary(read_wordpiece_vocab(vocab_path)), None, True))
    if normaliser is not None and tok_cfg.get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
        theirs = ours = _bert_settings({}, normaliser)  # that class reads tokenizer.json as it is
    lowercase, strip_accents, chinese = ours
    if vocab_path.endswith("tokenizer.json"):
        tokenizer = WordPieceTokenizer.from_tokenizer_json(vocab_path, lowercase, strip_accents,
                                                           tokenize_chinese_chars=chinese)
    else:
        tokenizer = WordPieceTokenizer(vocab_path, lowercase, strip_accents, tokenize_chinese_chars=chinese)
    note = None
    if ours != theirs and normaliser is None:
        note = (f"{hf_dir}: no do_lower_case in a tokenizer_config.json and {os.path.basename(vocab_path)} is cased: "
                "imported as a cased tokenizer (transformers lower-cases such a folder unless given "
                "do_lower_case=False; the export writes the setting)")
    elif ours != theirs:
        unset = [key for key, mine, its in zip(BERT_TOKENIZER_SETTINGS, ours, theirs) if mine != its]
        note = (f"{tokenizer_json}: its normaliser ({_describe_settings(ours)}) is kept, but tokenizer_config.json does "
                f"not set {', '.join(unset)}, so transformers' BertTokenizer would read this folder with its defaults "
                f"({_describe_settings(theirs)}); the export writes the settings")
    declared = _declared_special_tokens(hf_dir, tok_cfg)
    present = set(tokenizer.vocab)
    for token, source in declared.items():
        if token not in present:
            raise InteropError(f"{source}: special token {token!r} is not in {vocab_path} (tokens added beyond the "
                               "vocabulary are not imported)")
    tokenizer.add_special_tokens(list(declared))
    return tokenizer, note


BERT_TOKENIZER_SETTINGS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars")


def _bert_settings(tok_cfg, fallback):
    """(lowercase, strip_accents, tokenize_chinese_chars): each from ``tokenizer_config.json`` where it says, else from
    ``fallback``; accent stripping unset (None) follows lower-casing, as in BERT's normaliser."""
    lowercase, strip_accents, chinese = (tok_cfg[key] if key in tok_cfg else value
                                         for key, value in zip(BERT_TOKENIZER_SETTINGS, fallback))
    return bool(lowercase), bool(lowercase) if strip_accents is None else bool(strip_accents), bool(chinese)


def _describe_settings(settings):
    lowercase, strip_accents, chinese = settings
    return (f"{'lower-cased' if lowercase else 'cased'}, accents {'stripped' if strip_accents else 'kept'}, "
            f"CJK characters {'split' if chinese else 'not split'}")


def _declared_special_tokens(hf_dir, tok_cfg):
    """{token: the file declaring it} for the special tokens beyond BERT's five that transformers keeps whole:
    ``additional_special_tokens`` (transformers 4.x; also in ``special_tokens_map.json``) or ``extra_special_tokens``
    (5.x) of ``tokenizer_config.json``, and a ``tokenizer.json``'s special added tokens."""
    from ..core.tokenization import WORDPIECE_REQUIRED

    declared = {}
    map_path = os.path.join(hf_dir, "special_tokens_map.json")
    sources = [(os.path.join(hf_dir, "tokenizer_config.json"), tok_cfg)]
    sources += [(map_path, read_json(map_path))] if os.path.isfile(map_path) else []
    for path, settings in sources:
        for key in ("additional_special_tokens", "extra_special_tokens"):
            listed = settings.get(key) or []
            if isinstance(listed, dict):  # 4.x's named extra tokens: {"name": token}
                listed = list(listed.values())
            if not isinstance(listed, list):
                raise InteropError(f"{path}: {key} must be a list of tokens, found {listed!r}")
            for token in listed:
                content = token.get("content") if isinstance(token, dict) else token  # an AddedToken's fields
                if not isinstance(content, str):
                    raise InteropError(f"{path}: {key} holds {token!r}, not a token")
                declared.setdefault(content, path)
    tokenizer_json = os.path.join(hf_dir, "tokenizer.json")
    if os.path.isfile(tokenizer_json):
        for token in read_json(tokenizer_json).get("added_tokens") or []:
            if isinstance(token, dict) and token.get("special") and isinstance(token.get("content"), str):
                declared.setdefault(token["content"], tokenizer_json)
    return {token: path for token, path in declared.items() if token not in WORDPIECE_REQUIRED}
