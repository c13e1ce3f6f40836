"""Byte-for-byte comparison of mixq's quantized models at two revisions, on the bench models.

    python -m bench.compare_outputs --base 9feef13                  # quick suite, every preset
    python -m bench.compare_outputs --base 9feef13 --suite full     # all seven bench models
    python -m bench.compare_outputs --base 9feef13 --models ppocr_cls --presets A8W8,BFP16
    python -m bench.compare_outputs --base 9feef13 --head HEAD~3      # two revisions

The base revision is checked out into a temporary git worktree; every (model, preset) is
quantized in a fresh interpreter with each revision's source (PYTHONPATH) from the same float
model and calibration feeds the benchmark suite builds, and the outputs are compared by SHA-256.
Where they differ, the table names the tensors whose planned format differs (plan JSON of both
revisions), so a difference is either explained by a changed plan or is a rewrite change.
Exit status: 0 when every output is identical, 1 otherwise (a table row says why).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mixq.config import PRESETS

from . import env
from .cases import CASES
from .suite import SUITES, WORK_DIR, _ensure_requirements

_CHILD = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, {root!r})
import mixq
from bench.feeds import load_feeds
d = Path({case_dir!r})
res = mixq.quantize(str(d / "float.onnx"), {preset!r}, load_feeds(d / "calib.npz"),
                    output_path={out!r}, check_kernels=False)
plan = {{n: [tp.role, tp.format, sorted(tp.consumer_formats.items())]
        for n, tp in res.plan.tensors.items()}}
Path({out!r} + ".plan.json").write_text(json.dumps(plan, sort_keys=True))
"""


def _quantize(src: Path, case_dir: Path, preset: str, out: Path) -> str | None:
    """Quantize in a fresh interpreter with the mixq source at `src`; None, or the error."""
    code = _CHILD.format(root=str(env.ROOT), case_dir=str(case_dir), preset=preset, out=str(out))
    environ = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]
    return None


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()[:12]


def _plan_diff(a: Path, b: Path) -> str:
    pa, pb = json.loads(a.read_text()), json.loads(b.read_text())
    changed = sorted(n for n in set(pa) | set(pb) if pa.get(n) != pb.get(n))
    if not changed:
        return "same plan: the rewrite differs"
    head = ", ".join(f"{n}: {pa.get(n, ['-', 'absent'])[1]} -> {pb.get(n, ['-', 'absent'])[1]}"
                     for n in changed[:3])
    return f"plan differs on {len(changed)} tensors ({head}{', ...' if len(changed) > 3 else ''})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--head", help="git revision to compare (default: the working tree)")
    ap.add_argument("--suite", default="quick", choices=sorted(SUITES))
    ap.add_argument("--models", help="comma list of bench models (default: the suite's)")
    ap.add_argument("--presets", help="comma list of presets (default: every preset)")
    ap.add_argument("--no-install", action="store_true", help="skip models whose packages are missing")
    args = ap.parse_args(argv)
    models = args.models.split(",") if args.models else list(SUITES[args.suite])
    presets = args.presets.split(",") if args.presets else list(PRESETS)
    rows, differ = [], 0
    with tempfile.TemporaryDirectory(prefix="mixq_compare_") as tmp:
        base_tree, head_tree = Path(tmp) / "base", Path(tmp) / "head"
        subprocess.run(["git", "-C", str(env.ROOT), "worktree", "add", "--detach", "-q",
                        str(base_tree), args.base], check=True)
        if args.head:
            subprocess.run(["git", "-C", str(env.ROOT), "worktree", "add", "--detach", "-q",
                            str(head_tree), args.head], check=True)
        head_src = head_tree / "src" if args.head else env.ROOT / "src"
        try:
            for name in models:
                case = CASES[name]
                case.for_suite(args.suite)
                missing = _ensure_requirements(case, not args.no_install, allow_apt=args.suite == "full")
                if missing:
                    rows.append((name, "*", "skipped", f"missing: {'; '.join(missing)}"))
                    continue
                cdir = WORK_DIR / args.suite / name
                cdir.mkdir(parents=True, exist_ok=True)
                if not (cdir / "float.onnx").exists() or not (cdir / "calib.npz").exists():
                    case.build(cdir)
                for preset in presets:
                    outs = {}
                    for tag, src in (("base", base_tree / "src"), ("head", head_src)):
                        out = Path(tmp) / f"{name}.{preset}.{tag}.onnx"
                        err = _quantize(src, cdir, preset, out)
                        outs[tag] = (out, err)
                    (a, ea), (b, eb) = outs["base"], outs["head"]
                    if ea or eb:
                        verdict = "identical" if ea == eb else "differs"
                        why = f"base: {ea or 'ok'}; head: {eb or 'ok'}"
                    elif _sha(a) == _sha(b):
                        verdict, why = "identical", _sha(a)
                    else:
                        verdict = "differs"
                        why = _plan_diff(Path(str(a) + ".plan.json"), Path(str(b) + ".plan.json"))
                    differ += verdict != "identical"
                    rows.append((name, preset, verdict, why))
                    print(f"{name:20s} {preset:12s} {verdict:9s} {why}", flush=True)
        finally:
            for tree in (base_tree, head_tree):
                if tree.exists():
                    subprocess.run(["git", "-C", str(env.ROOT), "worktree", "remove", "--force",
                                    str(tree)], check=False)
    print(f"\n| model | preset | output | note |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n{len(rows) - differ} identical, {differ} different (base {args.base}, head "
          f"{args.head or '= the working tree'})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
