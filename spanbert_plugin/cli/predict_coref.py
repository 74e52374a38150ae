"""spanbert-predict-coref: resolve coreference in every document of a prepared split with a checkpoint."""
import argparse
import sys

from ..coref.conll import GENRES
from ..coref.prediction_modes import DEFAULT_ENTITY_CACHE_SIZE, DEFAULT_MAX_ANTECEDENT_DISTANCE, PREDICTION_MODES
from . import predict_command

PROG = "spanbert-predict-coref"


def _thresholds(text: str):
    try:
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers in (0, 1), got {text!r}") from None


def add_coref_arguments(parser):
    parser.set_defaults(split=None)  # given or not: --split has no place beside --text (test when unsaid)
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
    parser.add_argument("--text", metavar="BOOK.txt",
                        help="resolve a raw UTF-8 text file (.gz too) instead of a prepared split, with the "
                        "checkpoint's tokenizer: clusters.jsonl holds one cluster a line with character offsets into "
                        "the text, summary.json the counts; a line break ends a sentence (see --join-wrapped-lines)")
    parser.add_argument("--join-wrapped-lines", action="store_true",
                        help="with --text: lines are wrapped inside paragraphs (as in Project Gutenberg's files), so "
                        "only blank lines end a sentence besides . ! ?")
    parser.add_argument("--genre", choices=GENRES,
                        help="with --text: the OntoNotes genre to predict under (default: other, or for a checkpoint "
                        "trained without it, nw or another genre it trained)")
    parser.add_argument("--coref-prediction", choices=PREDICTION_MODES,
                        help="exact, bounded (block by block in bounded memory) or auto: bounded past the "
                        "checkpoint's --exact-prediction-max-words (default: the checkpoint's, auto)")
    parser.add_argument("--max-antecedent-distance", type=int, metavar="WORDS",
                        help="bounded prediction: farther back than this, only an entity's latest mention is a "
                        f"candidate antecedent (default: the checkpoint's, {DEFAULT_MAX_ANTECEDENT_DISTANCE:,})")
    parser.add_argument("--entity-cache-size", type=int, metavar="ENTITIES",
                        help="bounded prediction: entities whose latest mention stays a candidate past "
                        f"--max-antecedent-distance (default: the checkpoint's, {DEFAULT_ENTITY_CACHE_SIZE:,})")
    parser.add_argument("--scoring-convention", choices=("with_singletons", "without_singletons"),
                        help="which convention eval.json's top-level scores use (default: the checkpoint's; both "
                        "are always written)")


get_parser, main = predict_command(
    PROG,
    "Resolve coreference in every document of a spanbert-prepare-coref split; write <split>.conll (the input's "
    "lines with the last column replaced by the prediction), clusters.jsonl and eval.json (MUC, B-cubed, CEAF-e "
    "precision/recall/F1, the CoNLL F1, CEAF-m, BLANC, LEA and mention identification, in percent, with and "
    "without singletons). "
    "Documents are processed one at a time; long ones (whole books) in bounded memory. With --text BOOK.txt, a "
    "raw text file instead (clusters.jsonl with character offsets).",
    "coreference", "spanbert-prepare-coref", "test", "spanbert_plugin.coref.predict",
    hidden=("counts", "with_singletons", "without_singletons"), add_arguments=add_coref_arguments,
)

if __name__ == "__main__":
    sys.exit(main())
