"""Wall time of ``python -m lightning_dprel.accounting`` against its floor.

The floor is a bare ``python -c "import scipy.special"`` (the interpreter plus numpy/scipy, which the accountant
needs) plus the accountant's own time (one cold per-step RDP evaluation and the conversion, timed inside a
process that already imported everything). Targets: CLI ≤ 1.2 × floor, and the CLI at the paper's Section 5.1
defaults (n = 10⁶, m = 5·10⁶, K = 5, γ = 1e-5, σ = 0.5, k = 4, T = 10⁵, ``--clipping freq``) within 0.4 s of that bare
scipy process (a plain ``import scipy``, which loads no scipy.special, is shown too); importing torch (≈ 0.9 s) or dp-accounting (≈ 0.7 s, with scipy.signal and
scipy.stats) alone breaks them. The commands run in ``--repeats`` alternating rounds (medians reported, so a busy
machine slows all of them alike); also lists the heavy modules the CLI loaded. Writes
``benchmarks/results/accounting_cli.json``.

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
print("HEAVY=" + ",".join(sorted(m for m in ("torch", "torch_geometric", "pytorch_lightning", "transformers", "matplotlib", "dp_accounting", "scipy.stats")
                      if m in sys.modules)))
"""


SECTION_51 = ["epsilon", "--nodes", "1000000", "--edges", "5000000", "--max-degree", "5", "--sampling-rate", "1e-5",
              "--neg-per-pos", "4", "--noise-multiplier", "0.5", "--steps", "100000", "--clipping", "freq"]


def _walls(cmds: dict[str, list[str]], repeats: int) -> dict[str, list[float]]:
    """Each command once per round, the rounds alternating the order."""
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for r in range(repeats):
        for name in (list(cmds) if r % 2 == 0 else list(reversed(cmds))):
            t0 = time.perf_counter()
            subprocess.run(cmds[name], cwd=ROOT, check=True, capture_output=True)
            times[name].append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-degree", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    argv = _args(args.max_degree)
    py = sys.executable
    walls = _walls({"bare": [py, "-c", "import scipy.special"], "scipy": [py, "-c", "import scipy"],
                    "cli": [py, "-m", "lightning_dprel.accounting", *argv],
                    "section51": [py, "-m", "lightning_dprel.accounting", *SECTION_51]}, args.repeats)
    bare, cli = walls["bare"], walls["cli"]
    m_scipy, m_51 = statistics.median(walls["scipy"]), statistics.median(walls["section51"])
    own = [float(subprocess.run([py, "-c", _OWN_TIME.format(argv=argv)], cwd=ROOT, check=True, capture_output=True,
                                text=True).stdout.strip()) for _ in range(args.repeats)]
    out = subprocess.run([py, "-c", _HEAVY.format(argv=argv)], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    heavy = [line for line in out.splitlines() if line.startswith("HEAVY=")][-1][len("HEAVY="):]
    m_bare, m_cli, m_own = (statistics.median(x) for x in (bare, cli, own))
    ratio = m_cli / (m_bare + m_own)
    result = {"max_degree": args.max_degree, "repeats": args.repeats, "bare_scipy_special_s": m_bare, "accountant_s": m_own,
              "cli_s": m_cli, "ratio": ratio, "target": 1.2, "heavy_modules": heavy.split(",") if heavy else [],
              "bare_scipy_s": m_bare, "import_scipy_only_s": m_scipy, "section51_cli_s": m_51, "section51_gap_s": m_51 - m_bare,
              "section51_gap_vs_import_scipy_only_s": m_51 - m_scipy, "section51_target_gap_s": 0.4,
              "rounds_s": walls}
    (ROOT / "benchmarks" / "results" / "accounting_cli.json").write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
        return
    print(f"K = {args.max_degree}, median of {args.repeats} runs each")
    print(f"  bare python -c 'import scipy.special'   {m_bare:7.3f} s")
    print(f"  accountant's own time (in process)      {m_own:7.3f} s")
    print(f"  python -m lightning_dprel.accounting    {m_cli:7.3f} s")
    print(f"  ratio CLI / (bare + accountant)         {ratio:7.2f}   (target <= 1.2)")
    print(f"  heavy modules the CLI imported: {heavy or 'none'}")
    print(f"  Section 5.1 defaults: CLI {m_51:.3f} s vs bare python -c 'import scipy.special' {m_bare:.3f} s: "
          f"+{m_51 - m_bare:.3f} s (target <= +0.4 s); vs 'import scipy' alone ({m_scipy:.3f} s, no scipy.special, "
          f"which the RDP math needs): +{m_51 - m_scipy:.3f} s")


if __name__ == "__main__":
    main()
