"""The eager calls' holder: what a call was given and returned, kept until it is computed.

jax 0.11.2 on the GPU frees a pinned_host array dropped while a computation still writes or
reads it, and the next pinned_host array can get that memory at once (docs/lab/
freed_result_race_probe.py, freed_input_race_probe.py). So every eager call hands its result
and its arrays to :func:`hold_until_computed`.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import threading
from typing import Any

import jax

from pallas_pinned._placement import is_concrete

__all__ = ["hold_until_computed"]


class _Holder:
    """Keeps what it is given until a result given with it, or after it, is computed.

    The caller appends, and drops what is already computed at the front: an eager call must
    stay cheap. (A thread woken on every call, as before, cost a blocked 5-row set 35-110 us
    on CPU: docs/lab/holder_overhead_probe.py.) A daemon thread, while anything is held,
    waits for the newest result and drops what came before it, then pauses ``poll_s``: in an
    eager loop ``x = write(x, ...)`` every result is donated on to the next call, mostly
    before it is computed, and then tells nothing, so the loop's arrays would pile up until
    it ends. A call that finds ``_PILE`` entries held ends the pause early: the thread then
    runs when the caller next lets the GIL go (it waits for its inputs before it donates
    ``x``) and waits for a result not yet donated. The thread sleeps on an event once an
    interval passes with nothing held and no call. It is stopped at exit (``atexit``) once
    its results are computed, because Python ends a daemon thread caught inside a C++ wait
    by unwinding it, and that aborts the process ("FATAL: exception not rethrown").
    """

    def __init__(self, poll_s: float = 0.002):
        self._held: collections.deque = collections.deque()  # (number, result, inputs).
        self._numbers = itertools.count()
        self._front = threading.Lock()  # Drops from the front, by the caller or the thread.
        self._telling_nothing = 0  # Leading entries known to tell nothing (under _front).
        self._start = threading.Lock()
        self._wake = threading.Event()  # Set while anything may be held.
        self._nudge = threading.Event()  # Ends the thread's pause early.
        self._thread: threading.Thread | None = None
        self._closed = False
        self._holds = 0  # Calls so far: the thread sleeps only after an interval without.
        self._poll_s = poll_s
        atexit.register(self.close)

    def hold(self, result: Any, inputs: tuple) -> None:
        if self._closed:
            _computed(result)  # At exit: wait here.
            return
        self._held.append((next(self._numbers), result, inputs))
        self._holds += 1
        self._drop_computed()
        if not self._wake.is_set():
            self._start_or_wake()
        elif len(self._held) >= _PILE and not self._nudge.is_set():
            self._nudge.set()  # Results donated on pile up: the thread waits for a newer one.

    def close(self) -> None:
        """Lets the thread finish the results it holds, then stops it."""
        with self._start:
            self._closed, thread = True, self._thread
        self._nudge.set()
        self._wake.set()
        if thread is not None and thread.is_alive():
            thread.join()
        self._wait_for_all()

    def _start_or_wake(self) -> None:
        with self._start:
            if self._closed:
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._poll, name="pallas_pinned-hold", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _poll(self) -> None:
        while self._wake.wait() and not self._closed:
            holds = self._holds
            try:
                newest = self._held[-1]
            except IndexError:
                newest = None
            if newest is not None and _computed(newest[1]):
                self._drop_through(newest[0])  # It may be donated on by now: known computed.
            del newest
            self._drop_computed()
            self._nudge.wait(self._poll_s)
            self._nudge.clear()
            if self._held or self._holds != holds:
                continue  # Idle only after a quiet interval: a wake-up per call costs 40 us.
            self._wake.clear()
            if self._held or self._closed:  # Set before the clear: its setter saw it set.
                self._wake.set()
        self._wait_for_all()

    def _drop_computed(self) -> None:
        """Drops the front up to the last result computed.

        A deleted result (donated on to a later call before it was computed) or a failed one
        tells nothing, and never will: its entry stays until a result given after it is
        computed, as that one has run after it, and it is not looked at again. The states
        are read outside ``_front``, so that it is held only for moments (reading one lets
        the GIL go): the front is dropped only if it is still the entry looked at."""
        held = self._held
        while held:
            first, index = None, 0
            try:  # The other one may drop what is indexed here: then look again.
                first, index = held[0], self._telling_nothing
                while (state := _state(held[index][1])) is _UNKNOWN:
                    index += 1
            except IndexError:
                state = None  # Ran out: every entry after the known ones tells nothing.
            with self._front:
                if not held or held[0] is not first:
                    continue
                if state is not _COMPUTED:
                    self._telling_nothing = max(self._telling_nothing, index)
                    return
                for _ in range(index + 1):
                    held.popleft()
                self._telling_nothing = 0

    def _drop_through(self, number: int) -> None:
        """Drops the entries up to ``number``, whose result is computed."""
        with self._front:
            dropped = 0
            while self._held and self._held[0][0] <= number:
                self._held.popleft()
                dropped += 1
            self._telling_nothing = max(0, self._telling_nothing - dropped)

    def _wait_for_all(self) -> None:
        """Waits for every result held, then drops them all: a deleted one's inputs go last."""
        with self._front:
            entries = list(self._held)
            self._held.clear()
            self._telling_nothing = 0
        for _number, result, _inputs in entries:
            _computed(result)


_PENDING, _COMPUTED, _UNKNOWN = "pending", "computed", "unknown"
_PILE = 16  # Entries held at which a call nudges the thread to wait for the newest.


def _state(result: Any) -> str:
    """Whether ``result`` is computed, without waiting; unknown where deleted or failed."""
    try:
        if not all(leaf.is_ready() for leaf in jax.tree.leaves(result)):
            return _PENDING
        jax.block_until_ready(result)  # Ready: returns, or raises a failed computation's error.
    except Exception:  # noqa: BLE001 - deleted (donated on), or failed: the caller's to see.
        return _UNKNOWN
    return _COMPUTED


def _computed(result: Any) -> bool:
    """Waits for ``result``; False where it cannot tell (deleted, or failed)."""
    try:
        jax.block_until_ready(result)
    except Exception:  # noqa: BLE001 - deleted (donated on), or failed: the caller's to see.
        return False
    return True


_HOLDER = _Holder()


def hold_until_computed(result: Any, *inputs: Any) -> Any:
    """``result``, and the call's ``inputs``, kept alive by the library until it is computed.

    jax 0.11.2 frees a pinned_host array dropped while a computation still writes or reads
    it, and the next pinned_host array can get that memory at once, copied in by the CPU. On
    an H100 (docs/lab/freed_result_race_probe.py, freed_input_race_probe.py; calls queued
    behind 20 ms of device work): an eager add whose result was dropped changed the next array
    in 100 of 100 trials (as did plain JAX's donating jit of ``x.at[i].add(u)`` run at once);
    a gather whose buffer was dropped returned rows of the next array in 98 of 100, an add
    whose pinned updates were dropped wrote the next array's values in 100 of 100. Each eager
    call hands its result and inputs here, so that a caller who drops one loses only that.
    """
    # Tracers (an eager vmap or grad around the call) belong to their trace: never held.
    results = [a for a in jax.tree.leaves(result) if is_concrete(a)]
    if results:
        _HOLDER.hold(results, tuple(a for a in jax.tree.leaves(inputs) if is_concrete(a)))
    return result
