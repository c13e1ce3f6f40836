"""The benchmark suite's whole path on its smallest model, so that it cannot rot.

Runs the embedded Fashion-MNIST CNN through ``bench.suite.Suite`` with two presets (one integer
preset that both mixq and onnxruntime run, one simulated format only mixq has) and a few
latency runs: subprocess workers, JSON results, the Markdown report and the plot.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench_suite():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        from mixq.data import default_model_path, load_default_samples

        default_model_path(), load_default_samples()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"mixq's embedded model/data is not available: {exc}")
    from bench import suite

    return suite


def test_bench_path_embedded_cnn(bench_suite, tmp_path: Path) -> None:
    out, doc, work = tmp_path / "results", tmp_path / "BENCHMARKS.md", tmp_path / "work"
    s = bench_suite.Suite("quick", models=["fashion_cnn"], presets=["A8W8", "BF16"],
                          tools=["mixq", "ort"], latency_runs=3, install=False, out_dir=out,
                          doc=doc, work_dir=work, timeout=120, name="test")
    res = s.run()

    data = json.loads((out / "test.json").read_text())
    assert data == json.loads(json.dumps(res, default=str))
    assert data["machine"]["cpu"] and "vnni" in data["machine"]
    case = data["cases"]["fashion_cnn"]
    assert case["float"]["loads"] and case["float"]["metric_opt"] > 80.0  # top-1 on the labels
    # issue 19's floor: a float pass over the calibration data plus the save, in a fresh process
    assert 0 < case["floor_s"] < 60 and case["floor_runs"] == 3, case.get("floor_error")
    rows = {(r["preset"], r["tool"]): r for r in data["rows"]}
    assert set(rows) == {("A8W8", "mixq"), ("A8W8", "ort"), ("BF16", "mixq")}  # ORT has no BF16
    for key, r in rows.items():
        # a failing quantizer is a result row, never a crash of the suite
        if not r["ok"]:
            assert r.get("error"), key
            continue
        assert r["loads"] is True
        assert r["quantize_s"] > 0 and r["peak_rss_mb"] > 10 and r["size_mb"] > 0
        assert r["latency_ms"] > 0 and r["latency_runs"] == 3
        assert 0.0 <= r["metric_opt"] <= 100.0 and 0.0 <= r["metric_noopt"] <= 100.0
    assert rows[("A8W8", "ort")]["ok"], rows[("A8W8", "ort")].get("error")

    md = doc.read_text()
    assert "GENERATED" in md and "do not edit" in md
    assert data["machine"]["cpu"] in md
    assert "## Fashion-MNIST CNN" in md and "| A8W8 | mixq |" in md
    from bench.report import derived

    ratio = next(r["floor_ratio"] for r in derived(data) if (r["preset"], r["tool"]) == ("A8W8", "mixq"))
    assert ratio == pytest.approx(rows[("A8W8", "mixq")]["quantize_s"] / case["floor_s"])
    assert "quantize time / floor" in md and f"| {ratio:.2f}" in md
    if importlib.util.find_spec("matplotlib") is None:  # plots need the bench extra
        return
    png = out / "test_fashion_cnn.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "test_fashion_cnn.png" in md


def test_unknown_names_are_clear_errors(bench_suite, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        bench_suite.Suite("quick", models=["nope"], work_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown suite"):
        bench_suite.Suite("huge", work_dir=tmp_path)
