"""Console commands: thin wrappers (parse, call the library, report), like fairseq_cli.

What every command shares lives here: ``command(prog)`` turns the plugin's
errors and interruptions into one line and an exit status, and shows library
log records as ``prog: warning: ...`` lines only; ``add_predict_arguments``
defines the options common to the predict commands, and ``predict_command``
builds a predict command from them (its own options through ``add_arguments``).
"""
import argparse
import contextlib
import functools
import importlib
import json
import logging
import os
import sys
import warnings

from ..core.errors import UsageError
from ..core.file_utils import Interrupted, signals_as_interrupt


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, unless its text already speaks of it or there is none."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (main() may run in tests)."""

    stream = property(lambda self: sys.stderr, lambda self, value: None)


class _CommandFormatter(logging.Formatter):
    """``prog: warning: message``, the shape of the commands' own messages."""

    def __init__(self, prog: str):
        super().__init__()
        self.prog = prog

    def format(self, record):
        return f"{self.prog}: {record.levelname.lower()}: {record.getMessage()}"


@contextlib.contextmanager
def warnings_only(prog: str):
    """Show only WARNING and above from every logger, as ``prog: warning: ...``; restore logging afterwards.

    torch's pinned-memory warning on CPU-only hosts is hidden too.

    Importing fairseq's models runs ``logging.basicConfig(level=DEBUG)``, which
    would flood stderr with DEBUG/INFO lines; while a handler is installed on
    the root logger that call does nothing, so the order of imports does not matter.
    """
    root = logging.getLogger()
    handler = _StderrHandler()
    handler.setFormatter(_CommandFormatter(prog))
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = [handler]
    root.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            # fairseq's batch iterator always asks for pinned memory; on a CPU-only host torch says so on every run
            warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true but no accelerator")
            yield
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)


def command(prog: str, errors=()):
    """Decorate a ``main(argv)``: UsageError (and ``errors``) -> ``prog: error: message``, status 1;
    Ctrl-C -> 130, SIGTERM/SIGHUP -> 128 + its number; library logging quieted.

    The signal handlers are installed before ``main`` runs (heavy imports happen inside it), so a
    signal at any moment of the command gives the line and the status, not a traceback or a silent death.
    """

    def decorate(main):
        @functools.wraps(main)
        def run(argv=None):
            with warnings_only(prog):
                try:
                    with signals_as_interrupt():
                        return main(argv)
                except (UsageError, *errors) as err:
                    print(f"{prog}: error: {err}", file=sys.stderr)
                    return 1
                except KeyboardInterrupt as err:
                    written = getattr(err, "output_written", None)  # the signal came as the output was moved into place
                    print(f"{prog}: interrupted after writing {written}" if written else
                          f"{prog}: interrupted; no output written, an earlier one left as it was", file=sys.stderr)
                    return err.exit_status if isinstance(err, Interrupted) else 130

        return run

    return decorate


def add_predict_arguments(parser, prog: str, task: str, prepare_command: str, default_split: str, unit: str = "examples"):
    """The options shared by the predict commands: checkpoint, data, split, output folder, batching, device."""
    parser.add_argument("--checkpoint", required=True, help=f"{task} checkpoint (.pt)")
    parser.add_argument("--data", help=f"{prepare_command} folder (default: the one the checkpoint was trained on)")
    parser.add_argument("--split", default=default_split, help=f"split to predict (default: {default_split})")
    parser.add_argument("--out", required=True, help="output folder (created; --force replaces an earlier output)")
    parser.add_argument("--force", action="store_true", help=f"replace an earlier {prog} output")
    parser.add_argument("--batch-size", type=int, help=f"{unit} per batch (default: the checkpoint's validation batch size)")
    parser.add_argument("--max-tokens", type=int, help="tokens per batch (default: the checkpoint's validation setting)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true", default=None,
                           help="run the model under bfloat16 autocast: several times faster on CPUs with AVX512-BF16 or "
                           "AMX and on recent GPUs (several times slower on CPUs without them); scores may differ "
                           "slightly from fp32 (default: as the checkpoint validated, under --bf16-autocast or not)")
    precision.add_argument("--no-bf16", dest="bf16", action="store_false", default=None,
                           help="run the model in fp32 even if the checkpoint was trained under --bf16-autocast")


def _prediction_device(args) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"  # where load_finetuned_checkpoint puts it


def model_precision(args):
    """The context the model runs in: bfloat16 autocast on the model's device with ``--bf16``, else nothing."""
    if not args.bf16:
        return contextlib.nullcontext()
    import torch

    device = _prediction_device(args)
    from ..core.precision import warn_if_bf16_is_emulated

    warn_if_bf16_is_emulated("--bf16", device)
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


def check_predict_arguments(args, prog: str = "spanbert-predict") -> None:
    """UsageError for batching options that would build no batch (argparse accepts any integer); ``args.bf16``
    unsaid becomes the checkpoint's --bf16-autocast, so that predictions are computed as validation computed them."""
    if getattr(args, "bf16", False) is None:
        from ..core.checkpoint_loading import stored_run_option
        from ..core.precision import cpu_supports_bf16

        trained_bf16 = bool(stored_run_option(args.checkpoint, "task", "bf16_autocast"))
        # where bfloat16 would only be emulated (several times slower), fp32 unless asked
        native = _prediction_device(args) == "cuda" or cpu_supports_bf16()
        args.bf16 = trained_bf16 and native
        if args.bf16:
            print(f"{prog}: the checkpoint was trained under --bf16-autocast: predicting under bfloat16 autocast "
                  "too, as validation did (--no-bf16 for fp32)", file=sys.stderr)
        elif trained_bf16:
            print(f"{prog}: the checkpoint was trained under --bf16-autocast, but this CPU only emulates bfloat16: "
                  "predicting in fp32, so scores may differ slightly from validation's (--bf16 to match them, "
                  "several times slower)", file=sys.stderr)
    split = getattr(args, "split", None)
    if split is not None and (not split or split in (".", "..") or os.sep in split
                              or (os.altsep and os.altsep in split)):
        # the split names the files read and written (its .conll goes into --out): a path would lead outside
        raise UsageError(f"--split {split!r}: must be a split's name, as the prepare command wrote it (e.g. valid), "
                         "not a path")
    for flag, value in (("--batch-size", args.batch_size), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: must be at least 1 (leave it out for the checkpoint's validation setting)")


def predict_command(prog: str, description: str, task: str, prepare_command: str, default_split: str, library: str,
                    hidden=(), add_arguments=None):
    """(get_parser, main) of a predict command with the shared options; ``library``.predict_split does the work.

    The library module is imported when the command runs (it imports fairseq); keys in ``hidden`` are left out
    of the summary line printed on success. ``add_arguments(parser)`` adds the command's own options; their
    values go to ``predict_split`` as keyword arguments.
    """

    def get_parser():
        parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)
        add_predict_arguments(parser, prog, task, prepare_command, default_split)
        if add_arguments is not None:
            shared = {action.dest for action in parser._actions}
            add_arguments(parser)
            parser.set_defaults(_own_options=[action.dest for action in parser._actions if action.dest not in shared])
        return parser

    @command(prog)
    def main(argv=None):
        """Console entry point: exit status 1 and a one-line error on bad input."""
        args = get_parser().parse_args(argv)
        check_predict_arguments(args, prog)
        predict_split = importlib.import_module(library).predict_split
        own = {dest: getattr(args, dest) for dest in getattr(args, "_own_options", [])}
        with model_precision(args):
            scores = predict_split(args.checkpoint, args.data, args.split, args.out, args.force,
                                   args.batch_size, args.max_tokens, args.cpu, **own)
        shown = {key: value for key, value in scores.items() if key not in hidden}
        print(f"{prog}: wrote {args.out}: " + json.dumps(shown))
        return 0

    return get_parser, main
