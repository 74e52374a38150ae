"""fairseq-train that kills its own process (SIGKILL) part way through a checkpoint save, once, at a chosen point:
``write`` stops the write of ``checkpoint_E_N.pt.tmp`` after FRACTION of the previous checkpoint's bytes, ``copy``
stops the copy of that file onto ``checkpoint_last.pt`` after FRACTION of its bytes. The kill comes at the save of
update KILL_AT_UPDATE. The child of ``kill_during_save.py``; no timing involved.

    python benchmarks/scale/killed_in_save.py PHASE FRACTION KILL_AT_UPDATE FAIRSEQ-TRAIN-ARGS...
"""
import os
import shutil
import signal
import sys


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return
    if len(sys.argv) < 4:
        sys.exit("usage: killed_in_save.py PHASE FRACTION KILL_AT_UPDATE FAIRSEQ-TRAIN-ARGS...")
    phase, fraction, kill_at = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    from fairseq_cli import train  # first: it sets fairseq-train's log format

    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    state = {"updates": 0, "size": None}
    original_save_checkpoint = Trainer.save_checkpoint

    def save_checkpoint(self, filename, extra_state):
        state["updates"] = self.get_num_updates()
        return original_save_checkpoint(self, filename, extra_state)

    Trainer.save_checkpoint = save_checkpoint

    def armed():
        return state["updates"] == kill_at and state["size"] is not None

    original_write = checkpoint_utils._torch_persistent_save

    class KilledPartWay:
        """A file whose writes end the process once ``limit`` bytes went through."""

        def __init__(self, f, limit):
            self.f, self.limit, self.written = f, limit, 0

        def write(self, data):
            if self.written + len(data) >= self.limit:
                self.f.write(bytes(data)[:max(0, self.limit - self.written)])
                self.f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            self.written += len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    def write(obj, f):
        if phase == "write" and armed():
            return original_write(obj, KilledPartWay(f, int(fraction * state["size"])))
        result = original_write(obj, f)
        f.flush()
        state["size"] = os.fstat(f.fileno()).st_size
        return result

    checkpoint_utils._torch_persistent_save = write
    original_copyfile = shutil.copyfile

    def copyfile(src, dst, *args, **kwargs):
        if phase == "copy" and armed() and os.path.basename(str(dst)).startswith("checkpoint_last.pt"):
            with open(src, "rb") as source, open(dst, "wb") as target:
                target.write(source.read(int(fraction * os.path.getsize(src))))
                target.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return original_copyfile(src, dst, *args, **kwargs)

    shutil.copyfile = copyfile
    sys.argv = ["fairseq-train", *sys.argv[4:]]
    train.cli_main()


if __name__ == "__main__":
    main()
