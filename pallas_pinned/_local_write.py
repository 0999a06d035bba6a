"""The local layer of the writes: one buffer on one device, any index form, any update op.

The public ops validate and parse the index (``_index_parse.parse``), then call
:func:`write`. Inside a trace it stages :func:`write_traced` under the rules
below; outside, it runs that in a jit that donates ``x`` (so the update
happens in place) and places the result exactly where ``x`` is.

:func:`write_traced` asks ``_registry.choose`` for the implementation: a
block copy (``_block``), or the rows of a 2-D view of the buffer for XLA or
a kernel (``_write_rows``). The sharded layer calls :func:`write_traced` per
shard, never the public ops.

Transformations: the write updates one buffer, so ``jax.vmap`` is refused
(with the folded alternative), and so is a gradient with respect to ``x``
(its cotangent would be a second buffer of the same size). Set and add
differentiate with respect to ``updates`` by rules of their own; min, max and
mul refuse it. Under an eager ``jax.grad`` or ``jax.vmap``, ``x`` is not donated
(:func:`may_donate`), even with no traced argument: the caller never gets the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp

from pallas_pinned import _block, _placement, _registry, _rows, _write_rows, tuning
from pallas_pinned._index import IndexPlan
from pallas_pinned.reference import gather_rows_reference

try:  # Private: whether a transformation is on (see may_donate).
    from jax._src.core import trace_state_clean as _trace_state_clean
except ImportError:  # Moved: the arguments' tracers decide alone.
    _trace_state_clean = None

__all__ = ["WriteCall", "may_donate", "write", "write_traced"]

OP_NAMES = {
    "set": "scatter_to_host",
    "add": "scatter_add_to_host",
    "min": "scatter_min_to_host",
    "max": "scatter_max_to_host",
    "mul": "scatter_mul_to_host",
}


@dataclasses.dataclass(frozen=True)
class WriteCall:
    """Everything static about one write; hashable, so it keys jit's cache."""

    op: str
    plan: IndexPlan
    mode: str | None
    # The caller's promises, as written; _registry.choose decides what they let it skip.
    promised_distinct: bool
    promised_sorted: bool
    backend: str
    thresholds: tuning.Thresholds

    @classmethod
    def of(cls, op, plan, *, mode, unique_indices, indices_are_sorted, backend):
        """The call's settings and the current thresholds."""
        return cls(
            op=op,
            plan=plan,
            mode=mode,
            promised_distinct=bool(unique_indices),
            promised_sorted=bool(indices_are_sorted),
            backend=backend,
            thresholds=tuning.current(),
        )

    @property
    def one_copy(self) -> bool:
        """A set of a strided block (a KV cache's slot, ``kv[:, pos]``) that needs no run-time
        check is one copy, XLA's asynchronous DMA, on a host buffer too; a contiguous block
        is rows there (one kernel launch of distinct ascending rows)."""
        plan = self.plan
        return (
            self.op == "set"
            and plan.kind == "block"
            and not plan.block_is_contiguous
            and not plan.block_checked_at_run_time(self.mode, read=False)
        )

    @property
    def row_mode(self) -> str | None:
        """The mode the row writes apply: the call's own for axis-0 indices.

        Other forms arrive with their rows normalized axis by axis (rows to
        leave alone marked), so the row writes only drop the marked ones.
        """
        if self.plan.kind == "axis0" and self.mode != "wrap":
            return self.mode
        return "drop"


def write_traced(x, operands, updates, call: WriteCall):
    """``x.at[index].<op>(updates)``, staged; the result has ``x``'s shape and placement."""
    plan = call.plan
    if plan.num_entries == 0 or x.size == 0:
        return x
    on_copies = _placement.on_each_copy(
        functools.partial(write_traced, call=call), x, operands, updates)
    if on_copies is not None:
        return on_copies  # A replicated buffer on an Explicit mesh: see on_each_copy.
    # Index arrays may live in host memory; the row arithmetic runs on the device.
    operands = jax.tree.map(_placement.to_device_memory, operands)
    index_dtype = operands[0].dtype if plan.kind == "axis0" else None
    route = _registry.choose(call, x, index_dtype)
    if route.path == "block":
        return _block.write(x, plan, operands, updates, op=call.op, mode=call.mode)
    if route.path == "scalar":
        return _scalar_write(x, updates, call)
    rows = plan.rows(operands, call.mode, read=False)
    x2d = x.reshape(plan.num_rows, plan.width)
    updates2d = _write_rows.updates_2d(x.dtype, updates, plan.result_shape, plan.width)
    x2d = _placement.varying_as(x2d, rows, updates2d)
    cfg = _write_rows.RowWrite(call.op, call.row_mode, route)
    return _write_rows.write(x2d, rows, updates2d, cfg).reshape(x.shape)


def _scalar_write(x, updates, call: WriteCall):
    """A rank-0 host buffer's one value, computed on the device and put back in host memory.

    JAX types the replacement of a whole rank-0 array (a reshape or an update
    slice of it, what the rows and blocks do) in device memory: the result would
    leave the host, and a donating jit aborts. Four bytes or so move each way.
    """
    value = _placement.to_device_memory(x)
    block = jnp.broadcast_to(_rows.cast_updates(_placement.to_device_memory(updates), x.dtype),
                             call.plan.result_shape).reshape(())
    if call.op == "set":
        new = block
    else:
        acc = _rows.add_accumulator_dtype(x.dtype, call.op)
        new = _rows.COMBINERS[call.op](value.astype(acc), block.astype(acc))
    return _placement.place_like(new.astype(x.dtype), x)


# --- transformations -------------------------------------------------------------------


def _rows_of(call: WriteCall, operands):
    """The normalized rows of the 2-D view that the write touched (skip markers else)."""
    plan = call.plan
    operands = jax.tree.map(_placement.to_device_memory, operands)
    rows = plan.rows(operands, call.mode, read=False)
    return _rows.normalize_rows(_placement.to_device_memory(rows), plan.num_rows, call.row_mode)


def _updates_vjp(call: WriteCall, operands, updates, cotangent):
    """The cotangent of ``updates``: set gives each update its row's if it won; add, always."""
    plan = call.plan
    rows = _rows_of(call, operands)
    flat = _placement.to_device_memory(cotangent).reshape(plan.num_rows, plan.width)
    picked = gather_rows_reference(flat, rows)
    if call.op == "set":
        picked = jnp.where(winners(rows, plan.num_rows)[:, None], picked, 0)
    return transpose_to_updates(picked.reshape(plan.result_shape), updates)


def winners(rows: jax.Array, num_rows: int) -> jax.Array:
    """Which entries a set writes: the last of each row in range."""
    kept_sorted, src = _rows.dedupe_last_wins(rows, num_rows)
    return jnp.zeros(rows.shape, bool).at[src].set(
        _rows.rows_in_range(kept_sorted, num_rows), unique_indices=True
    )


def transpose_to_updates(picked: jax.Array, updates: jax.Array) -> jax.Array:
    """Undoes the forward's cast to the buffer's dtype and its broadcast (sums, casts back)."""
    if picked.size == 0:  # Nothing selected: updates of any shape (as jnp), none landed.
        return jnp.zeros_like(updates)
    _, to_updates = jax.vjp(
        lambda u: jnp.broadcast_to(u.astype(picked.dtype), picked.shape), updates
    )
    (cotangent,) = to_updates(picked)
    return cotangent


def _vmap_message(op_name: str) -> str:
    return (
        f"{op_name} does not support jax.vmap: it updates one buffer in place. Fold a batch "
        "of index/update sets into one call: for row indices on axis 0, "
        f"{op_name}(x, indices.reshape(-1), updates.reshape((-1,) + x.shape[1:])); for an "
        "index on another axis, put the batch into that axis's index and move the updates' "
        "batch axis there too (at(kv)[:, positions].set(jnp.moveaxis(updates, 0, 1))); for "
        "set, later entries win. Or loop over "
        "buffers with lax.fori_loop / lax.scan. (jax.jacfwd and jax.hessian vmap a jvp: "
        "take a Jacobian with respect to updates in reverse mode, jax.jacrev)"
    )


def _grad_message(op: str, what: str) -> str:
    op_name = OP_NAMES[op]
    if what == "x":
        return (
            f"{op_name} is not differentiable with respect to the buffer x: its cotangent "
            "would be a second buffer of x's full size. Differentiate with respect to updates "
            "only: wrap x in jax.lax.stop_gradient where no gradient should flow through the "
            "buffer. If x comes from an earlier write of differentiated updates (in the same "
            "function, or in an earlier step of a lax.scan or fori_loop that carries the "
            "buffer), make the two one call: concatenate their indices and their updates "
            "(for set, later entries win); in a loop, collect the differentiated rows on the "
            "device and write them once after it (there jax.lax.stop_gradient(x) would drop "
            "the earlier updates' gradient)"
        )
    return (
        f"{op_name} is not differentiable with respect to updates (only set and add are). "
        f"Compute the differentiated values on the device, e.g. new = {_DEVICE_COMBINES[op]} with "
        "old = pallas_pinned.gather_from_host(x, i), and write them with scatter_to_host "
        "outside the differentiated function"
    )


# The device-side formula for each refused op's new rows, for its gradient refusal.
_DEVICE_COMBINES = {"min": "jnp.minimum(old, u)", "max": "jnp.maximum(old, u)", "mul": "old * u"}


# JAX's own words when forward mode meets a write: its custom_vjp (jax/_src/interpreters/
# ad.py), or, under jax.hessian, the kernel's aliased pallas_call (jax/_src/pallas).
_JAX_JVP_REFUSALS = ("forward-mode autodiff (jvp) to a custom_vjp", "JVP with aliasing")


# JAX's words when an eager shard_map meets a custom_vjp with symbolic zeros
# (jax/_src/shard_map.py).
_EAGER_SHARD_MAP_REFUSAL = "symbolic_zeros support with shard_map"


@contextlib.contextmanager
def naming_the_jvp_fix(op: str):
    """Turns JAX's refusal of ``jax.jvp`` (also ``jacfwd``, ``hessian``) through a write's
    ``custom_vjp`` into one that names the reverse-mode alternative. JAX raises it when
    the tangent is computed: eagerly that is inside this call; under an enclosing ``jit``
    it is at the caller's, with JAX's words."""
    try:
        yield
    except (TypeError, NotImplementedError) as error:
        if not any(words in str(error) for words in _JAX_JVP_REFUSALS):
            raise
        raise TypeError(
            f"{OP_NAMES[op]} has no forward-mode derivative (jax.jvp, jax.jacfwd, "
            "jax.hessian): a write's tangent is a buffer of x's full size. Differentiate "
            "set and add with respect to updates in reverse mode (jax.grad, jax.vjp, "
            "jax.jacrev), reading the result back with "
            "jax.device_put(out, jax.memory.Space.Device)"
        ) from error


def _refuse_gradients(op: str, x, updates) -> None:
    """Refuses a gradient the write has no rule for: ``x``'s, and the updates' but for
    set and add. ``x`` and ``updates`` are ``custom_vjp``'s symbolic-zero primals, each
    saying whether it is differentiated, so the refusal comes while tracing."""
    if x.perturbed:
        raise TypeError(_grad_message(op, "x"))
    if updates.perturbed and op not in ("set", "add"):
        raise TypeError(_grad_message(op, "updates"))


def with_write_rules(op: str, traced, updates_cotangent):
    """``traced(x, operands, updates)`` with a write's transformation rules, for the
    local and the sharded write alike: ``jax.vmap`` refused (the write updates one
    buffer in place), the gradient for the updates of set and add,
    ``updates_cotangent(operands, updates, cotangent)``, and every other refused."""
    op_name = OP_NAMES[op]

    # The rules wrap ``traced`` itself: no frame of ours between them and the write.
    unbatched = jax.custom_batching.custom_vmap(traced)

    @unbatched.def_vmap
    def _reject(axis_size, in_batched, *args):
        raise NotImplementedError(_vmap_message(op_name))

    write_with_rules = jax.custom_vjp(unbatched)

    def fwd(x, operands, updates):
        _refuse_gradients(op, x, updates)
        operands = tuple(primal.value for primal in operands)
        return unbatched(x.value, operands, updates.value), (operands, updates.value)

    def bwd(residuals, cotangent):
        return None, None, updates_cotangent(*residuals, cotangent)

    write_with_rules.defvjp(fwd, bwd, symbolic_zeros=True)
    return write_with_rules


@functools.lru_cache(maxsize=256)  # One per static index value: bounded, as _front's plans.
def _with_rules(call: WriteCall):
    return with_write_rules(
        call.op, functools.partial(write_traced, call=call), functools.partial(_updates_vjp, call)
    )


@functools.lru_cache(maxsize=256)  # Keyed as _with_rules: one jit wrapper per call.
def _jitted_rules(call: WriteCall):
    return jax.jit(_with_rules(call))


@functools.cache
def _jitted(sharding, donate: bool):
    def run(x, operands, updates, call):
        return _with_rules(call)(x, *_replicated_like(_placement.explicit_mesh(x), operands,
                                                      updates))

    return jax.jit(
        run, static_argnums=(3,), donate_argnums=(0,) if donate else (), out_shardings=sharding
    )


def _replicated_like(mesh, operands, updates):
    """Indices and updates sharded over a replicated buffer's mesh (``mesh``: the
    ``Explicit`` mesh of its type, or None), gathered (outside the rules, so that the
    gradient's transpose scatters them back)."""
    if mesh is None:
        return operands, updates
    return tuple(map(_placement.gathered, operands)), _placement.gathered(updates)


def may_donate(*args) -> bool:
    """Whether an eager write may consume its buffer: nothing traced, no transformation on.

    A closed-over buffer written with constants inside an eager ``jax.grad`` or
    ``jax.vmap`` has no traced argument, yet its result stays inside the
    transformation. JAX's trace state says whether one is on; should that
    private function move, the arguments' tracers still decide. Nor under
    ``jax_debug_nans``/``jax_debug_infs``: a call that makes a NaN or inf is re-run
    de-optimized on the same inputs, and a donated buffer is gone by then (JAX
    turns donation off itself for NaNs only). Before it says yes, it waits for the
    inputs (:func:`_placement.wait_for_inputs`), so that a failed one leaves ``x`` alive.
    """
    if jax.config.jax_debug_nans or jax.config.jax_debug_infs:
        return False
    if any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(args)):
        return False
    if _trace_state_clean is None:
        _warn_trace_state_unknown()
    elif not _trace_state_clean():
        return False
    _placement.wait_for_inputs(args)
    return True


@functools.cache
def _warn_trace_state_unknown() -> None:
    warnings.warn(
        f"pallas_pinned cannot tell, with jax {jax.__version__}, whether a transformation "
        "is on (jax._src.core.trace_state_clean has moved): an eager write with no traced "
        "argument inside jax.grad or jax.vmap will consume its buffer x. Pass x through "
        "the transformed function, or jit the write (under jit nothing is donated but what "
        "you donate); please report this jax version",
        RuntimeWarning,
        stacklevel=4,
    )


def write(x, facts: _placement.Facts, operands, updates, call: WriteCall):
    """Runs (or, inside a trace, stages) the write with its transformation rules;
    ``facts`` are ``x``'s (``_placement.facts``), checked.

    Outside a trace, ``x`` in host memory is consumed (donated) and updated in place, unless
    another argument is being transformed (see the module docstring); when there is
    nothing to write, ``x`` comes back untouched."""
    if not isinstance(updates, jax.Array | jax.core.Tracer):
        updates = jnp.asarray(updates)  # custom_vjp wants arrays, not Python scalars.
    if not facts.concrete:
        rules = _with_rules(call)
        operands, updates = _replicated_like(facts.explicit_mesh, operands, updates)
        try:
            return rules(x, operands, updates)
        except NotImplementedError as error:
            if _EAGER_SHARD_MAP_REFUSAL not in str(error):
                raise
            # A shard_map run eagerly (no jit around it) has no custom_vjp with symbolic
            # zeros; under jit its body is traced as any other function.
            return _jitted_rules(call)(x, operands, updates)
    if call.plan.num_entries == 0 or x.size == 0:
        return x  # Nothing to write; the buffer stays as it is.
    x = facts.buffer  # Typed where it lives (_placement.fix_memory_space).
    donate = facts.in_host_memory and may_donate(operands, updates)
    written = _jitted(x.sharding, donate)(x, operands, updates, call)
    return _placement.wait_for_result(written)

