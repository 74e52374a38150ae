"""spanbert-predict-qa: answer a prepared QA split with a fine-tuned checkpoint, in the official formats."""
import argparse
import json
import math
import sys

from ..core.errors import UsageError
from . import HelpFormatter, add_predict_arguments, check_predict_arguments, command, model_precision

PROG = "spanbert-predict-qa"


def get_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="Answer every question of a spanbert-prepare-qa split; write predictions.json, "
        "null_odds.json (SQuAD 2.0), nbest_predictions.json and eval.json.",
    )
    add_predict_arguments(parser, PROG, "extractive_qa", "spanbert-prepare-qa", "valid", unit="windows")
    # unset: the checkpoint's criterion settings, so that predictions score as validation logged them
    threshold = parser.add_mutually_exclusive_group()
    threshold.add_argument("--null-threshold", type=float,
                           help="SQuAD 2.0: answer '' when null score minus best span score exceeds this (default: "
                           "the checkpoint's --null-threshold, else 0)")
    threshold.add_argument("--null-threshold-from-validation", action="store_true",
                           help="SQuAD 2.0: the threshold best on the validation before the checkpoint was saved "
                           "(its best_f1_thresh), as SpanBERT's code answers the test set")
    parser.add_argument("--n-best", type=int, help="best start/end positions per window and answers kept (default: "
                        "the checkpoint's --n-best, else 20)")
    parser.add_argument("--max-answer-length", type=int, help="longest answer, in tokens (default: the checkpoint's "
                        "--max-answer-length, else 30)")
    parser.add_argument("--fp32-recheck-margin", type=float, default=0.0, metavar="LOGITS",
                        help="with --bf16: compute again in fp32 the questions whose best answer leads the next by less "
                        "than this (start + end logits), so near ties are decided as in fp32 (0: off)")
    return parser


@command(PROG, errors=(FileNotFoundError,))
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    args = get_parser().parse_args(argv)
    check_predict_arguments(args, PROG)
    for flag, value in (("--n-best", args.n_best), ("--max-answer-length", args.max_answer_length)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1")
    if args.null_threshold is not None and math.isnan(args.null_threshold):
        raise UsageError("--null-threshold nan: must be a number (every comparison with nan is false)")
    if not args.fp32_recheck_margin >= 0 or math.isinf(args.fp32_recheck_margin):
        raise UsageError(f"--fp32-recheck-margin {args.fp32_recheck_margin}: must be a finite number of at least 0")
    if args.fp32_recheck_margin > 0 and not args.bf16:
        raise UsageError("--fp32-recheck-margin: only with --bf16 (without it every window is computed in fp32)")
    from ..qa.predict import predict_split  # imports torch and fairseq: after parsing, so --help is quick

    options = dict(n_best=args.n_best, max_answer_length=args.max_answer_length, null_threshold=args.null_threshold,
                   null_threshold_from_validation=args.null_threshold_from_validation)
    with model_precision(args):
        scores = predict_split(args.checkpoint, args.data, args.split, args.out, options, args.force,
                               args.batch_size, args.max_tokens, args.cpu, args.fp32_recheck_margin)
    print(f"{PROG}: wrote {args.out}: " + json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
