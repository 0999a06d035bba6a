"""The loop benchmark's write patterns: ring insert, KV-cache write, per-sequence decode write.

Each pattern is the write a client makes at every step of its own loop, through
the index grammar of ``pallas_pinned.at(x)[index].set(values, mode=...)``,
measured in a jitted ``lax.scan`` of ``--steps`` steps over a donated pinned
buffer against XLA's best formulation of the same write, in the same run:

* ``ring``: a block of ``n`` rows at a moving position ``pos = t * n mod N``
  of an ``(N, W)`` ring whose ``N`` is a multiple of ``n`` (the block never
  straddles the end). Ours: ``at(x)[jax.ds(pos, n)].set(y, mode="wrap")``;
  XLA: ``lax.dynamic_update_slice(x, jax.device_put(y, Space.Host), (pos, 0))``.
* ``ring_wrap``: the same with ``N = 8.5 n`` rows, so every few steps the block
  wraps from the end to the start. XLA's ``dynamic_update_slice`` clamps its
  start instead of wrapping, so XLA's formulation is the scatter
  ``x.at[(pos + arange(n)) % N].set(y)``.
* ``kv``: a KV cache ``(layers, T, H*D)``; step ``t`` writes one new token's
  rows for every layer at position ``pos = t mod T``. Ours
  ``at(kv)[:, pos].set(new)``; XLA ``kv.at[:, pos].set(new)``.
* ``decode``: per-sequence caches ``(B, T, D)``; step ``t`` writes one row per
  sequence at its own length, ``lengths = (lengths0 + t) mod T``. Ours
  ``at(cache)[jnp.arange(B), lengths].set(val)``; XLA
  ``cache.at[jnp.arange(B), lengths].set(val)``.
* ``kv_block``: the same KV write with ``dynamic_update_slice``'s semantics
  (``mode="clip"``: a position that does not fit is clamped, where jnp's
  default drops it), which makes it one strided copy. Ours
  ``at(kv)[:, pos].set(new, mode="clip")``; XLA
  ``lax.dynamic_update_slice(kv, jax.device_put(new[:, None], Space.Host), (0, pos, 0))``.
* ``block``: the contiguous insert with ``dynamic_update_slice``'s own
  semantics (a start that does not fit is clamped), at the ring's positions.
  Ours ``at(x)[jax.ds(pos, n)].set(y, mode="clip")``; XLA
  ``lax.dynamic_update_slice(x, jax.device_put(y, Space.Host), (pos, 0))``.

The values of step ``t`` are ``base + t`` (made on the device), and the
baseline makes the positions and values and carries them without writing.
After one checked run of each provider the sampled rows (every row some step
wrote, up to ``--check-written``, plus random others) must equal a numpy
replay of every step bit for bit. Then, after each provider's ``--warmup``
runs, the providers of a case are timed interleaved, as the grid's are
(``benchmarks/scan_runner.py``, one buffer threaded through all of them):
in ``--rounds`` rounds (``ROUNDS`` when the parser has no such option), each
giving every provider its share of its ``--runs`` timed runs, the order
rotated by one per round.
Timed one after the other, drift of the machine (clocks, PCIe, the state of
host memory) lands on one provider only; interleaved, every provider sees the
same drift. ``us_per_step`` is the median over all of a provider's timed runs,
``us_min``/``us_max`` their extremes.

Records have the grid's fields less its floor fields (``op`` is the pattern,
``rows`` the rows written per step; ``rounds``, as in the grid, the rounds
the provider was timed in: fewer than asked when ``--runs`` is smaller, 1 for
a scan timed once) plus ``shape`` and ``same_step_ops_as_xla`` (ours only:
whether its compiled step counts the same ops as XLA's, see
:func:`mark_same_step_ops`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from benchmarks import checks
from benchmarks.scan_runner import (
    PinnedBuffer,
    check_scan,
    check_then_time,
    compile_all,
    fill_op_costs,
    own_updates,
    split_runnable,
)
from pallas_pinned.testing import make_values, scatter_oracle

PATTERN_OPS = ("ring", "ring_wrap", "kv", "decode", "block", "kv_block")
# Rounds the providers of a pattern case are timed in, where the parser has no
# --rounds: the GPU's 5 runs then give one run per provider per round.
ROUNDS = 5


@dataclasses.dataclass(frozen=True)
class PatternCase:
    """One pattern on one buffer: ``rows`` rows of the last axis written per step."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    rows: int

    @property
    def name(self) -> str:
        # The rows per step are part of the name: two cases may share a buffer's shape
        # (the bfloat16 blocks of 64 and 1024 rows), and reports key records by name.
        return f"{self.op}{list(self.shape)}x{self.rows}-{self.dtype}".replace(" ", "")

    @property
    def row_bytes(self) -> int:
        return self.shape[-1] * jnp.dtype(self.dtype).itemsize

    @property
    def step_bytes(self) -> int:
        return self.rows * self.row_bytes


# H200 sizes: a 1 GiB ring of 1 KiB rows written 1024 rows at a time; an
# 8.5-block ring that wraps; a bf16 KV cache of 32 layers x 4096 tokens x
# (8 heads x 128) (256 MiB); 64 sequences x 4096 tokens x 1024 bf16 (512 MiB);
# contiguous blocks of 64 and 1024 rows of 1 KiB (float32) and of 2 KiB (bfloat16).
GPU_PATTERNS = (
    PatternCase("ring", (1 << 20, 256), "float32", 1024),
    PatternCase("ring_wrap", (8 * 1024 + 512, 256), "float32", 1024),
    PatternCase("kv", (32, 4096, 1024), "bfloat16", 32),
    PatternCase("decode", (64, 4096, 1024), "bfloat16", 64),
    PatternCase("block", (1 << 20, 256), "float32", 64),
    PatternCase("block", (1 << 19, 256), "float32", 1024),
    PatternCase("block", (1 << 19, 1024), "bfloat16", 64),
    PatternCase("block", (1 << 19, 1024), "bfloat16", 1024),
    PatternCase("kv_block", (32, 4096, 1024), "bfloat16", 32),
)
CPU_PATTERNS = (
    PatternCase("ring", (256, 16), "float32", 16),
    PatternCase("ring_wrap", (8 * 16 + 8, 16), "float32", 16),
    PatternCase("kv", (4, 32, 16), "bfloat16", 4),
    PatternCase("decode", (8, 32, 16), "float32", 8),
    PatternCase("block", (256, 16), "float32", 16),
    PatternCase("block", (256, 32), "bfloat16", 16),
    PatternCase("kv_block", (4, 32, 16), "bfloat16", 4),
)


_DESCRIPTIONS = {
    "ring": ("at(x)[jax.ds(pos, n)].set(y, mode='wrap'), pos = t*n mod N, N a multiple of n",
             "lax.dynamic_update_slice(x, jax.device_put(y, Space.Host), (pos, 0))"),
    "ring_wrap": ("at(x)[jax.ds(pos, n)].set(y, mode='wrap'), pos = t*n mod N, wraps",
                  "x.at[(pos + arange(n)) % N].set(y)"),
    "kv": ("at(kv)[:, pos].set(new), pos = t mod T", "kv.at[:, pos].set(new)"),
    "kv_block": ("at(kv)[:, pos].set(new, mode='clip'), pos = t mod T",
                 "lax.dynamic_update_slice(kv, jax.device_put(new[:, None], Space.Host), "
                 "(0, pos, 0))"),
    "decode": ("at(cache)[arange(B), lengths].set(val), lengths = (lengths0 + t) mod T",
               "cache.at[arange(B), lengths].set(val)"),
    "block": ("at(x)[jax.ds(pos, n)].set(y, mode='clip'), pos = t*n mod N",
              "lax.dynamic_update_slice(x, jax.device_put(y, Space.Host), (pos, 0))"),
}


def describe(case: PatternCase) -> dict:
    ours, xla = _DESCRIPTIONS[case.op]
    return {"shape": list(case.shape), "dtype": case.dtype, "rows_per_step": case.rows,
            "ours": ours, "xla": xla}


def step_index(case: PatternCase, t, lengths0):
    """What locates step ``t``'s write: a position, or per-sequence lengths."""
    if case.op in ("ring", "ring_wrap", "block"):
        return (t * case.rows) % case.shape[0]
    if case.op in ("kv", "kv_block"):
        return t % case.shape[1]
    return (lengths0 + t) % case.shape[1]


def written_rows(case: PatternCase, t: int, lengths0: np.ndarray) -> np.ndarray:
    """Step ``t``'s rows in the buffer seen as ``(-1, shape[-1])``, in the values' order."""
    where = step_index(case, np.int64(t), lengths0.astype(np.int64))
    if case.op in ("ring", "ring_wrap", "block"):  # a block's N is a multiple of n: no wrap
        return (where + np.arange(case.rows)) % case.shape[0]
    return np.arange(case.shape[0]) * case.shape[1] + where  # kv and decode: one per row


def write_fn(case: PatternCase, provider: str, backend: str) -> Callable:
    """``write(x, where, values) -> x`` of ``xla_<op>`` or ``ours_<op>``."""
    n, num = case.rows, case.shape[0]
    if provider.startswith("ours"):
        return functools.partial(_ours, case.op, n, backend)
    dus = lambda x, pos, y: lax.dynamic_update_slice(  # noqa: E731
        x, jax.device_put(y, jax.memory.Space.Host), (pos, 0))
    return {
        "ring": dus,
        "block": dus,
        "ring_wrap": lambda x, pos, y: x.at[(pos + jnp.arange(n)) % num].set(y),
        "kv": lambda x, pos, new: x.at[:, pos].set(new),
        "kv_block": lambda x, pos, new: lax.dynamic_update_slice(
            x, jax.device_put(new[:, None], jax.memory.Space.Host), (0, pos, 0)),
        "decode": lambda x, lengths, val: x.at[jnp.arange(num), lengths].set(val),
    }[case.op]


def _ours(op: str, n: int, backend: str, x, where, values):
    if op in ("ring", "ring_wrap"):
        return pp.at(x)[jax.ds(where, n)].set(values, mode="wrap", backend=backend)
    if op == "block":
        return pp.at(x)[jax.ds(where, n)].set(values, mode="clip", backend=backend)
    if op == "kv_block":
        return pp.at(x)[:, where].set(values, mode="clip", backend=backend)
    if op == "kv":
        return pp.at(x)[:, where].set(values, backend=backend)
    return pp.at(x)[jnp.arange(x.shape[0]), where].set(values, backend=backend)


def scan_fn(case: PatternCase, provider: str, backend: str, steps: int) -> Callable:
    """The jitted scan ``(x, base, lengths0) -> outputs``; outputs[0] is the buffer (donated)."""
    ts = jnp.arange(steps, dtype=jnp.int32)
    if provider == "baseline":
        def run(x, base, lengths0):
            def body(carry, t):
                return (carry[0], step_index(case, t, lengths0), base + t.astype(base.dtype)), None

            init = (x, step_index(case, jnp.int32(0), lengths0), jnp.zeros_like(base))
            return lax.scan(body, init, ts)[0]
    else:
        write = write_fn(case, provider, backend)

        def run(x, base, lengths0):
            def body(x, t):
                return write(x, step_index(case, t, lengths0), base + t.astype(base.dtype)), None

            return (lax.scan(body, x, ts)[0],)

    return jax.jit(run, donate_argnums=0)


@dataclasses.dataclass
class PatternData:
    case: PatternCase
    steps: int
    base: np.ndarray  # (rows, shape[-1]) values of step 0
    lengths0: np.ndarray  # (B,) int32 start lengths (decode; zeros otherwise)
    base_dev: jax.Array
    lengths_dev: jax.Array
    sample: np.ndarray  # sorted flat rows read back for the check
    # Each row's own updates' base on the device (scan_runner.own_updates).
    owned: list[jax.Array] = dataclasses.field(default_factory=list)

    def release(self) -> None:
        for a in (self.base_dev, self.lengths_dev, *self.owned):
            a.delete()


def make_pattern_data(case: PatternCase, steps: int, rng: np.random.Generator, *,
                      check_written: int, check_others: int) -> PatternData:
    base = make_values(rng, (case.rows, case.shape[-1]), case.dtype)
    lengths0 = (rng.integers(0, case.shape[1], size=case.shape[0]).astype(np.int32)
                if case.op == "decode" else np.zeros(1, np.int32))
    flat_rows = math.prod(case.shape[:-1])
    written = np.unique(np.concatenate([written_rows(case, t, lengths0) for t in range(steps)]))
    picked = written[rng.choice(written.size, min(check_written, written.size), replace=False)]
    others = rng.integers(0, flat_rows, size=min(check_others, flat_rows))
    sample = np.unique(np.concatenate([picked, others]).astype(np.int64))
    on_device = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="device")
    return PatternData(case, steps, base, lengths0, jax.device_put(base, on_device),
                       jax.device_put(lengths0, on_device), sample)


def read_flat_rows(x: jax.Array, rows: np.ndarray) -> np.ndarray:
    """Rows of ``x`` seen as ``(-1, shape[-1])``, read through a device copy of ``x``."""
    return checks.read_rows(x, rows, flat=True)


def check_pattern(data: PatternData, provider: str, before: np.ndarray,
                  after: np.ndarray) -> str | None:
    """The sampled rows after one scan against a numpy replay of every step; None if equal."""
    expected = before.copy()
    if provider != "baseline":
        for t in range(data.steps):
            rows = written_rows(data.case, t, data.lengths0)
            slots = np.searchsorted(data.sample, rows)
            hit = (slots < data.sample.size) & (
                data.sample[np.minimum(slots, data.sample.size - 1)] == rows)
            values = data.base + np.asarray(t, data.base.dtype)
            expected = scatter_oracle(expected, slots[hit], values[hit])
    if expected.tobytes() == after.tobytes():
        return None
    differ = int((expected.view(np.uint8).reshape(expected.shape[0], -1)
                  != after.view(np.uint8).reshape(after.shape[0], -1)).any(axis=1).sum())
    return f"{differ} of {after.shape[0]} sampled rows differ from the numpy replay"


def pattern_providers(case: PatternCase, backends: tuple[str, ...]) -> list[tuple[str, str]]:
    """(provider, backend) rows of a pattern case: baseline, XLA, ours, ours per backend."""
    ours = f"ours_{case.op}"
    return ([("baseline", "-"), (f"xla_{case.op}", "-"), (ours, "auto")]
            + [(ours, b) for b in backends])


def base_record(case: PatternCase, provider: str, backend: str, steps: int,
                rounds: int) -> dict:
    return {
        "case": case.name, "op": "none" if provider == "baseline" else case.op,
        "rows": case.rows, "row_bytes": case.row_bytes, "dtype": case.dtype,
        "shape": list(case.shape), "provider": provider, "backend": backend, "steps": steps,
        "status": "ok", "us_per_step": None, "us_min": None, "us_max": None, "runs": 0,
        "rounds": rounds, "op_cost_us": None, "kernels_per_step": None, "op_kernels": None,
        "hlo_ops": None, "same_step_ops_as_xla": None, "correct": None, "check": None,
        "compile_s": None, "notes": "",
    }


def run_pattern_case(args, buf: PinnedBuffer, case: PatternCase, over_budget: bool,
                     progress) -> list[dict]:
    """Every provider of one pattern case: compiled side by side, each checked, then all
    timed interleaved in rounds (the module's docstring says why)."""
    rounds = getattr(args, "rounds", ROUNDS)
    todo, records = split_runnable(
        args, pattern_providers(case, args.backends), over_budget,
        lambda p, b: base_record(case, p, b, args.steps, rounds), progress, case.name)
    if not todo:
        return records
    buf.ensure(case.dtype, case.shape)
    rng = np.random.default_rng([args.seed, PATTERN_OPS.index(case.op), *case.shape])
    data = make_pattern_data(case, args.steps, rng, check_written=args.check_written,
                             check_others=args.check_others)
    inputs = (data.base_dev, data.lengths_dev)
    lowerings = {key: functools.partial(
        lambda p, b: scan_fn(case, p, b, args.steps).lower(buf.x, *inputs), *key)
        for key in todo}
    try:
        compiled = compile_all(lowerings, getattr(args, "compiler_options", None))
        records += check_then_time(
            buf, todo, lambda p, b: _check(args, buf, data, p, b, compiled[(p, b)], rounds),
            rounds, progress, case.name)
    finally:
        data.release()
    order = {key: k for k, key in enumerate(pattern_providers(case, args.backends))}
    records.sort(key=lambda r: order[(r["provider"], r["backend"])])
    fill_op_costs(records)
    mark_same_step_ops(records)
    return records


def mark_same_step_ops(records: list[dict]) -> None:
    """``same_step_ops_as_xla`` of ours: does its compiled step launch the ops XLA's does?

    Compares the op counters of one compiled scan step (``hlo_ops``: launching
    instructions by opcode, custom calls by target, see ``benchmarks/hlo.py``)
    and the kernels per step (which also hold an unrolled body's scaling). The
    same counters say the two steps launch the same kinds and number of ops,
    so a difference in their times does not come from more or other launches
    (fusions are compared by count, not by contents). None for the baseline
    and XLA, and where either side has no counters (skipped, or failed
    before it compiled).
    """
    xla = next((r for r in records if r["provider"].startswith("xla_")), None)
    for r in records:
        if not r["provider"].startswith("ours_"):
            continue
        known = xla is not None and r["hlo_ops"] is not None and xla["hlo_ops"] is not None
        r["same_step_ops_as_xla"] = (
            r["hlo_ops"] == xla["hlo_ops"] and r["kernels_per_step"] == xla["kernels_per_step"]
            if known else None)


def _check(args, buf: PinnedBuffer, data: PatternData, provider: str, backend: str,
           compiled_and_s, rounds: int):
    """One provider's record and its checked run (:func:`check_scan`), timed later."""
    data = own_updates(data, f"{provider}[{backend}]")
    record = base_record(data.case, provider, backend, args.steps, rounds)
    record["check"] = f"{data.sample.size} sampled rows match the numpy replay"
    scan = check_scan(args, buf, record, compiled_and_s, (data.base_dev, data.lengths_dev),
                      lambda x: read_flat_rows(x, data.sample),
                      functools.partial(_judge, data, provider))
    return record, scan


def _judge(data: PatternData, provider: str, before: np.ndarray, outputs) -> str | None:
    return check_pattern(data, provider, before, read_flat_rows(outputs[0], data.sample))

