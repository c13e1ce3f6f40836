"""The fidelity guard (and what reads the guard's samples: weight_rounding='auto''s check of GPTQ
against nearest rounding, the kernel check) runs on every kind of calibration data. A data reader
or a generator cannot be read again: the calibration pass keeps its last samples as it goes
(mixq.fidelity.HeldBack), so a one-shot source is checked as a list is, and gives its bytes."""
from __future__ import annotations

import numpy as np
import pytest

import mixq
from mixq.calibration.data import CalibData
from mixq.distributed import SerialExecutor
from tests.conftest import feeds, small_cnn


class _OneShotReader:
    """The documented reader shape: get_next() until None, no rewind()."""

    def __init__(self, data):
        self.it = iter(data)
        self.read = 0

    def get_next(self):
        f = next(self.it, None)
        self.read += f is not None
        return f


class _RefillingReader(_OneShotReader):
    """A reader that writes every batch into the same buffer (a common memory saving)."""

    def __init__(self, data):
        super().__init__(data)
        self.buf = np.empty_like(data[0]["x"])

    def get_next(self):
        f = super().get_next()
        if f is None:
            return None
        self.buf[...] = f["x"]
        return {"x": self.buf}


def _gen(data):
    yield from data


SOURCES = {
    "reader": _OneShotReader,
    "refilling reader": _RefillingReader,
    "generator": _gen,
    "CalibData(generator)": lambda d: CalibData(_gen(d)),
    "CalibData(list)": CalibData,
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_a_one_shot_source_is_checked_and_gives_the_lists_bytes(source):
    """Old code: 'not checked: the calibration data is a one-shot reader', and GPTQ kept unmeasured
    (other bytes than the same feeds in a list, where 'auto' compares it with nearest rounding)."""
    m, data = small_cnn(), feeds(64, 8)
    ref = mixq.quantize(m, "A8W8", data, check_kernels=False)
    res = mixq.quantize(m, "A8W8", SOURCES[source](data), check_kernels=False)
    assert res.fidelity.not_checked is None and ref.fidelity.not_checked is None
    assert res.fidelity.samples == ref.fidelity.samples == 32
    assert res.fidelity.outputs[0].sqnr_db == ref.fidelity.outputs[0].sqnr_db
    assert res.weight_rounding.compared is not None or res.weight_rounding.nearest_because
    assert (res.weight_rounding.compared, res.weight_rounding.nearest_because) == \
        (ref.weight_rounding.compared, ref.weight_rounding.nearest_because)
    assert res.model.SerializeToString() == ref.model.SerializeToString()


@pytest.mark.parametrize("source", ["ndarray", "dict of arrays"])
def test_arrays_are_checked(source):
    """Arrays (and dicts of them) are read again for the guard (old code: not checked)."""
    m = small_cnn()
    x = np.concatenate([f["x"] for f in feeds(48, 8)])
    res = mixq.quantize(m, "A8W8", x if source == "ndarray" else {"x": x}, check_kernels=False)
    assert res.fidelity.not_checked is None and res.fidelity.samples == 32


def test_a_preset_without_calibration_reads_a_one_shot_source_once_for_the_guard():
    """A block preset needs no statistics, so no pass reads the data before the guard."""
    m, data = small_cnn(), feeds(48, 8)
    reader = _OneShotReader(data)
    res = mixq.quantize(m, "MXINT8", reader)
    assert reader.read == len(data)
    assert res.fidelity.not_checked is None and res.fidelity.samples == 32
    ref = mixq.quantize(m, "MXINT8", data)
    assert res.fidelity.outputs[0].sqnr_db == ref.fidelity.outputs[0].sqnr_db


def test_a_one_shot_source_calibrated_on_workers_is_checked_and_rounded():
    """The shards are read here once: the guard's samples are kept from them, and GPTQ's
    statistics come from a float pass over them here (old code: not checked, and nearest
    rounding 'since a one-shot reader cannot be read again'): the bytes of a list without
    workers."""
    m, data = small_cnn(), feeds(64, 8)
    with SerialExecutor(2) as ex:
        res = mixq.quantize(m, "A8W8", _gen(data), check_kernels=False, executor=ex)
    assert res.fidelity.not_checked is None and res.fidelity.samples == 32
    assert res.weight_rounding.rounded and res.weight_rounding.compared is not None
    ref = mixq.quantize(m, "A8W8", data, check_kernels=False)
    assert res.fidelity.outputs == ref.fidelity.outputs
    assert res.model.SerializeToString() == ref.model.SerializeToString()


def test_the_kernel_check_runs_on_a_one_shot_sources_first_feed(monkeypatch):
    """On a CPU without VNNI the kernel check compares optimized and unoptimized runs on the first
    feed: a reader's, kept by the calibration pass (old code: 'kernel check skipped')."""
    import mixq.evaluate as ev

    seen = []
    real = ev.sqnr_between_optimization_levels

    def spy(model, fds):
        seen.append(fds)
        return real(model, fds)

    monkeypatch.setattr(mixq.api, "cpu_has_vnni", lambda: False)
    monkeypatch.setattr(ev, "sqnr_between_optimization_levels", spy)
    m, data = small_cnn(), feeds(32, 8)
    res = mixq.quantize(m, "A8W8", _RefillingReader(data))
    assert not any("skipped" in w for w in res.warnings), res.warnings
    assert len(seen) == 1 and np.array_equal(seen[0][0]["x"], data[0]["x"][:2])


def test_the_guard_reuses_the_rounding_checks_runs(monkeypatch):
    """weight_rounding='auto' runs the float model and both roundings' models on the guard's 32
    samples; the guard scores the kept model's runs instead of making them again (old code: 64
    more sample runs), and reads what a fresh check of the written model reads."""
    import mixq.evaluate as ev
    import mixq.fidelity as fid

    rows = []
    real = ev.make_session

    class Counted:
        def __init__(self, sess):
            self.sess = sess

        def run(self, names, feed):
            rows.append(len(next(iter(feed.values()))))
            return self.sess.run(names, feed)

        def __getattr__(self, name):
            return getattr(self.sess, name)

    monkeypatch.setattr(fid, "make_session", lambda *a, **kw: Counted(real(*a, **kw)))
    m, data = small_cnn(), feeds(64, 8)
    res = mixq.quantize(m, "A8W8", data, check_kernels=False)
    assert res.weight_rounding.compared is not None and res.fidelity.runtime_sqnr_db is not None
    # 3 x 32: float, GPTQ's and nearest's models; 3 x 2: the runtime check (float, QDQ, optimized)
    assert sum(rows) == 3 * 32 + 3 * fid.RUNTIME_SAMPLES, rows
    monkeypatch.undo()
    # 'gptq' makes no comparison, so its guard runs both models itself: the same model, the
    # same numbers
    assert res.weight_rounding.nearest_because is None
    own = mixq.quantize(m, mixq.get_default_config("A8W8").with_options(weight_rounding="gptq"), data,
                        check_kernels=False)
    assert own.model.SerializeToString() == res.model.SerializeToString()
    assert own.fidelity.outputs == res.fidelity.outputs
    assert own.fidelity.runtime_sqnr_db == res.fidelity.runtime_sqnr_db


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plan_without_activation_statistics_still_rounds_and_checks_a_one_shot_source(workers):
    """Block-format activations with int8 weights: no statistic is missing, so no calibration
    pass would read the data; one float pass runs for GPTQ's grams and the guard's samples
    (old code: nearest rounding, 'the data is a one-shot reader GPTQ cannot read again')."""
    m, data = small_cnn(), feeds(64, 8)
    cfg = mixq.get_default_config("A8W8").with_options(activation="mxint8")
    if workers:
        with SerialExecutor(workers) as ex:
            res = mixq.quantize(m, cfg, _gen(data), check_kernels=False, executor=ex)
    else:
        res = mixq.quantize(m, cfg, _gen(data), check_kernels=False)
    ref = mixq.quantize(m, cfg, data, check_kernels=False)
    assert res.weight_rounding.nearest_because is None and len(res.weight_rounding.rounded) == 3
    assert res.fidelity.not_checked is None and res.fidelity.samples == 32
    assert res.model.SerializeToString() == ref.model.SerializeToString()
