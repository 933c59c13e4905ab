"""Plain answers to command-line mistakes: one short ``error:`` line that names the fix, exit code 2, no usage dump.

:class:`PlainParser` is the CLI's parser: abbreviated options are refused (``--trainer.max_step`` is not taken as
``--trainer.max_steps``) with the full name suggested, and jsonargparse's nested report of a bad value (a Union of
every type and subclass tried) is condensed by :func:`condense` to the key, the class it belongs to, the type expected
and the value given. :func:`yaml_problem` and :func:`accelerator_problem` are checked before anything is built.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from pytorch_lightning.cli import LightningArgumentParser

__all__ = ["PlainParser", "condense", "yaml_problem", "accelerator_problem"]

_TYPES = {"float": "a number", "int": "an integer", "bool": "true or false", "str": "a string", "dict": "a mapping",
          "list": "a list", "NoneType": "null"}
_NODE = (("key", re.compile(r'Parser key "([^"]+)":')), ("class", re.compile(r"Problem with given class_path '([^']+)':")),
         ("option", re.compile(r"Option '([^']+)' is not accepted")))
_NOISE = re.compile(r"^(Does not validate|Subtypes:|Errors:|Given value type:|Expected a path but|Not a valid subclass|"
                    r"Subclass types expect|a class path|a dict with|a dict without)")


def _nodes(lines: list[str]) -> list[tuple[int, int, str, str]]:
    """(line, depth, kind, name) of every ``Parser key``, ``class_path`` and ``Option ... not accepted`` line."""
    found = []
    for i, line in enumerate(lines):
        body = line.lstrip(" -")
        for kind, pattern in _NODE:
            m = pattern.match(body)
            if m:
                found.append((i, len(line) - len(body), kind, m.group(1)))
    return found


def _block(lines: list[str], start: int, depth: int) -> list[str]:
    """The lines under ``lines[start]`` (deeper than ``depth``), stripped."""
    out = []
    for line in lines[start + 1:]:
        body = line.lstrip(" -")
        if len(line) - len(body) <= depth:
            break
        out.append(body)
    return out


def _given(lines: list[str], start: int, depth: int) -> str | None:
    given = [b[len("Given value: "):] for b in _block(lines, start, depth) if b.startswith("Given value: ")]
    got = [m.group(1) for b in _block(lines, start, depth) for m in [re.search(r"Got value: (.*)$", b)] if m]
    return (given or got or [None])[-1]


def _index(lines: list[str], key: tuple[int, int, str, str], class_path: str, inner: str | None) -> int | None:
    """The position of ``class_path`` in the list given to ``key`` (e.g. which of ``trainer.callbacks``)."""
    given = _given(lines, key[0], key[1])
    if not given or not given.startswith("["):
        return None
    short = class_path.rpartition(".")[2]
    try:
        items = ast.literal_eval(given)
        paths = [str(it.get("class_path", "")) if isinstance(it, dict) else "" for it in items]
    except (ValueError, SyntaxError):  # some items shown as Namespace(...): their class paths in order
        items, paths = None, re.findall(r"class_path(?:': |=)'([^']+)'", given)
    hits = [i for i, path in enumerate(paths) if path.rpartition(".")[2] == short]
    if len(hits) > 1 and inner and items is not None:
        hits = [i for i in hits if inner in (items[i].get("init_args") or {})] or hits
    return hits[0] if hits else None


def _expected(block: list[str]) -> str:
    types, literals = [], []
    for body in block:
        types += re.findall(r"Expected a <class '([\w.]+)'>", body)
        m = re.search(r"Expected a typing\.Literal\[(.*)\]", body)
        if m:
            literals += [v.strip() for v in m.group(1).split(",")]
    named = [_TYPES.get(t, t.rpartition(".")[2]) for t in dict.fromkeys(types) if t != "NoneType" or len(set(types)) == 1]
    if literals:
        named.append("one of " + ", ".join(dict.fromkeys(literals)))
    return " or ".join(named)


def _options(class_path: str) -> list[str]:
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    except Exception:  # noqa: BLE001 - a suggestion is a nicety
        return []


def condense(message: str) -> str | None:
    """jsonargparse's report of a bad value, in one line: ``<key> (in <Class>): expected <type>, got <value>``; None
    when ``message`` is not such a report."""
    lines = [line for line in message.splitlines() if line.strip()]
    nodes = _nodes(lines)
    leaves = [n for n in nodes if n[2] in ("key", "option")]
    if not leaves:
        return None
    leaf = max(leaves, key=lambda n: n[1])
    chain = [leaf]
    for n in reversed(nodes[: nodes.index(leaf)]):
        if n[1] < chain[-1][1]:
            chain.append(n)
    chain.reverse()
    path, classes, after_class = "", [], False
    for pos, (i, depth, kind, name) in enumerate(chain):
        if kind == "class":
            parent = chain[pos - 1] if pos else None
            inner = chain[pos + 1][3] if pos + 1 < len(chain) else None
            at = _index(lines, parent, name, inner) if parent is not None else None
            path += f"[{at}]" if at is not None else ""
            classes.append(name)
            after_class = True
        else:
            path = f"{path}.init_args.{name}" if after_class else (f"{path}.{name}" if path else name)
            after_class = False
    where = f" (in {classes[-1].rpartition('.')[2]})" if classes else ""
    if leaf[2] == "option":
        options = _options(classes[-1]) if classes else []
        close = difflib.get_close_matches(leaf[3], options, n=1)
        hint = f"; did you mean {path.rpartition('.')[0]}.{close[0]}?" if close else (
            f"; it takes {', '.join(options)}" if options else "")
        return f"{path}: no such option{where}{hint}"
    block = _block(lines, leaf[0], leaf[1])
    expected, value = _expected(block), _given(lines, leaf[0], leaf[1])
    if expected and value is not None:
        return f"{path}{where}: expected {expected}, got {value!r}"
    details = [b for b in block if not _NOISE.match(b) and not _NODE[1][1].match(b) and not b.startswith("Given value")]
    return f"{path}{where}: " + "; ".join(details or ["invalid value"]) + (f" (got {value!r})" if value is not None else "")


def _option_names(parser: Any) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def _suggest(message: str, parser: Any) -> str | None:
    """An unknown (or abbreviated) option, with the full name it most resembles."""
    m = re.match(r"unrecognized arguments: (\S+)", message)
    if m:
        given = m.group(1).split("=", 1)[0]
        names = _option_names(parser)
        starts = [n for n in names if n.startswith(given)]
        close = starts[:1] if len(starts) == 1 else difflib.get_close_matches(given, names, n=1, cutoff=0.6)
        if close:
            return f"unknown option {given}: did you mean {close[0]}? (abbreviations are not accepted: give the full name)"
        return f"unknown option {given}; python -m lightning_dprel <subcommand> --help lists the options"
    m = re.search(r"(Group|Subcommand) '([^']+)' does not accept option '([^']+)'", message)
    if m:  # a key of a config file
        kind, owner, key = m.groups()
        key = f"{owner}.{key}" if kind == "Group" else key
        close = difflib.get_close_matches(key, [n[2:] for n in _option_names(parser)], n=1, cutoff=0.6)
        return f"{key} is no option of {owner}" + (f": did you mean {close[0]}?" if close else "")
    return None


class PlainParser(LightningArgumentParser):
    """The CLI's parser: no abbreviated options; errors as one plain line (see :mod:`lightning_dprel.cli_errors`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        plain = _suggest(message, parser) or condense(message) or message
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {plain}\n(all options: {prog} --help)\n")
        self.exit(2)


def yaml_problem(argv: list[str]) -> str | None:
    """The first ``--config`` file of ``argv`` that is not valid YAML: its path, line, column and the problem."""
    import yaml

    for i, arg in enumerate(argv):
        path = argv[i + 1] if arg in ("-c", "--config") and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--config=") else None)
        if not path or not Path(path).is_file():
            continue
        try:
            yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as e:
            mark, context = getattr(e, "problem_mark", None), getattr(e, "context", None)
            at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            opened = getattr(e, "context_mark", None)
            if context and opened is not None:
                context += f" (opened at line {opened.line + 1}, column {opened.column + 1})"
            what = ": ".join(str(s) for s in (getattr(e, "problem", None), context) if s) or str(e)
            return f"{path}{at}: not valid YAML: {what}"
    return None


def accelerator_problem(accelerator: Any) -> str | None:
    """A GPU asked for (``gpu`` / ``cuda``) where torch sees none."""
    import torch

    if isinstance(accelerator, str) and accelerator.lower() in ("gpu", "cuda") and not torch.cuda.is_available():
        return (f"trainer.accelerator is {accelerator!r} but no GPU is visible to torch here (torch.cuda.is_available() "
                "is False): use --trainer.accelerator cpu (or auto, which takes a GPU when there is one)")
    return None
