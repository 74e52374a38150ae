"""spanbert-prepare-qa: SQuAD / MRQA files -> a fairseq data folder of extractive-QA windows."""
import argparse
import json
import sys

from . import HelpFormatter, command

COMMAND = "spanbert-prepare-qa"  # spanbert_plugin.qa.prepare.COMMAND, imported only when the command runs


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        formatter_class=HelpFormatter,
        description="Cut SQuAD 1.1/2.0 JSON or MRQA JSONL(.gz) question-answering files into "
                    "[CLS] question [SEP] passage-window [SEP] examples for the extractive_qa task.",
    )
    parser.add_argument("--train", help="training file: SQuAD JSON or MRQA JSONL (plain or .gz), detected from the content")
    parser.add_argument("--valid", help="validation file (same formats); evaluation uses all its gold answers")
    parser.add_argument("--tokenizer-from", required=True, metavar="DIR",
                        help="folder with dict.txt and the tokenizer files (a spanbert-prepare or spanbert-import-hf output)")
    parser.add_argument("--destdir", required=True, help="output folder (created; must not exist unless --force)")
    parser.add_argument("--max-seq-length", type=int, default=512, help="tokens per window, [CLS] and [SEP]s included")
    parser.add_argument("--doc-stride", type=int, default=128, help="passage tokens between the starts of consecutive windows")
    parser.add_argument("--max-query-length", type=int, default=64, help="question tokens kept (longer questions are cut)")
    parser.add_argument("--strict", action="store_true",
                        help="fail on gold answers that do not match the context or cover no token "
                             "(default: count them, warn, leave their questions out of training)")
    parser.add_argument("--force", action="store_true", help="replace an existing --destdir written by this command")
    return parser


@command(COMMAND)
def main(argv=None) -> int:
    """Console entry point: exit status 1 and a one-line error on bad input."""
    args = get_parser().parse_args(argv)
    from ..qa.prepare import QAConfig, prepare_qa

    config = QAConfig(args.max_seq_length, args.doc_stride, args.max_query_length)
    stats = prepare_qa({"train": args.train, "valid": args.valid}, args.tokenizer_from, args.destdir, config,
                       force=args.force, strict=args.strict)
    print(f"{COMMAND}: wrote {args.destdir}: " + json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
