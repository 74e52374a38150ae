"""Runs the venv's console commands (fairseq-train, fairseq-hydra-train, spanbert-*) for the tests in forks of one
process that has already imported torch, fairseq and the plugin.

Starting Python and importing those takes about 6 s on this project's 2-core machines, and the suite starts a few
hundred commands: most of its time. Each command still runs in a process of its own, a fresh fork of the server
(which never runs anything itself), with its own environment, working directory, arguments and pipes, and exits as
a console script does (``sys.exit(main())``, then the interpreter's shutdown), but for the teardown of its modules
(``end_as_the_interpreter_would``). What a fork does not give afresh is whatever the environment decides at import
time (torch's thread count is set from OMP_NUM_THREADS again in the child).

``cli_forkserver.py --socket PATH``: the server listens on a Unix socket and writes, into a folder, one small script
per command (``write_shims``). The tests' ``run_cli`` runs a command's script instead of the command, and a benchmark
driver pointed at the folder (``SPANBERT_COMMANDS_DIR``) does the same; the script hands the server its arguments,
environment, working directory and stdin/stdout/stderr, and exits as the command did. Each connection is served by a
fork of its own, so commands started side by side run side by side; a command whose script goes away (killed at a
timeout) is killed with its process group. The server stops when its stdin closes (the test process has ended).

The project's programs (``python scripts/demo.py``, the drivers under benchmarks/) are served the same way, through
one shim that takes the script's path first (``PROJECT_SCRIPT``): the fork runs the script as ``__main__``, with
``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT`` sets them.
"""
import atexit
import gc
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
from importlib.metadata import entry_points

SERVED_MODULES = ("fairseq_cli.", "spanbert_plugin.")
HERE = os.path.dirname(os.path.abspath(__file__))
# the tests' own scripts that run fairseq-train in their process (``python tests/NAME ARGS``), served as commands too
HELPER_SCRIPTS = ("_train_and_dump.py", "fairseq_train_killed_once.py")
# the project's programs (``python scripts/NAME.py ARGS``, ``python benchmarks/.../NAME.py ARGS``): one shim of this
# name runs the script its first argument names, as ``python SCRIPT ARGS`` would
PROJECT_SCRIPT = "project-script.py"
PROJECT_FOLDERS = ("scripts", "benchmarks")


class HelperScript:
    """A helper script under tests/ as a command: ``load()`` gives what runs it as ``python tests/NAME`` would."""

    def __init__(self, name):
        self.path = os.path.join(HERE, name)

    def load(self):
        def main():
            import runpy

            runpy.run_path(self.path, run_name="__main__")

        return main


class ProjectScript:
    """A program of the project's scripts/ or benchmarks/ as a command: its first argument is the script's path."""

    def load(self):
        def main():
            import runpy

            script, *args = sys.argv[1:]
            sys.argv = [script, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(script))  # as ``python SCRIPT`` sets it
            runpy.run_path(script, run_name="__main__")

        return main


def console_scripts():
    """{command name: entry point} for the commands this server runs (it writes a shim for each): the venv's
    fairseq and plugin commands, and the helper scripts by their file names."""
    commands = {ep.name: ep for ep in entry_points(group="console_scripts") if ep.value.startswith(SERVED_MODULES)}
    return {**commands, **{name: HelperScript(name) for name in HELPER_SCRIPTS}, PROJECT_SCRIPT: ProjectScript()}


def preload():
    """Import what every command imports, once, for the forks to inherit."""
    import torch  # noqa: F401
    # transformers (below) imports torch._dynamo, whose exit handler builds a table and so may run a garbage collection;
    # imported after the plugin, that handler would run before the plugin's (exit handlers run last-registered first)
    # and free a run's mid-epoch DataLoader iterator before the plugin stops its workers (5 s per worker, as
    # spanbert_plugin.core.clean_exit says). A command that never imports it exits with the plugin's handler first,
    # as it does here when torch._dynamo is imported before the plugin.
    import torch._dynamo  # noqa: F401

    import fairseq  # noqa: F401
    import spanbert_plugin.registry  # noqa: F401

    # what spanbert-import-hf / spanbert-export-hf, the coreference HF head and the demo import when they run (about
    # 2 s a command otherwise)
    import safetensors.torch  # noqa: F401
    import tokenizers  # noqa: F401
    import transformers  # noqa: F401
    from transformers import (BertConfig, BertForMaskedLM, BertForQuestionAnswering,  # noqa: F401
                              BertForSequenceClassification, BertModel, BertTokenizerFast, PreTrainedTokenizerFast)

    warm_fairseq_config()

    # Importing fairseq leaves a DEBUG handler on the root logger (one of its modules calls logging.basicConfig);
    # fairseq-train configures logging before it imports fairseq, so each command must find logging as a fresh
    # interpreter has it. fairseq_cli's modules are left to the commands for the same reason: they configure
    # logging when imported.
    logging.getLogger().handlers.clear()
    logging.getLogger().setLevel(logging.WARNING)


def warm_fairseq_config():
    """Turn a fairseq-train command line into fairseq's hydra config once. Every fairseq-train and
    fairseq-hydra-train does so, and hydra parses each of the few hundred overrides with a parser that builds its
    tables on first use: built here, the forks inherit them (about 0.35 s less a command). Nothing else stays
    behind: hydra's global state is restored when the conversion ends, and no file is read."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        "unused-data-folder", "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch", "spanbert_tiny",
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-4", "--cpu"])
    convert_namespace_to_omegaconf(args)


def run_command(request, commands, fds):
    """In the forked child: become the command, with the shim's stdin, stdout and stderr (``fds``), and end as its
    console script would (``end_as_the_interpreter_would``)."""
    os.setsid()  # its own process group, so that a timeout kills its data-loader workers too
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    if os.environ.get("OMP_NUM_THREADS"):
        import torch  # preloaded

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.argv = list(request["argv"])
    end_as_the_interpreter_would(commands[os.path.basename(sys.argv[0])].load())


def end_as_the_interpreter_would(main):
    """Run ``main`` as ``sys.exit(main())`` does in a console script, and end the process as the interpreter ends
    it: the exit status (SystemExit's code, printed when it is no number; 1 after an uncaught exception, which
    ``sys.excepthook`` prints; killed by SIGINT after an uncaught KeyboardInterrupt), non-daemon threads joined, exit
    handlers run, the command's unreachable objects collected, the standard streams flushed (status 120 when that
    fails).

    Left out: the teardown of the modules, which would free every object the fork inherited from the server and so
    copy the pages they sit on (about 0.45 s a command on this project's machines, 60,000 page faults). A command
    sees no difference but for finalisers of objects that a module still holds at exit, which no longer run: the
    tests of exit behaviour start their commands as processes of their own (tests/test_clean_exit.py)."""
    interrupted = False
    try:
        code = main()
    except SystemExit as stop:
        code = stop.code
    except BaseException as error:  # noqa: BLE001 - the interpreter's own top level: print it, exit 1
        interrupted = isinstance(error, KeyboardInterrupt)
        sys.excepthook(type(error), error, error.__traceback__)
        code = 1
    if code is None or isinstance(code, int):
        status = int(code or 0)
    else:
        print(code, file=sys.stderr)
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


SHIM = """#!{python} -SE
# runs {name} in a fork of tests/cli_forkserver.py --socket (written by the tests; see that file)
import json, os, signal, socket, sys
server = socket.socket(socket.AF_UNIX)
server.connect({socket_path!r})
socket.send_fds(server, [b"!"], [os.open(os.devnull, os.O_RDONLY), 1, 2])
request = {{"argv": [{command!r}, *sys.argv[1:]], "env": dict(os.environ), "cwd": os.getcwd()}}
server.sendall((json.dumps(request) + "\\n").encode())
returncode = int(server.makefile().readline())
if returncode < 0:  # killed by a signal: end the same way, as subprocess reports it
    signal.signal(-returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -returncode)
sys.exit(returncode)
"""


def write_shims(folder, socket_path, commands_dir):
    """One script per served command in ``folder``, named as the command in ``commands_dir`` (the venv's bin), or
    as the helper script in tests/."""
    for name in console_scripts():
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(SHIM.format(python=sys.executable, name=name, socket_path=socket_path,
                                command=os.path.join(HERE if name in HELPER_SCRIPTS else commands_dir, name)))
        os.chmod(path, 0o755)


def serve_connection(connection, commands):
    """In a fork per connection: run the command a shim sent, kill it if the shim goes away, send its return code."""
    _, fds, _, _ = socket.recv_fds(connection, 1, 3)
    request = json.loads(connection.makefile().readline())
    pid = os.fork()
    if pid == 0:
        connection.close()
        run_command(request, commands, fds)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    ready, _, _ = select.select([pidfd, connection], [], [])
    if pidfd not in ready:  # the shim is gone (its driver was stopped): so is the command
        os.killpg(pid, signal.SIGKILL)
    returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    try:
        connection.sendall(f"{returncode}\n".encode())
    except OSError:
        pass
    os._exit(0)


def serve_socket(socket_path):
    """Accept until stdin closes (the test process that started the server has ended)."""
    commands = console_scripts()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the per-connection forks are reaped by the kernel
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready:
            return
        connection, _ = listener.accept()
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this fork waits for its command
            listener.close()
            serve_connection(connection, commands)
        connection.close()


if __name__ == "__main__":
    if sys.argv[1:2] != ["--socket"] or len(sys.argv) != 3:
        sys.exit("usage: cli_forkserver.py --socket PATH")
    preload()
    serve_socket(sys.argv[2])
