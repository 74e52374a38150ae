"""Timing rules shared by the speed benchmarks.

Two sides are timed in alternating runs (the order flips every run, so neither side
always runs first or last), in one process and thread setting. Each run gives one
time per side: the median step time of that run, or the time of one call. The
reported ratio is the median of the per-run ratios, with their range, and it is
printed with no more decimals than that range supports.
"""
import math
import os
import statistics
import time


def thread_note():
    """The thread setting both sides ran under (torch's, and OMP_NUM_THREADS when set)."""
    import torch

    omp = os.environ.get("OMP_NUM_THREADS")
    return f"{torch.get_num_threads()} torch threads" + (f" (OMP_NUM_THREADS={omp})" if omp else "")


def alternating_runs(sides, runs, steps_per_run=1, warmup=1):
    """``sides``: {name: fn(step_index)}. Returns {name: [one time per run]} in seconds.

    A run calls every side ``steps_per_run`` times, side after side (a side's steps are
    consecutive), and records each side's median step time. ``warmup`` untimed runs come first.
    """
    names = list(sides)
    per_run = {name: [] for name in names}
    step = 0
    for run in range(warmup + runs):
        order = names if run % 2 == 0 else names[::-1]
        for name in order:
            times = []
            for _ in range(steps_per_run):
                start = time.perf_counter()
                sides[name](step)
                times.append(time.perf_counter() - start)
                step += 1
            if run >= warmup:
                per_run[name].append(statistics.median(times))
    return per_run


def decimals_for(low, high):
    """Decimals a figure can carry when repeated runs spread over [low, high]: the last one shown is no
    finer than a tenth of that range (at least 1, at most 3)."""
    width = high - low
    if width <= 0:
        return 3
    return max(1, min(3, 1 - math.floor(math.log10(width))))


def ratio_line(label, numerator, denominator):
    """'label: 1.02x (median of N alternating runs, range 0.99x-1.05x)' for per-run times of two sides."""
    ratios = [n / d for n, d in zip(numerator, denominator)]
    median, low, high = statistics.median(ratios), min(ratios), max(ratios)
    if len(ratios) < 3:
        return f"{label}: {median:.2f}x ({len(ratios)} run(s): too few for a spread; use more runs)"
    places = decimals_for(low, high)
    return (f"{label}: {median:.{places}f}x (median of {len(ratios)} alternating runs, "
            f"range {low:.{places}f}x-{high:.{places}f}x)")


def time_line(name, per_run, unit="ms", scale=1000.0, places=1):
    """'name: median 123.4 ms (range 120.0-130.2) over N runs'."""
    values = [t * scale for t in per_run]
    return (f"{name}: median {statistics.median(values):.{places}f} {unit} "
            f"(range {min(values):.{places}f}-{max(values):.{places}f}) over {len(values)} runs")


def run_measured(command, cwd, env=None):
    """Run ``command`` to its end: (exit status, its output, wall seconds, peak resident memory in GB of it and the
    children it waited for), from the kernel's accounting of that one child."""
    import subprocess

    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    return os.waitstatus_to_exitcode(status), output, time.perf_counter() - started, usage.ru_maxrss / 2**20
