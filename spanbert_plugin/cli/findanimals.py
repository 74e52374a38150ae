"""spanbert-findanimals: baseline vs SpanDrop vs Beta-SpanDrop vs SpanMask on FINDANIMALS (SPEC §2.1).

Writes ``results.csv`` and ``error_vs_train_size.png`` into ``--out`` (all at
once, when every run has finished) and prints the error table.
"""
import argparse
import contextlib
import sys

from ..core.file_utils import atomic_directory, check_destination
from ..spandrop.find_animals_experiment import METHODS, SETTINGS, RunFailed, RunOptions, run_all, summary_table, write_results
from . import HelpFormatter, command

PROG = "spanbert-findanimals"


def _int_list(flag):
    def parse(text):
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected comma-separated integers") from None
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected positive integers")
        return values

    return parse


def _positive_int(flag):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected a positive integer")
        return value

    return parse


def get_parser():
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="quick", help="quick (<30 min, 2 cores) or full")
    parser.add_argument("--out", default="findanimals_out", help="output folder for results.csv and the plot (created)")
    parser.add_argument("--force", action="store_true", help="replace an earlier spanbert-findanimals output")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    parser.add_argument("--sizes", type=_int_list("--sizes"), help="comma-separated training sizes (default: the setting's)")
    parser.add_argument("--seeds", type=_int_list("--seeds"), help="comma-separated seeds (default: the setting's)")
    parser.add_argument("--seq-len", type=_positive_int("--seq-len"), help="letters per string (default: the setting's)")
    parser.add_argument("--max-update", type=_positive_int("--max-update"), help="updates per run (default: the setting's)")
    parser.add_argument("--animals", help="comma-separated animal names (default: the setting's, 'cat' as in SPEC §2.1)")
    parser.add_argument("--test-size", type=_positive_int("--test-size"), default=10000, help="held-out examples")
    parser.add_argument("--position-bias", default="uniform", choices=["uniform", "fixed", "first100"], help="training position bias")
    parser.add_argument("--jobs", type=_positive_int("--jobs"), default=2, help="runs in parallel")
    parser.add_argument("--threads", type=_positive_int("--threads"), default=1, help="torch threads per run")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where runs train; with cuda, the --jobs runs share the GPU")
    return parser


@command(PROG, errors=(RunFailed,))
def main(argv=None):
    """Console entry point: runs the grid with a progress bar, writes the results, prints the table."""
    parser = get_parser()
    args = parser.parse_args(argv)
    setting = SETTINGS[args.setting]
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(f"--methods {args.methods!r}: expected a comma-separated subset of {', '.join(METHODS)}")
    # the setting's values only where an option is not given (0 or '' are refused, not read as "unset")
    chosen = {key: setting[key] if getattr(args, key) is None else getattr(args, key)
              for key in ("sizes", "seeds", "seq_len", "max_update", "animals")}
    sizes, seeds = chosen["sizes"], chosen["seeds"]
    options = RunOptions(seq_len=chosen["seq_len"], max_update=chosen["max_update"],
                         animals=chosen["animals"], test_size=args.test_size,
                         position_bias=args.position_bias, threads=args.threads, device=args.device)
    from tqdm import tqdm

    from ..spandrop.find_animals_data import parse_animals  # imports fairseq: after parsing, so --help is quick

    parse_animals(options.animals, options.seq_len)
    check_destination(args.out, PROG, force=args.force, flag="--out")
    rows = []
    runs = run_all(methods, sizes, seeds, options, args.jobs)
    # closing: however this loop ends (a signal, a failed run), the runs in progress are stopped at once
    with tqdm(total=len(sizes) * len(seeds) * len(methods), desc="FINDANIMALS runs", unit="run") as bar, \
            contextlib.closing(runs):
        for row in runs:
            rows.append(row)
            bar.set_postfix_str(f"{row['method']} n={row['train_size']} seed={row['seed']}: {row['error']:.1f}%")
            bar.update()
    title = f"FINDANIMALS ({options.animals}), n={options.seq_len}, bias={options.position_bias}, {len(seeds)} seeds"
    with atomic_directory(args.out, PROG, force=args.force, flag="--out") as work:
        write_results(rows, work, title)
    print("\n" + summary_table(rows, methods, sizes))
    print(f"\nwrote {args.out}/results.csv and error_vs_train_size.png (held-out error %, mean ± sd over seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
