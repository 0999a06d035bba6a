"""Counting the kernels one step of a ``lax.scan`` launches, from the compiled HLO.

The counting rule (what ``kernels_per_step`` means in the loop benchmark):

* Start at the body of the scan's ``while`` (the ``while`` with the largest
  known trip count in the entry computation), after XLA's optimizations, so
  that fusion has already happened: one fusion is one kernel.
* Every instruction there counts once, except those that launch nothing:
  ``parameter``, ``constant``, ``get-tuple-element``, ``tuple``, ``bitcast``
  and other bookkeeping (see ``_FREE``), and the ``-done``/``-update`` halves
  of asynchronous pairs (their ``-start`` counts).
* ``fusion``, ``custom-call`` (Pallas and Triton kernels, cuBLAS, host
  offloads), ``sort``, and any other unfused op (``copy``, ``scatter``,
  ``dynamic-update-slice``...) count one each: a kernel or a transfer that
  the step waits for.
* ``call`` and ``conditional`` are not launches: their computations are
  counted instead (command buffers on GPU are ``call``s; a ``conditional``
  counts its largest branch). A nested ``while`` counts its body once.
* If XLA unrolled the loop (trip count below the number of steps), the body's
  count is scaled by ``trip_count / steps``; if no ``while`` is left, the
  whole entry computation is divided by the steps.

The loop's own condition (one small compare per iteration) is not counted:
it is the same for every provider, the baseline included.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re

# The rule in one line, for the results file's metadata.
COUNTING_RULE = (
    "instructions of the optimized scan body (the entry's while with the largest trip count) "
    "that launch work: fusions, custom-calls, sorts, copies and other unfused ops count one "
    "each; parameters, constants, tuples, bitcasts and async -done halves count zero; calls "
    "and conditionals count their computations (largest branch); scaled by trip_count/steps"
)

_FREE = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
    "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain",
})

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
# The opcode is the first lower-case word followed by "(" after the shape;
# shapes never have one ("f32[8]{0:S(5)}" has an upper-case S after a colon).
_OPCODE = re.compile(r"(?:^|\s)([a-z][a-z0-9_\-]*)\(")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)"
                     r"=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


@dataclasses.dataclass
class _Instr:
    name: str
    opcode: str
    rest: str

    def called(self, *keys: str) -> list[str]:
        found = [name for key, name in _CALLED.findall(self.rest) if key in keys]
        if "branch_computations" in keys:
            for group in _BRANCHES.findall(self.rest):
                found += [b.strip().lstrip("%") for b in group.split(",") if b.strip()]
        return found


def parse_computations(hlo_text: str) -> tuple[dict[str, list[_Instr]], str | None]:
    """``({computation name: instructions}, entry name)`` of an HLO module's text."""
    computations: dict[str, list[_Instr]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and "=" not in line.split("(")[0]:
                current = header.group(1)
                computations[current] = []
                if line.startswith("ENTRY"):
                    entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        instr = _INSTRUCTION.match(line)
        if instr:
            body = re.sub(r",\s*metadata=\{[^}]*\}", "", instr.group(2))
            opcode = _OPCODE.search(body)
            computations[current].append(
                _Instr(instr.group(1), opcode.group(1) if opcode else "?", body))
    return computations, entry


def _count(computations, name: str, ops: collections.Counter, depth: int = 0) -> int:
    if depth > 20 or name not in computations:
        return 0
    total = 0
    for ins in computations[name]:
        op = ins.opcode
        if op in _FREE or op.endswith("-done") or op.endswith("-update"):
            continue
        if op == "call":
            total += sum(_count(computations, c, ops, depth + 1) for c in ins.called("to_apply"))
        elif op == "conditional":
            branches = ins.called("branch_computations", "true_computation",
                                  "false_computation")
            sub = [collections.Counter() for _ in branches]
            counts = [_count(computations, b, c, depth + 1) for b, c in zip(branches, sub,
                                                                             strict=True)]
            if counts:
                biggest = max(range(len(counts)), key=counts.__getitem__)
                ops.update(sub[biggest])
                total += counts[biggest]
        elif op == "while":
            total += sum(_count(computations, b, ops, depth + 1) for b in ins.called("body"))
        else:
            target = _TARGET.search(ins.rest) if op == "custom-call" else None
            ops[f"custom-call:{target.group(1)}" if target else op] += 1
            total += 1
    return total


def _whiles(computations, name: str, depth: int = 0):
    """``while`` instructions reachable from ``name`` through calls (not loop bodies)."""
    for ins in computations.get(name, []) if depth < 20 else []:
        if ins.opcode == "while":
            yield ins
        elif ins.opcode == "call":
            for c in ins.called("to_apply"):
                yield from _whiles(computations, c, depth + 1)


@dataclasses.dataclass(frozen=True)
class StepKernels:
    per_step: float  # kernels (and waited-for transfers) per scan step
    ops: dict[str, int]  # what was counted in one body, by opcode (custom calls by target)
    trip_count: int | None  # iterations of the while found (None: no while left)


def kernels_per_step(hlo_text: str, steps: int) -> StepKernels:
    """Applies the counting rule of this module to a compiled scan of ``steps`` steps."""
    computations, entry = parse_computations(hlo_text)
    loops = list(_whiles(computations, entry)) if entry else []
    ops: collections.Counter = collections.Counter()
    if not loops:
        total = _count(computations, entry, ops) if entry else 0
        return StepKernels(total / steps, dict(ops), None)

    def trip(ins) -> int | None:
        found = _TRIP.search(ins.rest)
        return int(found.group(1)) if found else None

    loop = max(loops, key=lambda ins: trip(ins) or 0)
    n = trip(loop) or steps
    body_count = sum(_count(computations, b, ops) for b in loop.called("body"))
    return StepKernels(body_count * n / steps, dict(ops), trip(loop))


def describe(kernels: StepKernels) -> str:
    return json.dumps(kernels.ops, sort_keys=True)
