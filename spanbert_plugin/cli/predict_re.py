"""spanbert-predict-re: label every example of a prepared relation-extraction split with a checkpoint."""
import argparse
import json
import sys

from ..errors import UsageError
from ..file_utils import OutputError


def get_parser():
    parser = argparse.ArgumentParser(
        prog="spanbert-predict-re",
        description="Predict the relation of every example of a spanbert-prepare-re split; write "
        "predictions.jsonl (id, label, prob) and eval.json (precision, recall, F1, accuracy, counts).",
    )
    parser.add_argument("--checkpoint", required=True, help="relation_extraction checkpoint (.pt)")
    parser.add_argument("--data", help="spanbert-prepare-re folder (default: the one the checkpoint was trained on)")
    parser.add_argument("--split", default="test", help="split to predict (default: test)")
    parser.add_argument("--out", required=True, help="output folder (created; --force replaces an earlier output)")
    parser.add_argument("--force", action="store_true", help="replace an earlier spanbert-predict-re output")
    parser.add_argument("--batch-size", type=int, help="examples per batch (default: the checkpoint's validation batch size)")
    parser.add_argument("--max-tokens", type=int, help="tokens per batch (default: the checkpoint's validation setting)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    return parser


def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    from ..relation_extraction.predict import predict_split

    args = get_parser().parse_args(argv)
    try:
        scores = predict_split(args.checkpoint, args.data, args.split, args.out, args.force,
                               args.batch_size, args.max_tokens, args.cpu)
    except (UsageError, OutputError) as err:
        print(f"spanbert-predict-re: error: {err}", file=sys.stderr)
        return 1
    print(f"spanbert-predict-re: wrote {args.out}: " + json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
