"""Batching across concurrent requests, as TF Serving's batching does, for `serve`.

Requests put their sentences in a queue per signature; one worker takes up to
`max_batch_size` sentences of one signature (the oldest waiting first), waiting at most
`batch_timeout` seconds after the oldest arrived for more, sorts them by length (as
`translate` does, which saves padding), calls the artifact once on a thread of its own
and hands each request its rows back, in its order. A request larger than a batch
spans several. The queue holds at most `max_queued` sentences: a request that would
overflow it is refused at once (`QueueFull`, answered 503 with `Retry-After`), so
that a server under more load than it can take answers quickly instead of timing out.

A request's outputs are its rows of the batches it was in: values as the artifact gives
them for those batches (float sums may differ in the last digits from a call on the
request alone, as under TF Serving's batching), with outputs whose sizes depend on the
batch (`token_ids`, `attention`, ...) padded to the longest of its rows, with the value
the artifact pads with (`PADDING`).
"""

import asyncio
import collections
import concurrent.futures
import time

import numpy as np

from keras_transformer import files

# What the signatures pad each batch-dependent output with: PAD for ids, -1 for word
# indices (`decoding.alignment`), "" for strings, 0 for floats (`serving.translator`).
PADDING = {"token_ids": files.PAD_ID, "source_words": -1, "target_words": -1,
           "alignments": -1, "tokens": b"", "translations": b""}


class QueueFull(Exception):
    """The batching queue has no room for a request's sentences."""


class Batcher:
    """Batches calls of an artifact's signatures across concurrent requests.

    Args:
        call: callable `(signature, sentences, second) -> {name: array}`, the batch
            first; `second` is the second input's list or `None`. Runs on the
            batcher's own thread, one call at a time (the runtimes translate a batch
            with their own threads).
        max_batch_size: int. Most sentences per call (TF Serving's `max_batch_size`).
        batch_timeout: float. Seconds a batch waits for more sentences after its
            first (TF Serving's `batch_timeout_micros` / 1e6); 0 calls at once.
        max_queued: int. Most sentences waiting; more are refused (`QueueFull`).
        on_batch: optional callable `(signature, size, seconds)`, after each call.
    """

    def __init__(self, call, *, max_batch_size=32, batch_timeout=0.005, max_queued=1024,
                 on_batch=None):
        if max_batch_size < 1 or max_queued < 1 or batch_timeout < 0:
            raise ValueError("max_batch_size and max_queued must be at least 1, "
                             "batch_timeout at least 0.")
        self._call = call
        self.max_batch_size = max_batch_size
        self.batch_timeout = batch_timeout
        self.max_queued = max_queued
        self._on_batch = on_batch
        self._queues = collections.OrderedDict()  # signature -> deque of _Item
        self._queued = 0
        self._arrived = None
        self._worker = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "batcher")

    @property
    def queued(self):
        """Sentences waiting for a batch."""
        return self._queued

    async def run(self, signature, sentences, second=None):
        """Returns the outputs `{name: array}` of `sentences` (and `second`), batched
        with other requests' sentences.

        Raises:
            QueueFull: the queue has no room for them.
            Whatever the call raised, for every request of its batch.
        """
        self._start()
        if not sentences:  # nothing to batch: the artifact's outputs of an empty batch
            return await self.call(signature, sentences, second)
        if self._queued + len(sentences) > self.max_queued:
            raise QueueFull(f"{self._queued} sentences are waiting, at most "
                            f"{self.max_queued} may (--max-queued-sentences)")
        request = _Request(len(sentences), asyncio.get_running_loop().create_future())
        queue = self._queues.setdefault(signature, collections.deque())
        now = time.monotonic()
        for index, sentence in enumerate(sentences):
            queue.append(_Item(request, index, sentence,
                               None if second is None else second[index], now))
        self._queued += len(sentences)
        self._arrived.set()
        try:
            return await request.future
        finally:
            request.cancelled = True  # a timed-out request's waiting sentences are skipped

    async def call(self, signature, sentences, second=None):
        """Calls the artifact on the batcher's thread, unbatched (warm-up, empty
        batches)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._call, signature, sentences, second)

    def close(self):
        if self._worker is not None:
            self._worker.cancel()
        self._executor.shutdown(wait=False)

    def _start(self):
        if self._worker is None:
            self._arrived = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self):
        while True:
            signature = self._oldest()
            if signature is None:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            queue = self._queues[signature]
            deadline = queue[0].arrived + self.batch_timeout
            while len(queue) < self.max_batch_size and (wait := deadline - time.monotonic()) > 0:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), wait)
                except asyncio.TimeoutError:
                    break
            items = [queue.popleft() for _ in range(min(self.max_batch_size, len(queue)))]
            self._queued -= len(items)
            items = [item for item in items if not item.request.cancelled]
            if not items:
                continue
            items.sort(key=lambda item: len(item.sentence))
            second = None if items[0].second is None else [item.second for item in items]
            started = time.monotonic()
            try:
                outputs = await self.call(signature, [item.sentence for item in items], second)
            except Exception as error:  # every request of the batch gets it
                for item in items:
                    if not item.request.future.done():
                        item.request.future.set_exception(error)
                continue
            if self._on_batch:
                self._on_batch(signature, len(items), time.monotonic() - started)
            for position, item in enumerate(items):
                item.request.give(item.index,
                                  {name: value[position] for name, value in outputs.items()})

    def _oldest(self):
        """The signature whose first waiting sentence came first, or `None`."""
        waiting = [(queue[0].arrived, signature)
                   for signature, queue in self._queues.items() if queue]
        return min(waiting)[1] if waiting else None


class _Item:
    __slots__ = ("request", "index", "sentence", "second", "arrived")

    def __init__(self, request, index, sentence, second, arrived):
        self.request, self.index, self.sentence = request, index, sentence
        self.second, self.arrived = second, arrived


class _Request:
    """A request's rows as they come back; its future holds the stacked outputs."""

    def __init__(self, count, future):
        self.rows = [None] * count
        self.missing = count
        self.future = future
        self.cancelled = False

    def give(self, index, row):
        if self.future.done():
            return
        self.rows[index] = row
        self.missing -= 1
        if not self.missing:
            self.future.set_result(stack_rows(self.rows))


def stack_rows(rows):
    """Returns the `{name: array}` of per-sentence rows, batch first, each output
    padded to its longest row with its `PADDING` value (0 where not listed)."""
    stacked = {}
    for name in rows[0]:
        # Strings stay objects: a fixed-width bytes dtype would cut the longer ones.
        values = [np.asarray(row[name], dtype=object if isinstance(row[name], bytes)
                             else None) for row in rows]
        dtype = object if values[0].dtype.kind in "OS" else values[0].dtype
        shape = [len(values)] + [max(value.shape[axis] for value in values)
                                 for axis in range(values[0].ndim)]
        array = np.full(shape, PADDING.get(name, 0), dtype=dtype)
        for i, value in enumerate(values):
            # value[()]: a row's scalar itself (an object array would hold the 0-d array).
            array[(i, *[slice(0, size) for size in value.shape])] = (
                value[()] if value.ndim == 0 else value)
        stacked[name] = array
    return stacked
