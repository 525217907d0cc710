"""`python -m app.train`, saying as it exits which threads it leaves to the interpreter's
finalization. The FSDP tests run their ranks through it: a gloo worker thread still alive there
aborts the process now and then ("terminate called without an active exception"), so a run
must end with its process groups freed and their threads joined
(app/engine/comms/distributed.py: release_mesh_groups)."""

from __future__ import annotations

import atexit
import os
import runpy
import sys

EXIT_LINE = "threads at exit:"


def thread_names() -> list[str]:
    """The names of this process's threads, as the kernel knows them (C++ threads too)."""
    tasks = f"/proc/{os.getpid()}/task"
    names = []
    for task in os.listdir(tasks):
        with open(f"{tasks}/{task}/comm") as comm:
            names.append(comm.read().strip())
    return sorted(names)


def say_threads() -> None:
    # One write(2) of the whole line: both ranks share torchrun's stderr pipe, and print()
    # writes the text and its newline separately, so two ranks exiting together once gave
    # "threads at exit: pythonthreads at exit: python". A pipe write under PIPE_BUF is atomic.
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), f"{EXIT_LINE} {' '.join(thread_names())}\n".encode())


if __name__ == "__main__":
    atexit.register(say_threads)
    sys.argv[0] = "app.train"
    runpy.run_module("app.train", run_name="__main__", alter_sys=True)
