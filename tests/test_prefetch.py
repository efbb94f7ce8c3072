"""The prefetching thread: order, errors, stopping."""

from __future__ import annotations

import threading

import pytest
import torch

from transformer.data.prefetch import Prefetcher, prefetched


def test_prefetcher_keeps_order_and_passes_errors_on():
    assert list(Prefetcher(iter(range(50)), depth=3)) == list(range(50))

    def failing():
        yield 1
        raise KeyError("bad batch")

    failing_items = Prefetcher(failing())
    assert next(failing_items) == 1
    with pytest.raises(KeyError, match="bad batch"):
        next(failing_items)
    after = []  # after the error the iteration is over, as a generator's is (a thread: a wait would hang the test)
    asking = threading.Thread(target=lambda: after.append(next(failing_items, "over")), daemon=True)
    asking.start()
    asking.join(timeout=10)
    assert after == ["over"]
    endless = Prefetcher(iter(int, 1), depth=2)  # never ends: close() must still stop the thread
    assert next(endless) == 0
    endless.close()
    assert not endless._thread.is_alive()


def test_prefetched_uses_a_thread_only_for_cuda_and_stops_it_when_the_block_ends():
    items = iter(range(5))
    with prefetched(items, torch.device("cpu")) as batches:
        assert batches is items  # on a CPU the step and the collation share the cores: nothing to overlap
    endless = iter(int, 1)
    with prefetched(endless, torch.device("cuda")) as batches:  # only the device's type is read: no GPU needed
        assert isinstance(batches, Prefetcher) and next(batches) == 0
    assert not batches._thread.is_alive()  # the block left with items still coming: the thread was stopped
