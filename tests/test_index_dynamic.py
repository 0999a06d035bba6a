"""``jax.ds(start, size)`` windows with static and traced starts, in loops, and the cache patterns.

jnp treats a window whose start is out of range differently in reads and in
writes, and a static start differently from a traced one: jnp is the oracle,
case by case. ``"wrap"`` takes every position of the window modulo its axis
(oracle: jnp with the window spelled as the array ``(start + arange(k)) % n``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas_pinned
from tests.index_support import (
    Batches,
    assert_matches,
    buffer_values,
    case_ids,
    case_rng,
    check_case,
    check_eager,
    compile_fast,
    describe,
    jnp_call,
    pinned,
    pp_call,
    update_values,
    write_shape,
)

A = np.array
S = slice
# "drop" is jnp's (and our) other name for "fill": the eager tests keep it.
MODES = [None, "fill", "clip", "promise_in_bounds", "wrap"]
ALL = ("get", "set", "add")
N, K = 7, 3  # The window's axis and its size.
IN_RANGE = [0, 2, N - K]  # the last one at the edge
OUT_OF_RANGE = [N - K + 1, N - 1, N, N + 5, -1, -K, -N, -N - 2]

# Templates: a window on some axis of a (N, ...) buffer, next to other forms;
# "@" marks where the window goes.
TEMPLATES = [
    ((N,), ("@",)),
    ((N, 4), ("@",)),
    ((4, N, 2), (1, "@")),
    ((4, N, 2), (S(None), "@", 1)),
    ((5, N), (A([4, 0, 4]), "@")),
    ((N, 5, 3), ("@", S(None, None, -2), A([2, 0]))),
    ((3, N, 4), (None, -1, "@", S(1, 3))),
    ((K, 5), ("@", S(1, 4))),  # a window as long as its axis: jnp takes the whole axis
    ((4, N, 2), (jax.ds(3, 2), "@")),  # a static window past the end beside a traced one
]


def _fits(shape, template, start) -> bool:
    """Whether the window at ``start`` and every static window lie inside their axes."""
    fits, axis = True, 0
    for it in template:  # no ... in TEMPLATES
        if it is None:
            continue
        if isinstance(it, str):
            fits &= 0 <= start <= shape[axis] - K
        elif type(it).__name__ == "Slice":  # a static jax.ds
            fits &= 0 <= it.start <= shape[axis] - it.size
        axis += 1
    return fits


def _with(template, window):
    return tuple(window if isinstance(it, str) else it for it in template)


@pytest.mark.parametrize("shape,template", TEMPLATES, ids=case_ids(TEMPLATES))
def test_traced_start(shape, template):
    # One compile for the op and one for jnp, every mode in each; the start an argument.
    rng = case_rng(shape, describe(template))
    a = buffer_values(rng, shape, np.float32)
    v = update_values(rng, write_shape(a, _with(template, jax.ds(0, K)), None), np.float32)

    def run(x, s, call):
        idx = _with(template, jax.ds(s, K))
        return {(str(mode), m): call(x, idx, m, None if m == "get" else v, mode=mode)
                for mode in MODES for m in ALL}

    ours = compile_fast(lambda x, s: run(x, s, pp_call), pinned(a), jnp.int32(0))
    theirs = compile_fast(lambda x, s: run(x, s, jnp_call), a, jnp.int32(0))
    wrong = []
    for start in IN_RANGE + OUT_OF_RANGE:
        got, expected = ours(pinned(a), jnp.int32(start)), theirs(a, jnp.int32(start))
        for (mode, m), e in expected.items():
            if mode == "promise_in_bounds" and not _fits(shape, template, start):
                continue  # unchecked: out-of-range windows are undefined
            what = f"{m} x{shape}[{describe(_with(template, jax.ds(start, K)))}] mode={mode}"
            try:
                assert_matches(got[(mode, m)], e, what)
            except AssertionError:
                wrong.append(f"{what}: got {np.asarray(got[(mode, m)]).tolist()}, "
                             f"jnp {np.asarray(e).tolist()}")
    assert not wrong, f"{len(wrong)} disagreements with jnp (traced start):\n" + "\n".join(wrong)


# Strided windows: jnp reads and writes a strided jax.ds position by position
# (start + k * stride, each clipped, filled or dropped on its own), and a static
# jax.ds as a window beside a traced index that sends jnp through a gather.
STRIDED = [
    ((N,), (jax.ds("@", K, 2),)),
    ((2, N), (A([1, 0]), jax.ds("@", K, 2))),
    ((2, N), (1, jax.ds("@", 2, 3))),
    ((N, 3), (jax.ds("@", 2, 2), S(None))),
    ((4, 6, 5), (S(None, None, 2), jax.ds(5, 2), jax.ds("@", 2))),
    ((4, 6, 5), (S(None), jax.ds(4, 2, 2), jax.ds("@", 2))),
    ((1,), (jax.ds("@", 1, 2),)),  # one position: still not a window to jnp
    ((3, 4), (jax.ds("@", 1, 3), 1)),
]


def _strided(template, start):
    return tuple(jax.ds(start, it.size, it.stride)
                 if type(it).__name__ == "Slice" and isinstance(it.start, str) else it
                 for it in template)


STRIDED_STARTS = (-8, -3, -1, 0, 1, 2, 4, 6, 9)
# Eagerly, a start before the axis and one reaching past its end (the rest under jit).
EAGER_STARTS = (-3, 6)
# The kernels run every traced start; of the static ones (the plan, computed before any
# backend, is the xla cases') those before, at and past the axis, and the eager pair.
INTERPRET_STATIC_STARTS = (-8, 0, 2, 9, *EAGER_STARTS)
# The kernels take a cross-section (the index fuzz runs random strided windows through
# them, eagerly and under jit): one window alone, beside an index array, beside a static one.
STRIDED_CASES = [(s, t, "xla") for s, t in STRIDED] + [
    (*STRIDED[k], "interpret") for k in (0, 1, 4)]


@pytest.mark.parametrize("shape,template,backend", STRIDED_CASES,
                         ids=[f"{c[0]}-{describe(c[1])}-{c[2]}" for c in STRIDED_CASES])
def test_strided_window_position_by_position(shape, template, backend):
    rng = case_rng(shape, describe(template))
    a = buffer_values(rng, shape, np.float32)
    v = update_values(rng, write_shape(a, _strided(template, 0), None), np.float32)
    modes = [None, "fill", "clip"]

    def run(x, s, call, **kw):
        idx = _strided(template, s)
        return {(str(mode), m): call(x, idx, m, None if m == "get" else v, mode=mode, **kw)
                for mode in modes for m in ALL}

    ours = compile_fast(lambda x, s: run(x, s, pp_call, backend=backend), pinned(a),
                        jnp.int32(0))
    theirs = compile_fast(lambda x, s: run(x, s, jnp_call), a, jnp.int32(0))

    # The same window at a static start (jnp: a slice where its index is static), every
    # start in one program; the starts stay Python ints, so each is its own static index.
    static_starts = STRIDED_STARTS if backend == "xla" else INTERPRET_STATIC_STARTS

    def run_static(x, call, **kw):
        return {(start, m): call(x, _strided(template, start), m, None if m == "get" else v,
                                 mode=None, **kw) for start in static_starts for m in ALL}

    ours_static = compile_fast(lambda x: run_static(x, pp_call, backend=backend), pinned(a))
    theirs_static = compile_fast(lambda x: run_static(x, jnp_call), a)
    static_got, static_expected = ours_static(pinned(a)), theirs_static(a)
    wrong = []
    for start in STRIDED_STARTS:
        got, expected = ours(pinned(a), jnp.int32(start)), theirs(a, jnp.int32(start))
        for key, e in expected.items():
            try:
                assert_matches(got[key], e, f"{key} start {start}")
            except AssertionError:
                wrong.append(f"{key} start {start}: got {np.asarray(got[key]).tolist()}, "
                             f"jnp {np.asarray(e).tolist()}")
        for m in (ALL if start in static_starts else ()):
            e = static_expected[(start, m)]
            results = {"jit": static_got[(start, m)]}
            if start in EAGER_STARTS:  # Eagerly too: the op compiles the index on its own.
                results["eager"] = pp_call(pinned(a), _strided(template, start), m,
                                           None if m == "get" else v, mode=None,
                                           backend=backend)
            for how, g in results.items():
                try:
                    assert_matches(g, e, f"{m} static start {start} {how}")
                except AssertionError:
                    wrong.append(f"{m} static start {start} {how}: got "
                                 f"{np.asarray(g).tolist()}, jnp {np.asarray(e).tolist()}")
    assert not wrong, f"{len(wrong)} disagreements with jnp:\n" + "\n".join(wrong[:20])


STATIC_STARTS = [((4, N, 2), (S(None), jax.ds(s, K))) for s in IN_RANGE + OUT_OF_RANGE] + [
    ((4, K, 2), (S(None), jax.ds(s, K))) for s in (-1, 1, K + 2)  # the window spans the axis
]


@pytest.fixture(scope="module")
def batches():
    return Batches(ALL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,index", STATIC_STARTS, ids=case_ids(STATIC_STARTS))
def test_static_start_jit(batches, shape, index, mode):
    # A Python-int start: to jnp a slice, whose clamping differs from a traced start's.
    if mode == "promise_in_bounds" and not 0 <= index[1].start <= shape[1] - K:
        pytest.skip("promise_in_bounds is unchecked: out-of-range windows are undefined")
    check_case(batches.case(STATIC_STARTS, shape, index, mode, modes=MODES), ALL)


@pytest.mark.parametrize("start,mode", [(2, "wrap"), (N - 2, None), (-1, "drop")])
def test_static_start_eager(rng, start, mode):
    check_eager(rng, (4, N, 2), (S(None), jax.ds(start, K)), ALL, mode=mode)


@pytest.mark.parametrize("mode", [None, "clip", "wrap"])
def test_traced_start_interpret(rng, mode):
    a = buffer_values(rng, (N, 4), np.float32)
    v = update_values(rng, (K, 4), np.float32)

    def f(x, s, at, **kw):
        ref = at(x)[jax.ds(s, K)]
        return [ref.get(mode=mode, **kw), ref.set(v, mode=mode, **kw),
                ref.add(v, mode=mode, **kw)]

    ours = jax.jit(lambda x, s: f(x, s, pallas_pinned.at, backend="interpret"))
    theirs = jax.jit(lambda x, s: [jnp_call(x, jax.ds(s, K), m, None if m == "get" else v,
                                            mode=mode) for m in ALL])
    for s in (2, N - 1, -2):
        for g, e, m in zip(ours(pinned(a), jnp.int32(s)), theirs(a, jnp.int32(s)), ALL,
                           strict=True):
            assert_matches(g, e, f"{m} ds({s},{K}) mode={mode} interpret")


def test_concrete_jax_start_outside_jit(rng):
    # A jax scalar as the start, outside jit (jnp itself takes it only under jit: the
    # oracle runs jitted, the start an argument).
    a = buffer_values(rng, (N, 3), np.float32)
    v = update_values(rng, (K,), np.float32)
    theirs = jax.jit(lambda a, s: [jnp_call(a, (jax.ds(s, K), 1), m,
                                            None if m == "get" else v, mode="clip")
                                   for m in ALL])
    for s in (1, N - 1, -2):
        start = jnp.int32(s)
        for m, e in zip(ALL, theirs(a, start), strict=True):
            ref = pallas_pinned.at(pinned(a))[jax.ds(start, K), 1]
            g = ref.get(mode="clip") if m == "get" else getattr(ref, m)(v, mode="clip")
            assert_matches(g, e, f"{m} [ds(jnp.int32({s}), {K}), 1] clip, outside jit")


# --- loops ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_ring_insert_wraps_in_fori_loop(rng, backend):
    # A ring of T slots; each step writes n rows at pos and moves on: the writes wrap.
    T, n, F, steps = 10, 4, 3, 6
    a = buffer_values(rng, (T, F), np.float32)
    batches = jnp.asarray(update_values(rng, (steps, n, F), np.float32))

    def body(i, carry, insert):
        buf, pos = carry
        return insert(buf, pos, batches[i]), (pos + n) % T

    def ours(buf, pos, y):
        return pallas_pinned.at(buf)[jax.ds(pos, n)].set(y, mode="wrap", backend=backend)

    def theirs(buf, pos, y):
        return buf.at[(pos + jnp.arange(n)) % T].set(y)

    def loop(buf, insert):
        return lax.fori_loop(0, steps, lambda i, c: body(i, c, insert), (buf, jnp.int32(3)))

    got, got_pos = jax.jit(lambda b: loop(b, ours))(pinned(a))
    expected, _ = jax.jit(lambda b: loop(b, theirs))(jnp.asarray(a))
    assert got.sharding.memory_kind == "pinned_host"
    assert_matches(got, expected, f"ring insert, {backend}")
    assert int(got_pos) == (3 + steps * n) % T


def test_scan_reads_and_writes_windows(rng):
    # scan: each step reads a window at a traced start, scales it, and adds it back one row on.
    T, F, k = 8, 2, 3
    a = buffer_values(rng, (T, F), np.float32)

    def step_with(get, add):
        def step(buf, s):
            window = get(buf, s)
            return add(buf, s + 1, 2.0 * window), window.sum()
        return step

    ours = step_with(lambda b, s: pallas_pinned.at(b)[jax.ds(s, k)].get(mode="wrap"),
                     lambda b, s, w: pallas_pinned.at(b)[jax.ds(s, k)].add(w, mode="wrap"))
    theirs = step_with(lambda b, s: b[(s + jnp.arange(k)) % T],
                       lambda b, s, w: b.at[(s + jnp.arange(k)) % T].add(w))
    starts = jnp.array([0, 5, 7, -1, 2], jnp.int32)
    got = jax.jit(lambda b: lax.scan(ours, b, starts))(pinned(a))
    expected = jax.jit(lambda b: lax.scan(theirs, b, starts))(jnp.asarray(a))
    assert_matches(got[0], expected[0], "scan buffer")
    assert_matches(got[1], expected[1], "scan window sums")


# --- the cache patterns --------------------------------------------------------


def test_kv_cache_layer_positions(rng):
    # kv.at[layer, positions].set(new): a traced layer, positions per token.
    L, T, D = 3, 9, 4
    a = buffer_values(rng, (L, T, D), np.float32)
    new = update_values(rng, (5, D), np.float32)

    def write(kv, layer, positions, at):
        return at(kv)[layer, positions].set(new)

    f = jax.jit(lambda kv, layer, p: write(kv, layer, p, pallas_pinned.at))
    g = jax.jit(lambda kv, layer, p: write(kv, layer, p, lambda k: k.at))
    for layer, positions in [(1, [0, 1, 2, 3, 4]), (-1, [8, 2, 5, 6, 7]), (0, [3, 3, 3, 3, 3])]:
        args = (jnp.int32(layer), jnp.array(positions, jnp.int32))
        assert_matches(f(pinned(a), *args), g(jnp.asarray(a), *args),
                       f"kv[{layer}, {positions}].set")


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_maxtext_decode_write_in_fori_loop(rng, backend):
    # MaxText's decode step: cache.at[b, :, lengths[b], :].set(val[b]) for every sequence b.
    B, H, T, D = 3, 2, 6, 4
    a = buffer_values(rng, (B, H, T, D), np.float32)
    val = jnp.asarray(update_values(rng, (B, H, D), np.float32))
    lengths = jnp.array([0, 5, 2], jnp.int32)

    def decode(cache, at, **kw):
        def body(b, cache):
            return at(cache)[b, :, lengths[b], :].set(val[b], **kw)
        return lax.fori_loop(0, B, body, cache)

    got = jax.jit(lambda c: decode(c, pallas_pinned.at, backend=backend))(pinned(a))
    expected = jax.jit(lambda c: decode(c, lambda k: k.at))(jnp.asarray(a))
    assert got.sharding.memory_kind == "pinned_host"
    assert_matches(got, expected, f"decode write, {backend}")


def test_flashbax_ring_of_time(rng):
    # flashbax: x.at[:, (jnp.arange(seq) + idx) % T].set(batch) for a (B, T, F) buffer.
    B, T, F, seq = 2, 7, 3, 4
    a = buffer_values(rng, (B, T, F), np.float32)
    batch = update_values(rng, (B, seq, F), np.float32)

    def write(x, idx, at):
        return at(x)[:, (jnp.arange(seq) + idx) % T].set(batch)

    f = jax.jit(lambda x, i: write(x, i, pallas_pinned.at))
    g = jax.jit(lambda x, i: write(x, i, lambda k: k.at))
    for idx in (0, 3, 5, 6):
        assert_matches(f(pinned(a), jnp.int32(idx)), g(jnp.asarray(a), jnp.int32(idx)),
                       f"flashbax ring at {idx}")
        # The same write as a wrapping window on axis 1.
        h = pallas_pinned.at(pinned(a))[:, jax.ds(jnp.int32(idx), seq)].set(batch, mode="wrap")
        assert_matches(h, g(jnp.asarray(a), jnp.int32(idx)), f"ds wrap ring at {idx}")


def test_wrap_window_keeps_its_place(rng):
    # A window between an int and a slice keeps its place under "wrap", as without it:
    # the window is a slice to numpy's placement rules, not an index array.
    a = buffer_values(rng, (3, N, 4), np.float32)
    idx = (1, S(None), jax.ds(2, 2))
    got = jax.jit(lambda x, s: pallas_pinned.at(x)[1, :, jax.ds(s, 2)].get(mode="wrap"))(
        pinned(a), jnp.int32(3))
    assert got.shape == jax.eval_shape(lambda a: jnp.asarray(a).at[idx].get(), a).shape


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("mode", [None, "drop", "clip", "fill"])
def test_a_strided_ds_may_reach_past_its_axis(traced, mode):
    # jnp takes a strided window of any size: positions past the axis are each
    # clipped, filled or dropped (size 3, stride 3 on an axis of 4: positions 0, 3, 6).
    x0 = np.arange(8, dtype=np.float32).reshape(2, 4)
    for start in (0, 1, -10):
        def ours(x, s):
            return pallas_pinned.at(x)[:, jax.ds(s, 3, 3)].set(-1.0, mode=mode)

        def theirs(x, s):
            return x.at[:, jax.ds(s, 3, 3)].set(-1.0, mode=mode)

        if traced:
            got = jax.jit(ours)(pinned(x0), jnp.int32(start))
            want = jax.jit(theirs)(jnp.asarray(x0), jnp.int32(start))
        else:
            got, want = ours(pinned(x0), start), theirs(jnp.asarray(x0), start)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"{start}")
    got = jax.jit(lambda x, s: pallas_pinned.at(x)[:, jax.ds(s, 3, 3)].get(mode=mode))(
        pinned(x0), 0)
    want = jax.jit(lambda x, s: x.at[:, jax.ds(s, 3, 3)].get(mode=mode))(jnp.asarray(x0), 0)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="does not fit axis 1 of length 4"):
        pallas_pinned.at(pinned(x0))[:, jax.ds(jnp.int32(0), 5)].get()


@pytest.mark.parametrize("mode", [None, "clip", "promise_in_bounds", "fill"])
def test_a_read_takes_a_static_strided_ds_as_jnp_does_beside_any_int(mode):
    # jnp's static-slice read takes jax.ds(start, size, stride) as the slice
    # start:start + size:stride, but outside "clip" it first checks the static
    # ints: one out of range sends the index to its gather, which reads the ds
    # as its positions, each clamped (a (2, 4) result here, not (1, 4)).
    a = np.arange(48, dtype=np.float32).reshape(4, 3, 4)
    dss = (jax.ds(2, 2, 2), jax.ds(0, 3, 2), jax.ds(-3, 2, 3))
    ks = (0, 2, -1, -3, 3, 5, -4, -9)

    def forms(ds, k):
        return ((ds, k), (ds, ..., k), (ds, None, k), (k, ds), (k % 4, ds))

    indices = [index for ds in dss for k in ks for index in forms(ds, k)]
    # Every index in one program each side: the ints stay static inside it, as outside
    # jit. Eagerly too for eight of them: each int once, the ds and the form turning.
    eager = {repr(forms(dss[j % 3], k)[j % 5]) for j, k in enumerate(ks)}
    got = jax.jit(lambda x: [pallas_pinned.at(x)[i].get(mode=mode) for i in indices])(pinned(a))
    want = jax.jit(lambda x: [x.at[i].get(mode=mode) for i in indices])(jnp.asarray(a))
    for index, g, w in zip(indices, got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"jit {index} {mode}")
        if repr(index) in eager:
            g = pallas_pinned.at(pinned(a))[index].get(mode=mode)
            np.testing.assert_array_equal(
                np.asarray(g), np.asarray(w), err_msg=f"eager {index} {mode}")


@pytest.mark.parametrize("static", [False, True], ids=["traced", "static"])
def test_the_ds_start_rule_follows_the_installed_jnp(static):
    # jnp 0.12.1 began to wrap a negative jax.ds start once in writes (and in every mode);
    # the library picks its rule by jax's version (_index.DS_STARTS_WRAP): this asserts
    # that the version check says what the installed jnp does.
    from pallas_pinned._index import DS_STARTS_WRAP

    x, v = jnp.zeros(N, jnp.float32), jnp.ones(K, jnp.float32)

    def write(at, x, s):
        return at(x)[jax.ds(s, K)].set(v)

    if static:
        written = jax.jit(lambda x: write(lambda a: a.at, x, -K))(x)
        got = jax.jit(lambda x: write(pallas_pinned.at, x, -K))(pinned(np.zeros(N, np.float32)))
    else:
        written = jax.jit(lambda x, s: write(lambda a: a.at, x, s))(x, -K)
        got = jax.jit(lambda x, s: write(pallas_pinned.at, x, s))(
            pinned(np.zeros(N, np.float32)), -K)
    wraps = bool(np.asarray(written)[N - K:].all())
    assert wraps == DS_STARTS_WRAP, f"jnp {jax.__version__}: {np.asarray(written).tolist()}"
    assert_matches(got, written, f"ds(-{K}, {K}).set on jax {jax.__version__}")


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_a_ds_size_given_as_an_array_reads_as_the_installed_jnp_reads(jitted):
    # jnp 0.12.1 takes a jax.ds whose size is an array (concrete) as a dynamic slice: the
    # window is clamped inside, not cut short as a Python slice (before 0.12.1 jnp asserts).
    from pallas_pinned._index import DS_STARTS_WRAP

    a = np.arange(7, dtype=np.float32)

    def read(at, x):
        return at(x)[jax.ds(5, np.array(3))].get()

    run = jax.jit(read, static_argnums=0) if jitted else read
    got = run(pallas_pinned.at, pinned(a))
    if DS_STARTS_WRAP:
        assert_matches(got, run(lambda x: x.at, jnp.asarray(a)), "ds(5, array 3)")
    else:
        np.testing.assert_array_equal(np.asarray(got), a[5:8])
