"""Runs the venv's console commands (fairseq-train, fairseq-hydra-train, spanbert-*) for the tests in forks of one
process that has already imported torch, fairseq and the plugin.

Starting Python and importing those takes about 6 s on this project's 2-core machines, and the suite starts a few
hundred commands: most of its time. Each command still runs in a process of its own, a fresh fork of the server
(which never runs anything itself), with its own environment, working directory, arguments and output files, and
exits as a console script does (``sys.exit(main())``, then the interpreter's normal shutdown). What a fork does not
give afresh is whatever the environment decides at import time (torch's thread count is set from OMP_NUM_THREADS
again in the child).

Protocol, one JSON object per line: the client writes ``{"argv", "env", "cwd", "stdout", "stderr", "timeout"}``
on the server's stdin, the server answers ``{"returncode"}``, or ``{"timeout": true}`` when it killed the command.
"""
import json
import logging
import os
import select
import signal
import sys
from importlib.metadata import entry_points

SERVED_MODULES = ("fairseq_cli.", "spanbert_plugin.")


def console_scripts():
    """{command name: entry point} for the commands this server runs (the client asks it which those are)."""
    return {ep.name: ep for ep in entry_points(group="console_scripts") if ep.value.startswith(SERVED_MODULES)}


def preload():
    """Import what every command imports, once, for the forks to inherit."""
    import torch  # noqa: F401

    import fairseq  # noqa: F401
    import spanbert_plugin.registry  # noqa: F401

    # Importing fairseq leaves a DEBUG handler on the root logger (one of its modules calls logging.basicConfig);
    # fairseq-train configures logging before it imports fairseq, so each command must find logging as a fresh
    # interpreter has it. fairseq_cli's modules are left to the commands for the same reason: they configure
    # logging when imported.
    logging.getLogger().handlers.clear()
    logging.getLogger().setLevel(logging.WARNING)


def wait(pid, timeout):
    """The command's return code as subprocess gives it (negative: killed by that signal), or None after ``timeout``
    seconds, when its whole process group is killed."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
        if not ready:
            os.killpg(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
    finally:
        os.close(pidfd)
    return os.waitstatus_to_exitcode(status) if ready else None


def run_command(request, commands):
    """In the forked child: become the command, then leave through sys.exit as its console script would."""
    os.setsid()  # its own process group, so that a timeout kills its data-loader workers too
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, key in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    if os.environ.get("OMP_NUM_THREADS"):
        import torch  # preloaded

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.argv = list(request["argv"])
    sys.exit(commands[os.path.basename(sys.argv[0])].load()())


def serve():
    commands = console_scripts()
    answers = os.dup(1)
    os.dup2(2, 1)  # anything printed by the server itself goes to stderr, never into an answer
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.close(answers)
            run_command(request, commands)
        returncode = wait(pid, request["timeout"])
        answer = {"timeout": True} if returncode is None else {"returncode": returncode}
        os.write(answers, (json.dumps(answer) + "\n").encode())


if __name__ == "__main__":
    preload()
    serve()
