"""fairseq's prefetch thread is stopped at exit, so a run that stops mid-epoch cannot abort while Python finalises;
data-loading workers stop with their epoch and before exit, so none is killed and none leaves a pymp-* folder."""

import os
import pathlib
import subprocess
import sys
import tempfile
import threading

import torch

from conftest import ROOT

STOPPED_MID_EPOCH = """
import torch
{register}
from fairseq.data.iterators import BufferedIterator

class Batches:
    def __len__(self):
        return 100

    def __iter__(self):
        try:
            for i in range(100):
                yield {{"tokens": torch.full((4, 8), i)}}
        finally:
            print("source closed", flush=True)  # runs only when the prefetch thread leaves its loop

batches = BufferedIterator(2, Batches())
next(batches)
"""


def _prefetchers():
    from fairseq.data.iterators import BackgroundConsumer

    return [t for t in threading.enumerate() if isinstance(t, BackgroundConsumer) and t.is_alive()]


def test_stop_ends_a_prefetch_thread_blocked_on_a_full_queue():
    from fairseq.data.iterators import BufferedIterator
    from spanbert_plugin.core.clean_exit import stop_background_consumers

    batches = BufferedIterator(2, [torch.full((4, 8), i) for i in range(50)])
    assert int(next(batches)[0, 0]) == 0
    assert _prefetchers()  # blocked on the full queue, as after --max-update
    stop_background_consumers()
    assert not _prefetchers()


def _run(register):
    code = STOPPED_MID_EPOCH.format(register=register)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_importing_the_plugin_stops_the_thread_at_exit():
    with_plugin = _run("import spanbert_plugin.registry")
    assert with_plugin.returncode == 0, with_plugin.stderr[-2000:]
    assert "source closed" in with_plugin.stdout
    # the control: without the plugin the thread is still blocked when Python finalises
    without = _run("")
    assert "source closed" not in without.stdout


FORKED_CHILD_FINALISES = '''
import gc, os, sys, weakref
from torch.utils.data import DataLoader
if sys.argv[1] == "plugin":
    from spanbert_plugin.core import clean_exit
    clean_exit.install()
gc.disable()


class Holder:
    pass


def finished_epoch():
    """An epoch's iterator with a worker, left in a reference cycle: garbage that only a collection frees."""
    iterator = iter(DataLoader(list(range(64)), batch_size=4, num_workers=1))
    next(iterator)
    holder = Holder()
    holder.iterator, holder.itself = iterator, holder
    return weakref.ref(iterator)  # not a reference: the iterator stays garbage


iterator = finished_epoch()
pid = os.fork()  # as a DataLoader worker of the next epoch is forked
if pid == 0:
    gc.collect()  # the child's collector meets the inherited garbage
    os._exit(0)
os.waitpid(pid, 0)
# the parent, which owns the worker, stops it and frees the iterator (stopped first: an iterator freed inside a
# collection waits 5 s for a worker whose queues the collection has already finalised)
iterator()._shutdown_workers()
gc.enable()
gc.collect()
'''


def test_forked_children_do_not_finalise_the_parents_data_loaders(tmp_path):
    """Without the plugin the child runs the inherited iterator's __del__ and prints "Exception ignored ...
    can only test a child process" (as one successful pre-training run in about 35 did); with it, nothing."""
    script = tmp_path / "fork.py"
    script.write_text(FORKED_CHILD_FINALISES)
    outputs = {}
    for mode in ("bare", "plugin"):
        proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=120,
                              cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert proc.returncode == 0, proc.stderr
        outputs[mode] = proc.stderr
    assert "can only test a child process" in outputs["bare"]  # the mechanism, reproduced
    assert outputs["plugin"] == "", outputs["plugin"]


def short_temporary_folder(mode):
    """A fresh TMPDIR for one command: short, because each worker's socket lives in TMPDIR/pymp-*/listener-* and
    a Unix socket path over 107 bytes fails (pytest's tmp_path under xdist is already longer)."""
    return pathlib.Path(tempfile.mkdtemp(prefix=mode + "-"))


PERSISTENT_WORKERS_LEFT_AT_EXIT = '''
import sys
import torch
if sys.argv[1] == "plugin":
    import spanbert_plugin.registry
from torch.utils.data import DataLoader

loader = DataLoader([torch.arange(8) for _ in range(16)], batch_size=4, num_workers=2, persistent_workers=True)
for batch in loader:  # each worker sends tensors, through a socket in its own pymp-* folder
    pass
# the loader and its idle workers live until the end, as fairseq's epoch iterators keep theirs
'''


def test_data_loading_workers_leave_no_temporary_folders(tmp_path):
    """Without the plugin both workers are killed at exit and leave their pymp-* folders; with it, none is left."""
    script = tmp_path / "workers.py"
    script.write_text(PERSISTENT_WORKERS_LEFT_AT_EXIT)
    left = {}
    for mode in ("bare", "plugin"):
        temporary = short_temporary_folder(mode)
        proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=120,
                              cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(temporary)))
        assert proc.returncode == 0, proc.stderr
        assert "Warning" not in proc.stderr, proc.stderr
        left[mode] = sorted(p.name for p in temporary.iterdir())
    assert len(left["bare"]) == 2 and all(name.startswith("pymp-") for name in left["bare"])  # the mechanism
    assert left["plugin"] == []


EPOCHS_WITH_A_COLLECTION_EACH = '''
import gc, multiprocessing.process, sys
from fairseq import trainer
from fairseq_cli.train import cli_main

if sys.argv[1] == "bare":  # fairseq's own iterators: persistent workers for every epoch
    from spanbert_plugin.core.tasks import OneDictionaryTask
    from torch.utils.data import _utils
    del OneDictionaryTask.get_batch_iterator
    _utils.MP_STATUS_CHECK_INTERVAL = 1.0  # how long the freeing iterator waits for a worker before killing it (5 s)

killed = []
terminate = multiprocessing.process.BaseProcess.terminate
multiprocessing.process.BaseProcess.terminate = lambda self: (killed.append(self.pid), terminate(self))
begin_epoch = trainer.Trainer.begin_epoch
def collect_then_begin(self, epoch):
    gc.collect()  # as a full collection may run at any time: here it meets the previous epoch's iterator
    return begin_epoch(self, epoch)
trainer.Trainer.begin_epoch = collect_then_begin
sys.argv = ["fairseq-train", *sys.argv[2:]]
try:
    cli_main()
finally:
    print("workers killed:", len(killed))
'''


def test_an_epoch_iterator_stops_its_workers_when_the_epoch_ends(spm_data, tmp_path):
    """A training epoch's iterator is built anew each epoch: its workers stop with the epoch, so a garbage
    collection that frees it later kills nothing (fairseq's persistent workers: 2 killed per epoch, each after
    torch's 5 s wait, 1 s in this test, and each leaving a pymp-* folder)."""
    script = tmp_path / "epochs.py"
    script.write_text(EPOCHS_WITH_A_COLLECTION_EACH)
    runs = {}
    for mode in ("bare", "plugin"):  # side by side: the bare run spends most of its time in those waits
        temporary = short_temporary_folder(mode)
        train = [spm_data, "--user-dir", "user_dir", "--task", "spanbert_pretraining", "--criterion", "span_bert",
                 "--arch", "spanbert_tiny", "--encoder-layers", "1", "--encoder-embed-dim", "32",
                 "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--tokens-per-sample", "64",
                 "--batch-size", "32", "--optimizer", "adam", "--lr", "1e-3", "--cpu", "--num-workers", "2",
                 "--max-epoch", "2", "--disable-validation", "--no-save", "--save-dir", str(tmp_path / f"ck_{mode}"),
                 "--log-format", "none",
                 "--train-subset", "valid"]  # the small split: 5 batches an epoch are enough to start the workers
        runs[mode] = temporary, subprocess.Popen([sys.executable, str(script), mode, *train], stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                                 env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(temporary)))
    killed, left = {}, {}
    for mode, (temporary, proc) in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        killed[mode] = int(stdout.split("workers killed:")[1])
        left[mode] = [p.name for p in temporary.iterdir() if p.name.startswith("pymp-")]
    assert killed["bare"] >= 2 and len(left["bare"]) >= 2  # the mechanism: at least epoch 1's iterator
    assert killed["plugin"] == 0 and left["plugin"] == []


EXIT_ORDER = """
import atexit, sys
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
import spanbert_plugin.registry
from spanbert_plugin.core import clean_exit

atexit.register(lambda: print("handler registered after the plugin", flush=True))  # as torch._dynamo's, by --compile
clean_exit.stop_background_consumers = lambda *args, **kwargs: print("plugin's exit handler", flush=True)
cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), [
    sys.argv[1], "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch", "spanbert_tiny",
    "--tokens-per-sample", "128", "--cpu"]))
task = tasks.setup_task(cfg.task)
task.load_dataset("valid")
task.get_batch_iterator(task.dataset("valid"), max_sentences=4)
"""


def test_the_plugins_exit_handler_runs_before_those_registered_after_it_once_batches_are_made(spm_data):
    """atexit runs the last registered handler first: making a batch iterator registers the plugin's again, so a
    module imported after the plugin (torch._dynamo with --compile) cannot free the workers' queues first."""
    out = subprocess.run([sys.executable, "-c", EXIT_ORDER, spm_data], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if "handler" in line]
    assert lines == ["plugin's exit handler", "handler registered after the plugin"], out.stdout
