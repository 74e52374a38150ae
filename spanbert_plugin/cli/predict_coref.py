"""spanbert-predict-coref: resolve coreference in every document of a prepared split with a checkpoint."""
import argparse
import sys

from . import predict_command

PROG = "spanbert-predict-coref"



def _thresholds(text: str):
    try:
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers in (0, 1), got {text!r}") from None


def add_coref_arguments(parser):
    singletons = parser.add_mutually_exclusive_group()
    singletons.add_argument("--no-singletons", action="store_true", default=None,
                            help="predict no one-mention clusters (the OntoNotes convention; default: as the "
                            "checkpoint's training data: one-mention clusters only where it holds them)")
    singletons.add_argument("--singletons", dest="no_singletons", action="store_false", default=None,
                            help="predict one-mention clusters even where the training data holds none")
    parser.add_argument("--singleton-threshold", type=float,
                        help="mention probability above which a kept span with no antecedent is a one-mention "
                        "cluster (default: the checkpoint's, 0.5 unless set at training)")
    parser.add_argument("--singleton-threshold-sweep", type=_thresholds, metavar="T1,T2,...",
                        help="also score the split at each of these singleton thresholds, from the same model outputs "
                        "(one pass over the documents): singleton_thresholds.json, one eval.json-like object per "
                        "threshold, e.g. to choose the threshold on dev")
    parser.add_argument("--scoring-convention", choices=("with_singletons", "without_singletons"),
                        help="which convention eval.json's top-level scores use (default: the checkpoint's; both "
                        "are always written)")


get_parser, main = predict_command(
    PROG,
    "Resolve coreference in every document of a spanbert-prepare-coref split; write <split>.conll (the input's "
    "lines with the last column replaced by the prediction), clusters.jsonl and eval.json (MUC, B-cubed, CEAF-e "
    "precision/recall/F1, the CoNLL F1 and mention identification, in percent, with and without singletons). "
    "Documents are processed one at a time.",
    "coreference", "spanbert-prepare-coref", "test", "spanbert_plugin.coref.predict",
    hidden=("counts", "with_singletons", "without_singletons"), add_arguments=add_coref_arguments,
)

if __name__ == "__main__":
    sys.exit(main())
