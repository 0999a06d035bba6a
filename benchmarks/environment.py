"""What a results file says about where it was measured, what a call logged, and the
command-line values the benchmarks share.

Also the one rule for optional peers: a package is *unavailable* only when
importing it fails. Anything else that goes wrong while a provider runs is an
error, recorded as such, and fails the run.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def optional_import(name: str) -> tuple[ModuleType | None, str | None]:
    """``(module, None)``, or ``(None, why)`` when importing it raises ImportError.

    For third-party packages only (torch, triton, jax_triton): an ImportError inside a
    module of ours is a bug that must fail the run, not make a provider "unavailable".
    """
    if name.split(".")[0] in ("benchmarks", "pallas_pinned"):
        raise ValueError(f"{name} is ours: import it unguarded, after its third-party deps")
    try:
        return importlib.import_module(name), None
    except ImportError as err:
        return None, f"{name} is not importable ({type(err).__name__}: {err})"[:200]


def _writable_dir(path: str | None) -> bool:
    if not path:
        return False
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def ensure_triton_cache_dir(knobs, environ=os.environ) -> str:
    """Makes triton's cache directory one that exists and is writable; returns it.

    ``knobs`` is ``triton.knobs`` (None for triton < 3.4, which reads
    ``TRITON_CACHE_DIR``). jax-triton deletes ``TRITON_CACHE_DIR`` when it is
    imported, and triton raises "Could not create or locate cache dir" when
    its directory is empty or cannot be made. Keeps the configured directory
    when it is usable; else ``$PALLAS_PINNED_TRITON_CACHE``, else a new
    temporary one.
    """
    cache = getattr(knobs, "cache", None)
    current = cache.dir if cache is not None else environ.get("TRITON_CACHE_DIR")
    if _writable_dir(current):
        return current
    chosen = environ.get("PALLAS_PINNED_TRITON_CACHE")
    if not _writable_dir(chosen):
        chosen = tempfile.mkdtemp(prefix="triton_cache_")
    if cache is not None:
        cache.dir = chosen
    environ["TRITON_CACHE_DIR"] = chosen
    return chosen


def has_gpu() -> bool:
    import jax

    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:  # jax raises this when no GPU backend is initialized
        return False


@contextlib.contextmanager
def captured_output():
    """Collects C++ log lines (fd 2) and Python warnings instead of showing them.

    XLA reports "converting to host compute" and similar through its C++
    logger, which Python's ``warnings`` never sees; redirecting the file
    descriptor catches both. Yields a dict whose ``"text"`` is filled on exit.
    """
    box = {"text": ""}
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.dup2(sink.fileno(), 2)
        try:
            yield box
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            sink.seek(0)
            lines = [sink.read().decode(errors="replace").strip()]
            lines += [f"{w.category.__name__}: {w.message}" for w in caught]
            box["text"] = "\n".join(line for line in lines if line)


def first_lines(text: str, limit: int = 400) -> str:
    """A short, one-line excerpt of captured output for a record."""
    text = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_quietly(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


_SMI_FIELDS = (
    "name",
    "driver_version",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "memory.total",
)


def nvidia_smi_info() -> dict[str, str]:
    """GPU name, driver and PCIe link of GPU 0 from ``nvidia-smi``, if present.

    The current PCIe generation drops when the GPU idles, so the maximum is
    recorded too.
    """
    if shutil.which("nvidia-smi") is None:
        return {}
    out = _run_quietly(
        ["nvidia-smi", "-i", "0", f"--query-gpu={','.join(_SMI_FIELDS)}",
         "--format=csv,noheader,nounits"]
    )
    if not out:
        return {"nvidia_smi": "query failed"}
    values = [v.strip() for v in out.splitlines()[0].split(",")]
    return {f"gpu_{k.replace('.', '_')}": v for k, v in zip(_SMI_FIELDS, values, strict=False)}


def git_revision(repo: Path = REPO) -> str | None:
    rev = _run_quietly(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
    if rev is None:
        return None
    dirty = _run_quietly(["git", "-C", str(repo), "status", "--porcelain"])
    return rev + ("+dirty" if dirty else "")


def environment(repo: Path = REPO) -> dict[str, Any]:
    """Tags for a results file: when, where, which versions, which thresholds."""
    import dataclasses

    import jax
    import jaxlib

    from pallas_pinned import tuning

    device = jax.devices()[0]
    info: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "host_cpus": os.cpu_count(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "jax_backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "git": git_revision(repo),
        "thresholds": dataclasses.asdict(tuning.current()),
        tuning.ENV: os.environ.get(tuning.ENV, ""),  # Where thresholds differ from the code's.
        # Process-wide XLA options change what a step costs (command buffers: the loop
        # section of benchmarks/README.md); a run's per-compile options are its
        # "compiler_options" (--xla-option).
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    for package in ("triton", "jax-triton", "torch"):
        info[package.replace("-", "_")] = installed_version(package)
    info.update(nvidia_smi_info())
    return info


def parse_counts(text: str) -> tuple[int, ...]:
    """``"5,1K,16M"`` -> ``(5, 1024, 16777216)``."""
    import argparse

    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for part in text.split(","):
        part = part.strip().upper()
        try:
            out.append(int(part[:-1]) * scale[part[-1]] if part[-1] in scale else int(part))
        except (ValueError, IndexError) as err:
            raise argparse.ArgumentTypeError(f"bad count {part!r} in {text!r}") from err
    if any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"counts must be positive, got {text!r}")
    return tuple(out)


def choices(allowed: tuple[str, ...]):
    """An argparse type for a comma list drawn from ``allowed``; names the bad value."""
    import argparse

    def parse(text: str) -> tuple[str, ...]:
        items = tuple(s.strip() for s in text.split(",") if s.strip())
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {bad or text!r}; choose from {allowed}")
        return items

    return parse


def add_xla_option(parser) -> None:
    """``--xla-option NAME=VALUE`` (repeatable) on ``parser``: ``args.compiler_options``, a dict.

    The options go to every compile of the run, XLA's programs and ours alike
    (``Lowered.compile(compiler_options)``), and the results record them. The one
    that matters here is ``xla_gpu_graph_min_graph_size=1``: the step's kernels run
    as one CUDA graph, as a real step's are (``benchmarks/README.md``, loop).
    """
    import argparse

    class _Collect(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            name, value = values
            setattr(namespace, self.dest, {**getattr(namespace, self.dest), name: value})

    parser.add_argument("--xla-option", dest="compiler_options", type=parse_xla_option,
                        action=_Collect, default={}, metavar="NAME=VALUE",
                        help="an XLA option for every compiled program, XLA's and ours alike "
                        "(e.g. xla_gpu_graph_min_graph_size=1: the step's kernels as one CUDA "
                        "graph, as a real step's are); repeatable")


def parse_xla_option(text: str) -> tuple[str, Any]:
    """``"name=value"`` -> ``(name, value)``, the value an int or a bool where it reads as one.

    For ``compiler_options`` of ``Lowered.compile``: XLA's debug options by name, without
    the leading dashes of ``XLA_FLAGS``.
    """
    import argparse

    name, sep, value = text.partition("=")
    name = name.strip().lstrip("-")
    if not sep or not name.startswith("xla_"):
        raise argparse.ArgumentTypeError(f"expected xla_<name>=<value>, got {text!r}")
    value = value.strip()
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    try:
        return name, int(value)
    except ValueError:
        return name, value


def installed_version(package: str) -> str | None:
    """An installed distribution's version, without importing it (None: not installed)."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
