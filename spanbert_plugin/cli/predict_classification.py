"""spanbert-predict-classification: classify a prepared split with a fine-tuned checkpoint."""
import sys

from . import predict_command

PROG = "spanbert-predict-classification"

get_parser, main = predict_command(
    PROG,
    "Classify every example of a spanbert-prepare-classification split; write predictions.jsonl "
    "(input order: index, id, label and probabilities, or value) and eval.json (the validation metrics).",
    "sentence_classification", "spanbert-prepare-classification", "valid", "spanbert_plugin.classification.predict",
    hidden=("confusion",),
)

if __name__ == "__main__":
    sys.exit(main())
