"""spanbert-import-hf: turn a HuggingFace BERT directory into a spanbert checkpoint and data folder."""
import argparse
import sys

from . import HelpFormatter, command

PROG = "spanbert-import-hf"


def get_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="Import a HuggingFace BERT directory as a spanbert fairseq checkpoint (model.pt, dict.txt, tokenizer).",
    )
    parser.add_argument("--hf", required=True, help="HuggingFace folder: config.json, model.safetensors or pytorch_model.bin, vocab.txt")
    parser.add_argument("--out", required=True, help="output folder (created; --force replaces an earlier import)")
    parser.add_argument("--force", action="store_true", help="replace an earlier spanbert-import-hf output")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the weights the folder lacks (the SBO, a missing MLM head or its layers): the "
                        "same seed gives the same checkpoint")
    return parser


@command(PROG)
def main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    args = get_parser().parse_args(argv)
    from ..hf.interop import import_hf

    report = import_hf(args.hf, args.out, args.force, args.seed)
    print(f"{PROG}: wrote {args.out}/model.pt")
    for head in report["task_heads"]:
        print(f"task head kept: {head}")
    for note in report["notes"]:
        print(note)
    if report["freshly_initialised"]:
        print("freshly initialised (not in the HF checkpoint): " + ", ".join(report["freshly_initialised"]))
    if report["ignored_hf_weights"]:
        print("HF weights with no spanbert counterpart (ignored): " + ", ".join(report["ignored_hf_weights"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
