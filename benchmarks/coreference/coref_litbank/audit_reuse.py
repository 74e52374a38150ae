#!/usr/bin/env python
"""Did any committed coref_litbank.py result report a run trained for another checkpoint or budget?

Before finished runs in --work were keyed by every setting, a second invocation on the same --work reused the
first one's run (its record, commands included) for the same fold, arm and seed. Such a run shows in the
folder's commands.txt as a training command whose checkpoint, epochs or head size no invocation of that folder
asked for. This reads every committed commands.txt and prints, per folder, the invocations and the mismatches.

    .venv/bin/python benchmarks/coreference/coref_litbank/audit_reuse.py > benchmarks/coreference/coref_litbank/audit_reuse.txt
"""
import glob
import os
import re
import shlex

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = re.compile(r"# fold (\d+), (\S+), seed (\d+)")
DEFAULTS = {"--epochs": "20", "--ffnn-size": "3000"}
TRAINED = {"--checkpoint": r"checkpoint\.finetune_from_model=(\S+)", "--epochs": r"optimization\.max_epoch=(\S+)",
           "--ffnn-size": r"task\.coref_ffnn_size=(\S+)"}


def invocations(lines):
    """The options of every coref_litbank.py invocation a commands.txt names (its own and those it included)."""
    found = []
    for line in lines:
        text = line.lstrip("# ")
        if text.startswith("benchmarks/coreference/coref_litbank.py "):
            words = shlex.split(text)[1:]
            found.append({w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")})
    return found


def audit(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    invoked = invocations(lines)
    asked = {flag: {os.path.abspath(d[flag]) if flag == "--checkpoint" else d.get(flag, DEFAULTS.get(flag))
                    for d in invoked if flag in d or flag in DEFAULTS} for flag in TRAINED}
    run, trained, mismatches = None, 0, []
    for line in lines:
        if header := RUN.fullmatch(line):
            run = header.groups()
        elif run and "fairseq-hydra-train" in line:
            trained += 1
            for flag, pattern in TRAINED.items():
                value = re.search(pattern, line)
                if value is None or (flag == "--checkpoint" and run[1] != "pretrained"):
                    continue
                value = os.path.abspath(value[1]) if flag == "--checkpoint" else value[1]
                if value not in asked[flag]:
                    mismatches.append(f"fold {run[0]} {run[1]} seed {run[2]}: {flag} {value}, asked {sorted(asked[flag])}")
    return len(invoked), trained, mismatches


def main():
    folders = sorted(glob.glob(os.path.join(HERE, "*", "commands.txt")))
    affected = 0
    for path in folders:
        invoked, trained, mismatches = audit(path)
        affected += bool(mismatches)
        print(f"{os.path.basename(os.path.dirname(path))}: {invoked} invocation(s), {trained} training commands, "
              f"{len(mismatches)} mismatch(es)")
        for mismatch in mismatches:
            print(f"    {mismatch}")
    print(f"{affected} of {len(folders)} folders hold a run trained for other settings than asked")


if __name__ == "__main__":
    main()
