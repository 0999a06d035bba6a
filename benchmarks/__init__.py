"""Benchmarks of pallas_pinned, one command per question (run from the repository root).

    python -m benchmarks.one_call   # one scatter call per case, against every alternative
    python -m benchmarks.loop       # per-step cost inside lax.scan, ours against XLA
    python -m benchmarks.training   # a training step's table: device, pinned, cached

Each takes ``--quick`` (on CPU: tiny sizes, seconds). Shared: ``timing`` (the one
timing helper), ``checks`` (results against the numpy oracles of
``pallas_pinned.testing``), ``report`` (JSON, tables, progress, plots) and
``environment`` (where a result was measured). See benchmarks/README.md.
"""
