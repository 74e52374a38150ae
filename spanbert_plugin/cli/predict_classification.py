"""spanbert-predict-classification: classify a prepared split with a fine-tuned checkpoint."""
import argparse
import json
import sys

from . import add_predict_arguments, command

PROG = "spanbert-predict-classification"


def get_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Classify every example of a spanbert-prepare-classification split; write predictions.jsonl "
        "(input order: index, id, label and probabilities, or value) and eval.json (the validation metrics).",
    )
    add_predict_arguments(parser, PROG, "sentence_classification", "spanbert-prepare-classification", "valid")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    from ..classification.predict import predict_split

    args = get_parser().parse_args(argv)
    scores = predict_split(args.checkpoint, args.data, args.split, args.out, args.force,
                           args.batch_size, args.max_tokens, args.cpu)
    scores.pop("confusion", None)
    print(f"{PROG}: wrote {args.out}: " + json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
