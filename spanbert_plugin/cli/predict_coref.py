"""spanbert-predict-coref: resolve coreference in every document of a prepared split with a checkpoint."""
import sys

from . import predict_command

PROG = "spanbert-predict-coref"

get_parser, main = predict_command(
    PROG,
    "Resolve coreference in every document of a spanbert-prepare-coref split; write <split>.conll (the input's "
    "lines with the last column replaced by the prediction), clusters.jsonl and eval.json (MUC, B-cubed, CEAF-e "
    "precision/recall/F1 and the CoNLL F1, in percent). Documents are processed one at a time.",
    "coreference", "spanbert-prepare-coref", "test", "spanbert_plugin.coref.predict", hidden=("counts",),
)

if __name__ == "__main__":
    sys.exit(main())
