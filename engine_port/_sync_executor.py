"""The thread pool that runs sync (non-async) stage bodies, apart from everything else.

A sync body cannot be interrupted: past its timeout (or on cancellation) the engine stops
waiting for it, but its thread runs on. Such a thread is *abandoned*: it is counted and logged,
and a replacement thread is started, so abandoned bodies do not shrink the pool, up to
``max_abandoned`` of them at a time. Past that bound an abandoned thread keeps its slot (the
pool does not grow further) and new sync bodies wait for a free thread, still under their own
timeout, so the total number of threads is bounded by ``threads + max_abandoned``. When an
abandoned body finally returns, its thread ends and its slot is free again.

Threads are daemon threads: an abandoned body never blocks interpreter exit (the standard
``ThreadPoolExecutor`` joins its threads at exit, so one never-returning body would hang the
process). Blob I/O and async stages never use this pool, so a wedged pool cannot block them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

__all__ = ["SyncStageExecutor"]


@dataclass
class _Item:
    fn: Callable[[], Any]
    future: Future[Any]
    thread: threading.Thread | None = None


class SyncStageExecutor:
    """A bounded pool of daemon threads for sync stage bodies; see the module docstring."""

    def __init__(
        self, threads: int, max_abandoned: int | None = None, name: str = "wfe-sync-stage"
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self.threads = threads
        self.max_abandoned = threads if max_abandoned is None else max_abandoned
        self.name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._running: dict[Future[Any], _Item] = {}
        self._abandoned: set[threading.Thread] = set()
        self._n_threads = 0
        self._abandoned_total = 0
        self._closed = False
        self._seq = 0

    # -- the pool ------------------------------------------------------------------------------
    def _held(self) -> int:
        """Slots in use: every thread but the abandoned ones the bound lets us replace."""
        return self._n_threads - min(len(self._abandoned), self.max_abandoned)

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        """Queue ``fn``; start a thread when none is idle and the pool has room."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the sync stage executor is shut down")
            self._queue.put(_Item(fn, future))
            if not self._idle.acquire(blocking=False) and self._held() < self.threads:
                self._start_thread()
        return future

    def _start_thread(self) -> None:
        self._seq += 1
        t = threading.Thread(target=self._work, name=f"{self.name}-{self._seq}", daemon=True)
        self._n_threads += 1
        t.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._queue.get()
            if item is None:
                break
            if not item.future.set_running_or_notify_cancel():
                self._idle.release()
                continue
            item.thread = me
            with self._lock:
                self._running[item.future] = item
            try:
                result = item.fn()
            except BaseException as exc:
                item.future.set_exception(exc)
            else:
                item.future.set_result(result)
            with self._lock:
                self._running.pop(item.future, None)
                if me in self._abandoned:  # the engine gave up on it: this thread ends
                    self._abandoned.discard(me)
                    break
                if self._closed:
                    break
            del item
            self._idle.release()
        with self._lock:
            self._n_threads -= 1

    def abandon(self, future: Future[Any]) -> bool:
        """The engine stopped waiting for ``future``. A queued body is dropped (False); a
        running one is counted as abandoned (True), a replacement thread starts if the bound
        allows, and the abandoned thread ends when its body returns."""
        if future.cancel():
            return False
        with self._lock:
            item = self._running.get(future)
            if item is None or item.thread is None or item.thread in self._abandoned:
                return False
            self._abandoned.add(item.thread)
            self._abandoned_total += 1
            if not self._closed and self._held() < self.threads:
                self._start_thread()  # serves what is queued behind the stuck body
            return True

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "sync_threads": self._n_threads,
                "sync_abandoned_running": len(self._abandoned),
                "sync_abandoned_total": self._abandoned_total,
            }

    def shutdown(self) -> None:
        """Stop idle threads and refuse new work; never waits for a running body (a body that
        never returns keeps its daemon thread, which does not hold the process)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            n = self._n_threads
        for _ in range(n):
            self._queue.put(None)
