"""The report of an automatic mixed-precision search: Markdown (self-contained, with the plots
beside it), JSON, and PNG plots of per-layer sensitivity and of the accuracy/size front."""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._io import check_output_path, write_output
from ..errors import OutputError

#: the files write_report writes
_FILES = ("report.md", "report.json", "sensitivity.png", "front.png")

#: A mixq.search.AutoResult; read by attribute here, so that report depends on no search code
#: (search calls the report, never the other way around).
AutoResult = Any


def _fmt(v: float | None, why: str = "not measured (the search stopped early)") -> str:
    return why if v is None else f"{v:.6g}"


def bought_table(r: "AutoResult") -> list[str]:
    """The chosen plan next to the uniform baselines and the float model: weight size and metric."""
    mb = 1e6
    why = "not measured (the search stopped early)"
    wide = getattr(r, "wide_label", "") or "wide"
    narrow = getattr(r, "narrow_label", "") or "narrow"
    rows = [f"| model | weight MB | {r.metric_name} |", "|---|---|---|",
            f"| **auto (chosen)** | **{r.size_bytes / mb:.4f}** | **{r.metric:.6g}** |",
            f"| uniform {narrow} (all narrow) | {r.narrow_size_bytes / mb:.4f} | {_fmt(r.narrow_metric, why)} |",
            f"| uniform {wide} (all wide) | {r.wide_size_bytes / mb:.4f} | {_fmt(r.wide_metric, why)} |"]
    fs = getattr(r, "float_size_bytes", 0.0)
    if fs:
        rows.append(f"| float | {fs / mb:.4f} | {_fmt(r.float_metric, 'not measured')} |")
    return rows


def _narrowed(r: "AutoResult") -> int:
    """Layers at a precision narrower than the base (not float, not the base)."""
    base = r.sensitivity.candidates[0] if r.sensitivity.candidates else None
    return sum(1 for c in r.assignment.values() if c not in ("float", base))


def to_markdown(r: "AutoResult", images: list[str] | None = None) -> str:
    mb = 1e6
    message = getattr(r, "message", "")
    lines = [
        "# mixq auto mixed precision", "",
        f"**{message}**" if message else "",
        "",
        f"- target: {r.objective}" + (" (met)" if r.target_met else " (NOT met: best plan found returned)"),
        f"- {r.metric_name} on held-out data: {r.metric:.6g}"
        + (f" (float {r.float_metric:.6g})" if r.float_metric is not None else "")
        + (f"; the drop's {r.confidence:.0%} upper bound is {r.metric_margin:.3g} above the "
           "measured drop (sampling noise)" if r.metric_margin > 0 else ""),
        f"- weight size: {r.size_bytes / mb:.3f} MB (all wide {r.wide_size_bytes / mb:.3f} MB, "
        f"all narrow {r.narrow_size_bytes / mb:.3f} MB)",
        f"- layers narrowed below the base: {_narrowed(r)} of {len(r.sensitivity.layers)} "
        f"(path point {r.chosen_k} of {len(r.path_labels)})",
    ]
    if getattr(r, "widened_layers", None):
        still = [layer for layer, c in r.assignment.items() if c == "float"]
        lines.append(f"- the all-wide plan missed the target: the search started from all "
                     f"{len(r.widened_layers)} candidate layers float; {len(still)} stay float ("
                     + ", ".join(still[:8]) + (", ..." if len(still) > 8 else "") + ")")
    extra = getattr(r, "baseline_evaluations", 0)
    lines.append(f"- full-model evaluations: {r.full_evaluations} by the search"
                 + (f" (+{extra} for the baselines below)" if extra else "")
                 + f"; wall time {r.wall_seconds:.2f} s ("
                 + ", ".join(f"{k} {v:.2f} s" for k, v in r.timings.items()) + ")")
    if r.timed_out:
        lines.append("- the time budget ran out: this is the best plan found before it did")
    if r.held_out_note:
        lines.append(f"- held-out data: {r.held_out_note}")
    check = getattr(r, "check_metric", None)
    if check is not None:
        met = getattr(r, "check_met", None)
        lines.append(f"- {r.metric_name} on the check data (never searched on): {check:.6g}"
                     + ("" if met is None else " (meets the target)" if met else " (does NOT meet the target)"))
    lines += ["", "## What it bought", "", *bought_table(r)]
    lines += ["", "## Per-layer sensitivity (relative L2 of the layer output) and chosen precision", "",
              "| layer | " + " | ".join(r.sensitivity.candidates) + " | chosen |",
              "|---|" + "---|" * (len(r.sensitivity.candidates) + 1)]
    for layer in r.sensitivity.layers:
        row = r.sensitivity.err.get(layer, {})
        cells = " | ".join(f"{row[c]:.3g}" if c in row else "-" for c in r.sensitivity.candidates)
        lines.append(f"| {layer} | {cells} | {r.assignment.get(layer, r.sensitivity.candidates[0])} |")
    lines += ["", "## Evaluated plans", "", f"| path point | {r.metric_name} | meets | weight MB | seconds |",
              "|---|---|---|---|---|"]
    on_front = {e.k for e in r.front}
    for e in r.evaluations:
        if getattr(e, "label", ""):  # a point of another path (e.g. the all-wide one that missed)
            lines.append(f"| {e.label} | {e.metric:.6g} | {'yes' if e.ok else 'no'} | "
                         f"{e.size_bytes / mb:.3f} | {e.seconds:.2f} |")
            continue
        mark = " (front)" if e.k in on_front else ""
        chosen = " **chosen**" if e.k == r.chosen_k else ""
        lines.append(f"| {e.k}{mark}{chosen} | {e.metric:.6g} | {'yes' if e.ok else 'no'} | "
                     f"{e.size_bytes / mb:.3f} | {e.seconds:.2f} |")
    for img in images or []:
        lines += ["", f"![{img}]({img})"]
    return "\n".join(lines) + "\n"


def _plots(r: "AutoResult", out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are an optional extra: pip install mixq[report]
        return []
    names = []
    # wide enough to tell layers apart, bounded for models with thousands of candidate ops
    fig, ax = plt.subplots(figsize=(min(max(6.0, 0.35 * len(r.sensitivity.layers)), 24.0), 4))
    for c in r.sensitivity.candidates:
        ys = [r.sensitivity.err.get(layer, {}).get(c, float("nan")) for layer in r.sensitivity.layers]
        ax.plot(range(len(ys)), ys, marker="o", label=c)
    ax.set_yscale("log")
    ax.set_xlabel("layer (topological order)")
    ax.set_ylabel("relative L2 of the layer output")
    ax.set_title("per-layer sensitivity: relative L2 of the layer output")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "sensitivity.png", dpi=110)
    plt.close(fig)
    names.append("sensitivity.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [e.size_bytes / 1e6 for e in r.evaluations]
    ax.scatter(xs, [e.metric for e in r.evaluations], c="0.6", label="evaluated")
    fr = sorted(r.front, key=lambda e: e.size_bytes)
    ax.plot([e.size_bytes / 1e6 for e in fr], [e.metric for e in fr], "b-o", label="front")
    ax.scatter([r.size_bytes / 1e6], [r.metric], s=120, facecolors="none", edgecolors="r", label="chosen")
    for name, size, value in (("all narrow", r.narrow_size_bytes, r.narrow_metric),
                              ("all wide", r.wide_size_bytes, r.wide_metric)):
        if value is not None:
            ax.scatter([size / 1e6], [value], marker="s", c="k")
            ax.annotate(name, (size / 1e6, value), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("weight MB")
    ax.set_ylabel(r.metric_name)
    ax.set_title(f"{r.metric_name} vs weight size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "front.png", dpi=110)
    plt.close(fig)
    names.append("front.png")
    return names


def check_report_dir(out: Path, *, models: Iterable[Any] = (), inputs: Iterable[Any] = (),
                     output: Any = None) -> None:
    """Raise OutputError where `out` cannot take the report (a file; a report file there that
    is one of the input files or the `output` model's path): checked before the search, so that
    a long search does not end in that error after writing the model."""
    models, inputs = list(models), list(inputs)
    if out.exists() and not out.is_dir():
        raise OutputError(f"--report-dir {str(out)!r} is a file; give a directory (it is created "
                          "when missing).")
    if output is not None:
        target = Path(output).expanduser().resolve()
        clash = next((n for n in _FILES if (out / n).expanduser().resolve() == target), None)
        if clash is not None:
            raise OutputError(f"the output model {str(output)!r} is the report's {clash} in "
                              f"--report-dir {str(out)!r}; the report would overwrite it. Choose "
                              "another output name or report directory.")
    if out.is_dir():
        for name in _FILES:
            check_output_path(out / name, models=models, inputs=inputs, kind="report file")


def write_report(r: "AutoResult", out: Path, *, models: Iterable[Any] = (),
                 inputs: Iterable[Any] = ()) -> list[Path]:
    """Write report.md, report.json and the plots into `out`; returns the paths written.
    `models`/`inputs`: the input files, never overwritten (mixq._io.check_output_path)."""
    models, inputs = list(models), list(inputs)
    check_report_dir(out, models=models, inputs=inputs)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the report directory {str(out)!r}: {exc}") from exc
    for name in _FILES:  # all refused before any is written
        check_output_path(out / name, models=models, inputs=inputs, kind="report file")
    images = _plots(r, out)
    md = out / "report.md"
    write_output(md, to_markdown(r, images).encode(), models=models, inputs=inputs, kind="report")
    js = out / "report.json"
    data = {
        "objective": r.objective, "metric_name": r.metric_name, "metric": r.metric,
        "float_metric": r.float_metric, "target_met": r.target_met, "size_bytes": r.size_bytes,
        "wide_size_bytes": r.wide_size_bytes, "narrow_size_bytes": r.narrow_size_bytes,
        "wide_metric": r.wide_metric, "narrow_metric": r.narrow_metric,
        "assignment": r.assignment, "chosen_k": r.chosen_k, "path": r.path_labels,
        "evaluations": [e.__dict__ for e in r.evaluations], "front": [e.k for e in r.front],
        "full_evaluations": r.full_evaluations, "wall_seconds": r.wall_seconds,
        "timed_out": r.timed_out, "sensitivity": r.sensitivity.to_dict(), "timings": r.timings,
        "message": getattr(r, "message", ""), "widened_layers": getattr(r, "widened_layers", []),
        "float_size_bytes": getattr(r, "float_size_bytes", None),
        "baseline_evaluations": getattr(r, "baseline_evaluations", 0),
        "check_metric": getattr(r, "check_metric", None), "check_met": getattr(r, "check_met", None),
        "confidence": r.confidence, "metric_margin": r.metric_margin,
    }
    write_output(js, json.dumps(data, indent=1).encode(), models=models, inputs=inputs, kind="report")
    return [md, js, *(out / i for i in images)]
