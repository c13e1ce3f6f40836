"""mixq's embedded default model and sample data (no network, no extra deps).

The package ships a small float32 Fashion-MNIST CNN and a few hundred
Fashion-MNIST images so that ``mixq`` can be tried, demonstrated and tested
without any user model or data:

>>> from mixq.data import default_model_path, load_default_samples
>>> path = default_model_path()            # .../mixq/data/fashion_cnn.onnx
>>> s = load_default_samples()
>>> s.calib_images.shape, s.test_images.shape, s.test_labels.shape
((256, 1, 28, 28), (500, 1, 28, 28), (500,))

Model (opset 17, IR 8): input ``image`` float32 ``[N,1,28,28]`` holding raw
pixels / 255 in ``[0, 1]`` (the dataset normalization ``(x-0.2860)/0.3530`` is
the first Sub/Mul of the graph), output ``logits`` float32 ``[N,10]``. Every
Conv is followed by a separate BatchNormalization node, there is one residual
Add, two MaxPools, a GlobalAveragePool and a final Gemm.

``calib_images`` come from the Fashion-MNIST *training* split, ``test_images``
and ``test_labels`` from the *test* split. See ``README.md`` in this folder
for provenance, license (MIT, Zalando Research) and measured accuracy, and
``scripts/train_embedded.py`` for how the model was made.
"""
from __future__ import annotations

import functools
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

__all__ = [
    "DEFAULT_MODEL_NAME",
    "DEFAULT_SAMPLES_NAME",
    "DEFAULT_INPUT_NAME",
    "DEFAULT_OUTPUT_NAME",
    "DefaultSamples",
    "default_model_path",
    "default_samples_path",
    "load_default_samples",
]

DEFAULT_MODEL_NAME = "fashion_cnn.onnx"
DEFAULT_SAMPLES_NAME = "fashion_samples.npz"
DEFAULT_INPUT_NAME = "image"
DEFAULT_OUTPUT_NAME = "logits"


@functools.lru_cache(maxsize=None)
def _resource_path(name: str) -> Path:
    res = resources.files(__name__).joinpath(name)
    if isinstance(res, Path):
        if not res.is_file():
            raise FileNotFoundError(f"mixq data file missing from the installation: {res}")
        return res
    # Installed in a zip or similar: copy it out once to a real file.
    tmpdir = Path(tempfile.mkdtemp(prefix="mixq-data-"))
    out = tmpdir / name
    with resources.as_file(res) as p, open(out, "wb") as dst, open(p, "rb") as src:
        shutil.copyfileobj(src, dst)
    return out


def default_model_path() -> Path:
    """Path of the embedded float32 ONNX model ``fashion_cnn.onnx``."""
    return _resource_path(DEFAULT_MODEL_NAME)


def default_samples_path() -> Path:
    """Path of the embedded sample archive ``fashion_samples.npz``."""
    return _resource_path(DEFAULT_SAMPLES_NAME)


@dataclass(frozen=True)
class DefaultSamples:
    """Fashion-MNIST samples for the embedded model.

    Attributes:
        calib_images: float32 ``[256,1,28,28]`` in ``[0,1]``, from the training split.
        test_images: float32 ``[500,1,28,28]`` in ``[0,1]``, from the test split.
        test_labels: int64 ``[500]`` class indices for ``test_images``.
        class_names: ``[10]`` unicode array, index -> class name.
    """

    calib_images: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    class_names: np.ndarray


def _to_float01(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint8:
        a = a.astype(np.float32) / np.float32(255.0)
    a = np.ascontiguousarray(a, dtype=np.float32)
    a.setflags(write=False)
    return a


@functools.lru_cache(maxsize=1)
def load_default_samples() -> DefaultSamples:
    """Load the embedded samples (cached; the returned arrays are read-only).

    Images are stored as uint8 and returned as float32 ``pixels / 255``,
    exactly what the model's ``image`` input expects.
    """
    with np.load(default_samples_path(), allow_pickle=False) as z:
        labels = np.ascontiguousarray(z["test_labels"], dtype=np.int64)
        names = np.asarray(z["class_names"]).astype(str)
        labels.setflags(write=False)
        names.setflags(write=False)
        return DefaultSamples(
            calib_images=_to_float01(z["calib_images"]),
            test_images=_to_float01(z["test_images"]),
            test_labels=labels,
            class_names=names,
        )
