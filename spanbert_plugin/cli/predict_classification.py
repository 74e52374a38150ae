"""spanbert-predict-classification: classify a prepared split with a fine-tuned checkpoint."""
import argparse
import json
import sys

from ..errors import UsageError
from ..file_utils import OutputError


def get_parser():
    parser = argparse.ArgumentParser(
        prog="spanbert-predict-classification",
        description="Classify every example of a spanbert-prepare-classification split; write predictions.jsonl "
        "(input order: index, id, label and probabilities, or value) and eval.json (the validation metrics).",
    )
    parser.add_argument("--checkpoint", required=True, help="sentence_classification checkpoint (.pt)")
    parser.add_argument("--data", help="spanbert-prepare-classification folder (default: the one the checkpoint was trained on)")
    parser.add_argument("--split", default="valid", help="split to classify: train, valid or test (default: valid)")
    parser.add_argument("--out", required=True, help="output folder (created; --force replaces an earlier output)")
    parser.add_argument("--force", action="store_true", help="replace an earlier spanbert-predict-classification output")
    parser.add_argument("--batch-size", type=int, help="examples per batch (default: the checkpoint's validation batch size)")
    parser.add_argument("--max-tokens", type=int, help="tokens per batch (default: the checkpoint's validation setting)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    return parser


def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    from ..classification.predict import predict_split

    args = get_parser().parse_args(argv)
    try:
        scores = predict_split(args.checkpoint, args.data, args.split, args.out, args.force,
                               args.batch_size, args.max_tokens, args.cpu)
    except (UsageError, OutputError) as err:
        print(f"spanbert-predict-classification: error: {err}", file=sys.stderr)
        return 1
    scores.pop("confusion", None)
    print(f"spanbert-predict-classification: wrote {args.out}: " + json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
