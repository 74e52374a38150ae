"""spanbert-average-checkpoints: fairseq's scripts/average_checkpoints.py for the plugin's checkpoints."""
import argparse
import sys

from . import HelpFormatter, command

PROG = "spanbert-average-checkpoints"


def get_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="Average the weights of fairseq checkpoints into a new checkpoint, as fairseq's "
                    "scripts/average_checkpoints.py does (same options); the vocabulary and other integer records "
                    "must agree and are kept. The rest of the new checkpoint is the first input's.",
    )
    parser.add_argument("--inputs", required=True, nargs="+",
                        help="checkpoint files; with --num-epoch-checkpoints or --num-update-checkpoints, the run's "
                             "--save-dir")
    parser.add_argument("--output", required=True, metavar="FILE", help="the new checkpoint (must not exist)")
    number = parser.add_mutually_exclusive_group()
    number.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                        help="average the last N checkpointE.pt files of the folder --inputs names")
    number.add_argument("--num-update-checkpoints", type=int, metavar="N",
                        help="average the last N checkpoint_E_U.pt files (--save-interval-updates) of that folder")
    parser.add_argument("--checkpoint-upper-bound", type=int, metavar="K",
                        help="with --num-*-checkpoints: the last epoch (or update) to take, e.g. N=10, K=50: 41-50")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    parser = get_parser()
    args = parser.parse_args(argv)
    by_number = args.num_epoch_checkpoints is not None or args.num_update_checkpoints is not None
    if args.checkpoint_upper_bound is not None and not by_number:
        parser.error("--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints")
    if by_number and len(args.inputs) != 1:
        parser.error("with --num-epoch-checkpoints or --num-update-checkpoints, --inputs names one folder")
    import os

    from ..core.checkpoint_averaging import average_checkpoints, check_output, last_checkpoints, write_new_checkpoint

    inputs = args.inputs
    check_output(args.output, inputs if by_number else [os.path.dirname(path) or os.curdir for path in inputs])
    if by_number:
        by_update = args.num_update_checkpoints is not None
        count = args.num_update_checkpoints if by_update else args.num_epoch_checkpoints
        inputs = last_checkpoints(inputs[0], count, by_update, args.checkpoint_upper_bound)
    state = average_checkpoints(inputs)
    write_new_checkpoint(state, args.output)
    print(f"{PROG}: wrote {args.output}, the mean of {len(inputs)} checkpoints: {', '.join(inputs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
