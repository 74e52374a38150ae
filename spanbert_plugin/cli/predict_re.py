"""spanbert-predict-re: label every example of a prepared relation-extraction split with a checkpoint."""
import argparse
import json
import sys

from . import add_predict_arguments, command

PROG = "spanbert-predict-re"


def get_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Predict the relation of every example of a spanbert-prepare-re split; write "
        "predictions.jsonl (id, label, prob) and eval.json (precision, recall, F1, accuracy, counts).",
    )
    add_predict_arguments(parser, PROG, "relation_extraction", "spanbert-prepare-re", "test")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    from ..relation_extraction.predict import predict_split

    args = get_parser().parse_args(argv)
    scores = predict_split(args.checkpoint, args.data, args.split, args.out, args.force,
                           args.batch_size, args.max_tokens, args.cpu)
    print(f"{PROG}: wrote {args.out}: " + json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
