"""The step of each provider of ``benchmarks.sparse_training``: one jitted ``lax.scan`` each.

Every provider trains the same way (SGD on the rows a step's ids name, the loss
``0.5 * mean_b ||row_b - target_b||^2``); they differ in where the table lives
and how its rows are read and written. ``step_fns`` gives the jitted scans by
provider name; the table (argument 0) is donated.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from pallas_pinned import _rows

DEVICE_STEPS = ("device", "device_distinct")  # the providers whose table is in device memory


def _loss(rows, targets):
    return 0.5 * jnp.mean(jnp.sum((rows - targets) ** 2, axis=-1))


def _sgd_scan(read, add, lr: float, order=None):
    """``(table, ids, targets) -> table``: one scan step per row of ``ids``.

    ``order(ids, num_rows) -> (ids_sorted, perm)``, when given, orders each step's ids
    once for both ops (the targets permuted alike: the loss is a mean over entries).
    """

    def train(table, ids, targets):
        def step(table, xs):
            i, t = xs
            if order is not None:
                i, perm = order(i, table.shape[0])
                t = t[perm]
            grad = jax.grad(_loss)(read(table, i), t)
            return add(table, i, (-lr * grad).astype(table.dtype)), None

        return lax.scan(step, table, (ids, targets))[0]

    return train


def _xla_read(table, i):
    on_host = jax.device_put(i, jax.memory.Space.Host)
    # The barrier keeps XLA from moving the gradient's ops back across the copy
    # (as pallas_pinned/_host_xla.py does for the same reason).
    return lax.optimization_barrier(jax.device_put(table[on_host], jax.memory.Space.Device))


def step_fns(lr: float) -> dict:
    """The jitted scan of each provider; the table (argument 0) is donated."""
    kernels = "pallas" if jax.default_backend() == "gpu" else "interpret"
    reads_adds = {
        "ours": (pp.gather_from_host, pp.scatter_add_to_host),
        "ours_kernels": (functools.partial(pp.gather_from_host, backend=kernels),
                         functools.partial(pp.scatter_add_to_host, backend=kernels)),
        "xla": (_xla_read, lambda x, i, u: x.at[i].add(u)),
        "device": (lambda x, i: jnp.take(x, i, axis=0), lambda x, i, u: x.at[i].add(u)),
    }
    fns = {name: jax.jit(_sgd_scan(read, add, lr), donate_argnums=0)
           for name, (read, add) in reads_adds.items()}
    sorted_ops = [functools.partial(op, indices_are_sorted=True)
                  for op in (pp.gather_from_host, pp.scatter_add_to_host)]
    sorted_scan = _sgd_scan(*sorted_ops, lr, order=pp.sort_indices)
    distinct = {
        "ours_distinct": (
            functools.partial(pp.gather_from_host, mode="fill", fill_value=0, **_DISTINCT),
            functools.partial(pp.scatter_to_host, mode="drop", **_DISTINCT)),
        "device_distinct": (
            lambda x, rows: jnp.take(x, rows, axis=0, mode="fill", fill_value=0),
            lambda x, rows, v: x.at[rows].set(v, mode="drop", **_DISTINCT)),
    }
    fns |= {name: jax.jit(_read_once_scan(read, write, lr), donate_argnums=0)
            for name, (read, write) in distinct.items()}
    return fns | {"ours_sorted": jax.jit(sorted_scan, donate_argnums=0),
                  "transfer": jax.jit(_transfer_scan, donate_argnums=0)}


# What distinct_rows (and the transfer step's ids) guarantee of their rows (padding aside).
_DISTINCT = {"unique_indices": True, "indices_are_sorted": True}


def distinct_rows(ids, num_rows: int):
    """``(rows, inverse)``: each in-range id once, ascending, then skip markers; ``rows[inverse]``
    is each entry's row (the marker for ids out of range).

    The read-once step's helper, kept here rather than in the library: on the H200
    (2026-12-04 17:28 UTC) the step it serves was no faster than ``ours_sorted``
    (docs/PERFORMANCE.md, the sparse-training client).
    """
    rows = _rows.normalize_rows(ids, num_rows, None)
    n = rows.shape[0]
    ordered, order = _rows.stable_order(rows)
    marker = _rows.skip_row(num_rows, rows.dtype)
    real = ordered != marker  # the markers' run is no row
    starts = real & jnp.concatenate([jnp.ones((1,), bool), ordered[1:] != ordered[:-1]])
    run = jnp.cumsum(starts, dtype=jnp.int32) - 1  # each sorted entry's distinct position
    # With a marker among the entries at most n - 1 rows are distinct: the last place
    # is padding, which holds the marker.
    run = jnp.where(real, run, n - 1)
    distinct = jnp.full((n,), marker, rows.dtype).at[jnp.where(starts, run, n)].set(
        ordered, mode="drop", unique_indices=True)
    return distinct, jnp.zeros((n,), jnp.int32).at[order].set(run, unique_indices=True)


def _read_once_scan(read, write, lr: float):
    """The same training reading each distinct row once and writing it once (a set).

    :func:`distinct_rows` gives the step's distinct rows and each entry's place
    among them; ``jax.grad`` through ``values[inverse]`` sums each row's gradients,
    so the new rows are ``values - lr * grad``: the add's result up to rounding,
    without the add's second read of the rows.
    """

    def train(table, ids, targets):
        def step(table, xs):
            i, t = xs
            rows, inverse = distinct_rows(i, table.shape[0])
            values = read(table, rows)
            grad = jax.grad(lambda v: _loss(v[inverse], t))(values)
            return write(table, rows, (values - lr * grad).astype(table.dtype)), None

        return lax.scan(step, table, (ids, targets))[0]

    return train


def _transfer_scan(table, rows, targets):
    """The measured floor: each step reads its distinct rows and writes them, shifted by one.

    ``rows[s]`` is step ``s``'s pair of :func:`transfer_rows`: the distinct rows read,
    ascending, and the rows written, each read row's successor. The values go straight
    from the gather into the scatter, so the step costs a read of the distinct rows and
    a write of all but one of them, and nothing else (no arithmetic, no ordering; the
    scan slices each step's indices, as it did when the rows were written back where
    they were read). Yet the written rows change, so a step that moves nothing fails
    the check against :func:`transfer_replay`. ``targets`` is unused.
    """
    del targets

    def step(table, pair):
        values = pp.gather_from_host(table, pair[0], mode="fill", fill_value=0, **_DISTINCT)
        return pp.scatter_to_host(table, pair[1], values, mode="drop", **_DISTINCT), None

    return lax.scan(step, table, rows)[0]


def distinct_padded(ids: np.ndarray, num_rows: int, width: int | None = None) -> np.ndarray:
    """Each step's distinct ids, ascending, then ``num_rows, num_rows + 1, ...`` to one width:
    ``width``, or the most distinct ids of a step (a ``width`` below that is raised to it)."""
    distinct = [np.unique(row) for row in ids]
    width = max(width or 0, *(d.size for d in distinct))
    pads = [num_rows + np.arange(width - d.size) for d in distinct]
    return np.stack([np.concatenate([d, pad]) for d, pad in zip(distinct, pads, strict=True)]
                    ).astype(np.int32)


def transfer_rows(ids: np.ndarray, num_rows: int, width: int | None = None) -> np.ndarray:
    """``(steps, 2, width)`` int32: per step the rows the transfer floor reads
    (:func:`distinct_padded`) and those it writes: entry ``j``'s value goes to the row read
    by entry ``j + 1`` (the last real row's to a pad, out of range: dropped). Both sorted
    and unique, as the floor's ops are promised. One ``width`` gives sets of ids one shape."""
    reads = distinct_padded(ids, num_rows, width)
    past = np.full((reads.shape[0], 1), num_rows + reads.shape[1], np.int32)
    return np.stack([reads, np.concatenate([reads[:, 1:], past], axis=1)], axis=1)


def transfer_replay(table0: jax.Array, rows: np.ndarray) -> jax.Array:
    """The table after one :func:`_transfer_scan` from ``table0``, replayed in numpy on the
    rows it touches (each step's values read before any is written, as the step does)."""
    num_rows = table0.shape[0]
    touched = np.unique(rows[:, 0][rows[:, 0] < num_rows])
    values = np.array(table0[jnp.asarray(touched)])  # a writable copy
    for read, write in rows:
        moved = write < num_rows
        values[np.searchsorted(touched, write[moved])] = values[
            np.searchsorted(touched, read[moved])]
    return table0.at[touched].set(values)
