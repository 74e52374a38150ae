"""Stop fairseq's batch-prefetching threads before Python finalises, so a finished run exits 0; keep forked
children from finalising their parent's data loaders.

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


def _drain(batches: queue.Queue) -> None:
    try:
        while True:
            batches.get_nowait()
    except queue.Empty:
        pass


_FORK_HOOK = []  # os.register_at_fork cannot be undone: registered once per process


def install() -> None:
    """Run :func:`stop_background_consumers` at exit, and freeze inherited objects in forked children (once per process)."""
    atexit.unregister(stop_background_consumers)
    atexit.register(stop_background_consumers)
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=gc.freeze)
        _FORK_HOOK.append(gc.freeze)
