"""One size unit in every user-facing summary (MB = 10^6 bytes, kB = 10^3), and the `mixq
auto` cache: configurable (--cache-dir, MIXQ_CACHE_DIR), documented, bounded (issue 15)."""
from __future__ import annotations

import os
import re
import time

import pytest

from mixq.cli.main import build_parser, main
from mixq.data import default_model_path
from mixq.errors import ConfigError, OutputError
from mixq.search import auto as A


def test_convert_summary_in_mb_of_10_6_bytes(tmp_path, capsys):
    from mixq._io import load_model, model_size

    assert main(["--quiet", "convert", "bf16", str(default_model_path()), str(tmp_path / "o.onnx"),
                 "--no-eval"]) == 0
    out = capsys.readouterr().out
    assert "MiB" not in out
    before = float(re.search(r"size before -> after \| ([0-9.]+) MB", out).group(1))
    assert before == round(model_size(load_model(default_model_path())) / 1e6, 2)


def test_demo_sizes_in_kb_of_10_3_bytes(capsys):
    from mixq.demo import run_demo

    run_demo(presets=["A8W8"])
    out = capsys.readouterr().out
    assert "KB" not in out and "kB" in out
    float_row = next(line for line in out.splitlines() if line.startswith("| float |"))
    file_kb = float(float_row.split("|")[-3])
    assert file_kb == round(os.path.getsize(default_model_path()) / 1e3, 1)


def _k(i):
    return f"{i:032x}"  # cache keys are 32 hex digits (auto._key)


def _fill(cache, n, size=1000):
    for i in range(n):
        cache.put(_k(i), "x" * size)
        os.utime(cache.root / f"{_k(i)}.json", ns=(i * 10**9, i * 10**9))  # distinct, ordered ages


def test_cache_is_bounded_oldest_first(tmp_path):
    c = A._Cache(tmp_path / "c", max_bytes=5000)
    _fill(c, 12)
    files = sorted(p.name for p in (tmp_path / "c").iterdir())
    total = sum(p.stat().st_size for p in (tmp_path / "c").iterdir())
    assert total <= 5000
    assert f"{_k(11)}.json" in files and f"{_k(0)}.json" not in files  # newest stay, oldest go
    assert c.get(_k(11)) == "x" * 1000 and c.get(_k(0)) is None
    assert not [f for f in files if f.endswith(".tmp")]


def test_cache_eviction_goes_by_last_use(tmp_path):
    c = A._Cache(tmp_path / "c", max_bytes=3500)
    _fill(c, 3)
    assert c.get(_k(0)) is not None  # entry 0 used now: entry 1 is the least recently used
    c.put(_k(3), "x" * 1000)
    assert c.get(_k(1)) is None and c.get(_k(0)) is not None and c.get(_k(3)) is not None


def test_eviction_never_touches_other_files_in_the_cache_dir(tmp_path):
    mine = tmp_path / "settings.json"
    mine.write_text("{}" + " " * 5000)
    os.utime(mine, ns=(0, 0))  # the oldest file there
    c = A._Cache(tmp_path, max_bytes=1500)
    _fill(c, 3)
    assert mine.read_text().startswith("{}")
    assert c.get(_k(2)) is not None and c.get(_k(0)) is None


def test_cache_keeps_the_entry_just_written_even_when_over_the_bound(tmp_path):
    c = A._Cache(tmp_path / "c", max_bytes=10)
    c.put(_k(7), "y" * 100)
    assert c.get(_k(7)) == "y" * 100


def test_cache_bound_and_dir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXQ_CACHE_MAX_MB", "0.002")
    assert A._Cache(tmp_path).max_bytes == 2000
    monkeypatch.setenv("MIXQ_CACHE_MAX_MB", "lots")
    with pytest.raises(ConfigError, match="MIXQ_CACHE_MAX_MB"):
        A._Cache(tmp_path)
    monkeypatch.setenv("MIXQ_CACHE_DIR", str(tmp_path / "mine"))
    assert A.default_cache_dir() == str(tmp_path / "mine")
    monkeypatch.delenv("MIXQ_CACHE_DIR")
    assert A.default_cache_dir().endswith(os.path.join(".cache", "mixq"))


def test_cache_dir_that_is_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(OutputError, match="cache directory"):
        A._Cache(f)


def test_cache_documented_in_auto_help():
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
               and "auto" in a.choices)
    text = " ".join(sub.choices["auto"].format_help().split())
    assert "MIXQ_CACHE_DIR" in text and "MIXQ_CACHE_MAX_MB" in text and "~/.cache/mixq" in text
