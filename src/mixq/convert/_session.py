"""onnxruntime sessions for in-memory models of any size (past 2 GiB via a temporary file)."""
from __future__ import annotations

import pathlib
import tempfile

import onnx

from .._io import EXTERNAL_THRESHOLD, save_model
from ..kernels import session_options


def open_session(model: onnx.ModelProto, provider: str, *, optimize: bool = True):
    """(InferenceSession for `model` on `provider`, serialized size in bytes).

    Graph optimizations are on, as users run the model. Models the protobuf library cannot
    serialize in one piece (past 2 GiB) are written to a temporary directory with external data."""
    import onnxruntime as ort

    so = session_options(optimize=optimize)
    try:
        data = model.SerializeToString()
    except ValueError:  # too large for one protobuf
        data = None
    if data is not None and len(data) <= EXTERNAL_THRESHOLD:
        return ort.InferenceSession(data, sess_options=so, providers=[provider]), len(data)
    with tempfile.TemporaryDirectory(prefix="mixq_sess_") as tmp:
        path = save_model(model, pathlib.Path(tmp) / "model.onnx", external=True)
        size = sum(f.stat().st_size for f in pathlib.Path(tmp).iterdir())
        return ort.InferenceSession(str(path), sess_options=so, providers=[provider]), size


def make_session(model: onnx.ModelProto, provider: str, *, optimize: bool = True):
    """An InferenceSession for `model` on `provider` (see `open_session`)."""
    return open_session(model, provider, optimize=optimize)[0]
