"""The summary of ``benchmarks.sparse_training``: ratios of checked times, the table, the exit.

Kept apart from the run itself so that each module stays small; ``sparse_training``
imports these names, and tests call them there.
"""

from __future__ import annotations

from benchmarks.sparse_hot import PROVIDERS as HOT_PROVIDERS
from benchmarks.sparse_steps import DEVICE_STEPS


def checked_us(records: list[dict]) -> dict[str, float]:
    """Per-step times of the rows whose table was checked, and of the reference's."""
    return {r["provider"]: r["us_per_step"] for r in records
            if r["us_per_step"] is not None and (r["correct"] is True or r.get("is_reference"))}


def why_missing(records: list[dict], name: str) -> str:
    """Why ``name`` has no checked time: not run, errored, incorrect, untimed or unchecked."""
    r = next((r for r in records if r["provider"] == name), None)
    if r is None:
        return f"{name} not run"
    if r["status"] == "error":
        return f"{name} errored"
    if r["correct"] is False:
        return f"{name} incorrect"
    return f"{name} untimed" if r["us_per_step"] is None else f"{name} unchecked"


def summarize(records: list[dict], floor_us: float, *, on_gpu: bool = True,
              cache_holds_table: bool = False) -> dict:
    """Ratios of checked times only; where a side is missing the line says why, and a
    target line gives no verdict. No ratio to the nominal PCIe floor off the GPU."""
    us = checked_us(records)
    ratios, lines = {}, []

    def ratio(key: str, label: str, num: str, den: str, *, target: bool = False,
              spec: str = ".2f", detail=lambda value: "") -> None:
        if num not in us or den not in us:
            missing = "; ".join(why_missing(records, n) for n in (num, den) if n not in us)
            lines.append(f"{label}: n/a ({missing}{'; no verdict' if target else ''})")
            return
        ratios[key] = value = us[num] / us[den]
        verdict = f"target within 2x: {'met' if value <= 2 else 'NOT met'}" if target else ""
        lines.append(f"{label}: {value:{spec}}x ({verdict or detail(value)})")

    ratio("ours_over_device", "ours / device table", "ours", "device", target=True)
    ratio("ours_sorted_over_device", "ours with one shared order / device table",
          "ours_sorted", "device", target=True)
    device_best = min((k for k in DEVICE_STEPS if k in us), key=us.get, default="device")
    ratio("ours_distinct_over_device",
          "ours reading each distinct row once / the faster device table step",
          "ours_distinct", device_best, target=True)
    for name in HOT_PROVIDERS:  # no verdict where the cache is the whole table, on the device
        ratio(f"{name}_over_device", f"{name} (hot rows in device memory) / device table", name,
              "device", target=not cache_holds_table,
              detail=lambda value: "the cache holds every row: no verdict")
    ratio("ours_over_xla", "ours / xla", "ours", "xla", spec=".3f",
          detail=lambda value: f"xla / ours {1 / value:.1f}x")
    if not on_gpu:
        lines.append("ours / nominal PCIe floor: n/a (a CPU run: the floor is a GPU's PCIe rate)")
    elif "ours" in us:
        ratios["ours_over_pcie_floor"] = us["ours"] / floor_us
        lines.append(f"ours / nominal PCIe floor: {ratios['ours_over_pcie_floor']:.2f}x "
                     f"({us['ours']:.1f} us vs {floor_us:.1f} us per step; the floor's rate "
                     "is nominal, not measured in this run)")
    else:
        lines.append(f"ours / nominal PCIe floor: n/a ({why_missing(records, 'ours')})")
    ratio("ours_over_transfer", "ours / measured transfer of the distinct rows", "ours",
          "transfer", detail=lambda value: f"{us['transfer']:.1f} us per step")
    ratio("transfer_over_device", "transfer alone / device table", "transfer", "device",
          detail=lambda value: "what moving the rows costs before any ordering, combining "
          "or gradient")
    return {**ratios, "lines": lines}


def print_table(records: list[dict], floor_us: float | None) -> None:
    """One row per provider; ``x floor`` against the nominal PCIe floor (``-`` where None)."""
    print(f"\n{'provider':18} {'us/step':>10} {'min':>10} {'max':>10} {'x floor':>8} "
          f"{'max|diff|':>10}  status")
    for r in records:
        if r["us_per_step"] is None:
            print(f"{r['provider']:18} {'-':>10} {'-':>10} {'-':>10} {'-':>8} {'-':>10}  "
                  f"{r['status']}: {r.get('error', '')[:200]}")
            continue
        diff = r["max_abs_diff_vs_device"]
        against = "" if diff is None else f", vs {r['checked_against']}"
        checked = ("reference" if r.get("is_reference") else "unchecked" if diff is None
                   else f"{diff:.2e}")
        note = f"; {r['note']}" if r.get("note") else ""
        times_floor = "-" if floor_us is None else f"{r['us_per_step'] / floor_us:.2f}"
        print(f"{r['provider']:18} {r['us_per_step']:10.1f} {r['us_min']:10.1f} "
              f"{r['us_max']:10.1f} {times_floor:>8} {checked:>10}  "
              f"{r['status']} ({r['memory_kind']}{against}{note})")


def exit_status(records: list[dict]) -> int:
    """1 on an error, a wrong table, or a table left unchecked (no reference to check it)."""
    failed = False
    for r in records:
        if r["status"] == "error":
            print(f"ERROR: {r['provider']}: {r['error'][:300]}")
            failed = True
        elif r["correct"] is False:
            print(f"INCORRECT: {r['provider']}: max |table - {r['checked_against']}| "
                  f"{r['max_abs_diff_vs_device']:.3g} (tolerance {r['tolerance']:.3g}), "
                  f"memory kind {r['memory_kind']} (must be {r['expected_memory_kind']})")
            failed = True
        elif r["correct"] is None and not r.get("is_reference"):
            print(f"UNCHECKED: {r['provider']}: {r.get('note', 'not checked')}")
            failed = True
    return 1 if failed else 0
