"""spanbert-export-hf: write a spanbert checkpoint as a HuggingFace transformers directory."""
import argparse
import sys

from . import HelpFormatter, command

PROG = "spanbert-export-hf"


def get_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="Export a spanbert checkpoint to HuggingFace transformers (BertForMaskedLM and its task heads), "
        "then reload the output with transformers and compare it with fairseq.",
    )
    parser.add_argument("--checkpoint", required=True, help="fairseq checkpoint (.pt) of a spanbert model")
    parser.add_argument("--out", required=True, help="output folder (created; --force replaces an earlier export)")
    parser.add_argument("--data", help="folder with dict.txt and the tokenizer files, relative to the working directory "
                        "(default: the checkpoint's folder when it holds dict.txt, else the folder it was trained on)")
    parser.add_argument("--head", help="task head to export when the checkpoint has several: a classification head's "
                        "name, or 'qa' (default: the QA head and the only classification head)")
    parser.add_argument("--force", action="store_true", help="replace an earlier spanbert-export-hf output")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    args = get_parser().parse_args(argv)
    from ..hf.interop import export_hf

    report = export_hf(args.checkpoint, args.out, args.data, args.force, args.head)
    diffs = ", ".join(f"{name} {value:.2e}" for name, value in report.items())
    print(f"{PROG}: wrote {args.out}; transformers vs fairseq max |diff|: {diffs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
