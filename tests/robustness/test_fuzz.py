"""A ~10 s run of the model-bytes fuzz target (fuzz/fuzz_model_bytes.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def _load():
    path = Path(__file__).resolve().parents[2] / "fuzz" / "fuzz_model_bytes.py"
    spec = importlib.util.spec_from_file_location("fuzz_model_bytes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fuzz_model_bytes_short_run():
    fz = _load()
    counts = fz.run(8.0, seed=0)
    assert sum(counts.values()) > 10, counts
    assert any(k.startswith("error:") for k in counts)


def test_fuzz_seed_model_quantizes(tmp_path):
    fz = _load()
    assert fz.check_one(fz.SEED, tmp_path) == "ok"
