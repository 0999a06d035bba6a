"""Parsing an index: the user's ``x.at[index]`` into an :class:`~._index.IndexPlan`.

:func:`parse` takes anything jnp's ``.at[...]`` takes (boolean masks aside)
and returns the plan (static) and its dynamic operands (index arrays, traced
starts). Forms jnp refuses, and ours it does not take, raise here, before
anything is staged: TypeError (masks, floats, strings), IndexError (too many
indices, two ellipses, traced slice bounds), ValueError (a ``jax.ds`` of
stride 1 longer than its axis, but for a read that jnp takes as a static
slice; ragged lists).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned import _index_lists
from pallas_pinned._index import DS_STARTS_WRAP, IndexPlan, Item, wrapped
from pallas_pinned._rows import index_dtype, to_wide_numpy, without_sub_byte

__all__ = ["MASK_ADVICE", "SUPPORTED_FORMS", "parse"]

MASK_ADVICE = (
    "boolean masks are not supported: a mask selects a data-dependent number of rows. "
    "Turn it into row numbers of a fixed count, padded with an out-of-range row that "
    "mode='drop' skips: rows = jnp.nonzero(mask, size=MAX_ROWS, fill_value=x.shape[0])[0], "
    "then call with (rows, updates, mode='drop')"
)
SUPPORTED_FORMS = (
    "ints, integer arrays (numpy or jax, any shape), lists of ints, static slices, "
    "jax.ds(start, size) with a static or traced start, Ellipsis and None, "
    "or a tuple of these (one per axis)"
)

def _is_ds(a: Any) -> bool:
    # jax.ds and pl.ds make the same Slice class (jax._src.indexing.Slice in
    # jax 0.12); duck-typed so no private module is imported.
    return type(a).__name__ == "Slice" and all(hasattr(a, f) for f in ("start", "size", "stride"))


def _is_array(a: Any) -> bool:
    return isinstance(a, (np.ndarray, jax.Array)) or hasattr(a, "aval")


def _dynamic_ds(a: Any) -> bool:
    """A ``jax.ds`` that jnp takes as a dynamic slice: a traced (or array) start, and
    from jax 0.12.1 a static negative start or a size given as an array (a concrete
    one: a traced size is refused) too (``_index.DS_STARTS_WRAP``)."""
    if not _is_ds(a):
        return False
    if _is_array(a.start):
        return True
    if not DS_STARTS_WRAP:
        return False
    return _is_array(a.size) or (isinstance(a.start, (int, np.integer)) and a.start < 0)


def _type_error(what: str) -> TypeError:
    return TypeError(f"indices must be integers, got {what}; supported: {SUPPORTED_FORMS}")


def _as_array(a: Any, wrap_dim: int | None = None):
    """A list or array index as an integer array (numpy arrays narrowed, saturating;
    under ``mode="wrap"``, ``wrap_dim``, first taken modulo the axis, exactly)."""
    if isinstance(a, list):
        a = _index_lists.positions_array(a)
    dtype = jnp.dtype(a.dtype)
    if dtype == jnp.bool_:
        raise TypeError(f"indices has dtype bool (shape {a.shape}); {MASK_ADVICE}")
    if not jnp.issubdtype(dtype, jnp.integer):
        raise _type_error(f"an array of dtype {dtype} (shape {a.shape})")
    a = without_sub_byte(a)
    if isinstance(a, np.ndarray):
        if wrap_dim:  # Exact, before the narrowing below could clamp the index.
            a = wrapped(a, wrap_dim, np.int64, xp=np)
        # Narrow here, saturating, before jax would truncate int64 values.
        a = to_wide_numpy(a, index_dtype())
    return a


def _static_int(v: Any, what: str) -> int:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"indices must be integers, got the bool {v!r}; {MASK_ADVICE}")
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, complex, np.floating, np.complexfloating)):
        raise _type_error(f"the {type(v).__name__} {v!r}")
    if isinstance(v, jax.core.Tracer):
        # A size or stride fixes the result's shape, which a trace must know.
        raise TypeError(
            f"{what} must be static (a Python int), got a traced value {v!r}; pass it as a "
            "static argument of your jit, or use a fixed size with mode='fill' or 'drop'"
        )
    if _is_array(v) and np.ndim(v) == 0 and jnp.issubdtype(v.dtype, jnp.integer):
        return int(v)  # A concrete jax scalar: static (jnp before 0.12.1 asserts on it).
    raise _type_error(f"{type(v).__name__} {v!r} as {what}")


def _is_unit_step(step: Any) -> bool:
    """Whether a slice step is None, 1 or -1; a traced or non-integer one is not (it is
    refused with the slice, by :func:`_slice_bound`)."""
    if step is None or (isinstance(step, (int, np.integer)) and not isinstance(step, bool)):
        return step in (None, 1, -1)
    if _is_array(step) and not isinstance(step, jax.core.Tracer) and np.ndim(step) == 0:
        return jnp.issubdtype(step.dtype, jnp.integer) and int(step) in (1, -1)
    return False


def _slice_bound(part: Any, whole: slice) -> int | None:
    """A static slice bound as an int (concrete jax scalars too, as jnp takes them)."""
    if part is None or isinstance(part, (int, np.integer)):
        return part
    if isinstance(part, (float, np.floating, np.bool_)) or (
        _is_array(part) and not jnp.issubdtype(part.dtype, jnp.integer)
    ):
        raise TypeError(  # As jnp (and Python) refuse them.
            f"slice bounds must be integers or None, got {whole!r}"
        )
    if isinstance(part, jax.core.Tracer) or not (_is_array(part) and np.ndim(part) == 0):
        # jnp raises IndexError for traced bounds too.
        raise IndexError(
            f"slice bounds must be static, got {whole!r}; for a block at a traced position "
            "use jax.ds(start, size), e.g. at(x)[jax.ds(start, n)].set(y)"
        )
    if not jnp.issubdtype(part.dtype, jnp.integer):
        raise _type_error(f"the slice bound {part!r}")
    return int(part)


def _expand(index: Any, ndim: int) -> tuple[list, int | None]:
    """The index as one entry per axis (plus None), and where an ellipsis stood.

    numpy takes advanced indices with an ellipsis between them as apart even
    when the ellipsis stands for no axis, so its position is kept.
    """
    items = list(index) if isinstance(index, tuple) else [index]
    # A tuple inside the index is a sequence of positions, as a list is (numpy's rule).
    items = [list(it) if isinstance(it, tuple) else it for it in items]
    for it in items:
        # Before the axis count: numpy's bool scalar uses no axis, so "too many
        # indices" would name the wrong fault.
        if isinstance(it, (bool, np.bool_)):
            raise TypeError(f"indices must be integers, got the bool {it!r}; {MASK_ADVICE}")
    ellipses = [k for k, it in enumerate(items) if it is Ellipsis]
    if len(ellipses) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consuming = sum(1 for it in items if it is not None and it is not Ellipsis)
    if consuming > ndim:
        raise IndexError(
            f"too many indices: the buffer has {ndim} axes but the index uses {consuming}"
        )
    fill = [slice(None)] * (ndim - consuming)
    if ellipses:
        k = ellipses[0]
        return items[:k] + fill + items[k + 1 :], k
    return items + fill, None


def parse(
    index: Any,
    shape: tuple[int, ...],
    mode: str | None = None,
    *,
    read: bool = False,
    min_lead: int = 0,
) -> tuple[IndexPlan, tuple]:
    """The plan of ``x.at[index]`` for a buffer of ``shape``, and its dynamic operands.

    ``read``: the index is for ``get``. Without index arrays (rank >= 1),
    jnp reads a ``jax.ds`` with a static start (>= 0 from jax 0.12.1) as the Python slice
    ``start:start + size:stride`` (clamped like any slice) in its clamping
    modes; before 0.12.1 it reads an index without index arrays or strided slices
    as a dynamic slice, whose negative traced ``jax.ds`` starts wrap once
    (``IndexPlan.ds_read_wraps``), any other through a gather, whose window starts
    are only clamped; from 0.12.1 every negative start wraps once first
    (``_index.DS_STARTS_WRAP``). ``min_lead``: at least this
    many leading axes become rows (the sharded layer needs axis 0 among them).
    Raises TypeError, IndexError or ValueError for forms jnp refuses or that
    are not supported (boolean masks, traced slice bounds), before anything runs.
    """
    shape = tuple(int(d) for d in shape)
    items, operands, axis = [], [], 0
    expanded, ellipsis_at = _expand(index, len(shape))
    # jnp reads a jax.ds with a static start (>= 0 from jax 0.12.1) as the Python slice
    # start:start + size:stride in its clamping modes when no index array
    # (rank >= 1) is present, and then only if the index is static, or takes its
    # dynamic-slice path (slices of step 1 or -1, no strided jax.ds); a traced
    # index that does not goes through a gather, which reads a window.
    arrays = any(isinstance(it, list) or (_is_array(it) and np.ndim(it) >= 1) for it in expanded)
    dynamic = any(_is_array(it) or _dynamic_ds(it) for it in expanded)
    unit_steps = all(
        (not isinstance(it, slice) or _is_unit_step(it.step))
        and (not _is_ds(it) or it.stride in (None, 1))
        for it in expanded
    )
    static_ds_as_slice = (
        read and not arrays and (unit_steps or not dynamic)
        and mode in (None, "clip", "promise_in_bounds")
        and (unit_steps or _static_ints_fit(expanded, shape, mode))
    )
    for it in expanded:
        if it is None:
            items.append(Item("new"))
            continue
        items.append(_item(it, axis, shape[axis], operands, static_ds_as_slice=static_ds_as_slice,
                           advanced=arrays, wrap=mode == "wrap"))
        axis += 1
    plan = _plan(shape, items, mode, min_lead, ellipsis_at)
    if plan.kind == "axis0" and plan.items[0].kind == "slice":
        operands = [np.arange(*plan.items[0].static, dtype=index_dtype())]
    return plan, tuple(operands)


def _static_ints_fit(expanded: list, shape: tuple[int, ...], mode: str | None) -> bool:
    """Whether jnp's static-slice read takes these static ints.

    Outside ``mode="clip"`` it checks them first, and an int out of range (or
    any int on an empty axis) sends a strided index to its gather, which reads
    a ``jax.ds`` as its positions, each clamped, not as a Python slice.
    """
    axis = 0
    for it in expanded:
        if it is None:
            continue
        if isinstance(it, (int, np.integer)):
            dim = shape[axis]
            if dim == 0 or (mode != "clip" and not -dim <= int(it) < dim):
                return False
        axis += 1
    return True


def _item(
    it: Any, axis: int, dim: int, operands: list, *, static_ds_as_slice=False,
    advanced=False, wrap=False,
) -> Item:
    """One index entry on ``axis`` (length ``dim``); array operands are appended.

    ``wrap`` (``mode="wrap"``): static ints and starts are taken modulo ``dim`` here,
    in Python, and numpy arrays in their own type, so none is clamped or truncated
    to the index type first (traced ones: ``_index.wrapped``)."""
    wrap_dim = dim if wrap and dim > 0 else None
    if _is_ds(it) and static_ds_as_slice and not _dynamic_ds(it):
        start, size = _static_int(it.start, "a ds start"), _static_int(it.size, "a ds size")
        it = slice(start, start + size, _static_int(it.stride, "a ds stride"))
    if isinstance(it, slice):
        it = slice(*(_slice_bound(part, it) for part in (it.start, it.stop, it.step)))
        if it.step == 0:
            raise ValueError(f"slice step cannot be zero, got {it!r}")
        return Item("slice", axis, static=it.indices(dim))
    if _is_ds(it):
        size, stride = _static_int(it.size, "a ds size"), _static_int(it.stride, "a ds stride")
        # A window longer than its axis is refused, as jnp refuses it. A strided one is
        # its positions, each clipped, filled or dropped on its own: any size is jnp's too.
        if size < 0 or stride < 1 or (stride == 1 and size > dim):
            fix = "; wrap more positions than the axis has with the index array (start + " \
                "jnp.arange(size)) % length" if wrap and size > dim > 0 else ""
            raise ValueError(f"jax.ds(start, {size}, {stride}) does not fit axis {axis} "
                             f"of length {dim}{fix}")
        if not _is_array(it.start):
            start = _static_int(it.start, "a ds start")
            return Item("ds", axis, value=start % wrap_dim if wrap_dim else start,
                        static=(size, stride))
        start = _as_array(it.start, wrap_dim)
        if np.ndim(start):
            raise TypeError(f"a ds start must be a scalar, got shape {np.shape(start)}")
        operands.append(start)
        return Item("ds", axis, operand=len(operands) - 1, static=(size, stride))
    if isinstance(it, list) or (_is_array(it) and np.ndim(it) != 0):
        arr = _as_array(it, wrap_dim)
        operands.append(arr)
        return Item("array", axis, operand=len(operands) - 1, shape=tuple(np.shape(arr)))
    if dim == 0 and not advanced:
        # jnp (XLA) refuses a single index into an empty axis in any mode, unless an
        # index array makes it one of the advanced indices.
        raise IndexError(f"index is out of bounds for axis {axis} with size 0")
    if _is_array(it):
        operands.append(_as_array(it, wrap_dim))
        return Item("int", axis, operand=len(operands) - 1, shape=())
    value = _static_int(it, "an index")
    if wrap_dim:
        return Item("int", axis, value=value % wrap_dim)
    info = np.iinfo(index_dtype())  # Saturate: a huge int stays out of range.
    return Item("int", axis, value=min(max(value, info.min), info.max))


def _plan(shape, items, mode, min_lead: int = 0, ellipsis_at: int | None = None) -> IndexPlan:
    # Trailing whole-axis slices become the row; everything up to the last
    # other item indexes rows.
    def whole(item):
        return item.kind == "slice" and item.static == (0, shape[item.axis], 1)

    last = max((k for k, item in enumerate(items) if not whole(item)), default=-1)
    axes = [k for k, item in enumerate(items) if item.kind != "new"]
    if min_lead:
        last = max(last, axes[min_lead - 1])
    lead_items = tuple(items[: last + 1])
    lead = sum(1 for item in lead_items if item.kind != "new")
    adv = [k for k, item in enumerate(lead_items) if item.advanced]
    shapes = [item.shape for item in lead_items if item.advanced]
    try:
        group = np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(
            f"the index arrays have shapes {', '.join(map(str, shapes))}, which do not "
            "broadcast together (as in numpy, index arrays of several axes are broadcast "
            "against each other): give them shapes that broadcast, e.g. rows[:, None] and "
            "columns[None, :] for every pair"
        ) from None
    basic = [item.length(shape[item.axis] if item.axis >= 0 else 1) for item in lead_items]
    apart = ellipsis_at is not None and bool(adv) and adv[0] < ellipsis_at <= adv[-1]
    together = bool(adv) and adv[-1] - adv[0] + 1 == len(adv) and not apart
    if not adv:
        index_shape = tuple(basic)
    elif together:
        before = [b for k, b in enumerate(basic[: adv[0]]) if not lead_items[k].advanced]
        after = [b for k, b in enumerate(basic) if k > adv[-1] and not lead_items[k].advanced]
        index_shape = tuple(before) + tuple(group) + tuple(after)
    else:
        index_shape = tuple(group) + tuple(
            b for k, b in enumerate(basic) if not lead_items[k].advanced
        )
    arrays = any(item.kind == "array" for item in lead_items)
    ring = mode == "wrap" and any(
        item.kind == "ds" and item.static[0] > 1 for item in lead_items
    )
    blocky = all(
        item.kind in ("int", "new")
        or (item.kind == "ds" and item.static[1] == 1)
        or (item.kind == "slice" and item.static[2] == 1)
        for item in lead_items
    )
    first = lead_items[0] if len(lead_items) == 1 else None
    if first is not None and first.axis == 0 and (
        first.kind == "array" or (first.kind == "slice" and first.static[2] != 1)
    ):
        kind = "axis0"  # The first release's forms: the row path as it was.
    elif blocky and not arrays and not ring:
        kind = "block"
    else:
        kind = "rows"
    if kind == "rows" and math.prod(shape[:lead]) > jnp.iinfo(index_dtype()).max:
        raise ValueError(
            f"the indexed axes {shape[:lead]} hold more positions than {index_dtype()} "
            "counts; enable jax_enable_x64 or index fewer axes at once"
        )
    steps_up = all(item.kind != "slice" or item.static[2] > 0 for item in lead_items)
    # A strided jax.ds is clipped position by position: in "clip" two of them
    # can land on the same row (a write's duplicates).
    clipped_strides = mode == "clip" and any(
        item.kind == "ds" and item.static[1] > 1 and item.static[0] > 1
        for item in lead_items
    )
    # Under "wrap" a strided jax.ds longer than its cycle (dim / gcd(stride, dim)
    # positions) comes back to rows it wrote: a write's duplicates, out of order.
    wrapped_repeats = mode == "wrap" and any(
        item.kind == "ds"
        and item.static[0] > shape[item.axis] // math.gcd(item.static[1], shape[item.axis])
        for item in lead_items
    )
    # jnp's dynamic-slice path (what wraps a negative ds start on a read before jax
    # 0.12.1; from 0.12.1 every path wraps it): no index arrays, unit-step slices and
    # windows only.
    dynamic_slice_path = not arrays and all(
        (item.kind != "slice" or item.static[2] in (1, -1))
        and (item.kind != "ds" or item.static[1] == 1)
        for item in items
    )
    return IndexPlan(
        shape=shape,
        items=lead_items,
        lead=lead,
        kind=kind,
        index_shape=index_shape,
        advanced_together=together,
        ds_read_wraps=dynamic_slice_path,
        unique=not arrays and not clipped_strides and not wrapped_repeats,
        # A ring's rows ascend but for one jump back to row 0: as good an
        # address order as any (only speed depends on it: positions are unique).
        ascending=not arrays and steps_up and not wrapped_repeats,
    )
