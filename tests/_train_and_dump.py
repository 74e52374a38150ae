"""Run fairseq-train in this process, then save this rank's final parameters.

Usage: python tests/_train_and_dump.py OUT.pt FAIRSEQ-TRAIN-ARGS...
(fairseq saves checkpoints from rank 0 only; the distributed test compares ranks.)
"""
import sys

import torch
from fairseq import trainer as fairseq_trainer
from fairseq_cli.train import cli_main

instances = []
_init = fairseq_trainer.Trainer.__init__


def _remember(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    instances.append(self)


fairseq_trainer.Trainer.__init__ = _remember

if __name__ == "__main__":
    out = sys.argv[1]
    sys.argv = ["fairseq-train"] + sys.argv[2:]
    cli_main()
    torch.save({k: v.detach().float().cpu() for k, v in instances[-1].model.state_dict().items()}, out)
