"""benchmarks/coreference/coref_errors.py: predicted and gold mentions sorted by what they are on the other side."""
import os
import subprocess
import sys

import numpy as np

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "coreference"))
import coref_errors  # noqa: E402

from spanbert_plugin.coref.conll import CorefDocument, with_coref_column  # noqa: E402


def document(clusters, n_words=12):
    words = [f"w{i}" for i in range(n_words)]
    lines = ["#begin document (d); part 000",
             *[f"d\t0\t{i}\t{w}\t-\t-\t-\t-\t-\t-\t-\t-\t-" for i, w in enumerate(words)], "#end document"]
    doc = CorefDocument("d", words, np.zeros(n_words, dtype=np.int64), ["-"] * n_words, [], "x:1", lines,
                        np.arange(1, n_words + 1))
    return with_coref_column(doc, clusters)


GOLD = [[(0, 0), (3, 3), (6, 6)], [(8, 9)], [(10, 10)]]  # one chain of three, two singletons
PREDICTED = [[(0, 0), (3, 3)], [(6, 6)], [(8, 9)], [(11, 11)], [(1, 1), (10, 10)]]


def test_counts_each_mention_once_on_each_side(tmp_path):
    for name, clusters in (("test.gold.conll", GOLD), ("test.conll", PREDICTED)):
        (tmp_path / name).write_text("\n".join(document(clusters)) + "\n")
    (tmp_path / "eval.json").write_text('{"split": "test"}')
    counts = coref_errors.run_counts(str(tmp_path))
    assert counts["predicted_mentions"] == {
        "chain/chain": 2,  # (0,0) and (3,3): linked
        "chain/absent": 1,  # (1,1)
        "chain/singleton": 1,  # (10,10): a gold singleton put in a chain
        "singleton/chain": 1,  # (6,6): found, not linked
        "singleton/singleton": 1,  # (8,9)
        "singleton/absent": 1,  # (11,11)
    }
    assert counts["gold_mentions"] == {"chain/chain": 2, "chain/singleton": 1, "singleton/singleton": 1,
                                       "singleton/chain": 1}
    out = tmp_path / "errors.json"
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "coreference", "coref_errors.py"), str(tmp_path), "--out", str(out)]
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "| predicted one-mention cluster, in a gold chain | 1 |" in (tmp_path / "errors.md").read_text()
    again = subprocess.run(command, capture_output=True, text=True)  # never overwrites its earlier output
    assert again.returncode == 1 and "exists" in again.stderr
