"""Every graph of `python -m bench.class_sweep` (114 model classes, and 10 PyTorch modules as
torch.onnx exports them) through preparation, with and without the equalization pass: nothing
raises but the documented refusal of an already quantized model, and the prepared models
compute what the originals do in onnxruntime. (The
sweep found the pass raising KeyError on a Gemm whose bias is computed at run time.)"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from mixq.errors import ModelError
from mixq.evaluate import make_session
from mixq.passes.prepare import prepare

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.class_sweep import MODELS, _declare_outputs  # noqa: E402


def _outputs(model, feeds):
    return [np.asarray(v, np.float64) for v in make_session(model, optimize=False).run(None, feeds)
            if isinstance(v, np.ndarray) and v.dtype.kind in "fiub"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_prepared_graphs_compute_what_the_originals_do(name):
    m, gen = MODELS[name]()
    if name == "qdq_input":
        with pytest.raises(ModelError, match="already quantized"):
            prepare(m)
        return
    m = _declare_outputs(m, gen)
    feeds = gen(np.random.default_rng(3), 2)
    ref = _outputs(m, feeds)
    for equalize in (False, True):
        p, rep = prepare(m, equalize=equalize)
        got = _outputs(p, feeds)
        assert len(got) == len(ref)
        for r, g in zip(ref, got):
            ok = np.isfinite(r)
            assert np.array_equal(ok, np.isfinite(g)), name
            np.testing.assert_allclose(g[ok], r[ok], rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(r[ok]).max(initial=0))))
        assert equalize or rep.pairs_equalized == 0
