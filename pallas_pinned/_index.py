"""The ``.at[...]`` grammar: any index jnp takes (boolean masks aside) as a plan over rows.

:func:`parse` turns the user's index and the buffer's shape into an
:class:`IndexPlan` (static, hashable: it keys jit's cache) and the dynamic
operands it needs (index arrays, traced starts). The plan views the buffer as
2-D: the *leading* axes, up to the last one the index does more than take
whole, become the rows; the rest (axes the index takes whole) become the row.
Then every form is one of three kinds:

* ``"axis0"``: an index on axis 0 alone (int, integer array, list, static
  slice) — the forms of the first release, handed to the row kernels as
  they are (they wrap, check and de-duplicate the raw indices themselves);
* ``"block"``: a hyper-rectangle (ints, step-1 slices, ``jax.ds``, ``None``;
  no index arrays) — one copy: ``lax.dynamic_update_slice`` /
  ``dynamic_slice``, XLA's asynchronous DMA for a host buffer;
* ``"rows"``: everything else — integer arrays on several or inner axes,
  strided slices, rings. :meth:`IndexPlan.rows` computes the flat row
  numbers of the 2-D view on the device, each axis normalized by jnp's rules
  first; rows that must not be touched become :func:`skip_row`.

Semantics are jnp's (numpy's placement of advanced-index axes, jnp's modes
and its treatment of dynamic-slice windows, which differs between reads and
writes), plus ``mode="wrap"``: every index taken modulo its axis.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned._rows import index_dtype, skip_row, to_wide_numpy

__all__ = ["IndexPlan", "Item", "parse"]

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
# Modes whose out-of-range entries are dropped (writes) or filled (reads).
_DROPPING = (None, "drop", "fill", "promise_in_bounds")


@dataclasses.dataclass(frozen=True)
class Item:
    """One entry of the index tuple.

    ``kind``: ``"int"`` (a static int, or a 0-d integer array in ``operand``),
    ``"array"`` (an integer array in ``operand``), ``"slice"`` (static
    ``start, stop, step`` in ``static``), ``"ds"`` (``jax.ds``: static
    ``(size, stride)`` in ``static``; the start static in ``value`` or an
    operand), ``"new"`` (``None``: no axis). ``axis`` is the buffer axis.
    """

    kind: str
    axis: int = -1
    value: int | None = None
    operand: int | None = None
    shape: tuple[int, ...] = ()
    static: tuple = ()

    @property
    def advanced(self) -> bool:
        return self.kind in ("int", "array")

    def length(self, dim: int) -> int:
        if self.kind == "slice":
            return len(range(*self.static))
        if self.kind == "ds":
            return self.static[0]
        return 1  # "new"


@dataclasses.dataclass(frozen=True)
class IndexPlan:
    """What an index does to a buffer of ``shape``; see the module docstring."""

    shape: tuple[int, ...]
    items: tuple[Item, ...]
    lead: int  # buffer axes that become rows
    kind: str  # "axis0", "block" or "rows"
    index_shape: tuple[int, ...]
    unique: bool = False  # the form itself guarantees distinct positions
    ascending: bool = False  # ... in ascending address order (a ring: but for one jump)

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[self.lead :]

    @property
    def num_rows(self) -> int:
        return math.prod(self.shape[: self.lead])

    @property
    def width(self) -> int:
        return math.prod(self.row_shape)

    @property
    def result_shape(self) -> tuple[int, ...]:
        return self.index_shape + self.row_shape

    @property
    def num_entries(self) -> int:
        return math.prod(self.index_shape)

    # --- the "rows" view --------------------------------------------------------

    def rows(self, operands, mode: str | None, *, read: bool):
        """Flat rows of the ``(num_rows, width)`` view, in the index's row-major order.

        ``"axis0"`` plans return the raw index (the ops normalize it);
        ``"rows"`` and ``"block"`` plans return normalized rows with
        :func:`skip_row` where nothing is to be written or read.
        """
        wide = index_dtype()
        if self.kind == "axis0":
            if mode == "wrap":  # The row path's own modes do not wrap: take the modulus here.
                return jnp.mod(_widen(operands[0], wide), self.num_rows).reshape(-1)
            return operands[0]
        total = jnp.zeros((), wide)
        valid = jnp.ones((), bool)
        stride = 1
        placed = self._placement()
        for item, where in reversed(list(zip(self.items, placed, strict=True))):
            if item.kind == "new":
                continue
            dim = self.shape[item.axis]
            pos, ok = _positions(item, operands, dim, mode, read=read, wide=wide)
            pos = jnp.reshape(pos, where(pos.shape))
            total = total + pos * jnp.asarray(stride, wide)
            if ok is not None:
                valid = valid & jnp.reshape(ok, where(jnp.shape(ok)))
            stride *= dim
        total = jnp.broadcast_to(total, self.index_shape).reshape(-1)
        valid = jnp.broadcast_to(valid, self.index_shape).reshape(-1)
        return jnp.where(valid, total, skip_row(self.num_rows, wide))

    def _placement(self):
        """Per item, a function from its own shape to the shape it broadcasts in."""
        ndim = len(self.index_shape)
        adv = [k for k, item in enumerate(self.items) if item.advanced]
        group = _broadcast_rank(self.items)
        together = bool(adv) and adv[-1] - adv[0] + 1 == len(adv)
        dims, next_dim = [], group if adv and not together else 0
        for k, item in enumerate(self.items):
            if item.advanced:
                start = next_dim if together else 0
                dims.append(("adv", start))
                if together and k == adv[-1]:
                    next_dim += group
            else:
                dims.append(("basic", next_dim))
                next_dim += 1

        def shaper(kind, start):
            def shape_of(own):
                if kind == "basic":
                    return (1,) * start + (-1,) + (1,) * (ndim - start - 1)
                own = (1,) * (group - len(own)) + tuple(own)
                return (1,) * start + own + (1,) * (ndim - start - group)

            return shape_of

        return [shaper(*d) for d in dims]

    # --- the "block" view -------------------------------------------------------

    def block(self, operands, mode: str | None, *, read: bool):
        """``(starts, sizes, ok)`` of the hyper-rectangle.

        Starts are clamped as ``dynamic_slice`` clamps them (jnp's clip
        semantics). ``ok`` says whether a dropping (writes) or filling (reads)
        mode keeps the block: a Python bool when every start is static, else
        a traced bool.
        """
        wide = index_dtype()
        starts, sizes, ok = [], [], True
        by_axis = {item.axis: item for item in self.items if item.kind != "new"}
        for axis, dim in enumerate(self.shape):
            item = by_axis.get(axis)
            if item is None or item.kind == "slice":
                starts.append(0 if item is None else item.static[0])
                sizes.append(dim if item is None else item.length(dim))
                continue
            size = item.length(dim) if item.kind == "ds" else 1
            static = item.operand is None
            xp = _PY if static else jnp
            start = item.value if static else _start_of(item, operands, wide)
            # jnp wraps negative ints once; reads wrap ds starts too, except in
            # the filling modes, which judge the window as given.
            if item.kind == "int" or (read and mode not in ("fill", "drop")):
                start = xp.where(start < 0, start + dim, start)
            if mode == "wrap":
                start = xp.mod(start, dim)
            elif (not read and mode in _DROPPING) or (read and mode in ("fill", "drop")):
                ok = ok & (start >= 0) & (start <= dim - size)
            starts.append(xp.clip(start, 0, dim - size))
            sizes.append(size)
        return tuple(starts), tuple(sizes), ok


class _PY:
    """Python-int versions of the few jnp functions :meth:`IndexPlan.block` uses."""

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    @staticmethod
    def mod(a, n):
        return a % n

    @staticmethod
    def clip(a, lo, hi):
        return max(lo, min(a, hi))


def _start_of(item: Item, operands, wide):
    if item.operand is None:
        return jnp.asarray(item.value, wide)
    return _widen(operands[item.operand], wide)


def _widen(a, wide):
    a = jnp.asarray(a)
    if jnp.iinfo(a.dtype).max > jnp.iinfo(wide).max:
        a = jnp.minimum(a, jnp.asarray(jnp.iinfo(wide).max, a.dtype))
    return a.astype(wide)


def _positions(item: Item, operands, dim: int, mode, *, read: bool, wide):
    """``(positions, ok)`` along one axis; ``ok`` None when every position is valid."""
    if item.kind == "slice":
        return jnp.asarray(np.arange(*item.static), wide), None
    if item.kind == "ds":
        size, stride = item.static
        span = stride * (size - 1) + 1
        start = _start_of(item, operands, wide)
        steps = jnp.asarray(np.arange(size) * stride, wide)
        if mode == "wrap":
            return jnp.mod(start + steps, dim), None
        if read and mode not in ("fill", "drop"):
            start = jnp.clip(jnp.where(start < 0, start + dim, start), 0, dim - span)
            return start + steps, None
        if mode == "clip":  # A write: the window is shifted inside, never wrapped.
            return jnp.clip(start, 0, dim - span) + steps, None
        fits = (start >= 0) & (start <= dim - span)
        return start + steps, jnp.broadcast_to(fits, (size,))
    # "int" or "array": wrap negatives once, then the mode.
    pos = _start_of(item, operands, wide)
    if mode == "wrap":
        return jnp.mod(pos, dim), None
    pos = jnp.where(pos < 0, pos + dim, pos)
    if mode == "clip" or (read and mode not in ("fill", "drop")):
        return jnp.clip(pos, 0, dim - 1), None
    return pos, (pos >= 0) & (pos < dim)


def _broadcast_rank(items) -> int:
    shapes = [item.shape for item in items if item.advanced]
    return len(np.broadcast_shapes(*shapes)) if shapes else 0


# --- parsing -------------------------------------------------------------------------


def _is_ds(a: Any) -> bool:
    # jax.ds and pl.ds make the same Slice class (jax._src.indexing.Slice in
    # jax 0.12); duck-typed so no private module is imported.
    return type(a).__name__ == "Slice" and all(hasattr(a, f) for f in ("start", "size", "stride"))


def _is_array(a: Any) -> bool:
    return isinstance(a, (np.ndarray, jax.Array)) or hasattr(a, "aval")


def _type_error(what: str) -> TypeError:
    return TypeError(f"indices must be integers, got {what}; supported: {SUPPORTED_FORMS}")


def _as_array(a: Any):
    """A list or array index as an integer array (numpy arrays narrowed, saturating)."""
    if isinstance(a, list):
        if not a:
            a = np.zeros((0,), np.int64)  # An empty list has no dtype; numpy says float64.
        else:
            try:
                a = np.asarray(a)
            except ValueError as err:  # numpy refuses ragged nesting.
                raise ValueError(
                    "indices is a ragged list (its sublists differ in length), which has no "
                    f"array shape; pass a flat list or a rectangular nesting of ints ({err})"
                ) from None
    dtype = jnp.dtype(a.dtype)
    if dtype == jnp.bool_:
        raise TypeError(f"indices has dtype bool (shape {a.shape}); {MASK_ADVICE}")
    if not jnp.issubdtype(dtype, jnp.integer):
        raise _type_error(f"an array of dtype {dtype} (shape {a.shape})")
    if isinstance(a, np.ndarray):
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
    raise _type_error(f"{type(v).__name__} {v!r} as {what}")


def _slice_bound(part: Any, whole: slice) -> int | None:
    """A static slice bound as an int (concrete jax scalars too, as jnp takes them)."""
    if part is None or isinstance(part, (int, np.integer)):
        return part
    if isinstance(part, jax.core.Tracer) or not (_is_array(part) and np.ndim(part) == 0):
        # jnp raises IndexError for traced bounds too.
        raise IndexError(
            f"slice bounds must be static, got {whole!r}; for a block at a traced position "
            "use jax.ds(start, size), e.g. at(x)[jax.ds(start, n)].set(y)"
        )
    if not jnp.issubdtype(part.dtype, jnp.integer):
        raise _type_error(f"the slice bound {part!r}")
    return int(part)


def _expand(index: Any, ndim: int) -> list:
    items = list(index) if isinstance(index, tuple) else [index]
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
        return items[:k] + fill + items[k + 1 :]
    return items + fill


def parse(
    index: Any, shape: tuple[int, ...], mode: str | None = None, *, min_lead: int = 0
) -> tuple[IndexPlan, tuple]:
    """The plan of ``x.at[index]`` for a buffer of ``shape``, and its dynamic operands.

    ``min_lead``: at least this many leading axes become rows (the sharded
    layer needs axis 0 among them).
    Raises TypeError, IndexError or ValueError for forms jnp refuses or that
    are not supported (boolean masks, traced slice bounds), before anything runs.
    """
    shape = tuple(int(d) for d in shape)
    if not shape:
        raise ValueError(f"x must have at least one axis to index, got shape {shape}")
    items, operands, axis = [], [], 0
    for it in _expand(index, len(shape)):
        if it is None:
            items.append(Item("new"))
            continue
        items.append(_item(it, axis, shape[axis], operands))
        axis += 1
    plan = _plan(shape, items, mode, min_lead)
    if plan.kind == "axis0" and plan.items[0].kind == "slice":
        operands = [np.arange(*plan.items[0].static, dtype=index_dtype())]
    return plan, tuple(operands)


def _item(it: Any, axis: int, dim: int, operands: list) -> Item:
    """One index entry on ``axis`` (length ``dim``); array operands are appended."""
    if isinstance(it, slice):
        it = slice(*(_slice_bound(part, it) for part in (it.start, it.stop, it.step)))
        if it.step == 0:
            raise ValueError(f"slice step cannot be zero, got {it!r}")
        return Item("slice", axis, static=it.indices(dim))
    if _is_ds(it):
        size, stride = _static_int(it.size, "a ds size"), _static_int(it.stride, "a ds stride")
        if size < 0 or stride < 1 or (size and stride * (size - 1) >= dim):
            raise ValueError(
                f"jax.ds(start, {size}, {stride}) does not fit axis {axis} of length {dim}"
            )
        if not _is_array(it.start):
            start = _static_int(it.start, "a ds start")
            return Item("ds", axis, value=start, static=(size, stride))
        start = _as_array(it.start)
        if np.ndim(start):
            raise TypeError(f"a ds start must be a scalar, got shape {np.shape(start)}")
        operands.append(start)
        return Item("ds", axis, operand=len(operands) - 1, static=(size, stride))
    if isinstance(it, list) or _is_array(it):
        arr = _as_array(it)
        operands.append(arr)
        kind = "int" if np.ndim(arr) == 0 else "array"
        return Item(kind, axis, operand=len(operands) - 1, shape=tuple(np.shape(arr)))
    info = np.iinfo(index_dtype())  # Saturate: a huge int stays out of range.
    return Item("int", axis, value=min(max(_static_int(it, "an index"), info.min), info.max))


def _plan(shape, items, mode, min_lead: int = 0) -> IndexPlan:
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
    group = np.broadcast_shapes(*[item.shape for item in lead_items if item.advanced])
    basic = [item.length(shape[item.axis] if item.axis >= 0 else 1) for item in lead_items]
    together = bool(adv) and adv[-1] - adv[0] + 1 == len(adv)
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
        item.kind in ("int", "ds", "new") or (item.kind == "slice" and item.static[2] == 1)
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
    return IndexPlan(
        shape=shape,
        items=lead_items,
        lead=lead,
        kind=kind,
        index_shape=index_shape,
        unique=not arrays,
        # A ring's rows ascend but for one jump back to row 0: as good an
        # address order as any (only speed depends on it: positions are unique).
        ascending=not arrays and steps_up,
    )
