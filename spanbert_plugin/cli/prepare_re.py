"""spanbert-prepare-re: TACRED-style JSON -> a relation_extraction data folder."""
import argparse
import json
import sys

from ..relation.markers import ENTITY_MARKERS
from . import HelpFormatter, command

PROG = "spanbert-prepare-re"


def get_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="Prepare TACRED-style relation extraction data (JSON list or JSON Lines) for "
        "fairseq-train --task relation_extraction.",
    )
    parser.add_argument("--train", required=True, help="training examples (JSON list or JSON Lines)")
    parser.add_argument("--valid", required=True, help="validation examples")
    parser.add_argument("--test", help="test examples (optional)")
    parser.add_argument("--tokenizer-from", required=True,
                        help="folder with dict.txt and the tokenizer (spanbert-prepare or spanbert-import-hf output)")
    parser.add_argument("--destdir", required=True, help="output folder (created; --force replaces an earlier output)")
    parser.add_argument("--entity-marker", default="ner", choices=ENTITY_MARKERS,
                        help="ner: mentions replaced by [SUBJ-TYPE]/[OBJ-TYPE] (SpanBERT); typed_marker: mentions "
                        "wrapped in typed start/end markers; typed_marker_punct: wrapped in '@ * type * ... @' "
                        "and '# ^ type ^ ... #' (no new vocabulary)")
    parser.add_argument("--max-seq-length", type=int, default=128,
                        help="tokens per example including [CLS] and [SEP]; longer examples are cut around the entities")
    parser.add_argument("--negative-label", default="no_relation",
                        help="the 'no relation' label: label index 0, left out of precision/recall/F1")
    parser.add_argument("--labels", help="file with every label, one per line (default: the labels of --train)")
    parser.add_argument("--force", action="store_true", help="replace an earlier spanbert-prepare-re output")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    args = get_parser().parse_args(argv)
    from ..core.progress import progress_bar
    from ..relation.prepare import prepare_relation_data

    stats = prepare_relation_data(args, lambda total: progress_bar(total=total, desc="encode", unit="example"))
    print(f"{PROG}: wrote {args.destdir}: " + json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
