"""Where a coreference system's one-mention clusters go wrong: each predicted mention against the gold clusters.

Reads ``spanbert-predict-coref`` output folders (``<split>.conll`` beside ``<split>.gold.conll``) and counts

- predicted mentions by the size of their predicted cluster (one mention, or a chain of two or more) and what they
  are in the gold: a gold singleton, a mention of a gold chain, or no gold mention;
- gold mentions by what became of them: a predicted singleton, a mention of a predicted chain, or not predicted.

A predicted singleton that is a mention of a gold chain is a mention the model found but did not link; one that is
no gold mention is a mention-detection false positive. The counts are written as JSON and as a Markdown table::

    .venv/bin/python benchmarks/coreference/coref_errors.py RUN_TEST_FOLDER [RUN_TEST_FOLDER ...] --out errors.json
"""
import argparse
import json
import os
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers

from command_output import write_atomic  # noqa: E402

from spanbert_plugin.coref.conll import read_documents  # noqa: E402

SINGLETON, CHAIN, ABSENT = "singleton", "chain", "absent"


def mention_roles(clusters):
    """{span: "singleton" | "chain"} of one document's clusters."""
    return {tuple(span): SINGLETON if len(cluster) == 1 else CHAIN for cluster in clusters for span in cluster}


def compare(gold_docs, predicted_docs):
    """Counts of (predicted role, gold role) over predicted mentions and of (gold role, predicted role) over gold ones."""
    if [d.doc_key for d in gold_docs] != [d.doc_key for d in predicted_docs]:
        raise SystemExit("coref_errors: the predicted and gold files hold different documents")
    predicted_mentions, gold_mentions = Counter(), Counter()
    for gold, predicted in zip(gold_docs, predicted_docs):
        gold_role, predicted_role = mention_roles(gold.clusters), mention_roles(predicted.clusters)
        for span, role in predicted_role.items():
            predicted_mentions[f"{role}/{gold_role.get(span, ABSENT)}"] += 1
        for span, role in gold_role.items():
            gold_mentions[f"{role}/{predicted_role.get(span, ABSENT)}"] += 1
    return {"predicted_mentions": dict(sorted(predicted_mentions.items())),
            "gold_mentions": dict(sorted(gold_mentions.items()))}


def run_counts(folder):
    """The counts of one prediction folder (the split is read from its eval.json)."""
    with open(os.path.join(folder, "eval.json")) as f:
        split = json.load(f)["split"]
    return compare(read_documents(os.path.join(folder, f"{split}.gold.conll")),
                   read_documents(os.path.join(folder, f"{split}.conll")))


def table(runs):
    """Markdown: one row per (predicted or gold) mention kind, a column per run."""
    names = list(runs)
    lines = ["| mentions | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    labels = {
        "predicted_mentions": ("predicted", {SINGLETON: "one-mention cluster", CHAIN: "chain"},
                               {SINGLETON: "a gold singleton", CHAIN: "in a gold chain", ABSENT: "no gold mention"}),
        "gold_mentions": ("gold", {SINGLETON: "singleton", CHAIN: "chain mention"},
                          {SINGLETON: "predicted alone", CHAIN: "in a predicted chain", ABSENT: "not predicted"}),
    }
    for side, (noun, roles, outcomes) in labels.items():
        for role, role_name in roles.items():
            for outcome, outcome_name in outcomes.items():
                key = f"{role}/{outcome}"
                counts = [runs[name][side].get(key, 0) for name in names]
                lines.append(f"| {noun} {role_name}, {outcome_name} | " + " | ".join(map(str, counts)) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="spanbert-predict-coref --out folders")
    parser.add_argument("--out", required=True, help="JSON file to write (a .md table is written beside it)")
    args = parser.parse_args(argv)
    markdown_path = os.path.splitext(args.out)[0] + ".md"
    for path in (args.out, markdown_path):
        if os.path.exists(path):
            sys.exit(f"coref_errors: --out: {path} exists; choose another name")
    runs = {os.path.basename(os.path.normpath(folder)): run_counts(folder) for folder in args.folders}
    markdown = table(runs)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_atomic(args.out, json.dumps({"runs": runs, "folders": args.folders}, indent=2))
    write_atomic(markdown_path, markdown)
    print(markdown, end="")


if __name__ == "__main__":
    main()
