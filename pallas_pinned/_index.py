"""The ``.at[...]`` grammar: any index jnp takes (boolean masks aside) as a plan over rows.

:func:`._index_parse.parse` turns the user's index and the buffer's shape
into an :class:`IndexPlan` (static, hashable: it keys jit's cache) and the
dynamic operands it needs (index arrays, traced starts); this module holds the
plan. The plan views the buffer as 2-D: the *leading* axes, up to the last one
the index does more than take whole, become the rows; the rest (axes the index
takes whole) become the row. Every form is one of three kinds:

* ``"axis0"``: an index on axis 0 alone (integer array, list, strided
  slice; ints and step-1 slices are blocks) — the forms of the first
  release, handed to the row kernels as they are (they wrap, check and
  de-duplicate the raw indices themselves);
* ``"block"``: a hyper-rectangle (ints, step-1 slices, ``jax.ds``, ``None``;
  no index arrays), contiguous (:attr:`IndexPlan.block_is_contiguous`) or
  strided — one copy: ``lax.dynamic_update_slice`` / ``dynamic_slice``, XLA's
  asynchronous DMA for a host buffer (or its rows, as dispatch decides);
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

import jax
import jax.numpy as jnp
import numpy as np

from pallas_pinned._rows import index_dtype, skip_row, to_wide

__all__ = ["IndexPlan", "Item"]

# jnp from 0.12.1 wraps a negative jax.ds start once (start + length), as it wraps a
# negative int, in every mode, reads and writes, traced or static, before any other rule;
# a static start >= 0 is still a Python slice to its static-slice path. Before 0.12.1 only
# its dynamic-slice read path wrapped a traced start (IndexPlan.ds_read_wraps), and a
# static negative start was a Python slice. jnp is the oracle: the rules follow its version.
DS_STARTS_WRAP = jax.__version_info__ >= (0, 12, 1)


def _block_checked(mode: str | None, read: bool) -> bool:
    """Whether a block's start is checked (dropped or filled when out of range).

    A promised block is clamped instead, as ``dynamic_update_slice`` clamps:
    out-of-range starts are undefined under the promise, and a clamped block
    never reaches outside the buffer.
    """
    return mode in ("fill", "drop") if read else mode in (None, "drop", "fill")


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
    # An eager call's int that the front lifted to a 0-d operand (one program for every
    # position) after seeing it in [0, axis length): its block needs no run-time check.
    in_range: bool = False

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
    advanced_together: bool = False  # numpy's rule: the advanced axes stay in place
    # Before jax 0.12.1 (DS_STARTS_WRAP off): jnp reads a negative ds start wrapped (its
    # dynamic-slice path).
    ds_read_wraps: bool = True
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
                return wrapped(operands[0], self.num_rows, wide).reshape(-1)
            return operands[0]
        total = jnp.zeros((), wide)
        valid = jnp.ones((), bool)
        stride = 1
        placed = self._placement()
        for item, where in reversed(list(zip(self.items, placed, strict=True))):
            if item.kind == "new":
                continue
            dim = self.shape[item.axis]
            pos, ok = _positions(
                item, operands, dim, mode, read=read, wide=wide, wraps=self.ds_read_wraps
            )
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
        together = self.advanced_together
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

    @property
    def block_sizes(self) -> tuple[int, ...]:
        """A ``"block"`` plan's hyper-rectangle: its static size on each axis of the buffer."""
        by_axis = {item.axis: item for item in self.items if item.kind != "new"}
        return tuple(
            dim if by_axis.get(axis) is None else by_axis[axis].length(dim)
            for axis, dim in enumerate(self.shape)
        )

    @property
    def block_is_contiguous(self) -> bool:
        """Whether a ``"block"`` plan's hyper-rectangle is one run of addresses:
        past its leading axes of length 1, every axis but the first is taken whole
        (``x[jax.ds(p, n)]``, ``x[i, p:q]``); ``kv[:, pos]`` is strided."""
        sizes = self.block_sizes
        lead = next((a for a, size in enumerate(sizes) if size != 1), len(sizes))
        return all(sizes[a] == self.shape[a] for a in range(lead + 1, len(sizes)))

    def with_starts_in_range(self, axes: frozenset[int]) -> IndexPlan:
        """This plan with its 0-d int operands on ``axes`` marked :attr:`Item.in_range`."""
        if not axes:
            return self
        return dataclasses.replace(self, items=tuple(
            dataclasses.replace(item, in_range=True)
            if item.kind == "int" and item.operand is not None and item.axis in axes else item
            for item in self.items
        ))

    def block_checked_at_run_time(self, mode: str | None, *, read: bool) -> bool:
        """Whether :meth:`block`'s ``ok`` is traced: a start known only at run time
        that a dropping or filling mode must check (a write then reads the block
        back to keep it unchanged when the start is out of range)."""
        if not _block_checked(mode, read):
            return False
        return any(
            item.kind in ("int", "ds")
            and item.operand is not None
            and not item.in_range
            and not (item.kind == "ds" and item.static[0] == self.shape[item.axis])
            for item in self.items
        )

    def block(self, operands, mode: str | None, *, read: bool):
        """``(starts, sizes, ok)`` of the hyper-rectangle.

        Starts are clamped as ``dynamic_slice`` clamps them (jnp's clip
        semantics). ``ok`` says whether a dropping (writes) or filling (reads)
        mode keeps the block: a Python bool when every start is static or
        known in range (:attr:`Item.in_range`), else a traced bool.
        """
        wide = index_dtype()
        starts, sizes, ok = [], self.block_sizes, True
        by_axis = {item.axis: item for item in self.items if item.kind != "new"}
        for axis, (dim, size) in enumerate(zip(self.shape, sizes, strict=True)):
            item = by_axis.get(axis)
            if item is None or item.kind == "slice":
                starts.append(0 if item is None else item.static[0])
                continue
            if item.kind == "ds" and size == dim and mode != "wrap":
                starts.append(0)  # As long as its axis: the start is ignored (see _positions).
                continue
            static = item.operand is None
            xp = _PY if static else jnp
            if mode == "wrap":
                # In [0, dim) already: taken modulo the axis when parsed, or here.
                start = item.value if static else wrapped(operands[item.operand], dim, wide)
            else:
                start = item.value if static else _start_of(item, operands, wide)
                # jnp wraps negative ints once, and ds starts from jax 0.12.1; before
                # it, reads wrapped ds starts, except in the filling modes, which judge
                # the window as given.
                wraps = item.kind == "int" or DS_STARTS_WRAP or (
                    read and mode not in ("fill", "drop") and self.ds_read_wraps
                )
                if wraps:
                    start = xp.where(start < 0, start + dim, start)
                if _block_checked(mode, read) and not item.in_range:
                    ok = ok & (start >= 0) & (start <= dim - size)
            starts.append(xp.clip(start, 0, dim - size))
        return tuple(starts), sizes, ok


class _PY:
    """Python-int versions of the few jnp functions :meth:`IndexPlan.block` uses."""

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    @staticmethod
    def clip(a, lo, hi):
        return max(lo, min(a, hi))


def _start_of(item: Item, operands, wide, bounds: tuple[int, int] | None = None):
    """The item's start (or index) as ``wide``; with ``bounds``, clamped into them first,
    the static one in Python (a start past int64 has no ``wide`` form)."""
    if item.operand is None:
        value = item.value if bounds is None else min(max(item.value, bounds[0]), bounds[1])
        return jnp.asarray(value, wide)
    start = to_wide(jnp.asarray(operands[item.operand]), wide)
    return start if bounds is None else jnp.clip(start, *bounds)


def wrapped(index, dim: int, wide, xp=jnp):
    """``index`` modulo ``dim`` (``mode="wrap"``), as ``wide``: exact for every value of
    the index's own type. The modulus comes first, in that type where ``dim`` fits it,
    so no index is clamped to ``wide`` or overflows on the way (a uint32 index above
    2**31 - 1 without x64, say). ``xp``: ``jnp``, or ``np`` for a numpy index before
    jax would narrow it."""
    index = xp.asarray(index)
    if np.iinfo(index.dtype).max >= dim:
        return xp.mod(index, xp.asarray(dim, index.dtype)).astype(wide)
    return xp.mod(index.astype(wide), dim)  # A narrower type: the cast loses nothing.


def _wrapped_start(item: Item, operands, dim: int, wide):
    if item.operand is None:
        return jnp.asarray(item.value, wide)  # Taken modulo the axis when parsed.
    return wrapped(operands[item.operand], dim, wide)


def _positions(item: Item, operands, dim: int, mode, *, read: bool, wide, wraps: bool = True):
    """``(positions, ok)`` along one axis; ``ok`` None when every position is valid."""
    if item.kind == "slice":
        return jnp.asarray(np.arange(*item.static), wide), None
    if item.kind == "ds":
        size, stride = item.static
        span = stride * (size - 1) + 1
        if mode == "wrap":
            # (start + k * stride) mod dim without forming the sum, which could overflow
            # the index type near its top: both terms are reduced, then the one that
            # would pass dim comes back down.
            start = _wrapped_start(item, operands, dim, wide)
            to_top = jnp.asarray(dim - (np.arange(size, dtype=np.int64) * stride) % dim, wide)
            below = start - to_top  # In (-dim, dim): no overflow.
            return jnp.where(below < 0, below + dim, below), None
        # A start past the axis (or before it, by more than the window) selects as one at
        # its edge would: clamped there, `start + steps` cannot overflow `wide` (a start
        # near 2**63 wrapped to row 0).
        low = max(-(span + dim), int(np.iinfo(wide).min))
        start = _start_of(item, operands, wide, bounds=(low, dim))
        if DS_STARTS_WRAP:
            # Once (jnp from 0.12.1); a start clamped to `low` still lands before the
            # window's reach, as the unclamped one would.
            start = jnp.where(start < 0, start + dim, start)
        steps = jnp.asarray(np.arange(size) * stride, wide)
        if stride > 1:
            # jnp gathers or scatters a strided window position by position
            # (start + k * stride, never wrapped): each one is clipped, filled
            # or dropped on its own, like an index array's.
            return _each_position(start + steps, dim, mode, read=read)
        if span == dim:
            # A window as long as its axis: XLA (so jnp) ignores its start,
            # in every mode: the whole axis, never dropped or filled.
            return steps, None
        if read and mode not in ("fill", "drop"):
            if wraps and not DS_STARTS_WRAP:
                start = jnp.where(start < 0, start + dim, start)
            return jnp.clip(start, 0, dim - span) + steps, None
        if mode == "clip":  # A write: the window is shifted inside, never wrapped.
            return jnp.clip(start, 0, dim - span) + steps, None
        fits = (start >= 0) & (start <= dim - span)
        return start + steps, jnp.broadcast_to(fits, (size,))
    # "int" or "array": wrap negatives once, then the mode.
    if mode == "wrap":
        return _wrapped_start(item, operands, dim, wide), None
    pos = _start_of(item, operands, wide)
    return _each_position(jnp.where(pos < 0, pos + dim, pos), dim, mode, read=read)


def _each_position(pos, dim: int, mode, *, read: bool):
    """Positions taken one by one: clamped by "clip" and a clamping read, else masked."""
    if mode == "clip" or (read and mode not in ("fill", "drop")):
        return jnp.clip(pos, 0, dim - 1), None
    return pos, (pos >= 0) & (pos < dim)


def _broadcast_rank(items) -> int:
    shapes = [item.shape for item in items if item.advanced]
    return len(np.broadcast_shapes(*shapes)) if shapes else 0
