"""A benchmark's child commands: run with their output kept and a line of progress on the console as it comes, and
recorded for its commands file with paths relative to the repository root."""
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def relative_to_root(command):
    """A command line as a commands file records it: paths inside the repository relative to its root, and the
    ``shared`` folder beside it as ``../shared``, so that the file reads the same from any checkout and runs from
    the root of the reader's."""
    shared = os.path.join(os.path.dirname(ROOT), "shared") + os.sep
    return command.replace(ROOT + os.sep + ".." + os.sep + "shared" + os.sep, "../shared/").replace(
        shared, "../shared/").replace(ROOT + os.sep, "")


def write_atomic(path, text):
    """Replace ``path`` with ``text`` in one step (a half-written results file never exists)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def save_figure_atomic(fig, path, dpi=110):
    """Save a matplotlib figure to ``path`` in one step, and close it."""
    import matplotlib.pyplot as plt

    temporary = f"{path}.tmp{os.getpid()}{os.path.splitext(path)[1]}"  # savefig reads the format from the suffix
    try:
        fig.savefig(temporary, dpi=dpi)
        os.replace(temporary, path)
    finally:
        plt.close(fig)
        if os.path.exists(temporary):
            os.remove(temporary)


def run_streaming(argv, cwd, env=None, log_path=None, progress=None):
    """Run ``argv``; return its exit status and its output (stdout and stderr together). With ``log_path`` the output
    is appended there as it comes; ``progress`` maps an output line to a line for the console, or None."""
    lines = []
    with open(log_path or os.devnull, "a", encoding="utf-8") as log, subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            lines.append(line)
            log.write(line)
            log.flush()
            shown = progress(line) if progress else None
            if shown:
                print(shown, flush=True)
    return proc.returncode, "".join(lines)


def log_record(line, marker):
    """The json record of a fairseq log line (json log format) that holds ``marker``, or None."""
    return json.loads(line[line.index("{"):]) if marker in line and "{" in line else None


def train_progress(total_updates):
    """``progress`` for fairseq-train: each train_inner record as one line."""
    def progress(line):
        record = log_record(line, "| train_inner |")
        return None if record is None else f"   update {record['num_updates']}/{total_updates}: loss {record['loss']}"
    return progress


class CommandLog:
    """Runs commands, keeps each one's command line (paths relative to the repository root) for commands.md."""

    def __init__(self):
        self.lines = []

    @staticmethod
    def quote(argv):
        return relative_to_root(" ".join(shlex.quote(a) for a in argv))

    def run(self, argv, what, env=None, log_path=None, progress=None):
        """Run ``argv`` from the repository root; its output is returned (and, with ``log_path``, appended there as it
        comes). ``progress`` maps an output line to a line for the console, or None: long runs show how far they are."""
        self.lines.append((what, self.quote(argv)))
        print(f"== {what}: {self.lines[-1][1]}", flush=True)
        returncode, output = run_streaming(argv, ROOT, env, log_path, progress)
        if returncode != 0:
            sys.exit(f"{what} failed (exit {returncode}):\n{output[-3000:]}")
        return output
