"""Benchmarks of pallas_pinned, one command per question (run from the repository root).

    python -m benchmarks.sweep       # one scatter call per case, against every alternative
    python -m benchmarks.loop        # per-step cost inside lax.scan, ours against XLA
    python -m benchmarks.gather_add  # gather and add against their alternatives
    python -m benchmarks.tune        # where sorting the indices starts to pay

Shared pieces: ``cases`` (what runs, in which order), ``providers`` (the
sweep's alternatives), ``timing`` (the one timing helper), ``checks`` (results
against the numpy oracles of ``pallas_pinned.testing``), ``memory`` (the
device-memory probe), ``hlo`` (kernels per step), ``report`` and ``plots``.
See benchmarks/README.md.
"""
