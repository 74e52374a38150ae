"""spanbert-predict-qa: answer a prepared QA split with a fine-tuned checkpoint, in the official formats."""
import argparse
import json
import sys

from ..errors import UsageError
from ..file_utils import OutputError


def get_parser():
    parser = argparse.ArgumentParser(
        prog="spanbert-predict-qa",
        description="Answer every question of a spanbert-prepare-qa split; write predictions.json, "
        "null_odds.json (SQuAD 2.0), nbest_predictions.json and eval.json.",
    )
    parser.add_argument("--checkpoint", required=True, help="extractive_qa checkpoint (.pt)")
    parser.add_argument("--data", help="spanbert-prepare-qa folder (default: the one the checkpoint was trained on)")
    parser.add_argument("--split", default="valid", help="split to answer (default: valid)")
    parser.add_argument("--out", required=True, help="output folder (created; --force replaces an earlier output)")
    parser.add_argument("--force", action="store_true", help="replace an earlier spanbert-predict-qa output")
    parser.add_argument("--null-threshold", type=float, default=0.0,
                        help="SQuAD 2.0: answer '' when null score minus best span score exceeds this")
    parser.add_argument("--n-best", type=int, default=20, help="best start/end positions per window and answers kept")
    parser.add_argument("--max-answer-length", type=int, default=30, help="longest answer, in tokens")
    parser.add_argument("--batch-size", type=int, help="windows per batch (default: the checkpoint's validation batch size)")
    parser.add_argument("--max-tokens", type=int, help="tokens per batch (default: the checkpoint's validation setting)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    return parser


def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    from ..qa.predict import predict_split
    from ..qa.scoring import AnswerOptions

    args = get_parser().parse_args(argv)
    if args.n_best < 1:
        print("spanbert-predict-qa: error: --n-best must be at least 1", file=sys.stderr)
        return 1
    if args.max_answer_length < 1:
        print("spanbert-predict-qa: error: --max-answer-length must be at least 1", file=sys.stderr)
        return 1
    options = AnswerOptions(args.n_best, args.max_answer_length, args.null_threshold)
    try:
        scores = predict_split(args.checkpoint, args.data, args.split, args.out, options, args.force,
                               args.batch_size, args.max_tokens, args.cpu)
    except (UsageError, OutputError, FileNotFoundError) as err:
        print(f"spanbert-predict-qa: error: {err}", file=sys.stderr)
        return 1
    print(f"spanbert-predict-qa: wrote {args.out}: " + json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
