"""fairseq-train that kills its own process (SIGKILL, as a preempted node or the OOM killer would) when it starts
update KILL_AT_UPDATE, once: rank 0 (or the only process) leaves MARKER behind, and later attempts train on.

Rank 0, because it is the rank that saves: when it starts an update, its checkpoint of the update before is on
disk. Another rank could get there while rank 0 is still saving, and the agent's restart would then stop that
save and resume from the checkpoint before (the run would train one update twice).

    python tests/fairseq_train_killed_once.py MARKER KILL_AT_UPDATE FAIRSEQ-TRAIN-ARGS...

A test helper for elastic restarts (tests/test_launchers.py): deterministic, no timing involved.
"""
import os
import signal
import sys


def main():
    marker, kill_at = sys.argv[1], int(sys.argv[2])
    from fairseq_cli import train  # first: it sets fairseq-train's log format (the test reads its records)
    from fairseq.trainer import Trainer

    original = Trainer.train_step

    def train_step(self, samples, raise_oom=False):
        if self.get_num_updates() == kill_at and os.environ.get("RANK", "0") == "0" and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(f"killed at update {kill_at}, rank {os.environ.get('RANK')}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, samples, raise_oom)

    Trainer.train_step = train_step
    sys.argv = ["fairseq-train", *sys.argv[3:]]
    train.cli_main()


if __name__ == "__main__":
    main()
