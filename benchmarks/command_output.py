"""A benchmark's child command run with its output kept, and a line of progress on the console as it comes."""
import json
import os
import subprocess


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
