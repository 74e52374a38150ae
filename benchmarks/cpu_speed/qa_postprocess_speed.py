#!/usr/bin/env python
"""QA post-processing speed on the whole SQuAD 1.1 dev set: vectorised vs a per-window Python loop.

The windows are the real ``spanbert-prepare-qa`` output (BERT uncased WordPiece,
384-token windows, doc stride 128) of ../shared/data/squad/dev-v1.1.json; the
logits are random (fixed seed), the same for both sides. The reference follows
the structure of ``transformers``' ``postprocess_qa_predictions`` (loop over
examples, their features, nested loops over the top start and end indexes),
with the BERT rules ``postprocess`` implements (dedupe by text). Its per-feature
inputs (offset mapping, max-context map) are built before the clock starts, as a
prepared dataset would hold them. The two sides run in alternating runs (one call each per
run, the order flipping every run) under the same thread setting; the script prints each side's
median wall time and the ratio of the two (median of the per-run ratios, with their range), checks
that predictions and n-best texts are identical (exit status 1 otherwise), and scores both sides'
predictions with the same EM/F1 function.

    .venv/bin/python benchmarks/cpu_speed/qa_postprocess_speed.py [--runs 7] [--with-negative]
"""
import argparse
import collections
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers

import numpy as np  # noqa: E402
from timing import alternating_runs, ratio_line, thread_note, time_line  # noqa: E402

SQUAD_DEV = os.path.join(ROOT, "..", "shared", "data", "squad", "dev-v1.1.json")
VOCAB = os.path.join(ROOT, "..", "shared", "data", "bert_uncased_vocab", "vocab.txt")


def prepared_split(out):
    """The dev set's windows, prepared once into ``out`` (a tokenizer folder first)."""
    from spanbert_plugin.cli.prepare import main as prepare_main
    from spanbert_plugin.cli.prepare_qa import main as prepare_qa_main
    from spanbert_plugin.qa.windows import QASplit

    tokenizer_dir, qa_dir = os.path.join(out, "tokenizer"), os.path.join(out, "squad11_384")
    if not os.path.isfile(os.path.join(qa_dir, "valid.windows.npz")):
        os.makedirs(out, exist_ok=True)
        with open(SQUAD_DEV, encoding="utf-8") as f:
            articles = json.load(f)["data"]
        text = os.path.join(out, "text.txt")  # a small text: the tokenizer folder only needs dict + vocab
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n\n".join(p["context"] for a in articles[:4] for p in a["paragraphs"]) + "\n")
        assert prepare_main(["--train", text, "--destdir", tokenizer_dir, "--tokenizer", "wordpiece",
                             "--wordpiece-vocab", VOCAB, "--lowercase", "--force"]) == 0
        assert prepare_qa_main(["--valid", SQUAD_DEV, "--tokenizer-from", tokenizer_dir, "--destdir", qa_dir,
                                "--max-seq-length", "384", "--doc-stride", "128", "--force"]) == 0
    return QASplit.load(qa_dir, "valid")


def features_of(split):
    """Per window, what a transformers-style feature holds: offset mapping (None off the passage), max-context map."""
    features = []
    for w in range(split.num_windows):
        lo, hi, offset = split.token_offsets[w], split.token_offsets[w + 1], split.passage_offset[w]
        mapping = [None] * (offset + hi - lo + 1)
        mapping[offset:offset + hi - lo] = list(zip(split.char_start[lo:hi].tolist(), split.char_end[lo:hi].tolist()))
        max_context = {str(offset + k): bool(flag) for k, flag in enumerate(split.max_context[lo:hi])}
        features.append({"offset_mapping": mapping, "token_is_max_context": max_context})
    return features


def reference_postprocess(split, features, all_start_logits, all_end_logits, n_best_size=20,
                          max_answer_length=30, null_score_diff_threshold=0.0):
    """transformers' postprocess_qa_predictions loop structure, BERT's dedupe-by-text n-best."""
    features_per_example = collections.defaultdict(list)
    for i, example_index in enumerate(split.question_index.tolist()):
        features_per_example[example_index].append(i)
    predictions, all_nbest = collections.OrderedDict(), collections.OrderedDict()
    for example_index, example in enumerate(split.questions):
        context = split.contexts[example["context_index"]]
        min_null_prediction, prelim_predictions = None, []
        for feature_index in features_per_example[example_index]:
            offset_mapping = features[feature_index]["offset_mapping"]
            start_logits = all_start_logits[feature_index][:len(offset_mapping)]
            end_logits = all_end_logits[feature_index][:len(offset_mapping)]
            token_is_max_context = features[feature_index]["token_is_max_context"]
            feature_null_score = start_logits[0] + end_logits[0]
            if min_null_prediction is None or min_null_prediction["score"] > feature_null_score:
                min_null_prediction = {"offsets": (-1, -1), "score": feature_null_score,
                                       "start_logit": start_logits[0], "end_logit": end_logits[0]}
            start_indexes = np.argsort(start_logits)[-1: -n_best_size - 1: -1].tolist()
            end_indexes = np.argsort(end_logits)[-1: -n_best_size - 1: -1].tolist()
            for start_index in start_indexes:
                for end_index in end_indexes:
                    if (start_index >= len(offset_mapping) or end_index >= len(offset_mapping)
                            or offset_mapping[start_index] is None or offset_mapping[end_index] is None):
                        continue
                    if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                        continue
                    if not token_is_max_context.get(str(start_index), False):
                        continue
                    prelim_predictions.append({
                        "offsets": (offset_mapping[start_index][0], offset_mapping[end_index][1]),
                        "score": start_logits[start_index] + end_logits[end_index],
                        "start_logit": start_logits[start_index], "end_logit": end_logits[end_index]})
        nbest, seen = [], set()
        for pred in sorted(prelim_predictions, key=lambda x: x["score"], reverse=True):
            text = context[pred["offsets"][0]:pred["offsets"][1]]
            if text in seen:
                continue
            seen.add(text)
            nbest.append(dict(pred, text=text))
            if len(nbest) == n_best_size:
                break
        best_non_null = nbest[0] if nbest else None
        if split.with_negative and "" not in seen:
            nbest.append(dict(min_null_prediction, text=""))
        if not nbest:
            nbest = [{"offsets": (-1, -1), "score": 0.0, "start_logit": 0.0, "end_logit": 0.0, "text": ""}]
        scores = np.array([pred.pop("score") for pred in nbest])
        probs = np.exp(scores - np.max(scores))
        probs = probs / probs.sum()
        for prob, pred in zip(probs, nbest):
            pred["probability"] = prob
        if not split.with_negative:
            predictions[example["id"]] = nbest[0]["text"]
        else:
            score_diff = min_null_prediction["score"] - (
                best_non_null["start_logit"] + best_non_null["end_logit"] if best_non_null else -np.inf)
            predictions[example["id"]] = "" if best_non_null is None or score_diff > null_score_diff_threshold \
                else best_non_null["text"]
        all_nbest[example["id"]] = [  # JSON-serialisable, as transformers does
            {k: (float(v) if isinstance(v, (np.float16, np.float32, np.float64)) else v) for k, v in pred.items()}
            for pred in nbest]
    return predictions, all_nbest


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="alternating timed runs (one call of each side per run)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random logits")
    parser.add_argument("--with-negative", action="store_true",
                        help="treat the split as SQuAD 2.0 (null answers, null odds) with the same windows; "
                             "both sides are then scored by evaluate(rules='v2')")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "out", "qa_postprocess"),
                        help="work folder (prepared data is kept for later runs)")
    args = parser.parse_args()
    if not os.path.isfile(SQUAD_DEV):
        sys.exit(f"{SQUAD_DEV}: not available")

    from spanbert_plugin.qa.squad_metrics import evaluate
    from spanbert_plugin.qa.postprocess import postprocess

    split = prepared_split(args.out)
    split.with_negative = args.with_negative
    width = int((split.passage_offset + split.passage_lengths()).max()) + 1
    rng = np.random.default_rng(args.seed)
    start_logits, end_logits = rng.normal(size=(2, split.num_windows, width))
    features = features_of(split)
    window_ids = np.arange(split.num_windows)
    rules = "v2" if split.with_negative else "v1"
    print(f"SQuAD 1.1 dev: {split.num_questions} questions, {split.num_windows} windows, logits {width} wide")

    def vectorised():
        result = postprocess(split, window_ids, start_logits, end_logits)
        return result.predictions, dict(result.nbest)

    def reference():
        return reference_postprocess(split, features, start_logits, end_logits)

    per_run = alternating_runs({"vectorised": lambda _: vectorised(), "reference": lambda _: reference()}, args.runs)
    print(f"{args.runs} alternating runs, {thread_note()}")
    for name, times in per_run.items():
        print(time_line(f"{name:>10} post-processing (wall)", times, unit="s", scale=1.0, places=2))
    print(ratio_line("speed-up reference / vectorised (wall)", per_run["reference"], per_run["vectorised"]))

    ours = postprocess(split, window_ids, start_logits, end_logits)
    expected, expected_nbest = reference_postprocess(split, features, start_logits, end_logits)
    same_predictions = ours.predictions == dict(expected)
    same_nbest = all([e["text"] for e in ours.nbest[q] if e["text"]] == [e["text"] for e in nbest if e["text"]]
                     and ("" in {e["text"] for e in ours.nbest[q]}) == ("" in {e["text"] for e in nbest})
                     for q, nbest in expected_nbest.items())
    reference_probability = {q: {e["text"]: e["probability"] for e in nbest} for q, nbest in expected_nbest.items()}
    probability_gap = max(abs(e["probability"] - reference_probability[q][e["text"]])
                          for q in expected_nbest for e in ours.nbest[q])
    print(f"identical predictions: {same_predictions}, identical n-best texts (in order): {same_nbest}, "
          f"largest probability difference: {probability_gap:.1e}")
    for name, predictions in (("vectorised", ours.predictions), ("reference", dict(expected))):
        metrics = evaluate(split.questions, predictions, rules=rules)  # one scorer for both sides
        print(f"{name:>10}: EM {metrics['exact']:.2f}, F1 {metrics['f1']:.2f} (random logits)")
    return 0 if same_predictions and same_nbest and probability_gap < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
