"""Progress bars that show in logs too.

tqdm's ``disable=None`` hides a bar whenever stderr is not a terminal: a run under nohup, a batch scheduler or a
CI job then says nothing for as long as it works. ``progress_bar`` keeps the bar on a terminal and, elsewhere,
writes one line every ``LOG_EVERY_SECONDS`` (the first after that long, so a short run writes nothing) and a last
one when it ends. ``heartbeat`` does the same for a step that cannot count its progress (a library call).
"""
import sys
import threading
import time
from contextlib import contextmanager

from tqdm import tqdm

LOG_EVERY_SECONDS = 30


class _LinePerRedraw:
    """tqdm's output outside a terminal: each redraw as a line of its own (tqdm starts a redraw with a carriage
    return and pads it with spaces to clear the last one)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self):
        self.stream.flush()


def progress_bar(iterable=None, **options) -> tqdm:
    """tqdm on stderr (``options`` as tqdm's): redrawn in place on a terminal, a line every LOG_EVERY_SECONDS
    elsewhere."""
    stream = sys.stderr
    if stream is None:
        return tqdm(iterable, disable=True, **options)
    if stream.isatty():
        return tqdm(iterable, file=stream, **options)
    return tqdm(iterable, file=_LinePerRedraw(stream), mininterval=LOG_EVERY_SECONDS, delay=LOG_EVERY_SECONDS,
                **options)


@contextmanager
def heartbeat(what: str, every: float = LOG_EVERY_SECONDS, stop=None):
    """A line ``what: N s elapsed`` on stderr every ``every`` seconds while the block runs (none for a block shorter
    than that): for a step with no progress of its own to show, such as a library's training call."""
    stop = stop or threading.Event()
    start = time.monotonic()

    def beat():
        while not stop.wait(every):
            if sys.stderr is not None:
                sys.stderr.write(f"{what}: {time.monotonic() - start:.0f} s elapsed\n")
                sys.stderr.flush()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
