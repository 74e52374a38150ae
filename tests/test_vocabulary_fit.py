"""Prepare commands warn when the vocabulary does not fit the text: an uncased vocabulary read by a
case-keeping tokenizer, and more than 1% of tokens unknown ([UNK])."""
import json

from conftest import bin_path, needs_shared_data, run_cli, shared_path
from spanbert_plugin.core.tokenization import VocabularyFit, WordPieceTokenizer, lowercase_vocabulary

BERT_VOCAB = "bert_uncased_vocab/vocab.txt"
TEXT = ("Mr. Darcy walked to Netherfield with Elizabeth Bennet. Jane Austen wrote of Pemberley, Longbourn and London.\n"
        * 40)


@needs_shared_data(BERT_VOCAB)
def test_uncased_vocabulary_detected_and_counts_kept():
    vocab_file = shared_path(BERT_VOCAB)
    cased = WordPieceTokenizer(vocab_file, lowercase=False)
    assert lowercase_vocabulary(cased.vocab) and not lowercase_vocabulary(["[CLS]", "the", "The"])
    cased.encode_ids([TEXT])
    cased.encode("Elizabeth")
    fit = cased.fit
    assert fit.upper_case_seen and fit.tokens > 0 and fit.unk_tokens > 0.01 * fit.tokens
    lines = fit.warnings(cased, "novel.txt")
    assert len(lines) == 2 and all(line.startswith("novel.txt: ") for line in lines)
    assert "--lowercase" in lines[0] and "[UNK]" in lines[1]
    uncased = WordPieceTokenizer(vocab_file, lowercase=True)
    uncased.encode_ids([TEXT])
    assert uncased.fit.unk_tokens == 0 and uncased.fit.warnings(uncased, "novel.txt") == []
    assert VocabularyFit().warnings(uncased, "empty") == []


@needs_shared_data(BERT_VOCAB)
def test_spanbert_prepare_warns_once_per_problem_and_not_with_lowercase(tmp_path):
    common = [bin_path("spanbert-prepare"), "--train", str(_corpus(tmp_path)), "--wordpiece-vocab", shared_path(BERT_VOCAB),
              "--valid-fraction", "0.2"]
    cased = run_cli([*common, "--destdir", str(tmp_path / "cased")], check=False)
    assert cased.returncode == 0, cased.stderr
    warnings = [line for line in cased.stderr.splitlines() if ": warning: " in line]
    assert len(warnings) == 2, cased.stderr
    assert "lower-case" in warnings[0] and "--lowercase" in warnings[0] and "[UNK]" in warnings[1]
    stats = json.loads((tmp_path / "cased" / "prepare_stats.json").read_text())
    assert f"{stats['train']['unk_tokens'] + stats['valid']['unk_tokens']:,} of" in warnings[1]
    lowered = run_cli([*common, "--lowercase", "--destdir", str(tmp_path / "lowered")], check=False)
    assert lowered.returncode == 0 and ": warning: " not in lowered.stderr, lowered.stderr


@needs_shared_data(BERT_VOCAB)
def test_fine_tuning_prepare_warns_with_a_case_keeping_uncased_tokenizer(tmp_path):
    """spanbert-prepare-classification reads its tokenizer from a folder; the same warning names its input."""
    folder = tmp_path / "tokenizer"
    run_cli([bin_path("spanbert-prepare"), "--train", str(_corpus(tmp_path)), "--wordpiece-vocab",
             shared_path(BERT_VOCAB), "--valid-fraction", "0.2", "--destdir", str(folder)])
    table = tmp_path / "train.tsv"
    table.write_text("sentence\tlabel\n" + "".join(f"{line}\t{i % 2}\n" for i, line in enumerate(TEXT.splitlines())),
                     encoding="utf-8")
    proc = run_cli([bin_path("spanbert-prepare-classification"), "--train", str(table), "--valid", str(table),
                    "--tokenizer-from", str(folder), "--destdir", str(tmp_path / "cls"), "--text-columns", "sentence",
                    "--label-column", "label"], check=False)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if ": warning: " in line]
    assert len(warnings) == 2 and all(str(table) in line for line in warnings), proc.stderr


def _corpus(tmp_path):
    """Five documents of TEXT (a blank line between them)."""
    path = tmp_path / "corpus.txt"
    path.write_text((TEXT + "\n") * 5, encoding="utf-8")
    return path


def test_unknown_tokens_warn_only_above_one_percent():
    """More than 1% of tokens unknown warns: exactly 1% (1 of 100) does not, 2 of 100 does."""
    from types import SimpleNamespace

    tokenizer = SimpleNamespace(lowercase=True, vocab=["[UNK]", "the"])
    assert VocabularyFit(tokens=100, unk_tokens=1).warnings(tokenizer, "text") == []
    lines = VocabularyFit(tokens=100, unk_tokens=2).warnings(tokenizer, "text")
    assert len(lines) == 1 and "2 of 100 tokens (2.0%)" in lines[0]
