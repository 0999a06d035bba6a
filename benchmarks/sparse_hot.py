"""The sparse-training client with its hottest rows kept in device memory: a client's cache.

The table stays in pinned host memory. The ``--hot-rows`` ids seen most often in a
profile window of the id stream (:data:`PROFILE_STEPS` steps drawn apart from the
timed ones, as a client counts its ids before it trains) keep their rows in a device
array; a step reads and updates those there, and only its other ids (the cold ones)
touch the pinned table. Zipf ids repeat on a few rows, so a small cache takes most of
a step's entries, and the rows that cross PCIe drop with it (printed by the run).

Four providers of the same cache:

* ``ours_hot``: the cold ids through ``gather_from_host`` and ``scatter_add_to_host``
  (the hot entries turned into distinct out-of-range ids, which move nothing), so the
  add orders the step's entries and sums repeated rows in its fixed order;
* ``ours_hot_distinct``: each cold row read once and set once. A device scratch the
  length of the table (int32) finds each cold id's last entry, its owner:
  ``scratch.at[ids].max(code)`` needs no sort. A step's codes are ``base + entry``, where
  ``base`` (the state's ``next_code``) grows by each step's batch, so they are above every
  earlier step's whatever the batch, and the scratch is not cleared after each step (a
  clearing scatter after the read made XLA copy the whole scratch, twice a step on CPU).
  Codes stay below ``2**31 - 1`` (524,287 steps of 4096 ids): a scan that would pass that
  clears the scratch and starts the codes again at 0 before its loop, and a scan longer
  than that is refused. Only owners read their row;
  each entry takes its owner's value, the entries' updates are added onto their owners'
  values by a device scatter-add (XLA's atomics, in no fixed order, as the device table's),
  and the new rows are written with ``scatter_to_host`` promised unique. No second read
  of the rows and no ordering;
* ``ours_hot_merged``: ``ours_hot_distinct`` with one int32 array as long as the table,
  ``code``, for both the slots and the owner codes: a hot id's code is ``hot_base + slot``,
  ``hot_base = 2**31 - hot rows``, above every step's code, so a step's one
  ``code.at[ids].max(base + entry)`` leaves hot codes alone, and one gather of ``code``
  gives each entry its slot (code >= hot_base) or its owner. One scatter-max and one
  gather where ``ours_hot_distinct`` has two gathers and a scatter-max; but the scatter-max
  then takes the hot entries too, as atomics that change nothing. On an H100 (session 34,
  docs/PERFORMANCE.md) it was 0.1-2.2 us faster with partial caches, interleaved; with every
  row cached the sign differed between runs. Step codes stay below ``hot_base`` (524,224
  steps of 4096 ids with 2**18 hot rows); the guard's restart sets the cold codes back to
  -1 and keeps the hot ones;
* ``ours_hot_xla_add``: ``ours_hot``'s read (the cold ids through ``gather_from_host``),
  and the cold updates added by XLA's own scatter-add into the pinned table
  (``table.at[cold].add``: a GPU kernel of float atomics over PCIe, in no fixed order, as
  the device table's add). Without a cache that add is tenfold slower on Zipf ids (rows
  that repeat contend for their atomics; docs/PERFORMANCE.md), but the cache takes the
  ids that repeat, so the cold entries are mostly distinct: no owner codes, no ordering,
  no duplicate work, and no second read of the rows (session 35).

The hot rows' updates are XLA's scatter-add on the device array, as in the device
table. :func:`flush` writes the hot rows back into the pinned table, as a client does
when it saves the table; the run flushes before its check, and the timed scans do not
include it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas_pinned as pp
from benchmarks.sparse_steps import _loss

PROFILE_STEPS = 1024  # the profile window: about 4 M ids at 4096 a step
PROVIDERS = ("ours_hot", "ours_hot_distinct", "ours_hot_merged", "ours_hot_xla_add")
_DISTINCT = {"unique_indices": True, "indices_are_sorted": True}


def most_frequent(ids: np.ndarray, k: int, num_rows: int) -> np.ndarray:
    """The ``k`` ids (at most ``num_rows``) seen most often in ``ids``, ascending; ties go
    to the smaller id, and ids never seen fill the rest in id order."""
    counts = np.bincount(ids.ravel(), minlength=num_rows)
    return np.sort(np.argsort(-counts, kind="stable")[:min(k, num_rows)]).astype(np.int32)


def cold_stats(ids: np.ndarray, hot_ids: np.ndarray) -> dict:
    """Per step (means): the entries whose id is hot, and the distinct cold ids."""
    is_hot = np.isin(ids, hot_ids)
    cold = [np.unique(row[~hot]).size for row, hot in zip(ids, is_hot, strict=True)]
    return {"hot_entry_fraction": float(is_hot.mean()), "cold_distinct_mean": float(np.mean(cold))}


def hot_base(num_hot: int) -> int:
    """``ours_hot_merged``'s code of slot 0: the hot codes are the top ``num_hot`` of int32."""
    return 2**31 - num_hot


def _coded(num_rows: int, hot_ids: jax.Array, first: int) -> jax.Array:
    """Each id's code: ``first + slot`` for a hot id, -1 for a cold one."""
    return jnp.full((num_rows,), -1, jnp.int32).at[hot_ids].set(
        first + jnp.arange(hot_ids.shape[0], dtype=jnp.int32), **_DISTINCT)


def start(table: jax.Array, hot_ids: np.ndarray, provider: str) -> dict:
    """``provider``'s state: the pinned table, the hot rows copied to the device (in the
    order of ``hot_ids``, ascending) and each id's hot slot (-1: cold); for
    ``ours_hot_distinct`` also the owner scratch and ``next_code``, where the next step's
    codes start; for ``ours_hot_merged`` the slots and owner codes in one array, ``code``,
    and ``next_code``.
    Device memory: the cache, plus one int32 array as long as the table per slots, scratch
    and code."""
    hot_ids = np.asarray(hot_ids)
    if not hot_ids.size:
        raise ValueError("hot_ids is empty: cache at least one row (or train without a cache)")
    if not (np.all(np.diff(hot_ids) > 0) and 0 <= hot_ids[0] and hot_ids[-1] < table.shape[0]):
        # flush and the slots promise the library sorted, distinct rows in range.
        raise ValueError("hot_ids must be distinct ids in range, ascending")
    device = jax.sharding.make_single_device_sharding(next(iter(table.devices())))
    hot_ids = jax.device_put(hot_ids, device)
    num_rows = table.shape[0]
    state = {"table": table, "hot_ids": hot_ids,
             "hot": pp.gather_from_host(table, hot_ids, **_DISTINCT)}
    if provider == "ours_hot_merged":
        return state | {"code": _coded(num_rows, hot_ids, hot_base(hot_ids.shape[0])),
                        "next_code": jnp.zeros((), jnp.int32)}
    state["slot"] = _coded(num_rows, hot_ids, 0)
    if provider == "ours_hot_distinct":
        state |= {"owner": jnp.full((num_rows,), -1, jnp.int32),
                  "next_code": jnp.zeros((), jnp.int32)}
    return state


@functools.partial(jax.jit, donate_argnums=0)
def flush(state: dict) -> dict:
    """The hot rows written back into the pinned table; the state stays usable."""
    table = pp.scatter_to_host(state["table"], state["hot_ids"], state["hot"], **_DISTINCT)
    return state | {"table": table}


def table_of(state) -> jax.Array:
    """The pinned table of a provider's state (a table provider's state is its table)."""
    return state["table"] if isinstance(state, dict) else state


def _split(state: dict, i: jax.Array):
    """Each entry's hot slot (-1: cold), whether it is hot, its index, and its cold id: the
    id, or for a hot entry ``num_rows + entry``, distinct and out of range."""
    slot = state["slot"][i]
    is_hot = slot >= 0
    entry = jnp.arange(i.shape[0], dtype=i.dtype)
    return slot, is_hot, entry, jnp.where(is_hot, state["table"].shape[0] + entry, i)


def _rows_and_update(hot, slot, is_hot, cold_values, t, lr: float, dtype):
    """Every entry's row (the hot copy or the cold value) and its update ``-lr * grad``."""
    rows = jnp.where(is_hot[:, None], hot[jnp.maximum(slot, 0)], cold_values)
    return (-lr * jax.grad(_loss)(rows, t)).astype(dtype)


def _add_hot(hot, slot, is_hot, update):
    return hot.at[jnp.where(is_hot, slot, hot.shape[0])].add(update, mode="drop")


def _cold_added(state: dict, i, t, lr: float, add) -> dict:
    """A step whose cold ids are read by the library's gather and added by ``add(table,
    cold, update)``: ``ours_hot``'s and ``ours_hot_xla_add``'s."""
    table = state["table"]
    slot, is_hot, _, cold = _split(state, i)
    update = _rows_and_update(state["hot"], slot, is_hot,
                              pp.gather_from_host(table, cold, mode="fill", fill_value=0),
                              t, lr, table.dtype)
    return state | {"hot": _add_hot(state["hot"], slot, is_hot, update),
                    "table": add(table, cold, update)}


def _cold_by_ops(state: dict, i, t, lr: float) -> dict:
    """``ours_hot``'s step: the cold ids through the library's gather and add."""
    return _cold_added(state, i, t, lr, lambda x, rows, u: pp.scatter_add_to_host(
        x, rows, u, mode="drop"))


def _cold_xla_add(state: dict, i, t, lr: float) -> dict:
    """``ours_hot_xla_add``'s step: the cold ids read by the library's gather and added by
    XLA's own scatter-add into the pinned table (module doc)."""
    return _cold_added(state, i, t, lr, lambda x, rows, u: x.at[rows].add(u, mode="drop"))


def _write_owned(state: dict, ids, t, lr: float, slot, is_hot, owner_entry) -> dict:
    """The read-once steps' rest, once each entry's owner is known (``owner_entry``; not
    ``entry`` for a hot entry): owners read their row from ``ids``, every entry takes its
    owner's value, the updates are added onto the owners' values on the device, and the new
    rows are written once (module doc)."""
    table = state["table"]
    num_rows, batch = table.shape[0], ids.shape[0]
    entry = jnp.arange(batch, dtype=ids.dtype)
    reads = jnp.where(owner_entry == entry, ids, num_rows + entry)  # each cold row once
    values = pp.gather_from_host(table, reads, mode="fill", fill_value=0, unique_indices=True)
    update = _rows_and_update(state["hot"], slot, is_hot, values[jnp.maximum(owner_entry, 0)],
                              t, lr, table.dtype)
    # Each owner's new row: its value plus its entries' updates, added onto the values
    # themselves (no zeroed sums and no separate add; session 34).
    new = values.at[jnp.where(is_hot, batch, owner_entry)].add(update, mode="drop")
    return state | {
        "hot": _add_hot(state["hot"], slot, is_hot, update),
        "table": pp.scatter_to_host(table, reads, new, mode="drop", unique_indices=True),
        "next_code": state["next_code"] + batch}


def _cold_read_once(state: dict, i, t, lr: float) -> dict:
    """``ours_hot_distinct``'s step: each cold row read once and set once (module doc)."""
    slot, is_hot, entry, cold = _split(state, i)
    base = state["next_code"]  # this step's codes are base + entry (module doc)
    owner = state["owner"].at[cold].max(base + entry, mode="drop")
    # Each cold entry's owner: the last entry of its id (negative for a hot entry).
    owner_entry = owner.at[cold].get(mode="fill", fill_value=-1) - base
    return _write_owned(state | {"owner": owner}, cold, t, lr, slot, is_hot, owner_entry)


def _merged_read_once(state: dict, i, t, lr: float) -> dict:
    """``ours_hot_merged``'s step: ``ours_hot_distinct``'s, its slots and owners read from
    one scatter-max and one gather of ``code`` (module doc)."""
    entry = jnp.arange(i.shape[0], dtype=i.dtype)
    base = state["next_code"]
    # A hot id's code is above every step's: the max leaves it, no out-of-range ids needed.
    code = state["code"].at[i].max(base + entry)
    got = code[i]
    first = hot_base(state["hot"].shape[0])
    is_hot = got >= first
    owner_entry = jnp.where(is_hot, -1, got - base)  # -1: a hot entry owns no cold row
    return _write_owned(state | {"code": code}, i, t, lr, got - first, is_hot, owner_entry)


def code_top(state: dict) -> int:
    """One past the highest step code: merged's hot codes start there; ``ours_hot_distinct``'s
    stops at int32's largest value, so that ``next_code`` itself stays an int32."""
    return hot_base(state["hot"].shape[0]) if "code" in state else 2**31 - 1


def _codes_fit(state: dict, steps: int, batch: int) -> dict:
    """The state with room for ``steps`` more steps of ``batch`` codes below
    :func:`code_top`: the cold codes back to -1 and ``next_code`` back to 0 where the scan
    would pass it. Done once, before the scan's loop, so the steps themselves stay as
    measured."""
    top, need = code_top(state), steps * batch
    if need > top:
        raise ValueError(f"a scan of {steps} steps of {batch} ids needs more owner codes than "
                         f"the {top} below the top; split it into scans of at most "
                         f"{top // batch} steps")
    key = "code" if "code" in state else "owner"
    # Cold codes go back to -1, below any step's; the merged array's hot codes are its
    # slots and stay (the owner scratch holds no hot code).
    restart = ((lambda c: jnp.where(c >= top, c, -1)) if key == "code"
               else (lambda c: jnp.full_like(c, -1)))
    codes, next_code = lax.cond(state["next_code"] > top - need,
                                lambda c, n: (restart(c), jnp.zeros_like(n)),
                                lambda c, n: (c, n), state[key], state["next_code"])
    return state | {key: codes, "next_code": next_code}


def step_fns(lr: float) -> dict:
    """The jitted scan of each provider; the state (argument 0) is donated."""

    def scan(step):
        def train(state, ids, targets):
            if "next_code" in state:  # the read-once providers' codes
                state = _codes_fit(state, *ids.shape)
            return lax.scan(lambda s, xs: (step(s, *xs, lr), None), state, (ids, targets))[0]

        return jax.jit(train, donate_argnums=0)

    return {"ours_hot": scan(_cold_by_ops), "ours_hot_distinct": scan(_cold_read_once),
            "ours_hot_merged": scan(_merged_read_once), "ours_hot_xla_add": scan(_cold_xla_add)}
