"""Every code block of the README, docs/ and benchmarks/README.md is run or checked, by one rule per kind of block.

The rule (docs/architecture.md, "Docs that run"):

- A fence opens with ```python, ```bash or ```text; any other language, a bare fence, or an indented code block fails.
- ```python blocks run, in order, in one namespace per file, in a fresh working directory (a block may use what an
  earlier block of its file made). A ```text block right after a python block, with prose between that says "prints",
  is its output: the last line printed must equal the text's last line with every number masked, and exactly when
  that prose says the output is deterministic.
- ```text blocks are output, never run.
- ```bash blocks: each command (lines joined at a trailing backslash, comments dropped) must match one rule below;
  a command no rule covers fails. Commands run from the repository root.

  - the set-up command and ``pytest``: the set-up must be the README's own, character for character; ``pytest``'s
    paths must exist. Neither runs (one installs, the other is this suite);
  - ``python -m lightning_dprel fit|validate|test --config X …`` (the main job, resuming, every config): the CLI parses
    the whole command with ``--print_config`` appended, which imports every class path; nothing trains;
  - ``python -m lightning_dprel export …`` and ``python -m lightning_dprel.audit …``: every flag given is one the
    command's ``--help`` lists, and every ``configs/`` file named exists;
  - ``python -m lightning_dprel.accounting …``: runs and exits 0 (numpy only, under a second);
  - ``python benchmarks/X.py …``: the script exists, compiles, and declares every flag given (its ``add_argument``
    calls, read without running it);
  - ``bash X.sh``: the script exists and ``bash -n`` accepts it.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
SETUP = 'apt-get install -y wordnet-base && pip install torch==2.13.0 -e ".[examples,dev]"'
LANGUAGES = ("python", "bash", "text")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    prose: str  # the text between the previous block and this one


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order."""
    found, lines, i, last_end = [], path.read_text().splitlines(), 0, 0
    while i < len(lines):
        m = re.match(r"^\s*```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{path.name}:{i + 1}: a code fence is never closed"
        found.append(Block(m.group(1).strip(), "\n".join(lines[i + 1:end]) + "\n", i + 1, "\n".join(lines[last_end:i])))
        i = last_end = end + 1
    return found


def indented_code_lines(path: Path) -> list[int]:
    """Lines that open an indented (4-space) Markdown code block: after a blank line, outside fences and lists."""
    out, fenced, prev = [], False, ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("    ") and line.strip() and not prev.strip():
            out.append(n)
        prev = line
    return out


def commands(code: str) -> list[list[str]]:
    """The commands of a bash block as argument lists (continuation lines joined, comments dropped)."""
    return [argv for line in code.replace("\\\n", " ").splitlines() if (argv := shlex.split(line, comments=True))]


def _mask(line: str) -> str:
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", line.strip())


# --- bash rules ------------------------------------------------------------------------------------------------
def _run_main(main, argv: list[str]) -> tuple[object, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue()


def _flags(args: list[str]) -> list[str]:
    return [a.split("=")[0] for a in args if a.startswith("--")]


def _configs_exist(args: list[str]) -> None:
    for a in args:
        if a.startswith("configs/"):
            assert (ROOT / a).is_file(), f"{a} does not exist"


def check_fit(args: list[str]) -> None:
    from lightning_dprel.cli import main

    config = args[args.index("--config") + 1]
    assert (ROOT / config).is_file(), f"{config} does not exist"
    code, out = _run_main(main, [*args, "--print_config"])
    assert code in (0, None), f"`{' '.join(args)} --print_config` failed:\n{out[-3000:]}"
    assert "class_path" in out


def check_help_lists_flags(main, sub: list[str], args: list[str]) -> None:
    _configs_exist(args)
    code, out = _run_main(main, [*sub, "--help"])
    assert code in (0, None), out[-2000:]
    missing = [f for f in _flags(args) if f not in out]
    assert not missing, f"{' '.join(sub)} --help does not list {missing}"


def check_accounting(args: list[str]) -> None:
    from lightning_dprel.accounting.cli import main

    code, out = _run_main(main, args)
    assert code in (0, None), out[-2000:]


def check_benchmark(script: str, args: list[str]) -> None:
    path = ROOT / script
    assert path.is_file(), f"{script} does not exist"
    tree = ast.parse(path.read_text(), filename=script)  # compiles; nothing runs
    declared = {arg.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "add_argument" for arg in node.args
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
    missing = [f for f in _flags(args) if f not in declared]
    assert not missing, f"{script} declares no {missing}"
    _configs_exist(args)


def check_command(argv: list[str]) -> str:
    """Apply the rule that covers ``argv``; return the rule's name (AssertionError when none does or it fails)."""
    line = " ".join(argv)
    if argv[0] in ("apt-get", "pip"):
        assert argv == shlex.split(SETUP), f"not the README's set-up command: {line}"
        return "set-up"
    if argv[0] == "pytest":
        assert all((ROOT / a).exists() for a in argv[1:] if not a.startswith("-")), line
        return "tests"
    if argv[:2] == ["python", "-m"] and argv[2] == "lightning_dprel" and argv[3] in ("fit", "validate", "test"):
        check_fit(argv[3:])
        return "cli --print_config"
    if argv[:4] == ["python", "-m", "lightning_dprel", "export"]:
        from lightning_dprel.cli import main

        check_help_lists_flags(main, ["export"], argv[4:])
        return "--help"
    if argv[:3] == ["python", "-m", "lightning_dprel.audit"]:
        from lightning_dprel.audit.cli import main

        check_help_lists_flags(main, [], argv[3:])
        return "--help"
    if argv[:3] == ["python", "-m", "lightning_dprel.accounting"]:
        check_accounting(argv[3:])
        return "runs"
    if argv[0] == "python" and argv[1].startswith("benchmarks/") and argv[1].endswith(".py"):
        check_benchmark(argv[1], argv[2:])
        return "declared flags"
    if argv[0] == "bash" and argv[1].endswith(".sh"):
        assert (ROOT / argv[1]).is_file(), argv[1]
        subprocess.run(["bash", "-n", str(ROOT / argv[1])], check=True)
        return "bash -n"
    raise AssertionError(f"no rule covers the command `{line}`; add one to tests/test_docs_code_blocks.py")


# --- the tests ---------------------------------------------------------------------------------------------------
def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def test_the_rule_finds_blocks_commands_and_indented_code(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n\n```bash\npython benchmarks/x.py \\\n  --quick  # smoke\n```\n\n    indented code\n\n- a\n  list\n")
    (block,) = blocks(doc)
    assert block.lang == "bash" and block.line == 3 and commands(block.code) == [["python", "benchmarks/x.py", "--quick"]]
    assert indented_code_lines(doc) == [8]
    with pytest.raises(AssertionError, match="no rule covers"):
        check_command(["curl", "https://example.org"])
    with pytest.raises(AssertionError, match="declares no"):
        check_command(["python", "benchmarks/audit.py", "--no-such-flag"])
    assert _mask("ε = 7.9285 over 28 steps, δ = 1e-05") == _mask("ε = 1.5 over 3 steps, δ = 0.001")


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_every_block_is_python_bash_or_text(path):
    assert path.exists()
    bad = [f"{path.name}:{b.line}: ```{b.lang}" for b in blocks(path) if b.lang not in LANGUAGES]
    assert not bad, f"tag every fence with one of {LANGUAGES}: {bad}"
    assert not indented_code_lines(path), f"{path.name}: indented code blocks at lines {indented_code_lines(path)}; fence them"


@pytest.mark.slow
@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_every_bash_command_is_covered_by_a_rule_and_passes_it(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    for block in (b for b in blocks(path) if b.lang == "bash"):
        for argv in commands(block.code):
            try:
                check_command(argv)
            except AssertionError as err:
                raise AssertionError(f"{path.name}:{block.line}: {err}") from None


PYTHON_DOCS = [p for p in DOCS if any(b.lang == "python" for b in blocks(p))]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Each file's python blocks run once, in order, in one namespace and a fresh directory: {path: (scope, outputs)}."""
    cache: dict[Path, tuple[dict, list[tuple[Block, str]]]] = {}

    def run(path: Path):
        if path not in cache:
            here = os.getcwd()
            os.chdir(tmp_path_factory.mktemp(path.stem))
            scope: dict = {"__name__": f"docs_{path.stem}"}
            outputs = []
            try:
                for block in (b for b in blocks(path) if b.lang == "python"):
                    out = io.StringIO()
                    with contextlib.redirect_stdout(out):
                        exec(compile(block.code, f"{path.relative_to(ROOT)}:{block.line}", "exec"), scope)
                    outputs.append((block, out.getvalue()))
            finally:
                os.chdir(here)
            cache[path] = (scope, outputs)
        return cache[path]

    return run


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("path", PYTHON_DOCS, ids=_ids(PYTHON_DOCS))
def test_python_blocks_run_and_print_what_the_docs_show(path, ran):
    _, outputs = ran(path)
    printed = dict((b.line, out) for b, out in outputs)
    all_blocks = blocks(path)
    for before, shown in zip(all_blocks, all_blocks[1:]):
        if before.lang != "python" or shown.lang != "text" or "prints" not in shown.prose:
            continue
        last = [line for line in printed[before.line].splitlines() if line.strip()]
        assert last, f"{path.name}:{before.line} prints nothing, but the docs show its output at line {shown.line}"
        want = shown.code.strip().splitlines()[-1]
        if "deterministic" in shown.prose:
            assert last[-1].strip() == want.strip(), f"{path.name}:{shown.line}"
        else:
            assert _mask(last[-1]) == _mask(want), f"{path.name}:{shown.line}"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_the_quickstart_stops_within_its_budget(ran):
    scope, _ = ran(ROOT / "README.md")
    privacy, trainer = scope["privacy"], scope["trainer"]
    assert 0 < privacy.epsilon <= 4.0 and privacy.steps == trainer.global_step == 30
    assert privacy.accountant.epsilon_after(trainer.datamodule.sampling_spec, privacy.noise_multiplier, privacy.delta) > 4.0
    assert privacy.delta < 1.0 / trainer.datamodule.sampling_spec.num_nodes  # no δ ≥ 1/n warning in our own example


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_the_bring_your_own_graph_example_reads_the_files_it_wrote(ran, tmp_path, monkeypatch):
    scope, _ = ran(ROOT / "docs" / "usage.md")
    monkeypatch.chdir(tmp_path)
    scope["write_demo_files"]("my_graph")
    pair = scope["CsvGraph"]("my_graph").load()
    assert pair.train.num_nodes == 53 and pair.test.num_nodes == 27 and pair.train.edge_index.shape == (2, 52)
    (tmp_path / "my_graph" / "test_edges.txt").write_text("plant nowhere\n")
    with pytest.raises(ValueError, match="names ids missing from test_nodes.csv"):
        scope["CsvGraph"]("my_graph").load()


def test_the_readme_states_the_three_commands_unchanged():
    bash = [c for b in blocks(ROOT / "README.md") if b.lang == "bash" for c in commands(b.code)]
    assert [" ".join(c) for c in bash[:3]] == [
        SETUP.replace('"', ""), "python -m lightning_dprel fit --config configs/default.yaml", "pytest -q",
    ]
    assert SETUP in (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q " + SETUP.split("&& pip install ")[1] in ci and "\npytest -q\n" in ci  # CI runs them
