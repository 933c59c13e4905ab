"""Wall time of ``python -m lightning_dprel.accounting`` against its floor (issue 12).

The floor is a bare ``python -c "import scipy.special"`` (the interpreter plus numpy/scipy, which the accountant
needs) plus the accountant's own time (one cold per-step RDP evaluation and the conversion, timed inside a
process that already imported everything). The target is CLI ≤ 1.2 × floor; importing torch (≈ 0.9 s) alone
breaks it. Each command runs ``--repeats`` times (median reported); also lists the heavy modules the CLI loaded.

    python benchmarks/bench_accounting_cli.py [--repeats 5] [--max-degree 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _args(max_degree: int) -> list[str]:
    return ["epsilon", "--nodes", "2708", "--edges", "5000", "--max-degree", str(max_degree), "--sampling-rate", "0.01",
            "--neg-per-pos", "1", "--noise-multiplier", "1.0", "--steps", "1000", "--clipping", "freq"]


_OWN_TIME = """
import sys, time
from lightning_dprel.accounting.cli import main
from lightning_dprel.accounting import mechanisms
import io, contextlib
argv = {argv!r}
with contextlib.redirect_stdout(io.StringIO()):
    main(argv)  # warm imports and first-call costs (argparse, lazy numpy paths)
mechanisms._cached_rdp.cache_clear()
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    main(argv)
print(time.perf_counter() - t0)
"""

_HEAVY = """
import sys, io, contextlib
from lightning_dprel.accounting.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main({argv!r})
print("HEAVY=" + ",".join(sorted(m for m in ("torch", "torch_geometric", "pytorch_lightning", "transformers", "matplotlib")
                      if m in sys.modules)))
"""


def _wall(cmd: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-degree", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    argv = _args(args.max_degree)
    py = sys.executable
    bare = _wall([py, "-c", "import scipy.special"], args.repeats)
    cli = _wall([py, "-m", "lightning_dprel.accounting", *argv], args.repeats)
    own = [float(subprocess.run([py, "-c", _OWN_TIME.format(argv=argv)], cwd=ROOT, check=True, capture_output=True,
                                text=True).stdout.strip()) for _ in range(args.repeats)]
    out = subprocess.run([py, "-c", _HEAVY.format(argv=argv)], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    heavy = [line for line in out.splitlines() if line.startswith("HEAVY=")][-1][len("HEAVY="):]
    m_bare, m_cli, m_own = (statistics.median(x) for x in (bare, cli, own))
    ratio = m_cli / (m_bare + m_own)
    result = {"max_degree": args.max_degree, "repeats": args.repeats, "bare_scipy_s": m_bare, "accountant_s": m_own,
              "cli_s": m_cli, "ratio": ratio, "target": 1.2, "heavy_modules": heavy.split(",") if heavy else []}
    if args.json:
        print(json.dumps(result))
        return
    print(f"K = {args.max_degree}, median of {args.repeats} runs each")
    print(f"  bare python -c 'import scipy.special'   {m_bare:7.3f} s")
    print(f"  accountant's own time (in process)      {m_own:7.3f} s")
    print(f"  python -m lightning_dprel.accounting    {m_cli:7.3f} s")
    print(f"  ratio CLI / (bare + accountant)         {ratio:7.2f}   (target <= 1.2)")
    print(f"  heavy modules the CLI imported: {heavy or 'none'}")


if __name__ == "__main__":
    main()
