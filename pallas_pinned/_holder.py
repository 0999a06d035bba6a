"""The eager calls' holder: what a call was given and returned, kept until it is computed.

jax 0.11.2 on the GPU frees a pinned_host array dropped while a computation still writes or
reads it, and the next pinned_host array can get that memory at once (docs/lab/
freed_result_race_probe.py, freed_input_race_probe.py). So every eager call hands its result
and its arrays to :func:`hold_until_computed`.
"""

from __future__ import annotations

import atexit
import collections
import functools
import itertools
import threading
from typing import Any

import jax
import jax.numpy as jnp

from pallas_pinned._placement import is_concrete

__all__ = ["hold_until_computed"]

_PENDING, _COMPUTED, _UNKNOWN = "pending", "computed", "unknown"
_PILE = 16  # Entries in a lane at which a call nudges the thread to wait for the newest.


class _Lane:
    """The entries of one thread on one set of devices, in the order they were dispatched.

    A device runs its executions in the order they were dispatched, so a computed result
    vouches for the entries before it in its lane, and only there: another thread may have
    dispatched before it and handed its entry over after, another device may be slower.
    A deleted result (donated on to a later call before it was computed) or a failed one
    tells nothing, and never will: its entry stays until a result after it is computed, and
    it is not looked at again (``telling_nothing``). States are read outside ``front``, so
    that it is held only for moments (reading one lets the GIL go): the front is dropped
    only if it is still the entry looked at.
    """

    def __init__(self, devices: frozenset | None):
        self.held: collections.deque = collections.deque()  # (number, result, inputs).
        self.front = threading.Lock()  # Drops from the front, by the caller or the thread.
        self.telling_nothing = 0  # Leading entries known to tell nothing (under front).
        self.devices = devices

    def drop_computed(self) -> bool:
        """Drops the front up to the last result computed; True if it dropped any."""
        held, dropped = self.held, False
        while held:
            first, index = None, 0
            try:  # The other one may drop what is indexed here: then look again.
                first, index = held[0], self.telling_nothing
                while (state := _state(held[index][1])) is _UNKNOWN:
                    index += 1
            except IndexError:
                state = None  # Ran out: every entry after the known ones tells nothing.
            with self.front:
                if not held or held[0] is not first:
                    continue
                if state is not _COMPUTED:
                    self.telling_nothing = max(self.telling_nothing, index)
                    return dropped
                for _ in range(index + 1):
                    held.popleft()
                self.telling_nothing, dropped = 0, True
        return dropped

    def drop_through(self, number: int) -> bool:
        """Drops the entries up to ``number``, whose result has run; True if it dropped any."""
        with self.front:
            dropped = 0
            while self.held and self.held[0][0] <= number:
                self.held.popleft()
                dropped += 1
            self.telling_nothing = max(0, self.telling_nothing - dropped)
        return dropped > 0

    def settle(self) -> bool:
        """Waits for the newest result, then drops it and all before it. A newest result
        already donated on, or failed, is vouched for by a fence on its GPUs (dispatched
        after whatever consumed it); elsewhere its entry waits for a later one."""
        try:
            number, newest = self.held[-1][:2]
        except IndexError:
            return False
        ran = (not _deleted(newest) and _computed(newest)) or _fenced(self.devices)
        del newest
        return self.drop_through(number) if ran else self.drop_computed()


class _Holder:
    """Keeps what it is given until a result given with it, or after it in its lane, is
    computed.

    The caller appends, and drops what is already computed at its lane's front: an eager
    call must stay cheap (a thread woken on every call cost a blocked 5-row set 35-110 us on
    CPU: docs/lab/holder_overhead_probe.py). A daemon thread, while anything is held, settles
    each lane (:meth:`_Lane.settle`), then pauses ``poll_s``, doubling up to ``max_pause_s``
    while nothing changes: in an eager loop ``x = write(x, ...)`` every result is donated on
    to the next call, mostly before it is computed, and tells nothing, so without the
    thread the loop's arrays would pile up until it ends. A call that finds ``_PILE`` entries
    in its lane ends the pause early. The thread sleeps on an event once an interval passes
    with nothing held and no call. It is stopped at exit (``atexit``) once its results are
    computed, because Python ends a daemon thread caught inside a C++ wait by unwinding it,
    and that aborts the process ("FATAL: exception not rethrown").
    """

    def __init__(self, poll_s: float = 0.002, max_pause_s: float = 0.5):
        self._lanes: dict[tuple, _Lane] = {}
        self._lanes_lock = threading.Lock()  # Lanes made, appended to, removed; closing.
        self._numbers = itertools.count()
        self._start = threading.Lock()
        self._wake = threading.Event()  # Set while anything may be held.
        self._nudge = threading.Event()  # Ends the thread's pause early.
        self._thread: threading.Thread | None = None
        self._closed = False
        self._holds = 0  # Calls so far: the thread sleeps only after an interval without.
        self._poll_s, self._max_pause_s = poll_s, max(max_pause_s, poll_s)
        atexit.register(self.close)

    def hold(self, result: Any, inputs: tuple, devices: frozenset | None = None) -> None:
        key = (threading.get_ident(), devices)
        with self._lanes_lock:
            lane = None if self._closed else self._lanes.get(key)
            if lane is None and not self._closed:
                lane = self._lanes[key] = _Lane(devices)
            if lane is not None:
                lane.held.append((next(self._numbers), result, inputs))
        if lane is None:
            _computed(result)  # At exit: wait here.
            return
        self._holds += 1
        lane.drop_computed()
        if not self._wake.is_set() or self._thread is None or not self._thread.is_alive():
            self._start_or_wake()
        elif len(lane.held) >= _PILE and not self._nudge.is_set():
            self._nudge.set()

    def held(self) -> int:
        """How many entries are held, in all lanes."""
        with self._lanes_lock:
            return sum(len(lane.held) for lane in self._lanes.values())

    def close(self) -> None:
        """Lets the thread finish the results it holds, then stops it."""
        with self._start, self._lanes_lock:
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
        pause = self._poll_s
        while self._wake.wait() and not self._closed:
            holds = self._holds
            with self._lanes_lock:
                lanes = list(self._lanes.items())
            dropped = False
            for _key, lane in lanes:
                try:
                    dropped |= lane.settle()
                except Exception:  # noqa: BLE001 - the thread must go on; the entries stay.
                    pass
            with self._lanes_lock:
                for key, lane in lanes:
                    if not lane.held and self._lanes.get(key) is lane:
                        del self._lanes[key]
                anything = bool(self._lanes)
            quiet = not dropped and self._holds == holds
            pause = min(2 * pause, self._max_pause_s) if quiet else self._poll_s
            self._nudge.wait(pause)
            self._nudge.clear()
            if anything or self._holds != holds:
                continue  # Idle only after a quiet interval: a wake-up per call costs 40 us.
            self._wake.clear()
            if self._lanes or self._closed:  # Set before the clear: its setter saw it set.
                self._wake.set()
        self._wait_for_all()

    def _wait_for_all(self) -> None:
        """Waits for every result held (a lane's newest, if donated on, by a fence), then
        drops them all."""
        with self._lanes_lock:
            lanes = list(self._lanes.values())
            self._lanes.clear()
        for lane in lanes:
            for _number, result, _inputs in lane.held:
                _computed(result)
            if lane.held and _deleted(lane.held[-1][1]):
                _fenced(lane.devices)


def _state(result: Any) -> str:
    """Whether ``result`` is computed, without waiting; unknown where deleted or failed."""
    try:
        leaves = jax.tree.leaves(result)
        if any(leaf.is_deleted() for leaf in leaves):  # Asked, a deleted array raises: slow.
            return _UNKNOWN
        if not all(leaf.is_ready() for leaf in leaves):
            return _PENDING
        jax.block_until_ready(result)  # Ready: returns, or raises a failed computation's error.
    except Exception:  # noqa: BLE001 - deleted (donated on), or failed: the caller's to see.
        return _UNKNOWN
    return _COMPUTED


def _deleted(result: Any) -> bool:
    try:
        return any(leaf.is_deleted() for leaf in jax.tree.leaves(result))
    except Exception:  # noqa: BLE001 - what cannot say is not known deleted.
        return False


def _computed(result: Any) -> bool:
    """Waits for ``result``; False where it cannot tell (deleted, or failed)."""
    try:
        jax.block_until_ready(result)
    except Exception:  # noqa: BLE001 - deleted (donated on), or failed: the caller's to see.
        return False
    return True


def _fenced(devices: frozenset | None) -> bool:
    """Whether a fence, an empty computation dispatched now on each of ``devices`` (GPUs
    only: each runs its executions in order on one stream), has run."""
    if not devices or any(device.platform != "gpu" for device in devices):
        return False
    try:
        with jax.disable_jit(False):  # Disabled, jit would run the fence on the default device.
            fences = [_fence(device) for device in devices]
    except Exception:  # noqa: BLE001 - no fence (out of memory, a device in error): no word.
        return False
    return _computed(fences)


@functools.cache
def _fence_on(device) -> Any:
    sharding = jax.sharding.make_single_device_sharding(device)
    return jax.jit(lambda: jnp.zeros((), jnp.int8), out_shardings=sharding)


def _fence(device) -> jax.Array:
    return _fence_on(device)()


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
        devices = frozenset().union(*(a.sharding.device_set for a in results))
        inputs = tuple(a for a in jax.tree.leaves(inputs) if is_concrete(a))
        _HOLDER.hold(results, inputs, devices)
    return result
