"""Command line of the converters, shared by ``python -m mixq.tools.convert_*`` and ``mixq convert``.

```
python -m mixq.tools.convert_fp32_to_bf16 --input A.onnx --output B.onnx --format with_cast|bf16|simulate_bf16|customqdq
python -m mixq.tools.convert_fp16_to_bf16 --input A.onnx --output B.onnx --format ...
python -m mixq.tools.convert_fp32_to_fp16 --input A.onnx --output B.onnx --format fp16|with_cast|simulate_fp16
mixq convert bf16 --input A.onnx --output B.onnx --format bf16 [--from auto|fp32|fp16]
mixq convert fp16 --input A.onnx --output B.onnx
```
Exit status: 0 on success, 2 on a MixqError (the message goes to stderr as ``error: ...``).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .._io import check_output_path, save_model, write_output
from ..errors import OutputError, DataError, MixqError

__all__ = ["add_convert_subparser", "run_convert", "convert_main", "build_parser", "add_arguments",
           "parse_shapes"]

_FORMATS_HELP = {
    "bf16": "with_cast | bf16 | simulate_bf16 | customqdq (default: %(default)s)",
    "fp16": "fp16 | with_cast | simulate_fp16 (default: %(default)s)",
}


def add_arguments(p: argparse.ArgumentParser, target: str, *, source_default: str = "auto",
                  source_choice: bool = True, format_default: str | None = None,
                  positional: bool = False) -> None:
    """Add the converter options to parser `p` (`target`: 'bf16' or 'fp16'). `positional`: the
    input and output are positional (`mixq convert bf16 IN OUT`) instead of --input/--output
    (the documented module entry points)."""
    if positional:
        p.add_argument("input", help="input .onnx model")
        p.add_argument("output", help="output .onnx model (never the input)")
    else:
        p.add_argument("--input", "-i", required=True, help="input .onnx model")
        p.add_argument("--output", "-o", required=True, help="output .onnx model (never the input)")
    p.add_argument("--format", "-f", default=format_default or ("with_cast" if target == "bf16" else "fp16"),
                   help=_FORMATS_HELP[target])
    if source_choice:
        p.add_argument("--from", dest="source", default=source_default,
                       help="source precision: auto | fp32 | fp16 (default: %(default)s; auto = fp16 "
                            "if any weight or input is float16)")
    else:
        p.set_defaults(source=source_default)
    p.add_argument("--provider", default="auto",
                   help="onnxruntime execution provider the result must load on, and whose kernels "
                        "decide which nodes stay float in the bf16/fp16 formats (default: auto = CUDA or "
                        "ROCm when this onnxruntime has them, for the bf16/fp16 formats; else CPU)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="input shape for the fidelity check (repeatable; NAME= may be omitted for a "
                        "single-input model); dynamic dimensions default to 1")
    p.add_argument("--no-eval", action="store_true", help="skip the fidelity check on random inputs")
    p.add_argument("--strict", action="store_true",
                   help="exit 2 and write nothing when the fidelity check fails (an output below 10 dB "
                        "SQNR or a differing label, or no output it could compare)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random evaluation inputs")
    p.add_argument("--external-data", action="store_true",
                   help="store weights in <output>.data (automatic above ~1.8 GB)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    p.set_defaults(target=target)


#: `--help` epilog: what each bf16 format stores and runs (docs/BF16.md has the full table).
BF16_FORMATS_EPILOG = """bf16 formats (graph inputs/outputs keep their type in all four):
  with_cast      weights rounded to bf16 values (stored float32); a Cast pair on every activation,
                 so each op reads bf16-rounded values; float32 arithmetic; runs on any provider
  customqdq      as with_cast, with BFloat16Quantize/Dequantize functions (in the file, no library)
                 instead of Casts; weights stored as bf16 (half size); runs on any provider
  simulate_bf16  only the weights change (rounded to bf16 values, stored float32); runs anywhere
  bf16           weights stored as bf16; nodes compute in bf16 where --provider has a bf16 kernel
                 (CUDA/ROCm: most; CPU: few, e.g. Transpose/Reshape), the others in float32;
                 --provider auto targets CUDA/ROCm when onnxruntime has them, else CPU
Numerically fragile parts (written-out LayerNorm/RMSNorm internals, one-element weights) stay
float32 in every format; the report lists what stayed float and why, per op type."""


def build_parser(target: str, *, prog: str | None = None, source_default: str = "auto",
                 source_choice: bool = True, description: str | None = None) -> argparse.ArgumentParser:
    """A stand-alone parser for one converter tool."""
    p = argparse.ArgumentParser(prog=prog, description=description or __doc__.split("\n\n")[0],
                                epilog=BF16_FORMATS_EPILOG if target == "bf16" else None,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, target, source_default=source_default, source_choice=source_choice)
    return p


def parse_shapes(items: Sequence[str], input_names: Sequence[str] | None = None) -> dict[str, list[int]]:
    """Parse ``NAME=1,3,224,224`` items (or a bare ``1,3,224,224`` for a single-input model)."""
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        if not sep:
            if not input_names or len(input_names) != 1:
                raise DataError(f"--shape {item!r} gives no input name and the model has "
                                f"{len(input_names or [])} inputs; write --shape NAME={item}.")
            name = input_names[0]
        try:
            shapes[name] = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError as exc:
            raise DataError(f"--shape {item!r}: dimensions must be integers, e.g. --shape input=1,3,224,224.") from exc
    return shapes


def run_convert(args: argparse.Namespace) -> int:
    """Handler of the converter commands: convert, save, print the Markdown report. Returns 0."""
    from .._io import load_model
    from .api import to_bf16, to_fp16

    check_output_path(args.output, models=[args.input], kind="--output")  # before any work
    if args.json:
        from .._io import same_path

        check_output_path(args.json, models=[args.input], kind="--json report", example="report.json")
        if same_path(args.json, args.output):
            raise OutputError(f"--json {args.json!r} is the --output model; refusing to replace it "
                              "with the JSON report. Choose a different path, e.g. report.json.")
    model = load_model(args.input)
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    shapes = parse_shapes(args.shape, names)
    fn = to_bf16 if args.target == "bf16" else to_fp16
    from .._progress import Progress

    with Progress("converting", 2, "steps") as prog:  # convert (+ fidelity check), save
        out, report = fn(model, args.format, source=args.source, provider=args.provider,
                         evaluate=not args.no_eval, shapes=shapes, seed=args.seed, strict=args.strict)
        prog.update()
        path = save_model(out, args.output, external=True if args.external_data else None,
                          protect=args.input)
        prog.update()
    print(report.to_markdown())
    print(f"saved {path}")
    for w in report.warnings:  # also where a script reading only stderr sees it
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        # never onto the input, its data or the model just written; inf SQNR is written as Infinity
        write_output(args.json, json.dumps(report.to_dict(), indent=2).encode(),
                     models=[args.input], written=[path], kind="--json report", example="report.json")
    return 0


def convert_main(argv: Sequence[str] | None = None, *, target: str = "bf16", source: str = "auto",
                 source_choice: bool = True, prog: str | None = None) -> int:
    """Entry point of the stand-alone tools: parse `argv`, convert, return the exit status
    (0 ok, 2 on a MixqError with ``error: ...`` on stderr)."""
    parser = build_parser(target, prog=prog, source_default=source, source_choice=source_choice)
    args = parser.parse_args(argv)
    try:
        code = run_convert(args)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
        return code
    except BrokenPipeError:  # `... | head -1`: end quietly, as `mixq` does
        from .._progress import stdout_closed

        return stdout_closed()
    except MixqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def add_convert_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``convert bf16|fp16`` to a parent CLI. Each leaf parser sets ``func=run_convert``, so the
    parent calls ``args.func(args)`` and maps MixqError to its exit status."""
    conv = subparsers.add_parser("convert", help="convert a float model to bf16 or fp16",
                                 description="Convert a float32/float16 model to bfloat16 or float16.")
    sub = conv.add_subparsers(dest="convert_target", metavar="{bf16,fp16}")
    sub.required = True
    b = sub.add_parser("bf16", help="to bfloat16: with_cast | bf16 | simulate_bf16 | customqdq",
                       epilog=BF16_FORMATS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(b, "bf16", positional=True)
    b.set_defaults(func=run_convert)
    f = sub.add_parser("fp16", help="float32 to float16: fp16 | with_cast | simulate_fp16")
    add_arguments(f, "fp16", source_default="fp32", source_choice=False, positional=True)
    f.set_defaults(func=run_convert)
    return conv
