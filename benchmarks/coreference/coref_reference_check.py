#!/usr/bin/env python
"""Cross-check the coreference metrics against the CoNLL-2012 reference scorer on real documents.

The reference scorer (conll/reference-coreference-scorers, ``scorer.pl``; it needs
perl's Algorithm::Munkres) is not part of this repository: pass its path. Gold
documents (LitBank by default) get perturbed responses (missed mentions,
boundary errors, split and merged clusters, spurious mentions and clusters,
from ``--seed``), written with the prediction writer of
``spanbert-predict-coref``; both files go to the scorer (``name`` = none: corpus
totals) and to ``spanbert_plugin.coref.metrics``. Prints each metric's summed
numerators and denominators from both and the largest F1 difference: MUC, B-cubed,
CEAF-e, CEAF-m, BLANC (its coreference and non-coreference links apart) and LEA
(``--metrics`` to choose; scorers without Moosavi and Strube's ``lea`` lack the last).

    .venv/bin/python benchmarks/coreference/coref_reference_check.py --scorer ~/reference-coreference-scorers/scorer.pl

A prediction folder can be checked instead: ``--key S.gold.conll --response S.conll``.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
LITBANK = os.path.join(ROOT, "..", "shared", "data", "litbank")
_COUNTS = r"Recall: \(([\d.e+-]+) / ([\d.e+-]+)\).*Precision: \(([\d.e+-]+) / ([\d.e+-]+)\)"
# the totals' line of each metric; BLANC prints its two kinds of links on lines of their own
_TOTAL = {"": re.compile("^Coreference: " + _COUNTS), "blanc_coref": re.compile("^Coreference links: " + _COUNTS),
          "blanc_noncoref": re.compile("^Non-coreference links: " + _COUNTS)}


def perturbed(doc, rng):
    """A plausible system response for a gold document: each span once."""
    response = []
    for cluster in doc.clusters:
        cluster = [m for m in cluster if rng.random() > 0.2]
        cluster = [(s, e + 1) if rng.random() < 0.05 and e + 1 < len(doc.words) else (s, e) for s, e in cluster]
        if len(cluster) > 3 and rng.random() < 0.3:
            k = int(rng.integers(1, len(cluster)))
            response += [cluster[:k], cluster[k:]]
        elif cluster:
            response.append(cluster)
    for _ in range(len(response) // 5):
        i, j = rng.choice(len(response), 2, replace=False)
        response[i], response[j] = response[i] + response[j], []
    response = [c for c in response if c]
    for _ in range(20):
        s = int(rng.integers(len(doc.words) - 3))
        mention = (s, s + int(rng.integers(0, 3)))
        if rng.random() < 0.5 and response:
            response[int(rng.integers(len(response)))].append(mention)
        else:
            response.append([mention, (s + 1, s + 1)])
    seen, kept = set(), []
    for cluster in response:
        cluster = [m for m in dict.fromkeys(cluster) if m not in seen]
        seen.update(cluster)
        if cluster:
            kept.append(sorted(cluster))
    return kept


def reference_counts(scorer, metric, counted, key, response):
    """{name: [recall num, den, precision num, den]} for each name ``counted`` of ``metric``, from the scorer's
    totals."""
    out = subprocess.run(["perl", scorer, metric, key, response, "none"], capture_output=True, text=True)
    found = {}
    for name in counted:
        totals = [m.groups() for m in map(_TOTAL["" if name == metric else name].search, out.stdout.splitlines()) if m]
        if not totals:
            raise SystemExit(f"{scorer} {metric}: no totals line for {name} (does this scorer have the metric? "
                             f"--metrics chooses)\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        found[name] = [float(v) for v in totals[-1]]
    return found


def main():
    from spanbert_plugin.coref.conll import read_documents, read_split, with_coref_column
    from spanbert_plugin.coref.metrics import BLANC_PARTS, SCORED, add_counts, coref_counts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scorer", required=True, help="the reference scorer's scorer.pl")
    parser.add_argument("--documents", default=os.path.join(LITBANK, "splits", "fold0", "test.txt"),
                        help="gold documents (file, folder, glob or list file)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--key", help="a gold CoNLL file (with --response: check a prediction instead)")
    parser.add_argument("--response", help="a predicted CoNLL file")
    parser.add_argument("--metrics", type=lambda text: text.split(","), default=[m for m in SCORED if m != "mentions"],
                        help="comma-separated scorer metric names (default: all the plugin computes)")
    args = parser.parse_args()
    unknown = [m for m in args.metrics if m not in SCORED or m == "mentions"]
    if unknown:
        parser.error(f"--metrics: {', '.join(unknown)} not computed here; choose from "
                     f"{','.join(m for m in SCORED if m != 'mentions')}")
    if args.key:
        keys = {d.doc_key: d.clusters for d in read_documents(args.key)}
        responses = {d.doc_key: d.clusters for d in read_documents(args.response)}
        key_file, response_file = args.key, args.response
        pairs = [(keys[k], responses.get(k, [])) for k in keys]
    else:
        rng = np.random.default_rng(args.seed)
        docs = read_split(args.documents, "--documents")
        work = tempfile.mkdtemp(prefix="coref-reference-check-")
        key_file, response_file = os.path.join(work, "key.conll"), os.path.join(work, "response.conll")
        pairs, key_lines, response_lines = [], [], []
        for doc in docs:
            response = perturbed(doc, rng)
            pairs.append((doc.clusters, response))
            key_lines += doc.lines
            response_lines += with_coref_column(doc, response)
        for path, lines in ((key_file, key_lines), (response_file, response_lines)):
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
        # Both sides score what the file says: two crossing mentions of one cluster (which a random response
        # can hold, a prediction cannot) have no bracket notation, and are read back as other spans.
        read_back = {d.doc_key: d.clusters for d in read_documents(response_file)}
        altered = sum(sorted(map(sorted, read_back[doc.doc_key])) != sorted(map(sorted, r)) for doc, (_, r) in zip(docs, pairs))
        pairs = [(key, read_back[doc.doc_key]) for doc, (key, _) in zip(docs, pairs)]
        print(f"{altered} of {len(pairs)} responses read back otherwise than written (crossing mentions of one cluster)")
    total = {}
    for key, response in pairs:
        total = add_counts(total, coref_counts(key, response))
    worst = 0.0
    def f1(c):
        r, p = c[0] / c[1] if c[1] else 0.0, c[2] / c[3] if c[3] else 0.0
        return 100 * 2 * p * r / (p + r) if p + r else 0.0

    for metric in args.metrics:
        counted = BLANC_PARTS if metric == "blanc" else (metric,)
        for name, theirs in reference_counts(args.scorer, metric, counted, key_file, response_file).items():
            ours = [total[f"{name}_{part}"] for part in ("r_num", "r_den", "p_num", "p_den")]
            worst = max(worst, abs(f1(ours) - f1(theirs)))
            rounded = [round(v, 9) for v in ours]
            print(f"{name}: reference {theirs} F1 {f1(theirs):.4f} | ours {rounded} F1 {f1(ours):.4f}")
    print(f"documents {len(pairs)}; largest F1 difference {worst:.2e} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
