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

The windows are compared one by one (count per question, token ids, labels);
the timings alternate between the sides and the medians of wall and CPU seconds
(all threads) are reported. The tokenizer
calls of the recipe alone (``transformers-tokenize``, no labels) are timed too.

    .venv/bin/python benchmarks/qa_prepare_speed.py [--repeats 3] [--side both|ours|transformers]
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DATA = os.path.join(ROOT, "..", "shared", "data")

import numpy as np  # noqa: E402


def ours_setup(vocab):
    from spanbert_plugin.data.dictionary import SpanBertDictionary
    from spanbert_plugin.tokenization import WordPieceTokenizer

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
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (alternating)")
    parser.add_argument("--side", choices=["both", "ours", "transformers", "transformers-tokenize"], default="both",
                        help="run one side only (for whole-process timing)")
    args = parser.parse_args()
    for path in (args.squad, args.vocab):
        if not os.path.isfile(path):
            sys.exit(f"qa_prepare_speed: {path}: not found (see ../shared/data/README.md)")

    names = ["ours", "transformers", "transformers-tokenize"] if args.side == "both" else [args.side]
    sides = {}
    if "ours" in names:  # each side imports only what it needs (whole-process timing with --side)
        tokenizer, dictionary = ours_setup(args.vocab)
        sides["ours"] = lambda: ours(args.squad, tokenizer, dictionary, args)
    if any(name.startswith("transformers") for name in names):
        from transformers import BertTokenizerFast

        hf_tokenizer = BertTokenizerFast(args.vocab, do_lower_case=True)
        sides["transformers"] = lambda: transformers_recipe(args.squad, hf_tokenizer, args)
        sides["transformers-tokenize"] = lambda: transformers_recipe(args.squad, hf_tokenizer, args, labels=False)
    sides = {name: sides[name] for name in names}
    seconds = {name: [] for name in sides}
    cpu_seconds = {name: [] for name in sides}  # all threads of the process (tokenizers batches in parallel)
    results = {}
    for _ in range(args.repeats):
        for name, run in sides.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            results[name] = run()
            seconds[name].append(time.perf_counter() - start)
            cpu_seconds[name].append(time.process_time() - cpu_start)
    questions = len(results["ours"].split.questions) if "ours" in results else len({w[0] for w in next(iter(results.values()))})
    report = {"max_seq_length": args.max_seq_length, "doc_stride": args.doc_stride, "repeats": args.repeats}
    for name, times in seconds.items():
        median = statistics.median(times)
        report[name] = {"seconds_median": round(median, 3), "seconds_all": [round(t, 3) for t in times],
                        "cpu_seconds_median": round(statistics.median(cpu_seconds[name]), 3),
                        "questions_per_second": round(questions / median, 1)}
    if args.side == "both":
        for name in ("transformers", "transformers-tokenize"):
            report[f"speed_ratio_ours_vs_{name}"] = round(
                statistics.median(seconds[name]) / statistics.median(seconds["ours"]), 2)
            report[f"cpu_ratio_ours_vs_{name}"] = round(
                statistics.median(cpu_seconds[name]) / statistics.median(cpu_seconds["ours"]), 2)
        report["agreement"] = compare(results["ours"], results["transformers"])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
