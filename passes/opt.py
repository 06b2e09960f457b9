"""`kope-opt`: run KOPE and upstream MLIR passes on `.mlir` files, with mlir-opt's conventions.

    kope-opt [options] [input.mlir | -] [-o output.mlir]

Passes come either from `--pass-pipeline='builtin.module(...)'` or from one flag per pass in
order (`--kope-outline-operators --canonicalize`); a pass with options takes them as
`--kope-apply-kernels="store=/s target=cpu"`. Errors print `file:line:col: error: ...`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from torch_mlir import ir

from kope.passes.base import PipelineElement
from kope.passes.pipeline import (
    PipelineError,
    build_pass_manager,
    format_diagnostics,
    parse_pipeline,
    split_top_level,
)

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.MULTILINE)
_EXPECTED = re.compile(
    r"//\s*expected-(error|warning|note|remark)\s*(@[+-]\d+|@above|@below)?\s*\{\{(.*?)\}\}"
)
_DRIVER_FLAGS = {"--split-input-file", "--verify-diagnostics", "--mlir-print-ir-after-all"}

USAGE = """usage: kope-opt [options] [input.mlir | -]

Runs KOPE's MLIR passes (and upstream ones) on MLIR files, like mlir-opt.

options:
  -o FILE                    write the output here (default: stdout)
  --pass-pipeline=PIPELINE   a textual pipeline, e.g. 'builtin.module(kope-outline-operators,cse)'
  --PASS[=OPTIONS]           add one pass; KOPE passes below, or any upstream MLIR pass
                             (e.g. --canonicalize); options as "key=value key=value"
  --split-input-file         treat '// -----' as separate inputs
  --verify-diagnostics       check diagnostics against expected-error/warning/note comments
  --mlir-print-ir-after-all  print the IR after every pass (to stderr)
  -h, --help                 show this help

KOPE passes:
"""


class UsageError(Exception):
    pass


@dataclass
class Invocation:
    input: str = "-"
    output: str | None = None
    pipeline: list[PipelineElement] | None = None
    split: bool = False
    verify: bool = False
    print_ir: bool = False


def parse_args(argv: list[str]) -> Invocation:
    inv = Invocation()
    flags: list[str] = []
    pipeline_text: str | None = None
    inputs: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "-o":
            if not args:
                raise UsageError("-o needs a file name")
            inv.output = args.pop(0)
        elif arg.startswith("-o") and len(arg) > 2 and not arg.startswith("--"):
            inv.output = arg[2:]
        elif arg.startswith("--pass-pipeline"):
            _, eq, value = arg.partition("=")
            if not eq:
                if not args:
                    raise UsageError("--pass-pipeline needs a pipeline")
                value = args.pop(0)
            pipeline_text = value
        elif arg in _DRIVER_FLAGS:
            inv.split |= arg == "--split-input-file"
            inv.verify |= arg == "--verify-diagnostics"
            inv.print_ir |= arg == "--mlir-print-ir-after-all"
        elif arg.startswith("--"):
            name, eq, options = arg[2:].partition("=")
            flags.append(f"{name}{{{options}}}" if eq and options else name)
        elif arg == "-" or not arg.startswith("-"):
            inputs.append(arg)
        else:
            raise UsageError(f"unknown option '{arg}'; see kope-opt --help")
    if len(inputs) > 1:
        raise UsageError(f"one input file at a time, got {len(inputs)}: {' '.join(inputs)}")
    if inputs:
        inv.input = inputs[0]
    if pipeline_text is not None and flags:
        raise UsageError("give passes either with --pass-pipeline or as flags, not both")
    text = pipeline_text if pipeline_text is not None else ",".join(flags)
    inv.pipeline = parse_pipeline(text) if text.strip() else []
    return inv


@dataclass
class Diagnostic:
    severity: str
    line: int
    col: int
    message: str


def _chunks(text: str, split: bool) -> list[tuple[int, str]]:
    """(first line number - 1, text) of each input chunk."""
    if not split:
        return [(0, text)]
    chunks, offset, last = [], 0, 0
    for match in SPLIT_MARKER.finditer(text):
        chunks.append((offset, text[last : match.start()]))
        offset += text[last : match.end()].count("\n")
        last = match.end()
    chunks.append((offset, text[last:]))
    return chunks


def _collect(err: ir.MLIRError) -> list[Diagnostic]:
    found = []
    for diag in err.error_diagnostics:
        for info, severity in [(diag, "error"), *[(n, "note") for n in diag.notes]]:
            match = re.search(r'":(\d+):(\d+)', str(info.location))
            line, col = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
            found.append(Diagnostic(severity, line, col, info.message))
    return found


def _expected(text: str) -> list[Diagnostic]:
    wanted = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for match in _EXPECTED.finditer(line):
            severity, where, message = match.groups()
            target = lineno
            if where in ("@above",):
                target = lineno - 1
            elif where in ("@below",):
                target = lineno + 1
            elif where:
                target = lineno + int(where[1:])
            wanted.append(Diagnostic(severity, target, 0, message))
    return wanted


def _verify(name: str, offset: int, got: list[Diagnostic], wanted: list[Diagnostic], err: TextIO) -> bool:
    ok = True
    unmatched = list(got)
    for want in wanted:
        hit = next(
            (g for g in unmatched if g.severity == want.severity and g.line == want.line
             and want.message in g.message),
            None,
        )
        if hit is None:
            err.write(f"{name}:{want.line + offset}: error: expected {want.severity} "
                      f"\"{want.message}\" was not produced\n")
            ok = False
        else:
            unmatched.remove(hit)
    for g in unmatched:
        if g.severity == "error":
            err.write(f"{name}:{g.line + offset}:{g.col}: error: unexpected error: {g.message}\n")
            ok = False
    return ok


def run(inv: Invocation, out: TextIO, err: TextIO) -> int:
    name = "<stdin>" if inv.input == "-" else inv.input
    try:
        text = sys.stdin.read() if inv.input == "-" else Path(inv.input).read_text()
    except OSError as e:
        err.write(f"kope-opt: cannot read {name}: {e.strerror}\n")
        return 1
    results: list[str] = []
    status = 0
    for offset, chunk in _chunks(text, inv.split):
        context = ir.Context()
        context.enable_multithreading(False)
        diagnostics: list[Diagnostic] = []
        produced: str | None = None
        try:
            module = ir.Module.parse(chunk, context)
            pm = build_pass_manager(inv.pipeline or [], context)
            if inv.print_ir:
                pm.enable_ir_printing()
            with context:
                pm.run(module.operation)
            produced = str(module)
        except ir.MLIRError as e:
            diagnostics = _collect(e)
            if not inv.verify:
                for line in format_diagnostics(e, name):
                    err.write(_shift(line, name, offset) + "\n")
                status = 1
        if inv.verify:
            if not _verify(name, offset, diagnostics, _expected(chunk), err):
                status = 1
        if produced is not None:
            results.append(produced)
    output = "// -----\n".join(results)
    if inv.output and inv.output != "-":
        Path(inv.output).write_text(output)
    else:
        out.write(output)
    return status


def _shift(line: str, name: str, offset: int) -> str:
    """Make a chunk-relative `file:line:col` absolute within the whole input file."""
    if not offset:
        return line
    match = re.match(rf"{re.escape(name)}:(\d+):(\d+):", line)
    if not match:
        return line
    return f"{name}:{int(match.group(1)) + offset}:{match.group(2)}:" + line[match.end():]


def usage() -> str:
    from kope.passes import pass_class, pass_names

    lines = [USAGE]
    for pass_name in pass_names():
        cls = pass_class(pass_name)
        options = cls.option_names()
        suffix = f"  [options: {', '.join(options)}]" if options else ""
        lines.append(f"  --{pass_name:<28} {cls.summary}{suffix}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "-help") for a in argv):
        sys.stdout.write(usage())
        return 0
    try:
        inv = parse_args(argv)
    except (UsageError, PipelineError) as e:
        sys.stderr.write(f"kope-opt: {e}\n")
        return 2
    try:
        return run(inv, sys.stdout, sys.stderr)
    except PipelineError as e:
        sys.stderr.write(f"kope-opt: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
