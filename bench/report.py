"""The benchmark report: docs/BENCHMARKS.md (generated, never hand-edited) and one PNG per model
(accuracy vs model size, every tool and preset a point), from a suite's results JSON.

    python -m bench --report-only [--suite quick]      # regenerate from bench/results/quick.json
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from .tools import INT8_ACT_PRESETS, INT_PRESETS, supports

#: The performance goals, as (description, threshold).
GOAL_QTIME = 0.5  # mixq quantize wall time / onnxruntime's, same preset
GOAL_FLOOR = 3.0  # integer presets: quantize wall time / (one float pass over the calibration data + save)
GOAL_INT8_LAT = 1.05  # mixq int8 output latency / onnxruntime's output latency
GOAL_SIM_LAT = 3.0  # simulated (BF16/BFP/MX) output latency / float model latency

TOOL_NAMES = {"mixq": "mixq", "ort": "onnxruntime", "quark": "AMD Quark", "float": "float"}


def _f(v: Any, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{nd}f}"


def _metric_fmt(v: Any, metric: str) -> str:
    if v is None:
        return "-"
    return f"{v:.4f}" if "cosine" in metric else f"{v:.2f}"


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" ✓" if ok else " ✗")


def derived(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows with the goal ratios added (``q_ratio``, ``floor_ratio`` (quantize time over the
    case's floor: one float pass over the calibration data plus the save), ``lat_ratio``/``lat_ref``,
    ``metric_delta`` / ``metric_delta_noopt`` vs the best peer), for tools other than onnxruntime
    (``floor_ratio`` for every tool)."""
    rows = [dict(r) for r in results.get("rows", [])]
    for r in rows:  # loads but cannot run: a failure too
        if r.get("ok") and r.get("metric_opt") is None and r.get("metric_opt_error"):
            r["ok"] = False
            r["error"] = ("loads in onnxruntime but fails at run time: "
                          + str(r["metric_opt_error"]).split(" Status Message:")[0])
            r["where"] = r.get("metric_opt_where")
            r["traceback"] = r.get("metric_opt_traceback")
    by = {(r["model"], r["preset"], r["tool"]): r for r in rows}
    for r in rows:
        floor = results["cases"].get(r["model"], {}).get("floor_s")
        if r.get("ok") and r.get("quantize_s") and floor:
            r["floor_ratio"] = r["quantize_s"] / floor
        if not r.get("ok") or r["tool"] == "ort":
            continue
        case = results["cases"].get(r["model"], {})
        ort = by.get((r["model"], r["preset"], "ort"))
        ort_ok = ort is not None and ort.get("ok")
        if ort_ok and ort.get("quantize_s"):
            r["q_ratio"] = r["quantize_s"] / ort["quantize_s"]
        peers = [p for (m, pr, t), p in by.items()
                 if m == r["model"] and pr == r["preset"] and t != r["tool"] and p.get("ok")]
        for key, out in (("metric_opt", "metric_delta"), ("metric_noopt", "metric_delta_noopt")):
            vals = [p[key] for p in peers if p.get(key) is not None]
            if vals and r.get(key) is not None:
                r[out] = r[key] - max(vals)
        lat = r.get("latency_ms")
        if lat is None:
            continue
        if r["preset"] in INT_PRESETS and ort_ok and ort.get("latency_ms"):
            r["lat_ratio"], r["lat_ref"] = lat / ort["latency_ms"], "ORT"
            r["lat_goal"] = GOAL_INT8_LAT if r["preset"] in INT8_ACT_PRESETS else None
        elif r["preset"] not in INT_PRESETS and case.get("float", {}).get("latency_ms"):
            r["lat_ratio"], r["lat_ref"] = lat / case["float"]["latency_ms"], "float"
            r["lat_goal"] = GOAL_SIM_LAT
    return rows


# ------------------------------------------------------------------------------------- plots
def plot_case(results: dict[str, Any], rows: list[dict[str, Any]], model: str, path: Path) -> bool:
    """Accuracy (default optimizations) vs size for one model; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    case = results["cases"][model]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    style = {"mixq": ("o", "tab:blue"), "ort": ("s", "tab:orange"), "quark": ("^", "tab:green")}
    fl = case.get("float", {})
    if fl.get("metric_opt") is not None:
        ax.scatter([case["float_size_mb"]], [fl["metric_opt"]], marker="*", s=160, c="black",
                   label="float", zorder=3)
    for tool, (marker, color) in style.items():
        pts = [r for r in rows if r["model"] == model and r["tool"] == tool and r.get("ok")
               and r.get("metric_opt") is not None]
        if not pts:
            continue
        ax.scatter([r["size_mb"] for r in pts], [r["metric_opt"] for r in pts], marker=marker,
                   c=color, s=50, label=TOOL_NAMES[tool], zorder=2, alpha=0.85)
        groups: dict[tuple[float, float], list[dict[str, Any]]] = {}
        for r in pts:  # coinciding points get one label, e.g. "A8W8/U8S8"
            groups.setdefault((round(math.log10(r["size_mb"]), 1), round(r["metric_opt"])), []).append(r)
        for grp in groups.values():
            ax.annotate("/".join(r["preset"] for r in grp), (grp[0]["size_mb"], grp[0]["metric_opt"]),
                        textcoords="offset points", xytext=(4, 4 if tool == "mixq" else -10),
                        fontsize=7, color=color)
    ax.set_xscale("log")
    ax.set_xlabel("model file size (MB, log scale)")
    ax.set_ylabel(case["metric"] + " (default optimizations)")
    ax.set_title(f"{case['title']}: {case['metric']} vs size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------- markdown
def _row_cells(r: dict[str, Any], metric: str) -> list[str]:
    tool = TOOL_NAMES.get(r["tool"], r["tool"])
    if not r.get("ok"):
        err = str(r.get("error", "failed")).replace("|", "\\|").replace("\n", " ")[:220]
        where = f" ({r['where']})" if r.get("where") else ""
        return [r["preset"], tool, f"**failed**: {err}{where}"] + [""] * 10
    q = _f(r.get("quantize_s"))
    qr = f"{_f(r.get('q_ratio'))}{_mark(r['q_ratio'] <= GOAL_QTIME)}" if "q_ratio" in r else "-"
    lat = _f(r.get("latency_ms"), 3)
    if "lat_ratio" in r:
        goal = r.get("lat_goal")
        lr = f"{_f(r['lat_ratio'])} vs {r['lat_ref']}{_mark(None if goal is None else r['lat_ratio'] <= goal)}"
    else:
        lr = "-"
    d = r.get("metric_delta")
    dm = "-" if d is None else f"{d:+.2f}{_mark(d >= -1e-9)}"
    dn = r.get("metric_delta_noopt")
    dm += "" if dn is None else f" / {dn:+.2f}"
    notes = r.get("settings", "")
    if r.get("warnings"):
        notes += "; warns: kernels disagree (no VNNI)" if any("VNNI" in w for w in r["warnings"]) \
            else f"; {len(r['warnings'])} warning(s)"
    guard = r.get("guard") or {}
    if guard.get("broken") or guard.get("likely_loss"):
        named = [c["tensor"] for c in guard.get("culprits", [])]
        named += [f"{len(g['tensors'])} {g['kind']}s together" for g in guard.get("damage_groups", [])]
        notes += ("; guard: WARNS looks broken" if guard.get("broken") else
                  "; guard: WARNS likely loses > 5 points") + (f" (names {', '.join(named)})" if named else "")
    fr = "-" if "floor_ratio" not in r else \
        f"{_f(r['floor_ratio'])}{_mark(r['floor_ratio'] <= GOAL_FLOOR) if _floor_goal(r) else ''}"
    return [r["preset"], tool, q, qr, fr, _f(r.get("peak_rss_mb"), 0), _f(r.get("size_mb"), 3), lat,
            lr, _metric_cell(r, "metric_opt", metric), _metric_cell(r, "metric_noopt", metric),
            dm, notes.replace("|", "\\|")]


def _floor_goal(r: dict[str, Any]) -> bool:
    """Whether the floor goal applies to row r: mixq's integer presets (issue 19)."""
    return r["tool"] == "mixq" and r["preset"] in INT_PRESETS


def _metric_cell(r: dict[str, Any], key: str, metric: str) -> str:
    """The metric, with the prefix it covers when the evaluation budget cut it short."""
    if r.get(key) is None:
        err = r.get(f"{key}_error")
        return f"failed: {str(err)[:80]}" if err else "-"
    cell = _metric_fmt(r[key], metric)
    if r.get(f"{key}_units"):
        done, total = r[f"{key}_units"]
        cell += (f" ({done}/{total} batches; float there "
                 f"{_metric_fmt(r.get(f'{key}_float_same_units'), metric)})")
    return cell


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(c) + " |" for c in rows)]


def _runs_line(results: dict[str, Any]) -> str:
    """Which command(s) produced the results, when, and how long they took."""
    runs = results.get("runs") or [{"command": results.get("command"), "started": results.get("started"),
                                    "wall_s": results.get("wall_s")}]
    parts = [f"`{r['command']}` on {r['started']} ("
             + (f"{float(r['wall_s']):.0f} s wall" if r.get("wall_s") is not None else
                "interrupted: its rows up to then were kept") + ")" for r in runs]
    return f"Suite **{results['suite']}**, generated by " + "; then ".join(parts) + "."


def _load_line(results: dict[str, Any]) -> str:
    """The 1-minute load average seen when each run started: timings are only comparable on
    an otherwise idle machine."""
    loads = [r["loadavg_1m"] for r in results.get("rows", []) if r.get("loadavg_1m") is not None]
    if not loads:
        return "**Load**: not recorded."
    cores = results["machine"].get("cores") or 1
    busy = max(loads) > 1.5 * cores
    return (f"**Load** (1-minute load average when each quantization started): {min(loads):.1f} to "
            f"{max(loads):.1f} on {cores} cores"
            + (" — **the machine was shared with other work during this run, so absolute times and "
               "latencies are inflated and noisy; ratios between tools measured back to back are "
               "more robust than absolute figures.**" if busy else "."))


def render_markdown(results: dict[str, Any], plots: dict[str, str]) -> str:
    """The whole report as Markdown."""
    m = results["machine"]
    rows = derived(results)
    v = m.get("versions", {})
    lines = [
        "# Benchmarks: mixq and its peers on real models",
        "",
        f"<!-- GENERATED by `{results.get('command', 'python -m bench')}`; do not edit by hand. "
        "Regenerate with `make bench` (quick suite) or `python -m bench --suite full`. -->",
        "",
        _runs_line(results) + f" mixq at git `{m.get('git')}`. This file is written by "
        "`bench/report.py`; do not edit it by hand.",
        "",
        "**Machine**: " + f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('os')}, Python "
        f"{m.get('python')}. SIMD flags: {' '.join(m.get('simd_flags', [])) or '-'}. "
        f"VNNI: **{'yes' if m.get('vnni') else 'no'}**"
        + ("" if m.get("vnni") else " (so every tool gets `reduce_range` for the 8-bit activation "
           "presets A8W8, U8S8, XINT8: onnxruntime's fused u8s8 kernels saturate otherwise)") + ".",
        "",
        _load_line(results),
        "",
        "**Versions**: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".",
        "",
        "**Method**: each quantization runs in a fresh Python process (imports count): "
        "*quantize s* is the wall time from process start to the output file written, *peak RSS* "
        "is `resource.getrusage` in that process. Each output is then loaded in a fresh process "
        "in stock onnxruntime (CPU provider, no custom ops): *latency* is the median of "
        f"{results.get('latency_runs')} runs at batch 1, 1 thread, default graph optimizations; "
        "the task metric is measured with default optimizations (*opt*) and with all "
        "optimizations disabled (*no opt*, the pure QDQ semantics). Every metric is higher-is-"
        "better. For the simulated formats (no peer to compare with) a metric pass stops at the "
        f"end of the batch that exceeds {results.get('eval_budget_s')} s; the cell then "
        "says which prefix of the data it covers and float's metric on that prefix. Peers: onnxruntime `quantize_static` (QDQ, `quant_pre_process` first, opset "
        "upgraded to 13 when older, per-channel int8 weights, ActivationSymmetric as the preset "
        "says, MinMax, same calibration feeds); AMD Quark when `amd-quark` is installed"
        + ("" if "quark" in results.get("tools", []) else " (not installed on this run)") + ".",
        "",
        "*Floor*: the least a post-training quantizer does, timed the same way (fresh process, "
        "imports count; best of 3): read the float model, run every calibration feed through it "
        "once in onnxruntime (default session options) and write the model (`bench.worker floor`).",
        "",
        f"**Goals** (✓ met, ✗ missed): quantize time ≤ {GOAL_QTIME}x onnxruntime's, and for the "
        f"integer presets ≤ {GOAL_FLOOR}x the floor; metric ≥ the "
        f"best peer's for the same preset (*Δ peer*, opt / no opt); int8 output latency ≤ "
        f"{GOAL_INT8_LAT}x onnxruntime's output; simulated BF16/BFP/MX output latency ≤ "
        f"{GOAL_SIM_LAT}x the float model's.",
        "",
    ]
    # -- summary
    lines += ["## Summary", ""]
    summ = []
    for r in rows:
        if r["tool"] != "mixq":
            continue
        metric = results["cases"][r["model"]]["metric"]
        peer = next((p for p in rows if p["model"] == r["model"] and p["preset"] == r["preset"]
                     and p["tool"] == "ort"), None)
        if not r.get("ok"):
            summ.append([r["model"], r["preset"], "failed", _metric_fmt(peer.get("metric_opt"), metric)
                         if peer and peer.get("ok") else "-", "-", "-", "-", "-"])
            continue
        d = r.get("metric_delta")
        summ.append([r["model"], r["preset"], _metric_fmt(r.get("metric_opt"), metric),
                     _metric_fmt(peer.get("metric_opt"), metric) if peer and peer.get("ok") else
                     ("failed" if peer else "-"),
                     "-" if d is None else f"{d:+.2f}{_mark(d >= -1e-9)}",
                     "-" if "q_ratio" not in r else f"{r['q_ratio']:.2f}{_mark(r['q_ratio'] <= GOAL_QTIME)}",
                     "-" if "floor_ratio" not in r or not _floor_goal(r) else
                     f"{r['floor_ratio']:.2f}{_mark(r['floor_ratio'] <= GOAL_FLOOR)}",
                     "-" if "lat_ratio" not in r else f"{r['lat_ratio']:.2f} vs {r['lat_ref']}"
                     + _mark(None if r.get("lat_goal") is None else r["lat_ratio"] <= r["lat_goal"])])
    lines += _table(["model", "preset", "mixq metric (opt)", "onnxruntime metric (opt)",
                     "Δ peer", "quantize time / ORT", "quantize time / floor", "latency ratio"], summ)
    goals = [(k, r) for r in rows if r["tool"] == "mixq" and r.get("ok") for k in
             ("q", "f", "m", "l") if (k == "q" and "q_ratio" in r) or (k == "m" and "metric_delta" in r)
             or (k == "f" and "floor_ratio" in r and _floor_goal(r))
             or (k == "l" and r.get("lat_goal") is not None)]
    met = sum(1 for k, r in goals if (k == "q" and r["q_ratio"] <= GOAL_QTIME)
              or (k == "f" and r["floor_ratio"] <= GOAL_FLOOR)
              or (k == "m" and r["metric_delta"] >= -1e-9) or (k == "l" and r["lat_ratio"] <= r["lat_goal"]))
    failed = [r for r in rows if not r.get("ok")]
    lines += ["", f"mixq meets {met} of {len(goals)} goal checks; {len(failed)} run(s) failed "
              f"({', '.join(sorted({TOOL_NAMES.get(r['tool'], r['tool']) for r in failed})) or 'none'})."]
    have = {(r["model"], r["preset"], r["tool"]) for r in rows}
    not_run = [f"{mo} {pr} {TOOL_NAMES.get(t, t)}" for mo in results.get("cases", {})
               for pr in results.get("presets", []) for t in results.get("tools", [])
               if supports(t, pr) and (mo, pr, t) not in have]
    if not_run:
        lines += ["", "**Not run** (an interrupted run; rerun with `--models M --presets P --merge`): "
                  + ", ".join(not_run) + "."]
    if results.get("skipped"):
        lines += ["", "**Skipped models**:", ""]
        lines += [f"- `{k}`: {val}" for k, val in results["skipped"].items()]
    if results.get("tools_unavailable"):
        lines += ["", "**Tools not run**: " + "; ".join(f"{TOOL_NAMES.get(k, k)}: {val}" for k, val in
                                                       results["tools_unavailable"].items())]
    lines.append("")
    # -- per model
    header = ["preset", "tool", "quantize s", f"/ ORT (≤{GOAL_QTIME})", f"/ floor (≤{GOAL_FLOOR})",
              "peak RSS MB", "size MB",
              "latency ms", "latency ratio", "metric opt", "metric no opt", "Δ peer (opt / no opt)",
              "settings / notes"]
    for name, case in results["cases"].items():
        fl = case.get("float", {})
        metric = case["metric"]
        lines += [f"## {case['title']} (`{name}`)", "", case.get("doc", ""), "",
                  f"- calibration: {case.get('calibration', '-')}",
                  f"- evaluation: {case.get('evaluation', '-')}",
                  f"- metric: **{metric}**; float: {_metric_fmt(fl.get('metric_opt'), metric)} "
                  f"(no opt {_metric_fmt(fl.get('metric_noopt'), metric)}), "
                  f"{case['float_size_mb']:.3f} MB, {_f(fl.get('latency_ms'), 3)} ms",
                  f"- quantize-time floor: "
                  + (f"{case['floor_s']:.2f} s" if case.get("floor_s") else
                     f"not measured ({case.get('floor_error', 'a run before the floor existed')})"), ""]
        body = [["float", "-", "-", "-", "-", "-", f"{case['float_size_mb']:.3f}", _f(fl.get("latency_ms"), 3),
                 "1.00", _metric_fmt(fl.get("metric_opt"), metric),
                 _metric_fmt(fl.get("metric_noopt"), metric), "-", "the original model"]]
        body += [_row_cells(r, metric) for r in rows if r["model"] == name]
        lines += _table(header, body)
        if name in plots:
            lines += ["", f"![{name}: {metric} vs size]({plots[name]})"]
        mrows = [r for r in rows if r["model"] == name and r.get("ok") and r.get("timings")]
        if mrows:
            lines += ["", "<details><summary>Quantizer phases (s, in-process) and what was left "
                      "float</summary>", ""]
            for r in mrows:
                t = ", ".join(f"{k} {val:.2f}" for k, val in r["timings"].items())
                extra = ""
                if r["tool"] == "mixq":
                    reasons = "; ".join(f"{n} x {why}" for why, n in (r.get("float_reasons") or {}).items())
                    extra = (f"; {r.get('tensors_calibrated')} tensors calibrated, "
                             f"{r.get('nodes_left_float')} nodes left float"
                             + (f" ({reasons})" if reasons else ""))
                g = r.get("graph")
                if g:
                    extra += f"; output graph: {g.get('summary')}"
                lines.append(f"- {r['preset']} {TOOL_NAMES.get(r['tool'], r['tool'])}: {t}{extra}")
            lines += ["", "</details>"]
        lines.append("")
    if failed:
        lines += ["## Failures", ""]
        for r in failed:
            tb = (r.get("traceback") or r.get("load_traceback") or "").strip().splitlines()
            lines += [f"- `{r['model']}` {r['preset']} {TOOL_NAMES.get(r['tool'], r['tool'])}: "
                      f"{r.get('error')}" + (f" at `{r['where']}`" if r.get("where") else "")]
            if tb:
                lines += ["  ```", *("  " + x for x in tb[-6:]), "  ```"]
        lines.append("")
    return "\n".join(lines)


def write_report(results: dict[str, Any], doc: Path, plot_dir: Path) -> None:
    """Write the plots into `plot_dir` and the Markdown into `doc` (links relative to it)."""
    rows = derived(results)
    plots: dict[str, str] = {}
    for name in results.get("cases", {}):
        png = Path(plot_dir) / f"{results.get('name', results['suite'])}_{name}.png"
        if plot_case(results, rows, name, png):
            plots[name] = os.path.relpath(png, Path(doc).parent)
    Path(doc).parent.mkdir(parents=True, exist_ok=True)
    Path(doc).write_text(render_markdown(results, plots) + "\n")
