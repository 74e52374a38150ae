#!/usr/bin/env python
"""QA feature preparation speed: spanbert-prepare-qa's featurisation vs the `transformers` recipe.

Both sides start from the SQuAD 1.1 dev JSON file and the BERT uncased vocabulary
(lower-cased), in one process, and produce training features (token ids of every
window, start/end labels):

* ours: ``read_qa_file`` + ``featurize`` (each context tokenized once, questions in
  batches, windows / labels / max-context flags in numpy);
* transformers: ``BertTokenizerFast`` on (question, context) pairs with
  ``truncation="only_second"``, ``return_overflowing_tokens=True``,
  ``return_offsets_mapping=True``, then the per-window labelling loop of the
  ``run_qa.py`` example. HF's ``stride`` is the overlap between windows, so each
  question-length group gets stride = window passage length - doc_stride, which
  gives BERT's windows (window starts every doc_stride tokens).

The windows are compared one by one (count per question, token ids, labels) and any
difference makes the script exit with status 1. The sides run in ``--repeats``
alternating runs (the order flips every run); it prints each side's median wall time
and questions per second, and the ratio transformers / ours as the median of the
per-run ratios with their range. ``--tokenizer-only`` adds the recipe's tokenizer calls
alone (no labels) as a third side.

    .venv/bin/python benchmarks/cpu_speed/qa_prepare_speed.py [--repeats 3] [--tokenizer-only] [--articles N]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
DATA = os.path.join(ROOT, "..", "shared", "data")

import numpy as np  # noqa: E402
from timing import alternating_runs, ratio_line, time_line  # noqa: E402


def ours_setup(vocab):
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.tokenization import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(vocab, lowercase=True)
    return tokenizer, SpanBertDictionary.from_tokenizer(tokenizer)


def ours(path, tokenizer, dictionary, args):
    from spanbert_plugin.qa.prepare import QAConfig, featurize, read_qa_file

    config = QAConfig(args.max_seq_length, args.doc_stride, args.max_query_length)
    qa = read_qa_file(path)
    return featurize(qa, tokenizer, dictionary.bos_index, dictionary.eos_index, config, training=True)


def transformers_recipe(path, tokenizer, args, labels=True):
    """Features as in transformers' run_qa.py (training features), with BERT's window starts.

    ``labels=False`` stops after the tokenizer calls (the tokenizer's share of the time).
    """
    with open(path, encoding="utf-8") as f:
        data = json.load(f)["data"]
    questions, contexts, answers = [], [], []
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                questions.append(qa["question"].lstrip())
                contexts.append(paragraph["context"])
                answers.append(qa["answers"][0])
    lengths = np.array([len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]])
    windows = []  # (question index, input ids, start label, end label)
    for length in np.unique(lengths):
        group = np.flatnonzero(lengths == length)
        passage_tokens = args.max_seq_length - int(length) - 3
        enc = tokenizer([questions[i] for i in group], [contexts[i] for i in group], truncation="only_second",
                        max_length=args.max_seq_length, stride=passage_tokens - args.doc_stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
        if not labels:
            windows.extend((int(group[q]), None, 0, 0) for q in enc["overflow_to_sample_mapping"])
            continue
        for w, offsets in enumerate(enc["offset_mapping"]):
            q = int(group[enc["overflow_to_sample_mapping"][w]])
            sequence_ids = enc.sequence_ids(w)
            answer_start = answers[q]["answer_start"]
            answer_end = answer_start + len(answers[q]["text"])
            first = sequence_ids.index(1)
            last = len(sequence_ids) - 1 - sequence_ids[::-1].index(1)
            if offsets[first][0] > answer_start or offsets[last][1] < answer_end:
                label = (0, 0)
            else:
                start = first
                while start <= last and offsets[start][0] <= answer_start:
                    start += 1
                end = last
                while offsets[end][1] >= answer_end:
                    end -= 1
                label = (start - 1, end + 1)
            windows.append((q, enc["input_ids"][w], *label))
    return windows


def compare(features, windows):
    """Equal windows (by question, then order), equal token ids and labels: counts of each."""
    split = features.split
    ours_count = np.bincount(split.question_index, minlength=split.num_questions)
    hf_q = np.array([w[0] for w in windows])
    hf_count = np.bincount(hf_q, minlength=split.num_questions)
    order = np.argsort(hf_q, kind="stable")
    same_tokens = same_labels = 0
    if np.array_equal(ours_count, hf_count):
        offsets = features.window_offsets
        for ours_w, hf_w in enumerate(order):
            q, ids, start, end = windows[hf_w]
            same_tokens += np.array_equal(features.tokens[offsets[ours_w]: offsets[ours_w + 1]], ids)
            same_labels += (split.start_positions[ours_w], split.end_positions[ours_w]) == (start, end)
    return {"questions": int(split.num_questions), "windows_ours": int(split.num_windows),
            "windows_transformers": len(windows), "questions_with_same_window_count": int((ours_count == hf_count).sum()),
            "windows_with_same_tokens": int(same_tokens), "windows_with_same_labels": int(same_labels)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squad", default=os.path.join(DATA, "squad", "dev-v1.1.json"), help="SQuAD 1.1 JSON file")
    parser.add_argument("--vocab", default=os.path.join(DATA, "bert_uncased_vocab", "vocab.txt"), help="BERT uncased vocab.txt")
    parser.add_argument("--max-seq-length", type=int, default=384, help="tokens per window")
    parser.add_argument("--doc-stride", type=int, default=128, help="passage tokens between window starts")
    parser.add_argument("--max-query-length", type=int, default=64, help="question tokens kept")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed runs of the sides")
    parser.add_argument("--tokenizer-only", action="store_true", help="also time the recipe's tokenizer calls alone")
    parser.add_argument("--articles", type=int, help="only the first N articles (a quick check)")
    args = parser.parse_args()
    for path in (args.squad, args.vocab):
        if not os.path.isfile(path):
            sys.exit(f"qa_prepare_speed: {path}: not found (see ../shared/data/README.md)")
    squad = args.squad
    if args.articles:
        with open(args.squad, encoding="utf-8") as f:
            data = json.load(f)
        data["data"] = data["data"][: args.articles]
        squad = os.path.join(tempfile.mkdtemp(), "subset.json")
        with open(squad, "w", encoding="utf-8") as f:
            json.dump(data, f)

    from transformers import BertTokenizerFast

    tokenizer, dictionary = ours_setup(args.vocab)
    hf_tokenizer = BertTokenizerFast(args.vocab, do_lower_case=True)
    results = {}
    sides = {"ours": lambda: ours(squad, tokenizer, dictionary, args),
             "transformers": lambda: transformers_recipe(squad, hf_tokenizer, args)}
    if args.tokenizer_only:
        sides["transformers-tokenize"] = lambda: transformers_recipe(squad, hf_tokenizer, args, labels=False)
    per_run = alternating_runs({name: (lambda _, name=name: results.__setitem__(name, sides[name]())) for name in sides},
                               args.repeats, warmup=0)
    questions = len(results["ours"].split.questions)
    print(f"{questions} questions, windows {args.max_seq_length} / stride {args.doc_stride} / query "
          f"{args.max_query_length}, {args.repeats} alternating runs, one process")
    for name, times in per_run.items():
        print(time_line(f"{name:>21} (wall)", times, unit="s", scale=1.0, places=2)
              + f"; {questions / statistics.median(times):.0f} questions/s")
    for name in sides:
        if name != "ours":
            print(ratio_line(f"{name} / ours (wall)", per_run[name], per_run["ours"]))
    agreement = compare(results["ours"], results["transformers"])
    print("agreement:", json.dumps(agreement))
    windows = agreement["windows_ours"]
    agree = (agreement["windows_transformers"] == windows and agreement["questions_with_same_window_count"] == questions
             and agreement["windows_with_same_tokens"] == windows and agreement["windows_with_same_labels"] == windows)
    if not agree:
        print("qa_prepare_speed: the windows, tokens or labels differ from the transformers recipe's", file=sys.stderr)
        return 1
    print(f"same {windows} windows, token ids and labels as the transformers recipe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
