"""spanbert-predict-re: label every example of a prepared relation-extraction split with a checkpoint."""
import sys

from . import predict_command

PROG = "spanbert-predict-re"

get_parser, main = predict_command(
    PROG,
    "Predict the relation of every example of a spanbert-prepare-re split; write "
    "predictions.jsonl (id, label, prob) and eval.json (precision, recall, F1, accuracy, counts).",
    "relation_extraction", "spanbert-prepare-re", "test", "spanbert_plugin.relation.predict",
)

if __name__ == "__main__":
    sys.exit(main())
