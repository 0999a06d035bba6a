"""jax transformations around the three ops: grad w.r.t. updates, vmap, and clear refusals."""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned.gather import gather_from_host
from pallas_pinned.scatter_add import scatter_add_to_host
from pallas_pinned.testing import assert_same, gather_oracle
from tests.helpers import BACKENDS, check_gather, put, read

X0 = np.arange(12.0, dtype=np.float32).reshape(6, 2) + 1
WEIGHTS = jnp.arange(12.0, dtype=jnp.float32).reshape(6, 2) + 1


# --- scatter_to_host -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_grad_with_respect_to_updates(backend, kind):
    # Duplicates (1 twice), a negative index and a dropped one: only the
    # surviving update of each row receives gradient.
    idx = jnp.array([1, 4, 1, -1, 9])
    upd = jnp.arange(10.0, dtype=jnp.float32).reshape(5, 2) + 100

    def loss(u):
        out = pp.scatter_to_host(put(X0, kind), idx, u, backend=backend)
        return jnp.sum(jax.device_put(out, jax.memory.Space.Device) * WEIGHTS)

    expected = np.zeros((5, 2), np.float32)
    expected[1], expected[2], expected[3] = WEIGHTS[4], WEIGHTS[1], WEIGHTS[5]
    np.testing.assert_array_equal(jax.grad(loss)(upd), expected)


def test_grad_of_a_broadcast_scalar_update():
    def loss(value):
        return jnp.sum(pp.scatter_to_host(jnp.array(X0), jnp.array([0, 0, 3]), value))

    assert jax.grad(loss)(2.0) == 4.0  # Two surviving rows of two elements.


@pytest.mark.parametrize("op", ["set", "add"])
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_grad_of_a_write_that_selects_nothing_is_zero_whatever_the_updates_shape(op, jitted):
    # Such a write takes updates of any shape, as jnp's does; under jit the backward pass
    # broadcast them to the empty write's shape and failed.
    empty, updates = np.zeros((0,), np.int32), np.ones(5, np.float32)

    def loss(u, x):
        out = getattr(pp.at(x)[empty], op)(u)
        return jnp.sum(jax.device_put(out, jax.memory.Space.Device))

    grad = jax.jit(jax.grad(loss)) if jitted else jax.grad(loss)
    got = grad(updates, put(np.zeros((6, 2), np.float32)))
    want = jax.grad(lambda u: jnp.sum(getattr(jnp.zeros((6, 2)).at[empty], op)(u)))(updates)
    np.testing.assert_array_equal(got, want)
    assert got.shape == (5,)


def test_grad_with_respect_to_the_buffer_is_refused():
    with pytest.raises(TypeError, match="stop_gradient"):
        jax.grad(lambda x: jnp.sum(pp.scatter_to_host(x, 1, 0.0)))(jnp.array(X0))


@pytest.mark.parametrize("op", ["set", "add"])
def test_two_differentiated_writes_in_a_row_name_the_one_call_that_works(op):
    x = put(X0)
    i, j = jnp.array([1, 3]), jnp.array([3, 4])
    u1, u2 = jnp.ones((2, 2), jnp.float32), 2 * jnp.ones((2, 2), jnp.float32)
    weights = jnp.arange(12.0, dtype=jnp.float32).reshape(6, 2)

    def chained(u1, u2):
        once = getattr(pp.at(x)[i], op)(u1)
        return jnp.sum(_on_device(getattr(pp.at(once)[j], op)(u2)) * weights)

    with pytest.raises(TypeError, match="make the two one call: concatenate"):
        jax.grad(chained, argnums=(0, 1))(u1, u2)
    assert not x.is_deleted()

    def one_call(u1, u2):
        both = getattr(pp.at(x)[jnp.concatenate([i, j])], op)(jnp.concatenate([u1, u2]))
        return jnp.sum(_on_device(both) * weights)

    def theirs(u1, u2):
        once = getattr(jnp.asarray(X0).at[i], op)(u1)
        return jnp.sum(getattr(once.at[j], op)(u2) * weights)

    got = jax.grad(one_call, argnums=(0, 1))(u1, u2)
    for mine, jnps in zip(got, jax.grad(theirs, argnums=(0, 1))(u1, u2), strict=True):
        assert_same(mine, jnps)
    assert_same(read(x), X0)


def test_vmap_is_refused_with_the_alternative():
    x = jnp.array(X0)
    with pytest.raises(NotImplementedError, match=r"indices.reshape\(-1\)"):
        jax.vmap(lambda i: pp.scatter_to_host(x, i, 1.0))(jnp.array([[1], [2]]))


def test_vmap_over_an_inner_axis_names_the_fold_that_works():
    # A KV-cache write at a batch of positions: the message's fold for an index on another
    # axis (the batch into that axis's index, the updates' batch axis moved there) gives what
    # jnp's writes one position at a time give.
    kv0 = np.arange(120, dtype=np.float32).reshape(4, 10, 3)
    positions, updates = jnp.array([1, 7]), -jnp.arange(24.0, dtype=jnp.float32).reshape(2, 4, 3)
    with pytest.raises(NotImplementedError, match=r"jnp\.moveaxis\(updates, 0, 1\)"):
        jax.vmap(lambda p, u: pp.at(put(kv0))[:, p].set(u))(positions, updates)
    folded = pp.at(put(kv0))[:, positions].set(jnp.moveaxis(updates, 0, 1))
    want = jnp.asarray(kv0)
    for p, u in zip(positions, updates, strict=True):
        want = want.at[:, p].set(u)
    np.testing.assert_array_equal(read(folded), np.asarray(want))


@pytest.mark.parametrize("loop", ["scan", "fori_loop"])
@pytest.mark.parametrize("jitted", [False, True])
def test_grad_through_a_loop_that_carries_the_buffer_names_the_write_after_it(loop, jitted):
    x, i = put(X0), jnp.array([1, 3])
    steps = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 2, 2)

    def in_the_loop(steps):
        if loop == "scan":
            body = lambda buffer, u: (pp.at(buffer)[i].add(u), None)  # noqa: E731
            out = jax.lax.scan(body, x, steps)[0]
        else:
            out = jax.lax.fori_loop(0, 3, lambda k, b: pp.at(b)[i].add(steps[k]), x)
        return jnp.sum(_on_device(out) * WEIGHTS)

    grad = jax.jit(jax.grad(in_the_loop)) if jitted else jax.grad(in_the_loop)
    with pytest.raises(TypeError, match="in a loop, collect the differentiated rows"):
        grad(steps)
    assert not x.is_deleted()
    assert_same(read(x), X0)

    # What it names: the rows collected on the device, written once after the loop.
    def after_the_loop(steps):
        rows = jax.lax.scan(lambda total, u: (total + u, None), jnp.zeros((2, 2)), steps)[0]
        return jnp.sum(_on_device(pp.at(x)[i].add(rows)) * WEIGHTS)

    def theirs(steps):
        body = lambda buffer, u: (buffer.at[i].add(u), None)  # noqa: E731
        return jnp.sum(jax.lax.scan(body, jnp.asarray(X0), steps)[0] * WEIGHTS)

    assert_same(jax.grad(after_the_loop)(steps), jax.grad(theirs)(steps))


@pytest.mark.parametrize(
    ("op", "combine"),
    [("min", "jnp.minimum(old, u)"), ("max", "jnp.maximum(old, u)"), ("multiply", "old * u")],
)
def test_the_updates_gradient_refusal_names_each_ops_own_formula(op, combine):
    x, i, u = put(X0), jnp.array([1, 3]), jnp.ones((2, 2), jnp.float32)
    with pytest.raises(TypeError, match=re.escape(f"new = {combine} with")):
        jax.grad(lambda u: jnp.sum(_on_device(getattr(pp.at(x)[i], op)(u))))(u)
    assert_same(read(x), X0)


# --- gather_from_host ----------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
def test_vmap_of_gather_over_indices_is_one_call(backend, kind):
    idx = jnp.array([[0, -1, 3], [12, -13, 5]])
    x = put(X0, kind)
    batched = jax.vmap(lambda i: gather_from_host(x, i, mode="fill", backend=backend))
    out = batched(idx)
    check_gather(out, X0, np.asarray(idx), "fill")
    # One read of all 2 x 3 entries: each read in the batched program (one per branch
    # of auto's platform_dependent) returns the 6 rows, none a batch entry's 3.
    reads = re.findall(r"\[(\d+),(\d+)\] = (?:gather|pallas_call)\[",
                       str(jax.make_jaxpr(batched)(idx)))
    assert reads and set(reads) == {("6", "2")}, reads
    out = jax.jit(jax.vmap(lambda i: gather_from_host(x, i, backend=backend), 1, 1))(idx)
    check_gather(out, X0, np.asarray(idx))
    # An empty batch reads nothing: no kernel is given zero rows.
    out = jax.vmap(lambda i: gather_from_host(x, i, backend=backend))(jnp.zeros((0,), jnp.int32))
    assert out.shape == (0,) + X0.shape[1:] and out.dtype == X0.dtype


@pytest.mark.parametrize("kind", ["pinned_host", "device"])
@pytest.mark.parametrize("form", ["int", "ds", "ds fill", "ds beside an int", "int beside a ds"])
def test_vmap_of_a_block_read_over_its_starts(kind, form):
    # A scalar or jax.ds index is a block read (one copy); batched over its start,
    # XLA would gather from host memory, which it refuses: one copy per entry instead.
    a = np.arange(20, dtype=np.float32).reshape(5, 4)
    starts = jnp.array([3, 0, 1, -1, 7])
    index, mode = {
        "int": (lambda i: i, None),
        "ds": (lambda i: jax.ds(i, 2), None),
        "ds fill": (lambda i: jax.ds(i, 2), "fill"),
        "ds beside an int": (lambda i: (jax.ds(i, 2), 1), None),
        "int beside a ds": (lambda i: (1, jax.ds(i, 2)), None),
    }[form]
    x = put(a, kind)
    batched = jax.vmap(lambda i: pp.at(x)[index(i)].get(mode=mode))
    expected = jax.vmap(lambda i: jnp.asarray(a).at[index(i)].get(mode=mode))(starts)
    for got in (batched(starts), jax.jit(batched)(starts)):  # Eagerly and under jit.
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_vmap_of_gather_over_device_buffers_works_and_over_host_buffers_is_refused():
    xs = np.stack([X0, X0 + 100])
    idx = jnp.array([[0, 5], [-1, 2]])
    out = jax.vmap(lambda x, i: gather_from_host(x, i))(jnp.asarray(xs), idx)
    assert_same(read(out), np.stack([gather_oracle(xs[b], np.asarray(idx[b])) for b in (0, 1)]))
    with pytest.raises(NotImplementedError, match="vmap over the indices"):
        jax.vmap(lambda x, i: gather_from_host(x, i))(put(xs), idx)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["fill", "clip", None, "promise_in_bounds"])
def test_grad_of_gather_for_a_device_buffer(backend, mode):
    # Clamped rows receive the cotangent of the rows they read; filled ones none. None and
    # "promise_in_bounds" clamp as "clip" does, their gradient too (the README): jnp's
    # drops the out-of-range entries there, unlike its forward pass.
    theirs = "clip" if mode in (None, "promise_in_bounds") else mode
    idx = jnp.array([[0, -1, 3], [9, -13, 3]])
    weights = jnp.arange(12.0).reshape(2, 3, 2)

    def loss(gather, x):
        return jnp.sum(gather(x) * weights)

    ours = jax.grad(
        lambda x: loss(
            lambda x: gather_from_host(x, idx, mode=mode, fill_value=0.0, backend=backend), x
        )
    )(jnp.asarray(X0))
    jnps = jax.grad(lambda x: loss(lambda x: x.at[idx].get(mode=theirs, fill_value=0.0), x))(
        jnp.asarray(X0)
    )
    assert_same(ours, np.asarray(jnps))


def test_grad_of_gather_for_a_host_buffer_is_refused_but_stop_gradient_works():
    x = put(X0)
    with pytest.raises(TypeError, match="stop_gradient"):
        jax.grad(lambda x: jnp.sum(gather_from_host(x, [1, 2])))(x)
    with pytest.raises(TypeError, match="pinned_host"):
        jax.jvp(lambda x: gather_from_host(x, [1]), (x,), (jnp.ones_like(X0),))
    # Differentiating with respect to something else is fine.
    grad = jax.grad(lambda w: jnp.sum(gather_from_host(jax.lax.stop_gradient(x), [1, 2]) * w))(
        jnp.ones((2, 2))
    )
    assert_same(grad, X0[1:3])


# --- scatter_add_to_host ---------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["device", "pinned_host"])
@pytest.mark.parametrize("mode", [None, "clip"])
def test_grad_of_add_with_respect_to_updates(backend, kind, mode):
    # Every update that lands gets its row's cotangent (duplicates too);
    # dropped ones none, clipped ones that of the edge row.
    idx = jnp.array([1, 4, 1, -1, 9, -9])
    upd = jnp.arange(12.0, dtype=jnp.float32).reshape(6, 2) + 100

    def loss(u):
        out = scatter_add_to_host(put(X0, kind), idx, u, mode=mode, backend=backend)
        return jnp.sum(jax.device_put(out, jax.memory.Space.Device) * WEIGHTS)

    expected = jax.grad(lambda u: jnp.sum(jnp.asarray(X0).at[idx].add(u, mode=mode) * WEIGHTS))(upd)
    assert_same(jax.grad(loss)(upd), np.asarray(expected))


def test_grad_of_add_of_a_broadcast_scalar():
    def loss(value):
        return jnp.sum(scatter_add_to_host(jnp.asarray(X0), jnp.array([0, 0, 9]), value))

    assert jax.grad(loss)(2.0) == 4.0  # Two landing rows of two elements; 9 is dropped.


def test_grad_of_add_with_respect_to_the_buffer_is_refused():
    with pytest.raises(TypeError, match="stop_gradient"):
        jax.grad(lambda x: jnp.sum(scatter_add_to_host(x, 1, 0.0)))(jnp.asarray(X0))


def test_vmap_of_add_is_refused_with_the_alternative():
    x = jnp.asarray(X0)
    with pytest.raises(NotImplementedError, match=r"indices.reshape\(-1\)"):
        jax.vmap(lambda i: scatter_add_to_host(x, i, 1.0))(jnp.array([[1], [2]]))


# --- no failed transformation loses the buffer ----------------------------------------


def _on_device(a):
    return jax.device_put(a, jax.memory.Space.Device)


def _failing_transformations(x, i, u):
    """Transformations of our ops that jax cannot finish, each with what it raises."""
    return {
        # jnp.sum of a host-memory result is itself in host memory: jax's grad
        # cannot seed it (jnp's own x.at[i].set on a host x fails the same way).
        "grad of a host sum": (
            lambda: jax.grad(lambda u: jnp.sum(pp.scatter_to_host(x, i, u)))(u),
            ValueError,
        ),
        "grad read back by gather": (
            lambda: jax.grad(
                lambda u: gather_from_host(scatter_add_to_host(x, i, u), i).sum()
            )(u),
            TypeError,
        ),
        "jvp": (lambda: jax.jvp(lambda u: pp.scatter_to_host(x, i, u), (u,), (u,)), TypeError),
        "grad of max": (
            lambda: jax.grad(lambda u: jnp.sum(_on_device(pp.scatter_max_to_host(x, i, u))))(u),
            TypeError,
        ),
    }


@pytest.mark.parametrize(
    "case", ["grad of a host sum", "grad read back by gather", "jvp", "grad of max"]
)
@pytest.mark.parametrize("jitted", [False, True])
def test_a_failing_transformation_leaves_the_buffer_alive_and_unchanged(case, jitted):
    x = put(X0)
    i, u = jnp.array([1, 3]), jnp.ones((2, 2), jnp.float32)
    call, error = _failing_transformations(x, i, u)[case]
    with pytest.raises(error):
        jax.jit(call)() if jitted else call()
    assert not x.is_deleted()
    assert_same(read(x), X0)


@pytest.mark.parametrize(
    "forward_mode",
    [
        lambda f, u: jax.jvp(f, (u,), (u,)),
        lambda f, u: jax.jacfwd(lambda u: _on_device(f(u)))(u),
        lambda f, u: jax.hessian(lambda u: jnp.sum(_on_device(f(u))))(u),
    ],
    ids=["jvp", "jacfwd", "hessian"],
)
@pytest.mark.parametrize("op", ["set", "add"])
@pytest.mark.parametrize("backend", ["auto", "xla"])
def test_forward_mode_names_the_reverse_mode_that_works(forward_mode, op, backend):
    x, i, u = put(X0), jnp.array([1, 3]), jnp.ones((2, 2), jnp.float32)

    def write(u):
        return getattr(pp.at(x)[i], op)(u, backend=backend)

    # jax.hessian is jacfwd's vmap of a jvp: the vmap refusal can come first (XLA's path).
    with pytest.raises((TypeError, NotImplementedError)) as raised:
        forward_mode(write, u)
    assert re.search(r"no forward-mode derivative .*jax\.jacrev|does not support jax\.vmap"
                     r".*reverse mode, jax\.jacrev", str(raised.value)), raised.value
    assert not x.is_deleted()
    assert_same(read(x), X0)
    # The reverse mode it names gives jnp's Jacobian.
    jacobian = jax.jacrev(lambda u: _on_device(write(u)))(u)
    expected = jax.jacrev(lambda u: getattr(jnp.asarray(X0).at[i], op)(u))(u)
    assert_same(jacobian, expected)


def test_the_gather_refusal_shows_a_formulation_that_works():
    x, i, u = put(X0), jnp.array([1, 3]), jnp.ones((2, 2), jnp.float32)
    with pytest.raises(TypeError, match=r"gather_from_host\(x0, i\) \+ u"):
        jax.grad(lambda u: gather_from_host(scatter_add_to_host(x, i, u), i).sum())(u)
    # The formulation it names: differentiate on the device, write outside.
    grad = jax.grad(lambda u: (gather_from_host(x, i) + u).sum())(u)
    assert_same(grad, np.ones((2, 2), np.float32))
    assert_same(read(x), X0)


def test_an_eager_grad_that_works_does_not_consume_the_buffer():
    # The updated buffer never reaches the caller of jax.grad, so x must stay.
    x = put(X0)
    idx = jnp.array([1, 4])

    def loss(u):
        out = pp.scatter_to_host(x, idx, u)
        return jnp.sum(jax.device_put(out, jax.memory.Space.Device) * WEIGHTS)

    grad = jax.grad(loss)(jnp.ones((2, 2), jnp.float32))
    assert_same(grad, np.asarray(WEIGHTS[np.array([1, 4])]))
    assert not x.is_deleted()
    assert_same(read(x), X0)


def _constant_writes(x):
    """Writes of constants into a closed-over x, inside eager transformations of u."""
    on_device = jax.memory.Space.Device
    return {
        "grad": lambda: jax.grad(
            lambda u: jnp.sum(u) + jnp.sum(jax.device_put(pp.at(x)[1].set(7.0), on_device))
        )(jnp.ones(2)),
        "vmap": lambda: jax.vmap(
            lambda u: u + jax.device_put(pp.at(x)[1].add(7.0), on_device)[1]
        )(jnp.ones((3, 2))),
    }


@pytest.mark.parametrize("case", ["grad", "vmap"])
def test_a_write_with_no_traced_argument_inside_a_transformation_keeps_x(case, monkeypatch):
    # None of the write's arguments is traced, yet its result stays inside the
    # transformation: x must not be donated (README, "donation").
    from pallas_pinned import _local_write

    x = put(X0)
    _constant_writes(x)[case]()
    assert not x.is_deleted()
    assert_same(read(x), X0)
    # The documented fallback, should JAX's private trace state move: the
    # arguments' tracers decide alone, and this x is donated.
    # It says so, once per process.
    monkeypatch.setattr(_local_write, "_trace_state_clean", None)
    _local_write._warn_trace_state_unknown.cache_clear()
    x = put(X0)
    with pytest.warns(RuntimeWarning, match="will consume its buffer x"):
        _constant_writes(x)[case]()
    assert x.is_deleted()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _constant_writes(put(X0))[case]()
    # Outside any transformation the eager write still consumes x (in place).
    monkeypatch.undo()
    x = put(X0)
    out = pp.at(x)[1].set(7.0)
    assert x.is_deleted() and read(out)[1].tolist() == [7.0, 7.0]
