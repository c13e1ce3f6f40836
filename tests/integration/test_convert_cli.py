"""The `python -m mixq.tools.convert_*` commands and `mixq convert` sub-parser."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto

from mixq.convert.cli import add_convert_subparser
from mixq.convert.testing import TEST_MODELS, to_fp16_model
from mixq.tools import convert_fp16_to_bf16, convert_fp32_to_bf16, convert_fp32_to_fp16

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture()
def fp32_path(tmp_path):
    p = tmp_path / "model.onnx"
    onnx.save(TEST_MODELS["classifier"](), str(p))
    return p


@pytest.fixture()
def fp16_path(tmp_path):
    p = tmp_path / "model16.onnx"
    onnx.save(to_fp16_model(TEST_MODELS["transformer"]()), str(p))
    return p


def test_module_entry_point_subprocess(fp32_path, tmp_path):
    out = tmp_path / "out.onnx"
    r = subprocess.run([sys.executable, "-m", "mixq.tools.convert_fp32_to_bf16", "--input", str(fp32_path),
                        "--output", str(out), "--format", "bf16"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "SQNR" in r.stdout and "fp32 -> bfloat16 (bf16)" in r.stdout
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    assert any(t.data_type == TensorProto.BFLOAT16 for t in m.graph.initializer)


@pytest.mark.parametrize("fmt", ["with_cast", "simulate_bf16", "customqdq"])
def test_fp32_to_bf16_main(fp32_path, tmp_path, capsys, fmt):
    out = tmp_path / f"{fmt}.onnx"
    rc = convert_fp32_to_bf16.main(["--input", str(fp32_path), "--output", str(out), "--format", fmt])
    assert rc == 0
    text = capsys.readouterr().out
    assert f"({fmt})" in text and "saved" in text
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)


@pytest.mark.parametrize("fmt", ["with_cast", "bf16", "simulate_bf16", "customqdq"])
def test_fp16_to_bf16_main(fp16_path, tmp_path, capsys, fmt):
    out = tmp_path / f"{fmt}.onnx"
    rc = convert_fp16_to_bf16.main(["-i", str(fp16_path), "-o", str(out), "--format", fmt, "--json",
                                    str(tmp_path / "r.json")])
    assert rc == 0
    assert "fp16 -> bfloat16" in capsys.readouterr().out
    m = onnx.load(str(out))
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["source"] == "fp16" and rep["fidelity"][0]["sqnr_db"] > 35


def test_fp32_to_fp16_main(fp32_path, tmp_path, capsys):
    out = tmp_path / "h.onnx"
    assert convert_fp32_to_fp16.main(["--input", str(fp32_path), "--output", str(out), "--shape",
                                      "input=2,3,16,16"]) == 0
    assert "fp32 -> float16 (fp16)" in capsys.readouterr().out
    assert any(t.data_type == TensorProto.FLOAT16 for t in onnx.load(str(out)).graph.initializer)


def test_error_missing_input(tmp_path, capsys):
    rc = convert_fp32_to_bf16.main(["--input", str(tmp_path / "missing.onnx"), "--output",
                                    str(tmp_path / "o.onnx"), "--format", "bf16"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "missing.onnx" in err and "does not exist" in err


def test_error_output_is_input(fp32_path, capsys):
    before = fp32_path.read_bytes()
    rc = convert_fp32_to_bf16.main(["--input", str(fp32_path), "--output",
                                    str(fp32_path.parent / "." / fp32_path.name), "--format", "bf16"])
    assert rc == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert fp32_path.read_bytes() == before


def test_error_unknown_format(fp32_path, tmp_path, capsys):
    rc = convert_fp32_to_bf16.main(["--input", str(fp32_path), "--output", str(tmp_path / "o.onnx"),
                                    "--format", "with-cast"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "'with-cast'" in err and "Did you mean: with_cast" in err
    assert not (tmp_path / "o.onnx").exists()


def test_error_bad_shape(fp32_path, tmp_path, capsys):
    rc = convert_fp32_to_bf16.main(["--input", str(fp32_path), "--output", str(tmp_path / "o.onnx"),
                                    "--shape", "inptu=1,3,16,16"])
    assert rc == 2
    assert "Did you mean: input" in capsys.readouterr().err


def test_error_fp16_tool_on_fp32_model(fp32_path, tmp_path, capsys):
    rc = convert_fp16_to_bf16.main(["--input", str(fp32_path), "--output", str(tmp_path / "o.onnx")])
    assert rc == 2
    assert "convert_fp32_to_bf16" in capsys.readouterr().err


def test_mixq_convert_subparser(fp32_path, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="mixq")
    sub = parser.add_subparsers(dest="command")
    add_convert_subparser(sub)
    out = tmp_path / "s.onnx"
    args = parser.parse_args(["convert", "bf16", str(fp32_path), str(out),
                              "--format", "simulate_bf16", "--no-eval"])
    assert args.func(args) == 0
    assert out.exists() and "simulate_bf16" in capsys.readouterr().out
    args = parser.parse_args(["convert", "fp16", str(fp32_path), str(tmp_path / "h.onnx")])
    assert args.format == "fp16" and args.func(args) == 0


@pytest.mark.parametrize("which", ["input", "output"])
def test_error_json_onto_a_model(fp32_path, tmp_path, capsys, which):
    """Issue 15: --json onto the input model, or onto the model just written, replaced it."""
    out = tmp_path / "o.onnx"
    target = fp32_path if which == "input" else tmp_path / "." / "o.onnx"
    before = fp32_path.read_bytes()
    rc = convert_fp32_to_bf16.main(["--input", str(fp32_path), "--output", str(out), "--json", str(target)])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --json") and "refusing" in err
    assert fp32_path.read_bytes() == before and not out.exists()


@pytest.mark.parametrize("shape,msg", [("input=-1,3,16,16", "positive integer"),
                                       ("input=0,3,16,16", "positive integer"),
                                       ("input=3,16,16", "has 3 dimension(s)"),
                                       ("input=100000000,3,16,16", "limit")])
def test_error_bad_shape_values(fp32_path, tmp_path, capsys, shape, msg):
    rc = convert_fp32_to_bf16.main(["--input", str(fp32_path), "--output", str(tmp_path / "o.onnx"),
                                    "--shape", shape])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --shape") and msg in err and "Traceback" not in err


def test_error_invalid_utf8_name(tmp_path, capsys):
    m = TEST_MODELS["classifier"]()
    data = m.SerializeToString()
    assert data.count(b"relu1") == 1  # the node name
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(data.replace(b"relu1", b"rel\xff1"))
    rc = convert_fp32_to_bf16.main(["--input", str(bad), "--output", str(tmp_path / "o.onnx")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "not valid UTF-8" in err and "node[2].name" in err
    assert not (tmp_path / "o.onnx").exists()


def test_help_explains_the_four_bf16_formats(capsys):
    with pytest.raises(SystemExit):
        convert_fp32_to_bf16.main(["--help"])
    text = capsys.readouterr().out
    for fmt in ("with_cast", "customqdq", "simulate_bf16", "bf16"):
        assert f"\n  {fmt} " in text
    assert "stored as bf16" in text and "any provider" in text and "--provider auto" in text
