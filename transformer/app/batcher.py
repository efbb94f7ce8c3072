"""Dynamic batching for ``transformer-serve``: requests wait in one queue; the decoder takes the first and, for up to
``max_wait_s``, every later one with the same search settings until ``batch_tokens`` source tokens, and decodes them
as one list. While it decodes, new requests queue, so a busy server batches without waiting. ``batching=False``
decodes each request alone, in arrival order. One thread decodes (the model's one user); the event loop keeps
accepting requests meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from transformer.inference.translator import Translation

log = logging.getLogger(__name__)


@dataclass(eq=False)  # hashed by identity
class _Job:
    sentences: list[str]
    key: tuple[int, int]  # (beam_size, n_best): only equal settings decode together
    tokens: int  # source tokens
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Decodes queued translation requests together (see the module docstring); one decoding at a time."""

    def __init__(self, decode: Callable[[list[str], int, int], list[list[Translation]]], *, batching: bool,
                 max_wait_s: float, batch_tokens: int) -> None:
        self.decode, self.batching, self.max_wait_s, self.batch_tokens = decode, batching, max_wait_s, batch_tokens
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")  # the model's one user
        self.batches = self.requests = 0  # decoded so far: batches, and the requests in them
        self._queue: asyncio.Queue[_Job] | None = None
        self._held: deque[_Job] = deque()  # taken from the queue but not batchable with the batch being formed
        self._task: asyncio.Task | None = None
        self._waiting: set[_Job] = set()  # the jobs whose clients wait for an answer

    @property
    def waiting(self) -> int:
        """Requests whose clients wait for an answer: queued or being decoded."""
        return len(self._waiting)

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.executor.shutdown(wait=True)

    async def translate(self, sentences: list[str], beam_size: int, n_best: int,
                        tokens: int) -> list[list[Translation]]:
        assert self._queue is not None, "Batcher.start() first"
        job = _Job(sentences, (beam_size, n_best), tokens, asyncio.get_running_loop().create_future())
        self._waiting.add(job)
        try:
            await self._queue.put(job)
            return await job.future  # cancelled (the client left): the job is dropped unless already decoding
        finally:
            self._waiting.discard(job)

    async def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on the decoding thread (anything else that uses the model)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _next_batch(self) -> list[_Job]:
        assert self._queue is not None
        first = self._held.popleft() if self._held else await self._queue.get()
        batch, tokens = [first], first.tokens
        if not self.batching:
            return batch
        for job in list(self._held):  # earlier arrivals first
            if job.future.done():  # its client left
                self._held.remove(job)
            elif job.key == first.key and tokens + job.tokens <= self.batch_tokens:
                self._held.remove(job)
                batch.append(job)
                tokens += job.tokens
        deadline = asyncio.get_running_loop().time() + self.max_wait_s
        while tokens < self.batch_tokens:
            if self._queue.empty():
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            else:
                job = self._queue.get_nowait()
            if job.future.done():  # its client left: it takes no room in the batch
                continue
            if job.key == first.key and tokens + job.tokens <= self.batch_tokens:
                batch.append(job)
                tokens += job.tokens
            else:
                self._held.append(job)
                if job.key == first.key:
                    break  # the batch is full
        return batch

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _loop(self) -> None:
        while True:
            batch = [job for job in await self._next_batch() if not job.future.done()]  # done: the client left
            if not batch:
                continue
            sentences = [sentence for job in batch for sentence in job.sentences]
            self.batches, self.requests = self.batches + 1, self.requests + len(batch)
            try:
                results = await self.run(self.decode, sentences, *batch[0].key)
            except Exception as error:  # a failed decoding fails its requests, not the server
                log.exception("decoding a batch of %d requests failed", len(batch))
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)
                continue
            start = 0
            for job in batch:
                if not job.future.done():  # a client that went away cancelled its future
                    job.future.set_result(results[start:start + len(job.sentences)])
                start += len(job.sentences)
