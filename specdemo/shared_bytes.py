"""A few bytes that every process holding a pickled copy reads and writes: how a run's stop flag
(limits.Cancel) and the app's progress reach a forked worker whose arguments were pickled (ZeroGPU).

The original owns a small file (in DIR: memory-backed where the system has it), maps it, and removes it
when it is collected; pickling sends the file's path, and each copy maps the same file. A copy made after
the original has gone holds private bytes instead.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref

DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class SharedBytes:
    """`size` bytes (zeros at first) shared with every pickled copy, as `view` (a writable buffer)."""

    def __init__(self, size: int):
        fd, self.path = tempfile.mkstemp(prefix="specdemo-shared-", dir=DIR)
        try:
            os.write(fd, bytes(size))
            self.view: mmap.mmap | bytearray = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.size = size
        weakref.finalize(self, _remove, self.path)

    def __reduce__(self):
        return _attach, (self.path, self.size)


def _attach(path: str, size: int) -> SharedBytes:
    shared = SharedBytes.__new__(SharedBytes)
    shared.path, shared.size = path, size
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        shared.view = bytearray(size)
        return shared
    try:
        shared.view = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return shared


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
