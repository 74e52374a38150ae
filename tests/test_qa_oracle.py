"""Oracle round trip on the real SQuAD 1.1 dev set: gold token spans through post-processing and the metrics."""
import numpy as np

from conftest import needs_shared_data, shared_path
from spanbert_plugin.evaluation.squad import evaluate
from spanbert_plugin.qa.postprocess import postprocess
from spanbert_plugin.qa.prepare import QAConfig, featurize, read_qa_file

BERT_VOCAB = shared_path("bert_uncased_vocab", "vocab.txt")
SQUAD_DEV = shared_path("squad", "dev-v1.1.json")


def oracle_scores(max_answer_length):
    """EM/F1 when every window holding the first gold answer puts its logits on that answer's tokens."""
    from spanbert_plugin.data.dictionary import SpanBertDictionary
    from spanbert_plugin.tokenization import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(BERT_VOCAB, lowercase=True)
    dictionary = SpanBertDictionary.from_tokenizer(tokenizer)
    qa = read_qa_file(SQUAD_DEV)
    features = featurize(qa, tokenizer, dictionary.bos(), dictionary.eos(), QAConfig(384, 128, 64), training=False)
    split = features.split
    width = int(np.diff(features.window_offsets).max())
    start = np.zeros((split.num_windows, width), np.float32)
    end = np.zeros_like(start)
    rows = np.flatnonzero(split.start_positions > 0)
    start[rows, split.start_positions[rows]] = 10
    end[rows, split.end_positions[rows]] = 10
    result = postprocess(split, np.arange(split.num_windows), start, end, n_best=20, max_answer_length=max_answer_length)
    scores = evaluate(split.questions, result.predictions, rules="v1")
    misses = [(q["id"], result.predictions[q["id"]], q["answers"][0]) for q in split.questions
              if not any(result.predictions[q["id"]] == a for a in q["answers"])]
    return scores, misses, split


@needs_shared_data("squad/dev-v1.1.json", "bert_uncased_vocab/vocab.txt")
def test_oracle_round_trip_on_squad_dev():
    scores, misses, split = oracle_scores(max_answer_length=1000)
    assert scores["total"] == 10570 and scores["missing"] == 0
    # Alignment through character offsets loses only answers that start or end inside a token.
    assert scores["exact"] >= 99.0, (scores, misses[:10])
    # The predicted text is cut from the context by offsets: where it differs from the first gold
    # answer, the gold answer starts or ends inside a WordPiece token (e.g. "1990s" vs "1990").
    for qid, predicted, gold in misses[:50]:
        assert gold.lower() in predicted.lower() or predicted.lower() in gold.lower(), (qid, predicted, gold)
