"""The console commands' shared wrapper (errors, interruptions, logging) and the predict commands' shared options."""
import logging
import re
import signal
import warnings
from types import SimpleNamespace

import pytest
import torch

from conftest import bin_path, run_cli
from spanbert_plugin.cli import command, warnings_only
from spanbert_plugin.cli import predict_classification, predict_qa, predict_re
from spanbert_plugin.core.errors import UsageError
from spanbert_plugin.core.file_utils import Interrupted, OutputError


class Boom(RuntimeError):
    pass


def failing(exc):
    @command("demo-cmd", errors=(Boom,))
    def main(argv=None):
        raise exc

    return main


@pytest.mark.parametrize("exc", [UsageError("--x 3: expected an even number"), OutputError("out: not empty"),
                                 Boom("run 2 failed")])
def test_user_errors_are_one_line_and_status_1(exc, capsys):
    assert failing(exc)() == 1
    assert capsys.readouterr().err == f"demo-cmd: error: {exc}\n"


def test_other_errors_propagate():
    with pytest.raises(KeyError):
        failing(KeyError("bug"))()


@pytest.mark.parametrize("exc, status", [(KeyboardInterrupt(), 130), (Interrupted(signal.SIGTERM), 143),
                                         (Interrupted(signal.SIGHUP), 129)])
def test_interruptions_give_the_shell_status(exc, status, capsys):
    assert failing(exc)() == status
    err = capsys.readouterr().err
    assert err.startswith("demo-cmd: interrupted") and err.count("\n") == 1


def test_logging_shows_warnings_only_and_is_restored(capsys):
    root = logging.getLogger()
    before = (root.handlers[:], root.level)
    library = logging.getLogger("spanbert_plugin.some_library")
    with warnings_only("demo-cmd"):
        logging.basicConfig(level=logging.DEBUG)  # what importing fairseq's models does: must change nothing
        library.info("step 1 of 3")
        library.debug("details")
        library.warning("3 examples were cut")
    assert capsys.readouterr().err == "demo-cmd: warning: 3 examples were cut\n"
    assert (root.handlers, root.level) == before


def test_cpu_pinned_memory_warning_is_hidden_others_kept():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with warnings_only("demo-cmd"):
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used.")
            warnings.warn("something a user can act on")
    assert [str(w.message) for w in caught] == ["something a user can act on"]


def test_success_returns_the_status_of_main(capsys):
    @command("demo-cmd")
    def main(argv=None):
        print("done")
        return 0

    assert main([]) == 0 and capsys.readouterr().out == "done\n"


@pytest.mark.parametrize("module, split", [(predict_qa, "valid"), (predict_re, "test"), (predict_classification, "valid")])
def test_predict_commands_share_their_options(module, split):
    parser = module.get_parser()
    args = parser.parse_args(["--checkpoint", "c.pt", "--out", "o", "--batch-size", "4", "--max-tokens", "99",
                              "--cpu", "--force", "--data", "d"])
    assert (args.checkpoint, args.out, args.batch_size, args.max_tokens, args.cpu, args.force, args.data) == \
        ("c.pt", "o", 4, 99, True, True, "d")
    assert parser.parse_args(["--checkpoint", "c.pt", "--out", "o"]).split == split
    assert parser.prog == module.PROG
    assert parser.parse_args(["--checkpoint", "c.pt", "--out", "o", "--bf16"]).bf16


def test_bf16_option_runs_the_model_under_bfloat16_autocast():
    import argparse

    import torch

    from spanbert_plugin.cli import model_precision

    layer = torch.nn.Linear(4, 2)
    with model_precision(argparse.Namespace(bf16=True, cpu=True)):
        assert layer(torch.ones(1, 4)).dtype == torch.bfloat16
    with model_precision(argparse.Namespace(bf16=False, cpu=True)):
        assert layer(torch.ones(1, 4)).dtype == torch.float32


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_native_bfloat16_is_warned_about(native, monkeypatch, caplog):
    import argparse

    from spanbert_plugin.cli import model_precision
    from spanbert_plugin.core import precision

    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: native)
    with caplog.at_level("WARNING"), model_precision(argparse.Namespace(bf16=True, cpu=True)):
        pass
    assert sum("without native bfloat16" in r.getMessage() for r in caplog.records) == (0 if native else 1)


def test_predict_qa_checks_its_own_options(tmp_path, capsys):
    assert predict_qa.main(["--checkpoint", "c.pt", "--out", str(tmp_path / "o"), "--n-best", "0"]) == 1
    assert capsys.readouterr().err == "spanbert-predict-qa: error: --n-best must be at least 1\n"


def test_console_command_prints_one_line_without_fairseq_logging(tmp_path):
    """A real process: importing fairseq must not add DEBUG/INFO lines around the error."""
    proc = run_cli([bin_path("spanbert-predict-re"), "--checkpoint", str(tmp_path / "missing.pt"),
                    "--out", str(tmp_path / "o")], check=False)
    assert proc.returncode == 1
    assert proc.stderr == f"spanbert-predict-re: error: --checkpoint {tmp_path / 'missing.pt'}: no such file\n"
    assert not (tmp_path / "o").exists()


def test_usage_error_rewrapped_by_fairseq_is_still_one_line(capsys):
    """fairseq's Trainer.load_checkpoint re-raises a UsageError from loading weights as a bare Exception."""
    from spanbert_plugin.core.errors import _hook

    try:
        try:
            raise UsageError("the checkpoint's vocabulary has 30 symbols but the data's dict.txt has 20")
        except Exception:
            raise Exception("Cannot load model parameters from checkpoint x.pt")
    except Exception as err:  # noqa: BLE001 - the shape fairseq raises
        wrapped = err
    shown = []
    _hook(lambda *exc_info: shown.append(exc_info))(type(wrapped), wrapped, wrapped.__traceback__)
    assert capsys.readouterr().err == "error: the checkpoint's vocabulary has 30 symbols but the data's dict.txt has 20\n"
    assert not shown
    other = RuntimeError("a bug")
    _hook(lambda *exc_info: shown.append(exc_info))(RuntimeError, other, None)
    assert shown and shown[0][1] is other  # anything else keeps its traceback


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("trained_bf16, flag, expected", [(True, [], True), (True, ["--no-bf16"], False),
                                                          (False, [], False), (False, ["--bf16"], True)])
def test_predict_precision_defaults_to_the_checkpoints(trained_bf16, flag, expected, native, tmp_path, capsys,
                                                       monkeypatch):
    """Unsaid, --bf16 is what the checkpoint validated with (--bf16-autocast), so predictions score as logged; where
    the CPU only emulates bfloat16 (several times slower), fp32 unless asked, said in one line."""
    import torch

    from spanbert_plugin.cli import check_predict_arguments
    from spanbert_plugin.core import precision

    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: native)
    expected = expected if flag or native else False

    checkpoint = str(tmp_path / "c.pt")
    torch.save({"cfg": {"task": {"_name": "sentence_classification", "bf16_autocast": trained_bf16}}}, checkpoint)
    args = predict_classification.get_parser().parse_args(["--checkpoint", checkpoint, "--out", "o", "--cpu", *flag])
    check_predict_arguments(args, "spanbert-predict-classification")
    assert args.bf16 is expected
    err = capsys.readouterr().err
    assert ("predicting under bfloat16 autocast too" in err) == (trained_bf16 and not flag and native)
    assert ("only emulates bfloat16: predicting in fp32" in err) == (trained_bf16 and not flag and not native)


def test_progress_outside_a_terminal_is_a_line_per_redraw_and_nothing_for_a_short_run(monkeypatch):
    """tqdm's disable=None showed nothing when stderr was a log (nohup, a batch scheduler): there the bar is a line
    every LOG_EVERY_SECONDS, the first after that long, without carriage returns."""
    import io

    from spanbert_plugin.core import progress

    log = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", log)
    monkeypatch.setattr(progress, "LOG_EVERY_SECONDS", 0)
    for _ in progress.progress_bar(range(3), desc="encode", unit="doc"):
        pass
    lines = log.getvalue().splitlines()
    assert lines and "\r" not in log.getvalue() and all(line.startswith("encode") for line in lines)
    assert "3/3" in lines[-1]
    log.seek(0)
    log.truncate()
    monkeypatch.setattr(progress, "LOG_EVERY_SECONDS", 30)  # a run far shorter than that writes nothing
    for _ in progress.progress_bar(range(3), desc="encode"):
        pass
    assert log.getvalue() == ""


def test_a_heartbeat_writes_a_line_per_period_while_the_block_runs(monkeypatch):
    """For a step that cannot count its progress (sentencepiece's training): a line each period, none after."""
    import io

    from spanbert_plugin.core import progress

    class Periods:
        """stop.wait(): two periods pass, then the block has ended."""
        answers = [False, False, True]

        def wait(self, seconds):
            return self.answers.pop(0)

        def set(self):
            pass

    log = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", log)
    with progress.heartbeat("spanbert-prepare: training the sentencepiece model", stop=Periods()):
        pass
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and all(re.fullmatch(r"spanbert-prepare: training the sentencepiece model: \d+ s elapsed",
                                                line) for line in lines), lines


class _Model(torch.nn.Linear):
    def __init__(self):
        super().__init__(1, 1)

    def max_positions(self):
        return 512


class _Task:
    """A split of 5 examples (example i's output is 10 * i), batched in an order other than the input's."""

    ORDER = [3, 0, 4, 1, 2]

    def __init__(self, drop_last_batch=False):
        self.drop_last_batch, self.asked = drop_last_batch, None

    def load_dataset(self, split, training=False):
        assert not training

    def dataset(self, split):
        return list(range(5))

    def get_batch_iterator(self, dataset, max_tokens, max_sentences, **kwargs):
        self.asked = {"max_tokens": max_tokens, "max_sentences": max_sentences}
        size = max_sentences or 2
        batches = [self.ORDER[i:i + size] for i in range(0, len(self.ORDER), size)]
        if self.drop_last_batch:
            batches = batches[:-1]
        samples = [{"id": torch.tensor(b), "x": torch.tensor(b, dtype=torch.float)[:, None] * 10} for b in batches]
        return SimpleNamespace(next_epoch_itr=lambda shuffle: iter(samples))


_CFG = SimpleNamespace(dataset=SimpleNamespace(max_tokens_valid=4096, batch_size_valid=2), common=SimpleNamespace(seed=1))


def test_predict_split_outputs_batches_by_the_given_options_and_writes_input_order():
    from spanbert_plugin.core.finetune_io import predict_split_outputs

    task = _Task()
    out = predict_split_outputs(_Model(), task, _CFG, "valid", lambda s: s["x"], (1,))
    assert task.asked == {"max_tokens": 4096, "max_sentences": 2}  # the checkpoint's validation settings
    assert out[:, 0].tolist() == [0, 10, 20, 30, 40]
    out = predict_split_outputs(_Model(), task, _CFG, "valid", lambda s: s["x"], (1,), batch_size=3, max_tokens=100)
    assert task.asked == {"max_tokens": 100, "max_sentences": 3}  # --max-tokens / --batch-size
    assert out[:, 0].tolist() == [0, 10, 20, 30, 40]


def test_predict_split_outputs_refuses_a_split_with_an_example_left_out():
    from spanbert_plugin.core.finetune_io import predict_split_outputs

    # batches [3, 0], [4, 1], [2]: the last (partial) batch never comes
    with pytest.raises(RuntimeError, match=r"split 'valid': 1 of 5 examples were not evaluated"):
        predict_split_outputs(_Model(), _Task(drop_last_batch=True), _CFG, "valid", lambda s: s["x"], (1,))


def test_a_bug_raised_while_handling_a_usage_error_keeps_its_traceback(capsys):
    """Only fairseq's bare ``Exception`` re-wrapping a UsageError is shown as the UsageError's line; an exception of
    another type raised while one was handled (a bug in the handler) keeps its traceback."""
    from spanbert_plugin.core.errors import _hook

    try:
        try:
            raise UsageError("--data x: no such folder")
        except UsageError:
            raise KeyError("missing_key")
    except KeyError as err:
        bug = err
    shown = []
    _hook(lambda *exc_info: shown.append(exc_info))(KeyError, bug, bug.__traceback__)
    assert shown and shown[0][1] is bug
    assert capsys.readouterr().err == ""


def test_progress_on_a_terminal_is_tqdms_bar_redrawn_in_place_and_nothing_without_stderr(monkeypatch):
    import io

    from spanbert_plugin.core import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(progress.sys, "stderr", terminal)
    for _ in progress.progress_bar(range(3), desc="encode", unit="doc"):
        pass
    assert "\r" in terminal.getvalue() and "encode" in terminal.getvalue() and "3/3" in terminal.getvalue()
    monkeypatch.setattr(progress.sys, "stderr", None)  # pythonw, or a daemon whose stderr was closed
    bar = progress.progress_bar(range(3), desc="encode")
    assert bar.disable and list(bar) == [0, 1, 2]
