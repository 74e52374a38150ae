"""spanbert-prepare-coref: CoNLL-2012 or JSON-lines coreference documents -> a coreference data folder."""
import argparse
import json
import sys

from . import HelpFormatter, command

PROG = "spanbert-prepare-coref"


def get_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="Prepare coreference documents (CoNLL-2012 or c2f-coref JSON lines, detected from the content) "
        "for fairseq-train --task coreference. Each split takes a file, a folder, a glob or a list file "
        "(one document file per line, relative to the list).",
    )
    parser.add_argument("--train", help="training documents")
    parser.add_argument("--valid", help="validation documents")
    parser.add_argument("--test", help="test documents")
    parser.add_argument("--tokenizer-from", required=True,
                        help="folder with dict.txt and the tokenizer (spanbert-prepare or spanbert-import-hf output)")
    parser.add_argument("--destdir", required=True, help="output folder (created; --force replaces an earlier output)")
    parser.add_argument("--max-segment-length", type=int, default=384,
                        help="tokens per independent segment including [CLS] and [SEP] (the paper tunes 128-512)")
    parser.add_argument("--max-span-width", type=int, default=30,
                        help="widest gold mention (tokens) counted as trainable; wider ones are kept for evaluation")
    parser.add_argument("--refuse-shared-documents", action="store_true",
                        help="stop when a --valid or --test document is also in --train (same key or same words); "
                        "by default one warning says how many")
    parser.add_argument("--force", action="store_true", help=f"replace an earlier {PROG} output")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    args = get_parser().parse_args(argv)
    from ..coref.prepare import prepare_coref_data

    stats = prepare_coref_data(args)
    print(f"{PROG}: wrote {args.destdir}: " + json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
