#!/usr/bin/env python
"""Run ``fairseq-train`` up to its first update and record where a rank's memory and time went on the way.

    python benchmarks/scale/first_update_probe.py RECORD.json -- DATA --user-dir user_dir --task ... (fairseq-train's arguments)

The training split's loading, the epoch iterator's creation and the first update are wrapped (nothing else
changes) to read the kernel's accounting of the process and of its data loader's workers at each, in MB:
proportional anonymous memory (``Pss_Anon``: a page the forked workers still share with the main process counts
once over them all; what the rank holds), proportional file-backed pages (``Pss_File``: the memory-mapped corpus
and libraries, which the kernel can drop) and the main process's peak resident size (``VmHWM``). The process
exits after the first update; ``RECORD.json`` is a list of those readings.
"""
import json
import os
import sys
import time

STARTED = time.perf_counter()
FIELDS = {"status": ("VmHWM",), "smaps_rollup": ("Pss_Anon", "Pss_File")}


def status(pid="self") -> dict:
    """The memory fields above of process ``pid``, in MB (None for a process that has gone)."""
    values = {}
    for source, names in FIELDS.items():
        try:
            with open(f"/proc/{pid}/{source}", encoding="ascii") as f:
                lines = f.read().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            return None
        for line in lines:
            name, _, rest = line.partition(":")
            if name in names:
                values[name] = round(int(rest.split()[0]) / 1024, 1)
    return values


def children() -> list:
    pid = os.getpid()
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                found += f.read().split()
        except FileNotFoundError:
            pass
    return found


def main() -> None:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit("usage: first_update_probe.py RECORD.json -- fairseq-train arguments")
    record_path = sys.argv[1]
    sys.argv = ["fairseq-train"] + sys.argv[3:]
    readings = []

    def read(stage: str) -> None:
        workers = [s for s in (status(pid) for pid in children()) if s]
        readings.append({"stage": stage, "seconds": round(time.perf_counter() - STARTED, 2), "main": status(),
                         "workers": workers})

    from fairseq import trainer as trainer_module
    from fairseq_cli import train

    get_train_iterator = trainer_module.Trainer.get_train_iterator
    train_step = trainer_module.Trainer.train_step

    def get_train_iterator_read(self, *args, **kwargs):
        read("before the training split loads")
        iterator = get_train_iterator(self, *args, **kwargs)
        read("epoch iterator made")
        return iterator

    def train_step_read(self, samples, *args, **kwargs):
        read("first batch in hand")
        train_step(self, samples, *args, **kwargs)
        read("first update done")
        with open(record_path, "w", encoding="utf-8") as f:
            json.dump(readings, f, indent=1)
        os._exit(0)  # the readings are what was wanted; the data loader's workers go with the process

    trainer_module.Trainer.get_train_iterator = get_train_iterator_read
    trainer_module.Trainer.train_step = train_step_read
    train.cli_main()
    sys.exit("first_update_probe.py: fairseq-train ended before its first update")


if __name__ == "__main__":
    main()
