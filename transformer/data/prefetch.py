"""Items made ahead in a background thread: batches collated (and pinned) while the device runs the step."""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Generic, Iterator, TypeVar

import torch

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Runs an iterator in a background thread, ``depth`` items ahead of the consumer.

    Used with an iterator that collates (and pins) batches, so that work overlaps the training step: numpy and
    tensor building release the GIL for most of their work. Exceptions raised by the iterator reach the
    consumer in order; ``close`` stops the thread (items made ahead are dropped).
    """

    _DONE = object()

    def __init__(self, items: Iterator[T], *, depth: int = 2) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(items,), daemon=True)
        self._thread.start()

    def _fill(self, items: Iterator[T]) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
        except BaseException as error:  # handed to the consumer; then the iteration is over, as a generator's is
            if self._put(error):
                self._put(self._DONE)
            return
        self._put(self._DONE)

    def _put(self, item: object) -> bool:
        """Queue ``item`` unless closed meanwhile; False when closed."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        item = self._queue.get()
        if item is self._DONE:
            self._queue.put(item)  # later calls stop too
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        self._thread.join()


@contextmanager
def prefetched(items: Iterator[T], device: torch.device, *, depth: int = 4) -> Iterator[Iterator[T]]:
    """``items``, made ``depth`` ahead by a ``Prefetcher`` thread on CUDA (where the host would otherwise wait
    for the device), or as they come elsewhere; the thread stops when the ``with`` block ends."""
    if device.type != "cuda":
        yield items
        return
    prefetcher = Prefetcher(items, depth=depth)
    try:
        yield prefetcher
    finally:
        prefetcher.close()
