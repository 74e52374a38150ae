"""tests/cli_forkserver.py --socket: a command started through its shim, as a benchmark driver starts it, gets the
driver's arguments, working directory, environment and pipes, and its return code comes back to the driver."""
import os
import subprocess
import sys

import pytest

from conftest import driver_env


def test_a_shim_runs_its_command_with_the_callers_arguments_pipes_and_return_code(tmp_path):
    env = driver_env()
    if "SPANBERT_COMMANDS_DIR" not in env:
        pytest.skip("SPANBERT_TESTS_NO_FORKSERVER=1: commands start as new processes, there is no server")
    commands = env["SPANBERT_COMMANDS_DIR"]
    usage = subprocess.run([os.path.join(commands, "fairseq-train"), "--help"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: fairseq-train") and "Traceback" not in usage.stderr
    # argparse's error goes to the caller's stderr, with exit 2
    refused = subprocess.run([os.path.join(commands, "spanbert-prepare-coref"), "--train", "train.txt"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "the following arguments are required: --tokenizer-from, --destdir" in refused.stderr

    # the environment is the caller's: argparse wraps its usage at the caller's COLUMNS
    def usage_first_line(columns):
        return subprocess.run([os.path.join(commands, "spanbert-prepare-coref"), "--help"], cwd=tmp_path,
                              env={**env, "COLUMNS": columns}, capture_output=True, text=True,
                              timeout=300).stdout.splitlines()[0]

    assert usage_first_line("40") == "usage: spanbert-prepare-coref"
    assert usage_first_line("200").startswith("usage: spanbert-prepare-coref [-h] [--train TRAIN]")


def test_a_training_command_must_name_its_checkpoint_folder():
    """fairseq resumes from ./checkpoints/checkpoint_last.pt even under --no-save: a test's training command names
    its own folder, or run_cli refuses it before it starts."""
    from conftest import bin_path, run_cli

    with pytest.raises(AssertionError, match="without --save-dir"):
        run_cli([bin_path("fairseq-train"), "data", "--no-save"])
    with pytest.raises(AssertionError, match="without checkpoint.save_dir="):
        run_cli([bin_path("fairseq-hydra-train"), "--config-name", "x"])


ENDINGS = {  # how a command can end: the server ends its fork as the interpreter ends a process
    "returns": "print('done', end='')",  # unflushed output is flushed
    "exit_code": "import sys; sys.exit(3)",
    "exit_message": "import sys; sys.exit('stopped: a message')",
    "exception": "raise ValueError('bad input')",
    "interrupted": "raise KeyboardInterrupt",
    "exit_handlers_after_threads": (
        "import atexit, threading\n"
        "atexit.register(print, 'exit handler')\n"
        "held = threading.Lock(); held.acquire()  # the thread prints once the script has ended\n"
        "threading.Thread(target=lambda: (held.acquire(), print('thread done'))).start()\n"
        "held.release()\n"),
    "unreachable_objects_finalised": (
        "class Cycle:\n"
        "    def __del__(self): print('finalised', flush=True)\n"
        "a, b = Cycle(), Cycle(); a.other, b.other = b, a\n"
        "del a, b\n"
        "import gc; gc.disable()  # left to the interpreter's end\n"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_command_ends_as_in_a_process_of_its_own(ending, tmp_path):
    """The server skips the teardown of the interpreter's modules (each fork would copy the whole inherited heap to
    free it); status, output and error output stay those of `python SCRIPT` (a traceback's last line: the frames
    above the command's differ)."""
    env = driver_env()
    if "SPANBERT_COMMANDS_DIR" not in env:
        pytest.skip("SPANBERT_TESTS_NO_FORKSERVER=1: commands start as new processes, there is no server")
    script = tmp_path / "command.py"
    script.write_text(ENDINGS[ending])
    served, alone = (subprocess.run([*launcher, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                                    timeout=300)
                     for launcher in ([os.path.join(env["SPANBERT_COMMANDS_DIR"], "project-script.py")],
                                      [sys.executable]))
    assert (served.returncode, served.stdout) == (alone.returncode, alone.stdout)
    assert served.stderr.splitlines()[-1:] == alone.stderr.splitlines()[-1:]
    assert alone.returncode == {"exit_code": 3, "exit_message": 1, "exception": 1, "interrupted": -2}.get(ending, 0)
