"""Render docs/COMPAT.md from the translation table: `python -m mixq.compat.doc [PATH]` writes it,
`python -m mixq.compat.doc --check [PATH]` exits 1 when the file is out of date."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .table import (AUTO_MIXPRECISION, BFP_MX, EXTRA_OPTIONS, FAST_FINETUNE, QCONFIG_API, QUANTIZATION_CONFIG,
                    Entry, enum_entries)

_INTRO = """# The vendor vocabulary in mixq

Generated from `src/mixq/compat/table.py` by `python -m mixq.compat.doc`; do not edit by hand
(a test checks that this file is up to date).

Code written against the vendor's ONNX quantizer documentation runs with only its imports
changed (`from mixq.compat import ...`). Every documented name is below: **maps** names change
the result as described; **unsupported** names raise `ConfigError: <name>=<value>: unsupported:
<why> (<what to use instead>)`, except for the listed values that are what mixq does anyway (the
vendor default included). Unknown names raise with a "did you mean"; booleans must be `True` /
`False` (not strings), lists must be lists (not a single string), numbers are range-checked; op
types and node names are checked against the model when `ModelQuantizer.quantize_model` loads it.
Backticked words are `mixq.QuantConfig` fields.
"""


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _accepts(e: Entry) -> str:
    from .table import _UNSET

    vals = ([] if e.default is _UNSET else [e.default]) + [a for a in e.accept if a != e.default]
    return ", ".join(repr(v) for v in vals) if vals else "-"


def _section(title: str, entries: list[Entry], note: str = "", accepts: bool = True) -> list[str]:
    lines = [f"## {title}", ""]
    if note:
        lines += [note, ""]
    if accepts:
        lines += ["| name | kind | in mixq | accepted as is |", "|---|---|---|---|"]
        lines += [f"| `{e.name}`{f' (`{e.alias}`)' if e.alias else ''} | {e.kind} | {_cell(e.mixq)} | "
                  f"{_cell(_accepts(e)) if e.kind == 'unsupported' else ''} |" for e in entries]
    else:
        lines += ["| name | kind | in mixq |", "|---|---|---|"]
        lines += [f"| `{e.name}` | {e.kind} | {_cell(e.mixq)} |" for e in entries]
    return lines + [""]


def _presets() -> list[str]:
    from .presets import PRESET_DATA, get_default_config
    from .qconfig import QCONFIG_PRESETS, qconfig_preset

    lines = ["## Presets: `get_default_config(name)` (65 names)", "",
             "`mixq.compat.get_default_config(name)` returns a QuantizationConfig, as the vendor's "
             "(use it in `Config(global_quant_config=...)`); `mixq.get_default_config` is mixq's own "
             "and returns a QuantConfig. The vendor's presets also switch CLE on (its default "
             "`include_cle=True`): mixq.compat.ModelQuantizer runs it on every Conv pair (see `include_cle`).", "",
             "| name | in mixq |", "|---|---|"]
    for name in PRESET_DATA:
        try:
            t = get_default_config(name).translate()
            c = t.config
            what = f"activation {c.activation}, weight {c.weight}, calibration {c.calibration}"
            if c.power_of_two:
                what += f", power-of-two {c.power_of_two}"
            if t.finetune is not None:
                what += f", {t.finetune.algorithm} ({t.finetune.num_iterations} iterations, lr {t.finetune.learning_rate:g})"
            if c.layer_rules:
                what += ", layer rules " + "; ".join(f"{'/'.join(sorted(r.op_types)) or ','.join(r.nodes)} -> {r.activation}/{r.weight}" for r in c.layer_rules)
        except ConfigError as exc:
            what = f"raises: {exc}"
        lines.append(f"| `{name}` | {_cell(what)} |")
    lines += ["", "## QConfig presets (`mixq.compat.<NAME>`)", "", "| name | in mixq |", "|---|---|"]
    for name in QCONFIG_PRESETS:
        try:
            t = qconfig_preset(name).translate()
            what = f"activation {t.config.activation}, weight {t.config.weight}, calibration {t.config.calibration}"
            if t.finetune is not None:
                what += f", {t.finetune.algorithm}"
        except ConfigError as exc:
            what = f"raises: {exc}"
        lines.append(f"| `{name}` | {_cell(what)} |")
    return lines + [""]


def render() -> str:
    """The whole COMPAT.md text."""
    out = [_INTRO]
    out += _section("QuantizationConfig fields", QUANTIZATION_CONFIG)
    out += _section("extra_options keys", EXTRA_OPTIONS)
    out += _section("extra_options['AutoMixprecision'] keys", AUTO_MIXPRECISION,
                    "The walk and its measures are the vendor's (see `mixq.compat.amp`); mixq's own "
                    "search, with a relative L2 on held-out data and EvaluateFunction(model_path), is "
                    "`mixq.search.auto_quantize` / `mixq auto`.")
    out += _section("extra_options['FastFinetune'] keys (and AdaRoundConfig / AdaQuantConfig arguments)",
                    FAST_FINETUNE, "Also `mixq quantize --finetune adaround|adaquant --ft-iters N --ft-lr X`, "
                    "which builds the same config (the three spellings write the same bytes).")
    out += _section("BFPAttributes / MXAttributes keys", BFP_MX)
    out += _section("The QConfig API", QCONFIG_API, accepts=False)
    out += _section("Enum members", [Entry(e.scope, f"{e.scope}.{e.name}", e.kind, e.mixq) for e in enum_entries()],
                    accepts=False)
    out += _presets()
    return "\n".join(out)


def default_path() -> Path:
    return Path(__file__).resolve().parents[3] / "docs" / "COMPAT.md"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mixq.compat.doc",
                                 description="Write (or check) docs/COMPAT.md from the translation table.")
    ap.add_argument("path", nargs="?", default=None, help="where to write it (default: docs/COMPAT.md)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the file is out of date")
    ns = ap.parse_args(sys.argv[1:] if argv is None else argv)
    path = Path(ns.path) if ns.path else default_path()
    text = render()
    if ns.check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            print(f"{path} is out of date: run python -m mixq.compat.doc", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
