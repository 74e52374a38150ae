"""Stop fairseq's batch-prefetching threads and data-loading workers before Python finalises, so a finished run
exits 0 and leaves no temporary folders; keep forked children from finalising their parent's data loaders.

fairseq's ``BufferedIterator`` loads batches on a daemon thread. When training stops mid-epoch (``--max-update``),
that thread is still loading; if it frees a tensor while the interpreter finalises, torch's destructor cannot take
the GIL, the thread is unwound through a ``noexcept`` frame and the process aborts ("terminate called without an
active exception", exit 134) after the run has succeeded. atexit callbacks run before finalisation, while the
thread can still finish the batch in hand and return.

A forked child (a DataLoader worker of the next epoch or of validation) inherits the parent's objects, garbage
included: a finished epoch's ``_MultiProcessingDataLoaderIter`` caught in a reference cycle, not yet collected.
When the child's garbage collector frees it, its ``__del__`` shuts down workers that belong to the parent and
prints "Exception ignored in ... AssertionError: can only test a child process" at the end of a successful run.
The child freezes what it inherited (``gc.freeze``), so only the parent, which owns those workers, finalises them.
"""
import atexit
import gc
import os
import queue
import sys
import threading
import time

_EXIT_WAIT_SECONDS = 60.0  # at most this long for a prefetcher to finish the batch it is loading


def stop_background_consumers(wait_seconds: float = _EXIT_WAIT_SECONDS) -> None:
    """Let every live fairseq prefetch thread finish its current batch and end; drop what it prefetched."""
    iterators = sys.modules.get("fairseq.data.iterators")  # not imported: no prefetch thread (and no import at exit)
    if iterators is None:
        return
    BackgroundConsumer = iterators.BackgroundConsumer
    for thread in threading.enumerate():
        if not isinstance(thread, BackgroundConsumer):
            continue
        thread._max_len = 0  # the thread stops after the batch it is loading (fairseq checks count >= max_len)
        deadline = time.monotonic() + wait_seconds
        while thread.is_alive() and time.monotonic() < deadline:
            _drain(thread._queue)  # a full queue would block its put
            thread.join(0.05)


def shut_down_data_loader_workers() -> None:
    """Let the workers of every live multiprocessing DataLoader iterator exit on their own, while the queues that
    tell them to are intact.

    fairseq keeps its epoch iterators' DataLoaders, and with them their persistent workers, until the process ends.
    Left to the interpreter's end, each worker is killed before it can remove its ``pymp-*`` folder from the
    temporary directory (a worker that sends a tensor opens a socket there): every run left one per worker.
    """
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    if dataloader is None:
        return
    iterator_class = dataloader._MultiProcessingDataLoaderIter
    # type(), not isinstance(): isinstance reads __class__, which some torch module proxies answer with a warning
    for iterator in [o for o in gc.get_objects() if issubclass(type(o), iterator_class)]:
        if all(worker._parent_pid == os.getpid() for worker in iterator._workers):  # not one a fork inherited
            iterator._shutdown_workers()


def _drain(batches: queue.Queue) -> None:
    try:
        while True:
            batches.get_nowait()
    except queue.Empty:
        pass


_FORK_HOOK = []  # os.register_at_fork cannot be undone: registered once per process


def at_exit() -> None:
    """Prefetch threads first: one may be waiting for a batch from a worker."""
    stop_background_consumers()
    shut_down_data_loader_workers()


def install() -> None:
    """Run :func:`at_exit` at exit, and freeze inherited objects in forked children (once per process)."""
    atexit.unregister(at_exit)
    atexit.register(at_exit)
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=gc.freeze)
        _FORK_HOOK.append(gc.freeze)
