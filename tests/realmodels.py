"""Real pretrained models and real, offline-built inputs for mixq's tests.

Models: the PP-OCR ONNX files shipped inside the ``rapidocr-onnxruntime``
wheel (Apache-2.0, PaddleOCR models converted by RapidAI). Install them with::

    pip install --no-deps rapidocr-onnxruntime==1.4.4

(``--no-deps``: only the ``.onnx`` files are used; the package itself needs
OpenCV to import, so it is located with ``importlib.util.find_spec`` and is
never imported.) Nothing is ever downloaded.

=========  ===================================  =====  =====  ====================  ==================
model      file                                 opset  IR     input                 output
=========  ===================================  =====  =====  ====================  ==================
cls        ch_ppocr_mobile_v2.0_cls_infer.onnx  11     7      x  [N,3,48,192]*      [N,2] softmax (0°, 180°)
rec        ch_PP-OCRv4_rec_infer.onnx           12     8      x  [N,3,48,W]*        [N,W/8,6625] softmax (CTC)
det        ch_PP-OCRv4_det_infer.onnx           12     8      x  [N,3,H,W]          [N,1,H,W] sigmoid
=========  ===================================  =====  =====  ====================  ==================

``*`` the model input shapes are dynamic; the shapes given are the ones
PP-OCR / RapidOCR feed. The rec model stores its character dictionary in the
ONNX metadata (key ``character``, 6623 entries; the CTC classes are
``blank`` + those + ``" "``).

Inputs: single text lines rendered with Pillow in DejaVu Sans
(``/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf``, Debian package
``fonts-dejavu-core``) from real English sentences: the Zen of Python (the
stdlib ``this`` module) and a fixed list of public-domain English proverbs
(below). Sentences are assigned to the ``"calib"`` or ``"eval"`` split by
index (every 4th sentence is eval), so the two splits never share text.
Pre-processing follows RapidOCR 1.4.4 / PaddleOCR exactly: keep-aspect resize
to height 48 (OpenCV-style bilinear), scale ``(x/255 - 0.5)/0.5``, right-pad
with zeros to the model width (192 for cls, 320 for rec).

Everything is deterministic for a given ``(split, n, seed)`` and fast
(rendering 64 lines takes well under a second).
"""
from __future__ import annotations

import codecs
import contextlib
import functools
import importlib.util
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

__all__ = [
    "RAPIDOCR_PIP",
    "ModelNotInstalled",
    "OcrLine",
    "ppocr_cls_model_path",
    "ppocr_rec_model_path",
    "ppocr_det_model_path",
    "have_ppocr_models",
    "font_path",
    "sentences",
    "ocr_lines",
    "ocr_line_images",
    "preprocess_line",
    "cls_inputs",
    "rec_inputs",
    "rec_charset",
    "ctc_greedy_decode",
    "edit_distance",
    "char_accuracy",
]

RAPIDOCR_PIP = "pip install --no-deps rapidocr-onnxruntime==1.4.4"
FONT_APT = "apt-get install -y fonts-dejavu-core"

Split = Literal["calib", "eval"]


class ModelNotInstalled(FileNotFoundError):
    """A real test model (or its font) is not installed locally."""


# --------------------------------------------------------------------------- models
def _rapidocr_dir() -> Path:
    try:
        spec = importlib.util.find_spec("rapidocr_onnxruntime")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalled(
            f"the PP-OCR ONNX models come from the rapidocr-onnxruntime wheel, "
            f"which is not installed; install it with: {RAPIDOCR_PIP}")
    return Path(list(spec.submodule_search_locations)[0])


def _model(filename: str) -> Path:
    p = _rapidocr_dir() / "models" / filename
    if not p.is_file():
        raise ModelNotInstalled(
            f"{p} is missing (wrong rapidocr-onnxruntime version?); install with: {RAPIDOCR_PIP}")
    return p


def ppocr_cls_model_path() -> Path:
    """PP-OCR mobile v2.0 text-direction classifier (0° / 180°), opset 11."""
    return _model("ch_ppocr_mobile_v2.0_cls_infer.onnx")


def ppocr_rec_model_path() -> Path:
    """PP-OCRv4 text recogniser (CTC, 6625 classes), opset 12."""
    return _model("ch_PP-OCRv4_rec_infer.onnx")


def ppocr_det_model_path() -> Path:
    """PP-OCRv4 text detector (DB), opset 12."""
    return _model("ch_PP-OCRv4_det_infer.onnx")


def have_ppocr_models() -> bool:
    """True if all three PP-OCR models are installed (for ``pytest.mark.skipif``)."""
    try:
        ppocr_cls_model_path(), ppocr_rec_model_path(), ppocr_det_model_path()
    except ModelNotInstalled:
        return False
    return True


# --------------------------------------------------------------------------- text
_PROVERBS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "Actions speak louder than words.",
    "All that glitters is not gold.",
    "An apple a day keeps the doctor away.",
    "Better late than never.",
    "Birds of a feather flock together.",
    "Do not count your chickens before they hatch.",
    "Do not put all your eggs in one basket.",
    "Early to bed and early to rise makes a man healthy, wealthy and wise.",
    "Every cloud has a silver lining.",
    "Fortune favours the bold.",
    "Great minds think alike.",
    "Honesty is the best policy.",
    "If it is not broken, do not fix it.",
    "Knowledge is power.",
    "Laughter is the best medicine.",
    "Look before you leap.",
    "Many hands make light work.",
    "Necessity is the mother of invention.",
    "No man is an island.",
    "Practice makes perfect.",
    "Rome was not built in a day.",
    "The early bird catches the worm.",
    "The pen is mightier than the sword.",
    "There is no place like home.",
    "Time and tide wait for no man.",
    "Two heads are better than one.",
    "When in Rome, do as the Romans do.",
    "Where there is a will, there is a way.",
    "You cannot judge a book by its cover.",
    "A picture is worth a thousand words.",
    "Absence makes the heart grow fonder.",
    "Beauty is in the eye of the beholder.",
    "Curiosity killed the cat.",
    "Easy come, easy go.",
    "Good things come to those who wait.",
    "Half a loaf is better than none.",
    "Haste makes waste.",
    "It takes two to tango.",
    "Let sleeping dogs lie.",
    "Make hay while the sun shines.",
    "Still waters run deep.",
    "The grass is always greener on the other side.",
    "Too many cooks spoil the broth.",
    "Waste not, want not.",
    "You can lead a horse to water, but you cannot make it drink.",
    "Pack my box with five dozen liquor jugs.",
    "Sphinx of black quartz, judge my vow.",
    "How vexingly quick daft zebras jump!",
    "Jackdaws love my big sphinx of quartz.",
    "The five boxing wizards jump quickly.",
    "In 1969, 3 men flew 384400 km to the Moon.",
    "Call 555 0123 before 9:30 on May 14.",
)


@functools.lru_cache(maxsize=1)
def _zen_of_python() -> tuple[str, ...]:
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (prints the Zen on first import)
    text = codecs.decode(this.s, "rot_13")
    return tuple(line.strip() for line in text.splitlines()[2:] if line.strip())


def sentences(split: Split) -> tuple[str, ...]:
    """The real English sentences behind ``split`` (every 4th one is ``eval``)."""
    _check_split(split)
    allsent = _zen_of_python() + _PROVERBS
    want_eval = split == "eval"
    return tuple(s for i, s in enumerate(allsent) if (i % 4 == 3) == want_eval)


def _wrap(sentence: str, max_chars: int) -> list[str]:
    """Greedy word wrap into text lines of at most ``max_chars`` (PP-OCR line crops)."""
    lines: list[str] = []
    cur = ""
    for word in sentence.split():
        cand = f"{cur} {word}" if cur else word
        if len(cand) <= max_chars or not cur:
            cur = cand
        else:
            lines.append(cur)
            cur = word
    if cur:
        lines.append(cur)
    return lines


@functools.lru_cache(maxsize=4)
def _line_pool(split: Split, max_chars: int = 24) -> tuple[str, ...]:
    return tuple(line for s in sentences(split) for line in _wrap(s, max_chars))


def _check_split(split: str) -> None:
    if split not in ("calib", "eval"):
        raise ValueError(f"split must be 'calib' or 'eval', not {split!r}")


# --------------------------------------------------------------------------- render
_DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def font_path() -> Path:
    """DejaVu Sans; raises :class:`ModelNotInstalled` with the apt line if absent."""
    if _DEJAVU.is_file():
        return _DEJAVU
    raise ModelNotInstalled(f"{_DEJAVU} not found; install it with: {FONT_APT}")


@functools.lru_cache(maxsize=32)
def _font(size: int):
    from PIL import ImageFont

    # BASIC layout: no dependence on whether libraqm is installed.
    return ImageFont.truetype(str(font_path()), size, layout_engine=ImageFont.Layout.BASIC)


@dataclass(frozen=True)
class OcrLine:
    text: str
    image: np.ndarray  # uint8 [H, W, 3], dark text on light background, upright


def _render(text: str, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image, ImageDraw

    size = int(rng.integers(30, 41))
    font = _font(size)
    left, top, right, bottom = font.getbbox(text)
    mx = int(rng.integers(4, 14))
    my_top = int(rng.integers(3, 10))
    my_bot = int(rng.integers(3, 10))
    w = right - left + 2 * mx
    h = bottom - top + my_top + my_bot
    bg = int(rng.integers(200, 256))
    fg = int(rng.integers(0, 70))
    tint = rng.integers(-12, 13, size=3)  # slight colour cast, still near-grey
    img = Image.new("L", (w, h), color=bg)
    ImageDraw.Draw(img).text((mx - left, my_top - top), text, fill=fg, font=font)
    a = np.asarray(img, dtype=np.float32)[:, :, None] + tint[None, None, :].astype(np.float32)
    a = a + rng.normal(0.0, 4.0, size=a.shape).astype(np.float32)  # sensor noise
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


def ocr_lines(n: int, seed: int = 0, split: Split = "calib") -> list[OcrLine]:
    """``n`` rendered text lines (text + uint8 HxWx3 image) from ``split``.

    Lines are drawn from the split's pool in a seeded random order; when ``n``
    exceeds the pool, it cycles with fresh random rendering parameters.
    """
    _check_split(split)
    if n < 0:
        raise ValueError("n must be >= 0")
    pool = _line_pool(split)
    rng = np.random.default_rng([int(seed), 0 if split == "calib" else 1])
    out: list[OcrLine] = []
    order: list[int] = []
    for _ in range(n):
        if not order:
            order = list(rng.permutation(len(pool)))
        text = pool[order.pop()]
        out.append(OcrLine(text, _render(text, rng)))
    return out


def ocr_line_images(n: int, seed: int = 0, split: Split = "calib") -> list[np.ndarray]:
    """Just the uint8 [H,W,3] images of :func:`ocr_lines` (widths vary)."""
    return [line.image for line in ocr_lines(n, seed, split)]


# --------------------------------------------------------------------------- preprocess
def _resize_bilinear(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """``cv2.resize(img, (out_w, out_h))`` (INTER_LINEAR, half-pixel centres) in numpy."""
    h, w = img.shape[:2]

    def coords(n_out: int, n_in: int):
        s = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
        s = np.clip(s, 0.0, n_in - 1)
        i0 = np.floor(s).astype(np.int64)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, (s - i0).astype(np.float32)

    y0, y1, fy = coords(out_h, h)
    x0, x1, fx = coords(out_w, w)
    a = img.astype(np.float32)
    top = a[y0] * (1 - fy)[:, None, None] + a[y1] * fy[:, None, None]
    res = top[:, x0] * (1 - fx)[None, :, None] + top[:, x1] * fx[None, :, None]
    return np.clip(np.rint(res), 0, 255).astype(np.uint8)


def preprocess_line(img: np.ndarray, width: int, height: int = 48) -> np.ndarray:
    """PaddleOCR ``resize_norm_img``: uint8 HxWx3 -> float32 [3,height,width]."""
    h, w = img.shape[:2]
    ratio = w / float(h)
    resized_w = width if math.ceil(height * ratio) > width else int(math.ceil(height * ratio))
    r = _resize_bilinear(img, height, resized_w).astype(np.float32)
    r = (r.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    out = np.zeros((3, height, width), dtype=np.float32)
    out[:, :, :resized_w] = r
    return out


def cls_inputs(split: Split = "calib", n: int = 32, seed: int = 0, *,
               with_labels: bool = False):
    """Inputs for the PP-OCR direction classifier: float32 [n,3,48,192].

    Every odd-indexed line is rotated by 180 degrees (label 1), the others are
    upright (label 0) -- the two classes the model distinguishes. With
    ``with_labels=True`` returns ``(x, labels int64[n])``.
    """
    imgs = ocr_line_images(n, seed, split)
    labels = (np.arange(n) % 2).astype(np.int64)
    x = np.zeros((n, 3, 48, 192), dtype=np.float32)
    for i, img in enumerate(imgs):
        if labels[i]:
            img = img[::-1, ::-1]
        x[i] = preprocess_line(np.ascontiguousarray(img), 192)
    return (x, labels) if with_labels else x


def rec_inputs(split: Split = "calib", n: int = 32, width: int = 320, seed: int = 0, *,
               with_texts: bool = False):
    """Inputs for the PP-OCRv4 recogniser: float32 [n,3,48,width] (upright lines).

    With ``with_texts=True`` returns ``(x, texts)`` with the ground-truth strings.
    """
    lines = ocr_lines(n, seed, split)
    x = np.zeros((n, 3, 48, width), dtype=np.float32)
    for i, line in enumerate(lines):
        x[i] = preprocess_line(line.image, width)
    return (x, [line.text for line in lines]) if with_texts else x


# --------------------------------------------------------------------------- decode
@functools.lru_cache(maxsize=2)
def _charset_cached(path: str) -> tuple[str, ...]:
    import onnx

    m = onnx.load(path, load_external_data=False)
    meta = {p.key: p.value for p in m.metadata_props}
    if "character" not in meta:
        raise ValueError(f"{path} has no 'character' metadata")
    return ("blank",) + tuple(meta["character"].splitlines()) + (" ",)


def rec_charset(model_path: str | Path | None = None) -> tuple[str, ...]:
    """CTC classes of the rec model: ``blank`` + metadata ``character`` + ``" "``."""
    return _charset_cached(str(model_path or ppocr_rec_model_path()))


def ctc_greedy_decode(probs: np.ndarray, charset: Sequence[str] | None = None) -> list[str]:
    """Greedy CTC decoding of rec output [N,T,C]: argmax, merge repeats, drop blank (0)."""
    if charset is None:
        charset = rec_charset()
    idx = np.asarray(probs).argmax(axis=2)
    texts = []
    for row in idx:
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != 0
        texts.append("".join(charset[i] for i in row[keep]))
    return texts


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_accuracy(predicted: Sequence[str], reference: Sequence[str], *,
                  strip: bool = True) -> float:
    """``1 - sum(edit distance) / sum(len(reference))`` (can go below 0).

    With ``strip`` (default) leading/trailing spaces are ignored: PP-OCRv4
    often emits a space for the margin of the line crop.
    """
    if strip:
        predicted = [p.strip() for p in predicted]
        reference = [r.strip() for r in reference]
    errs = sum(edit_distance(p, r) for p, r in zip(predicted, reference, strict=True))
    return 1.0 - errs / max(1, sum(len(r) for r in reference))
