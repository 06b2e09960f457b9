"""Textual pipelines that mix upstream MLIR passes and KOPE passes, and one way to run them.

`parse_pipeline("builtin.module(kope-outline-operators,canonicalize,func.func(cse))")` gives
pipeline elements; `run_pipeline` assembles a real `PassManager` from them and, when the
pipeline fails, writes the input IR under the repro directory and names the exact `kope-opt`
command that reproduces the failure.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shlex
from pathlib import Path

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from kope.passes.base import ModulePass, PipelineElement

log = logging.getLogger("kope.passes.pipeline")

REPRO_MARKER = "reproduce with: "
"""Precedes the `kope-opt` command in a failed pipeline's message (callers look for it)."""

_LOC = re.compile(r'"([^"]*)":(\d+):(\d+)')
_NESTED_KOPE = re.compile(r"[(,]\s*(kope-[\w-]+)")  # a KOPE pass named inside a nested pipeline


class PipelineError(Exception):
    """A pipeline failed to parse or to run; the message carries diagnostics and a repro."""

    def __init__(self, message: str, diagnostics: list[str] | None = None):
        super().__init__(message)
        self.diagnostics = diagnostics or []


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside (), {}, [] and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def parse_options(text: str) -> dict[str, str]:
    """`store=/s target=cpu` → {"store": "/s", "target": "cpu"} (values may be quoted)."""
    options: dict[str, str] = {}
    for item in shlex.split(text):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise PipelineError(f"option {item!r} is not of the form key=value")
        options[key] = value
    return options


def make_pass(name: str, options_text: str = "") -> ModulePass:
    """Instantiate the KOPE pass `name` from its textual options."""
    from kope.passes import pass_class, pass_names

    try:
        cls = pass_class(name)
    except KeyError:
        raise PipelineError(
            f"unknown KOPE pass '{name}'; KOPE passes are: {', '.join(pass_names())}"
        ) from None
    try:
        return cls.from_options(parse_options(options_text))
    except ValueError as err:
        raise PipelineError(str(err)) from None


def parse_pipeline(text: str) -> list[PipelineElement]:
    """Parse `builtin.module(...)` (or a bare comma list) into upstream strings and KOPE passes."""
    from kope.passes import pass_names

    body = text.strip()
    if body.count("(") != body.count(")") or body.count("{") != body.count("}"):
        raise PipelineError(f"unbalanced parentheses or braces in the pipeline {body!r}")
    if body.startswith("builtin.module(") and body.endswith(")"):
        body = body[len("builtin.module(") : -1]
    elements: list[PipelineElement] = []
    kope = set(pass_names())
    for item in split_top_level(body):
        name = re.split(r"[{(]", item, maxsplit=1)[0].strip()
        if name in kope or name.startswith("kope-"):
            options = ""
            if "{" in item:
                if not item.endswith("}"):
                    raise PipelineError(f"malformed options in pipeline element {item!r}")
                options = item[item.index("{") + 1 : -1]
            elements.append(make_pass(name, options))
        elif (nested := _NESTED_KOPE.search(item)) is not None:
            raise PipelineError(
                f"KOPE passes run on the whole module: put '{nested.group(1)}' at the top level "
                f"of builtin.module(...), not inside '{item}'"
            )
        else:
            elements.append(item)
    return elements


def pipeline_text(elements: list[PipelineElement]) -> str:
    return "builtin.module(" + ",".join(str(e) for e in elements) + ")"


def build_pass_manager(elements: list[PipelineElement], context: ir.Context) -> PassManager:
    with context:
        pm = PassManager("builtin.module")
        for element in elements:
            if isinstance(element, str):
                try:
                    pm.add(element)
                except ValueError as err:
                    raise PipelineError(
                        f"cannot add pipeline element '{element}': {err}".strip()
                    ) from None
            else:
                element.add_to(pm)
    return pm


def format_diagnostics(err: ir.MLIRError, filename: str = "-") -> list[str]:
    """`file:line:col: error: message` lines (notes included) for an MLIR error."""
    lines = []
    for diag in err.error_diagnostics:
        lines.append(_format_one(diag, filename, "error"))
        for note in diag.notes:
            lines.append(_format_one(note, filename, "note"))
    if not lines:
        lines.append(f"{filename}: error: {err.message}")
    return lines


def _format_one(diag: ir.DiagnosticInfo, filename: str, kind: str) -> str:
    match = _LOC.search(str(diag.location))
    if match and match.group(2) != "0":
        file, line, col = match.groups()
        file = filename if file in ("-", "<stdin>", "") else file
        return f"{file}:{line}:{col}: {kind}: {diag.message}"
    return f"{filename}: {kind}: {diag.message}"


def run_pipeline(
    module: ir.Module,
    elements: list[PipelineElement],
    *,
    description: str,
    repro_dir: Path | None = None,
) -> None:
    """Run `elements` on `module` in place; on failure raise `PipelineError` with a repro file."""
    from kope.vocabulary.home import kope_home

    before = module.operation.get_asm(enable_debug_info=True)
    context = module.context
    try:
        pm = build_pass_manager(elements, context)
        with context:
            pm.run(module.operation)
        return
    except ir.MLIRError as err:
        diagnostics = format_diagnostics(err)
    except PipelineError:
        raise
    text = pipeline_text(elements)
    directory = (repro_dir or kope_home() / "repro").expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256((text + before).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", description).strip("-")[:48] or "pipeline"
    path = directory / f"{slug}-{digest}.mlir"
    path.write_text(before)
    command = f"kope-opt --pass-pipeline={shlex.quote(text)} {shlex.quote(str(path))}"
    summary = "\n".join(diagnostics)
    # Callers turn this error into data (a failed attempt, an eager fallback) and some keep only
    # its first line, so the command is logged too. At info, not warning: the partitioner
    # probes torch-mlir with pipelines that are expected to fail, and those must stay quiet.
    log.info("%s failed; %s%s", description, REPRO_MARKER, command)
    raise PipelineError(f"{description} failed:\n{summary}\n{REPRO_MARKER}{command}", diagnostics)
