"""GPU-only checks of the pinned-host path (marker ``gpu``; run on the H200).

The randomized suites (test_scatter.py, test_gather.py, test_scatter_add.py)
also run their "pallas" and "triton" cases on a GPU; this file covers what
only a GPU shows: the compiled HLO, donation of the host buffer, device memory
that stays flat (measured per call in a fresh process), buffers past 2**31
elements. scatter_to_host first, then gather_from_host and scatter_add_to_host.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_pinned as pp
from pallas_pinned import tuning
from pallas_pinned.gather import gather_from_host
from pallas_pinned.scatter_add import scatter_add_to_host
from tests.helpers import put, read, sharding

pytestmark = pytest.mark.gpu

GIB = 1024**3


def _host_rows(array: jax.Array, rows: np.ndarray) -> np.ndarray:
    """Reads a few rows of a pinned_host array through its host pointer.

    Copying a many-GiB buffer back just to look at a handful of rows would
    dominate the test; pinned memory is ordinary host memory, so read it.
    """
    array.block_until_ready()
    width = int(np.prod(array.shape[1:]))
    itemsize = array.dtype.itemsize
    base = array.unsafe_buffer_pointer()
    out = np.empty((rows.size, width), array.dtype)
    for k, row in enumerate(rows.tolist()):
        raw = (ctypes.c_char * (width * itemsize)).from_address(base + row * width * itemsize)
        out[k] = np.frombuffer(bytes(raw), array.dtype)
    return out


def _bytes_in_use() -> int:
    return jax.devices()[0].memory_stats()["bytes_in_use"]


def _user_update(x, y):
    host = sharding("pinned_host")
    i = jax.device_put(jnp.arange(5), host)
    y = jax.device_put(y.astype(x.dtype), host)
    return pp.scatter_to_host(x, i, y)


def test_user_example_verbatim_with_2gib_buffer():
    gpu = sharding("device")
    cpu = sharding("pinned_host")
    x_cpu = jax.device_put(np.zeros((2 * 1024**3 // 4,), np.float32), cpu)
    y_gpu = jax.device_put(jnp.arange(5), gpu)
    before = _bytes_in_use()
    pointer = x_cpu.unsafe_buffer_pointer()
    out = jax.jit(_user_update, donate_argnums=(0,))(x_cpu, y_gpu)
    out.block_until_ready()
    grown = _bytes_in_use() - before
    assert out.sharding.memory_kind == "pinned_host"
    assert x_cpu.is_deleted()
    assert out.unsafe_buffer_pointer() == pointer  # Updated in place.
    np.testing.assert_array_equal(
        _host_rows(out.reshape(-1, 1), np.arange(7))[:, 0], [0, 1, 2, 3, 4, 0, 0]
    )
    assert grown < 64 * 1024**2, f"device memory grew by {grown} bytes for a 2 GiB buffer"


# Device memory of one call, in a fresh process per (op, buffer size): the
# peak of bytes_in_use lasts the process's lifetime and jax cannot reset it,
# so a peak read in this pytest process would hold whatever an earlier test
# allocated. The buffer is filled from the host (the device never holds it);
# the indices and updates are on the device and compiling is done before
# "before" is read. peak_after - before bounds the call's growth from above
# (exact when the call set a new peak).
_MEMORY_CHILD = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import pallas_pinned as pp
    op, gib, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    device = jax.devices()[0]
    host = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
    x = jax.device_put(np.ones((int(gib * 2**30) // 4, 1), np.float32), host)
    rng = np.random.default_rng(0)
    idx = jnp.asarray(rng.integers(0, x.shape[0], n, dtype=np.int32))
    upd = jnp.asarray(rng.standard_normal((n, 1), np.float32))
    fns = {
        "set": lambda x, i, u: pp.scatter_to_host(x, i, u),
        "add": lambda x, i, u: pp.scatter_add_to_host(x, i, u),
        "gather": lambda x, i, u: pp.gather_from_host(x, i),
    }
    donate = (0,) if op != "gather" else ()
    compiled = jax.jit(fns[op], donate_argnums=donate).lower(x, idx, upd).compile()
    jax.block_until_ready((x, idx, upd))
    stats = device.memory_stats()
    before, peak_before = stats["bytes_in_use"], stats["peak_bytes_in_use"]
    out = jax.block_until_ready(compiled(x, idx, upd))
    after = device.memory_stats()
    print("MEM " + json.dumps({
        "growth_upper_bound": after["peak_bytes_in_use"] - before,
        "new_peak": after["peak_bytes_in_use"] > peak_before,
        "kind": out.sharding.memory_kind,
    }), flush=True)
    """
)


def _call_peak_growth(op: str, gib: float, n: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, op, str(gib), str(n)],
        env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"),
        capture_output=True, text=True, timeout=300,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("MEM ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stderr[-3000:])
    return json.loads(lines[-1][len("MEM "):])


@pytest.mark.parametrize("op", ["set", "add", "gather"])
def test_device_memory_does_not_grow_with_the_buffer(op):
    n = 1 << 20
    growth = {gib: _call_peak_growth(op, gib, n) for gib in (1, 4)}
    for gib, probe in growth.items():
        expected_kind = "device" if op == "gather" else "pinned_host"
        assert probe["kind"] == expected_kind, (gib, probe)
        # Scratch scales with the 1 M entries (sort, permutation, rows), not the buffer.
        assert probe["growth_upper_bound"] < 256 * 2**20, growth
    # A copy of even part of the buffer would add GiBs between 1 and 4 GiB.
    assert growth[4]["growth_upper_bound"] - growth[1]["growth_upper_bound"] < 64 * 2**20, growth


def test_buffer_past_2_31_elements():
    # (2**24 + 5) rows x 130 float32 = 8.7 GB: offsets past 2**31 elements
    # and past 2**32 bytes need 64-bit address arithmetic.
    rows, width = 2**24 + 5, 130
    x = jax.device_put(np.zeros((rows, width), np.float32), sharding("pinned_host"))
    targets = np.array([0, 2**31 // width + 1, 2**32 // 4 // width + 3, rows - 1, rows - 2])
    upd = np.random.default_rng(1).standard_normal((targets.size, width)).astype(np.float32)
    out = pp.scatter_to_host(x, jnp.asarray(targets), jnp.asarray(upd))
    np.testing.assert_array_equal(_host_rows(out, targets), upd)
    np.testing.assert_array_equal(_host_rows(out, targets + 1)[:-2], 0)  # Neighbours untouched.


_HUGE_X64 = textwrap.dedent(
    """
    import ctypes, json
    import jax, jax.numpy as jnp, numpy as np
    import pallas_pinned as pp
    rows = 2**31 + 5
    host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    x = jax.device_put(np.zeros((rows, 1), np.float32), host)
    idx = jnp.array([0, 2**31 - 1, -1, -5, 7, 7], jnp.int64)
    upd = jnp.arange(1, 7, dtype=jnp.float32)[:, None]
    targets = [0, 2**31 - 1, rows - 1, rows - 5, 7, 1, 6, 8, rows - 2]

    def at(a):
        a.block_until_ready()
        base = a.unsafe_buffer_pointer()
        return [ctypes.c_float.from_address(base + 4 * r).value for r in targets]

    out = pp.at(x)[idx].set(upd)
    after_set = at(out)
    out = pp.at(out)[idx].add(upd)
    print(json.dumps({"index": str(idx.dtype), "set": after_set, "add": at(out)}))
    """
)


def test_buffer_of_more_rows_than_int32_needs_x64_indices():
    # 2**31 + 5 rows x 1 float32 (8 GiB). Without x64 the indices are int32, which
    # cannot number the rows past 2**31 - 1: refused at trace time, x intact (jnp
    # refuses such an axis too). With x64 a negative index wraps onto those rows.
    rows = 2**31 + 5
    x = jax.device_put(np.zeros((rows, 1), np.float32), sharding("pinned_host"))
    idx = jnp.array([0, -1], jnp.int32)
    with pytest.raises(OverflowError, match="jax_enable_x64"):
        pp.at(x)[idx].set(jnp.ones((2, 1), jnp.float32))
    assert not x.is_deleted()
    np.testing.assert_array_equal(_host_rows(x, np.array([0, rows - 1]))[:, 0], 0)
    del x
    # The child's GPU allocator must not wait on this process's preallocated share.
    env = dict(os.environ, JAX_ENABLE_X64="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    done = subprocess.run(
        [sys.executable, "-c", _HUGE_X64], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["index"] == "int64"
    assert got["set"] == [1, 2, 3, 4, 6, 0, 0, 0, 0]
    assert got["add"] == [2, 4, 6, 8, 17, 0, 0, 0, 0]


def _compiled_hlo(fn, *args, donate: bool) -> str:
    jitted = jax.jit(fn, donate_argnums=(0,) if donate else ())
    return jitted.lower(*args).compile().as_text()


def _triton_calls(hlo: str) -> list[str]:
    return [line for line in hlo.splitlines() if "__gpu$xla.gpu.triton" in line]


def _run_without_host_compute_offload(script: str) -> subprocess.CompletedProcess:
    """Runs ``script`` where XLA refuses to turn any op into host compute."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_disable_automatic_host_compute_offload=true"
    ).strip()
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )


def test_hlo_kernel_in_host_memory_no_copy():
    x = put(np.ones((4096, 64), np.float32))
    idx = jnp.arange(100, dtype=jnp.int32) * 7
    upd = jnp.ones((100, 64), jnp.float32)
    # The kernel's HLO, named explicitly.
    fn = lambda x, i, u: pp.scatter_to_host(x, i, u, backend="pallas")  # noqa: E731
    hlo = _compiled_hlo(fn, x, idx, upd, donate=True)
    calls = _triton_calls(hlo)
    assert len(calls) == 1, hlo
    # Result and aliased buffer operand both in memory space S(5) (pinned host).
    assert re.search(r"=\s*f32\[4096,64\]\{1,0:S\(5\)\}\s*custom-call", calls[0]), calls[0]
    # The result aliases the buffer: the call's last operand (one launch for
    # 100 updates: operands indices, updates, buffer).
    operands = re.search(r"custom-call\(([^)]*)\)", calls[0]).group(1).split(", ")
    assert f"output_to_operand_aliasing={{{{}}: ({len(operands) - 1}, {{}})}}" in calls[0]
    assert operands[-1].lstrip("%").startswith("x"), operands
    assert "pallas_pinned_scatter_rows_fused" in calls[0]
    assert not re.search(r"copy\(%?x", hlo), "the buffer parameter was copied"
    assert "host-compute" not in hlo.lower()


def test_without_donation_xla_copies_the_buffer_and_the_answer_is_right():
    x0 = np.random.default_rng(2).standard_normal((256, 8)).astype(np.float32)
    x = put(x0)
    fn = lambda x, i, u: pp.scatter_to_host(x, i, u)  # noqa: E731
    hlo = _compiled_hlo(fn, x, jnp.array([1, 2]), jnp.ones((2, 8)), donate=False)
    # The documented cost of not donating: a copy (of any form: copy, copy-start, a
    # copy fusion) of the whole (256, 8) buffer, not merely some copy somewhere.
    whole = [line for line in hlo.splitlines() if "copy" in line and "f32[256,8]" in line]
    assert whole, hlo
    out = jax.jit(fn)(x, jnp.array([1, 2]), jnp.ones((2, 8), jnp.float32))
    np.testing.assert_array_equal(np.asarray(x), x0)
    expected = x0.copy()
    expected[1:3] = 1
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_compiles_with_automatic_host_compute_offload_disabled():
    # If any of our ops were turned into host compute, XLA would refuse here.
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        import pallas_pinned as pp
        dev = jax.devices()[0]
        host = jax.sharding.make_single_device_sharding(dev, memory_kind="pinned_host")
        def update(x, y):
            i = jax.device_put(jnp.arange(5), host)
            y = jax.device_put(y.astype(x.dtype), host)
            return pp.scatter_to_host(x, i, y)
        x = jax.device_put(np.zeros((1 << 20,), np.float32), host)
        out = jax.jit(update, donate_argnums=(0,))(x, jnp.arange(5))
        assert np.asarray(out)[:6].tolist() == [0, 1, 2, 3, 4, 0], np.asarray(out)[:6]
        print("ok", out.sharding.memory_kind)
        """
    )
    done = _run_without_host_compute_offload(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok pinned_host" in done.stdout


def test_eager_call_updates_in_place():
    x = put(np.zeros((1000, 16), np.float32))
    pointer = x.unsafe_buffer_pointer()
    out = pp.scatter_to_host(x, jnp.array([3, 999]), jnp.ones((2, 16), jnp.float32))
    assert x.is_deleted()
    assert out.unsafe_buffer_pointer() == pointer
    np.testing.assert_array_equal(
        _host_rows(out, np.array([3, 999, 4])), np.stack([np.ones(16), np.ones(16), np.zeros(16)])
    )


# --- gather_from_host and scatter_add_to_host ---------------------------------------


@pytest.mark.parametrize("n", [100, 20000])  # below and above the sort crossover
def test_gather_hlo_reads_the_host_buffer_in_place(n):
    x = put(np.ones((32768, 64), np.float32))
    idx = (jnp.arange(n, dtype=jnp.int32) * 7919) % 32768
    hlo = _compiled_hlo(lambda x, i: gather_from_host(x, i, backend="pallas"), x, idx,
                        donate=False)
    calls = _triton_calls(hlo)
    assert len(calls) == 1, hlo
    # The kernel's operand is the buffer parameter itself, which lives in
    # pinned host memory, S(5); the result does not. (The call line lists
    # operands by name; their memory space shows on the parameter's line.)
    param = re.search(r"(%[\w.]+) = f32\[32768,64\]\{1,0:S\(5\)\} parameter\(0\)", hlo)
    assert param, hlo
    assert re.search(rf"custom-call\([^)]*{re.escape(param.group(1))}\)", calls[0]), calls[0]
    assert re.search(rf"=\s*f32\[{n},64\]\{{1,0\}}\s*custom-call", calls[0]), calls[0]
    # Nothing but the parameter has the buffer's shape: no copy of it anywhere.
    full = [ln for ln in hlo.splitlines() if re.search(r"=\s*f32\[32768,64\]", ln)]
    assert all("parameter(" in ln for ln in full), full
    assert "host-compute" not in hlo.lower()


# 50 updates take the one launch; 100 (more than tuning's fused_max_unpromised_adds, 64)
# are put in a stable order first (by the order kernel up to tuning's order_kernel_max),
# and the kernel that sums the runs takes the buffer as its fourth operand.
@pytest.mark.parametrize("n", [50, 100])
def test_add_hlo_updates_the_host_buffer_in_place(n):
    x = put(np.ones((4096, 64), np.float32))
    idx = jnp.arange(n, dtype=jnp.int32) % 37  # duplicates: combined first
    upd = jnp.ones((n, 64), jnp.float32)
    fn = lambda x, i, u: scatter_add_to_host(x, i, u, backend="pallas")  # noqa: E731
    hlo = _compiled_hlo(fn, x, idx, upd, donate=True)
    all_calls = _triton_calls(hlo)
    into_buffer = r"=\s*f32\[4096,64\]\{1,0:S\(5\)\}\s*custom-call"
    calls = [c for c in all_calls if re.search(into_buffer, c)]
    assert len(calls) == 1, hlo
    others = [c for c in all_calls if c not in calls]
    ordered_by_kernel = 64 < n <= tuning.current().order_kernel_max
    assert len(others) == int(ordered_by_kernel), others
    assert all('name = "pallas_pinned_stable_order"' in c for c in others), others
    # The result aliases the operand that is the buffer parameter itself.
    param = re.search(r"(%[\w.]+) = f32\[4096,64\]\{1,0:S\(5\)\} parameter\(0\)", hlo)
    assert param, hlo
    operands = re.search(r"custom-call\(([^)]*)\)", calls[0]).group(1).split(", ")
    position = operands.index(param.group(1))
    assert f"output_to_operand_aliasing={{{{}}: ({position}, {{}})}}" in calls[0], calls[0]
    kernel = {50: "rows_fused", 100: "sorted_runs"}[n]
    assert f'name = "pallas_pinned_scatter_add_{kernel}"' in calls[0], calls[0]
    assert not re.search(r"f32\[4096,64\]\{[^}]*\}\s+copy\(", hlo), "the buffer was copied"
    assert "host-compute" not in hlo.lower()


def test_add_eager_call_updates_in_place():
    x = put(np.zeros((1000, 16), np.float32))
    pointer = x.unsafe_buffer_pointer()
    out = scatter_add_to_host(x, jnp.array([3, 3, 999]), jnp.ones((3, 16), jnp.float32))
    assert x.is_deleted()
    assert out.unsafe_buffer_pointer() == pointer
    rows = read(out)
    assert (rows[3] == 2).all() and (rows[999] == 1).all() and (rows[4] == 0).all()


def test_gather_and_add_compile_with_automatic_host_compute_offload_disabled():
    # If either op were turned into host compute, XLA would refuse here.
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from pallas_pinned.scatter_add import scatter_add_to_host
        from pallas_pinned.gather import gather_from_host
        host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
        x = jax.device_put(np.zeros((1 << 20,), np.float32), host)
        add = jax.jit(lambda x, i: scatter_add_to_host(x, i, 1.0), donate_argnums=(0,))
        x = add(x, jnp.array([0, 0, 3]))
        got = jax.jit(lambda x, i: gather_from_host(x, i, mode="fill"))(x, jnp.array([0, 3, 9, -1]))
        assert np.asarray(got).tolist() == [2, 1, 0, 0], np.asarray(got)
        print("ok", x.sharding.memory_kind, got.sharding.memory_kind)
        """
    )
    done = _run_without_host_compute_offload(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok pinned_host device" in done.stdout
