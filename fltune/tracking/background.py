"""A writer thread: tracking calls queued by the round loop, run in order off its critical path (MLflow's
import and sqlite writes cost seconds), so the store sees what a synchronous logger would write. ``close``
waits for all; the first error is re-raised there (and by ``check``), later calls skipped."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


class BackgroundWriter:
    """Runs submitted calls one after another on a daemon thread (a stuck store cannot keep the
    process alive once the main thread has gone)."""

    def __init__(self, name: str = "fltune-tracking") -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        """Queue ``call(*args)``; raise the error of an earlier call instead, if one failed."""
        self.check()
        self._queue.put((call, args))

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Wait until every queued call has run, stop the thread, raise the first error."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self.check()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if self._error is None:
                call, args = item
                try:
                    call(*args)
                except BaseException as err:  # re-raised in the main thread by check / close
                    self._error = err
