"""Every CLI command in a pipe (issue 15): a reader that goes away (`mixq ... | head -1`) ends
the command quietly (exit 0, no traceback), and progress appears on stderr as plain lines
(not a bar) unless --quiet.

Each case runs `python -m mixq.cli.main` as a subprocess on the embedded model, with small
.npz files made here; stdout is unbuffered so that every line is its own write."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mixq
from mixq.data import default_model_path, load_default_samples

SRC = str(Path(mixq.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipes")
    s = load_default_samples()
    np.savez(d / "calib.npz", image=s.calib_images[:16])
    np.savez(d / "eval.npz", image=s.test_images[:16])
    np.save(d / "labels.npy", s.test_labels[:16])
    mixq.quantize(default_model_path(), "A8W8", d / "calib.npz", output_path=d / "q.onnx",
                  check_kernels=False)
    return d


def _commands(d: Path) -> dict[str, list[str]]:
    m = str(default_model_path())
    return {
        "check": ["check", m],
        "plan": ["plan", m],
        "quantize": ["quantize", m, str(d / "out.onnx"), "--calib", str(d / "calib.npz")],
        "inspect": ["inspect", m],
        "eval": ["eval", m, str(d / "q.onnx"), "--data", str(d / "eval.npz"),
                 "--labels", str(d / "labels.npy")],
        "convert": ["convert", "bf16", m, str(d / "bf16.onnx")],
        "demo": ["demo", "--presets", "A8W8"],
    }


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MIXQ_QUIET", None)
    env.update(extra)
    return env


def _spawn(argv: list[str], cwd: Path, stderr_file, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mixq.cli.main", *argv], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=stderr_file, env=_env(**env))


COMMANDS = ["check", "plan", "quantize", "inspect", "eval", "convert", "demo"]


@pytest.mark.parametrize("when", ["after_first_line", "before_any_output"])
@pytest.mark.parametrize("cmd", COMMANDS)
def test_closed_pipe_exits_quietly(cmd, when, files, tmp_path):
    """`mixq CMD | head -1`; 'before_any_output' closes at once, so the very first write
    meets the closed pipe whatever the timing."""
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as ef:
        p = _spawn(_commands(files)[cmd], tmp_path, ef)
        if when == "after_first_line":
            first = p.stdout.readline()
            assert first.strip(), "the command printed nothing"
        p.stdout.close()
        rc = p.wait(timeout=60)
    text = err.read_text()
    assert "Traceback" not in text and "BrokenPipe" not in text, text
    # check exits 1 when the model has problems to fix; the embedded model has none
    assert rc == 0, (rc, text)


@pytest.mark.parametrize("cmd,expect", [("quantize", "calibrating: 16/16 batches"),
                                        ("eval", "evaluating: 16/16 batches"),
                                        ("convert", "converting: 2/2 steps")])
def test_progress_lines_in_a_pipe_and_quiet(cmd, expect, files, tmp_path):
    argv = _commands(files)[cmd]
    runs = {}
    for quiet in (False, True):
        err = tmp_path / f"stderr{quiet}.txt"
        with open(err, "wb") as ef:
            p = _spawn(argv + (["--quiet"] if quiet else []), tmp_path, ef, MIXQ_PROGRESS_INTERVAL="0")
            out = p.stdout.read().decode()
            assert p.wait(timeout=60) == 0, err.read_text()
        runs[quiet] = (out, err.read_text())
    out, err_text = runs[False]
    assert expect in err_text, err_text
    assert "\r" not in err_text  # plain lines, not a terminal bar
    if cmd != "convert":  # totals known up front: an ETA before the end
        assert "eta" in err_text
    assert expect not in out  # progress never mixes into the results on stdout
    q_out, q_err = runs[True]
    assert expect.split(":")[0] + ":" not in q_err, q_err
    assert q_out.split("\n")[:3] == out.split("\n")[:3]  # --quiet changes nothing else


def test_quiet_before_the_command_name(files, tmp_path):
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as ef:
        p = _spawn(["--quiet", *_commands(files)["quantize"]], tmp_path, ef, MIXQ_PROGRESS_INTERVAL="0")
        p.stdout.read()
        assert p.wait(timeout=60) == 0
    assert "calibrating" not in err.read_text()


def test_plain_lines_every_interval_with_total_and_eta(monkeypatch):
    from mixq import _progress

    monkeypatch.setenv("MIXQ_PROGRESS_INTERVAL", "0")
    s = io.StringIO()
    with _progress.Progress("calibrating", 4, stream=s) as p:
        for i in range(4):
            p(i)  # the collect_stats callback form: 0-based index
    lines = s.getvalue().splitlines()
    assert lines[0].startswith("calibrating: 1/4 batches, ") and ", eta " in lines[0]
    assert lines[-1].startswith("calibrating: 4/4 batches, ") and "eta" not in lines[-1]


def test_heartbeat_between_slow_steps_and_silence_under_the_interval(monkeypatch):
    """A step longer than the interval still prints (a piped run is never silent for long);
    a short run prints nothing."""
    from mixq import _progress

    monkeypatch.setenv("MIXQ_PROGRESS_INTERVAL", "0.05")
    s = io.StringIO()
    with _progress.Progress("converting", 2, "steps", stream=s):
        time.sleep(0.3)
    assert s.getvalue().count("converting: 0/2 steps") >= 2
    s = io.StringIO()
    with _progress.Progress("calibrating", stream=s) as p:  # a callback made before the step
        time.sleep(0.2)
        assert s.getvalue() == ""  # not started: no line
        p.set_total(1)
        p(0)
        time.sleep(0.2)
    assert s.getvalue().count("calibrating: 1/1") == 1  # done: no heartbeat, no repeated line
    monkeypatch.setenv("MIXQ_PROGRESS_INTERVAL", "60")
    s = io.StringIO()
    with _progress.Progress("converting", 2, "steps", stream=s) as p:
        p.update(2)
    assert s.getvalue() == ""


def test_stage_progress_of_auto(monkeypatch):
    from mixq import _progress

    monkeypatch.setenv("MIXQ_PROGRESS_INTERVAL", "0")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    sp = _progress.StageProgress()
    for i in range(1, 4):
        sp("sensitivity", i, 3)
    sp("evaluate", 1, 9)
    sp.close()
    text = sys.stderr.getvalue()
    assert "sensitivity: 1/3 steps" in text and "eta" in text.split("evaluate")[0]
    assert "evaluate: 1/9 steps" in text and "eta" not in text.split("evaluate", 1)[1]


def test_quiet_silences_the_api_display(monkeypatch):
    from mixq import _progress

    monkeypatch.setenv("MIXQ_PROGRESS_INTERVAL", "0")
    s = io.StringIO()
    _progress.set_quiet(True)
    try:
        with _progress.Progress("calibrating", 2, stream=s) as p:
            p.update(2)
    finally:
        _progress.set_quiet(False)
    assert s.getvalue() == ""


def test_closed_pipe_of_the_stand_alone_converter(files, tmp_path):
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as ef:
        p = subprocess.Popen([sys.executable, "-m", "mixq.tools.convert_fp32_to_bf16", "--input",
                              str(default_model_path()), "--output", str(tmp_path / "t.onnx")],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=ef, env=_env())
        p.stdout.close()
        rc = p.wait(timeout=60)
    assert "Traceback" not in err.read_text() and rc == 0
