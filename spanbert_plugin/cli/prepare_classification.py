"""spanbert-prepare-classification: TSV/CSV/JSON Lines -> a folder for the sentence_classification task."""
import argparse
import dataclasses
import json
import sys

from ..core.errors import UsageError
from . import HelpFormatter, command

PROG = "spanbert-prepare-classification"


def get_parser():
    from ..classification.prepare import DEFAULT_MAX_SEQ_LENGTH, FORMATS

    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="Tokenize sentence or sentence-pair classification data as [CLS] A [SEP] (B [SEP]) "
        "with token types 0/1, for fairseq-train --task sentence_classification.",
    )
    parser.add_argument("--train", required=True, help="training file (TSV, CSV or JSON Lines); defines the labels")
    parser.add_argument("--valid", required=True, nargs="+", action="extend", metavar="FILE",
                        help="validation file, same columns; several are the splits valid, valid_1, ... (MNLI's "
                             "dev_matched and dev_mismatched: fairseq-train --valid-subset valid,valid_1)")
    parser.add_argument("--test", nargs="+", action="extend", metavar="FILE",
                        help="optional test file(s), the splits test, test_1, ...; a label column may be absent")
    parser.add_argument("--tokenizer-from", required=True,
                        help="spanbert-prepare or spanbert-import-hf folder (dict.txt + tokenizer) of the checkpoint to fine-tune")
    parser.add_argument("--destdir", required=True, help="output folder")
    parser.add_argument("--force", action="store_true", help="replace an earlier output of this command")
    parser.add_argument("--text-columns", required=True,
                        help="text column, or two for pairs: names (header line) or 0-based indices, e.g. sentence1,sentence2 or 3")
    parser.add_argument("--label-column", required=True, help="label column: name or 0-based index")
    parser.add_argument("--id-column", help="optional column copied into predictions as 'id'")
    parser.add_argument("--regression", action="store_true", help="labels are numbers (e.g. STS-B); one regression output")
    parser.add_argument("--max-seq-length", type=int, default=DEFAULT_MAX_SEQ_LENGTH,
                        help=f"tokens per example with [CLS]/[SEP]; pairs are truncated longest-first (default {DEFAULT_MAX_SEQ_LENGTH})")
    parser.add_argument("--format", choices=["auto", *FORMATS], default="auto",
                        help="input format (default: from the extension .tsv, .csv, .jsonl/.json); "
                             "TSV is read without quoting, as GLUE needs")
    parser.add_argument("--header", choices=["auto", "yes", "no"], default="auto",
                        help="is the first line a header? auto: yes when a column is given by name (TSV/CSV)")
    parser.add_argument("--skip-malformed-rows", action="store_true",
                        help="drop --train/--valid rows whose field count differs from the header's, with a warning "
                             "(GLUE's QQP: a question holding a line break); never the --test file")
    parser.add_argument("--test-text-columns",
                        help="the --test files' own text columns, when their layout differs from train and dev (GLUE's "
                             "test files: an index column first, no label); the test files are then read without labels")
    parser.add_argument("--test-header", choices=["auto", "yes", "no"],
                        help="is a --test file's first line a header? (default: as --header; with --test-text-columns, auto)")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    args = get_parser().parse_args(argv)
    from ..classification.prepare import PrepareOptions, ReadOptions, parse_columns, prepare_classification

    read = ReadOptions(
        text_columns=parse_columns(args.text_columns, "--text-columns"),
        label_column=parse_columns(args.label_column, "--label-column", most=1)[0],
        id_column=parse_columns(args.id_column, "--id-column", most=1)[0] if args.id_column else None,
        file_format=args.format,
        header=args.header,
        skip_malformed=args.skip_malformed_rows,
    )
    test_read = None
    if (args.test_text_columns or args.test_header) and not args.test:
        raise UsageError("--test-text-columns and --test-header describe the --test files; give --test")
    if args.test_text_columns:
        test_read = ReadOptions(text_columns=parse_columns(args.test_text_columns, "--test-text-columns"),
                                label_column=None, file_format=args.format, header=args.test_header or "auto")
    elif args.test_header:
        test_read = dataclasses.replace(read, header=args.test_header)
    options = PrepareOptions(args.tokenizer_from, args.destdir, read, args.regression, args.max_seq_length, args.force)
    stats = prepare_classification(args.train, args.valid, options, args.test, test_read)
    print(f"{PROG}: wrote {args.destdir}: " + json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
