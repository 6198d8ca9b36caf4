"""The formatting and plotting helpers every report of the benchmark uses, defined once so the
reports cannot drift apart: numbers, ratios and percentages as the tables print them, Markdown
rows, medians, one colour per configuration, the JSON results written atomically, and
matplotlib (headless; re-executed under Debian's python3 when the one running lacks it)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Optional

# One colour per configuration, the same in every plot.
COLORS = {"native": "#4d4d4d", "kernel-vxlan": "#1f77b4", "vnet-guest-driven": "#2ca02c",
          "vnet-polling": "#d62728", "vnet-adaptive": "#ff7f0e", "vnet-encrypted": "#9467bd",
          "vnet-encrypted-veth": "#8c564b", "vnet-kernel": "#17becf"}
NONE = "–"  # what a table shows where there is no figure


def ensure_matplotlib() -> None:
    """Debian's python3-matplotlib is installed for /usr/bin/python3; when another python3
    (pyenv, venv) runs this benchmark and lacks matplotlib, run the same module again under
    the system one (same arguments, same working directory)."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    alt = "/usr/bin/python3"
    if os.environ.get("VNET_BENCH_REEXEC") or not os.path.exists(alt):
        return
    if os.path.realpath(sys.executable) == os.path.realpath(alt):
        return
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None:
        return
    if subprocess.run([alt, "-c", "import matplotlib"], capture_output=True).returncode == 0:
        os.environ["VNET_BENCH_REEXEC"] = "1"
        os.execv(alt, [alt, "-m", spec.name, *sys.argv[1:]])


def pyplot():
    """matplotlib's pyplot, drawing to files only (ImportError when it is not installed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path) -> str:
    """Lay ``fig`` out, write it to ``path`` (PNG, 110 dpi) and free it; its file name."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


# --- numbers ----------------------------------------------------------------------------------

def med(vals) -> Optional[float]:
    """The median of the values that are there (None for none)."""
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v: Optional[float], sci_below: float = 0.0) -> str:
    """A figure with three significant digits or so (``NONE`` for no figure); magnitudes below
    ``sci_below`` in scientific notation (HPCC's rates can be tiny at small N)."""
    if v is None:
        return NONE
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a >= sci_below:
        return f"{v:.3f}"
    return f"{v:.2e}"


def sig(v, unit: str = "", digits: int = 3) -> str:
    """A float with ``digits`` significant digits, anything else as it is; "-" for None."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}{unit}"
    return f"{v}{unit}"


def ratio(v: Optional[float], ref: Optional[float], mark: str = "×", none: str = NONE) -> str:
    """``v / ref`` with two decimals and ``mark``; ``none`` where either is missing (or ref 0)."""
    if v is None or not ref:
        return none
    return f"{v / ref:.2f}{mark}"


def pct(p: Optional[float]) -> str:
    return NONE if p is None else f"{p:.0f} %"


def spread(vals, f=fmt) -> str:
    """min–max of the values, each through ``f``."""
    return f"{f(min(vals))}–{f(max(vals))}"


# --- tables and records -----------------------------------------------------------------------

def md_row(cells) -> str:
    """One row of a Markdown table."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def phases(records) -> list:
    """The phases (``record["phase"]``) in the order they first appear."""
    seen = []
    for r in records:
        if r["phase"] not in seen:
            seen.append(r["phase"])
    return seen


def write_json(path: Path, doc) -> None:
    """Write ``doc`` to ``path`` whole or not at all (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)
