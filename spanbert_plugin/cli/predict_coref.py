"""spanbert-predict-coref: resolve coreference in every document of a prepared split with a checkpoint."""
import sys

from . import predict_command

PROG = "spanbert-predict-coref"



def add_coref_arguments(parser):
    parser.add_argument("--no-singletons", action="store_true", default=None,
                        help="predict no one-mention clusters (the OntoNotes convention; default: as the checkpoint "
                        "was trained)")
    parser.add_argument("--singleton-threshold", type=float,
                        help="mention probability above which a kept span with no antecedent is a one-mention "
                        "cluster (default: the checkpoint's, 0.5 unless set at training)")
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
