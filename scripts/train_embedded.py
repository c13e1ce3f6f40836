#!/usr/bin/env python3
"""Train and export mixq's embedded default model (a small Fashion-MNIST CNN).

This is a maintainer script: it is *not* run by the test suite and torch is
*not* a runtime dependency of mixq. It writes

* ``src/mixq/data/fashion_cnn.onnx``  - the float32 model (opset 17)
* ``src/mixq/data/fashion_samples.npz`` - calibration / test images

Requirements (see INSTALL_NOTES.md)::

    apt-get install -y dataset-fashion-mnist     # data, MIT (Zalando Research)
    pip install torch==2.13.0                    # CPU build

Usage::

    python scripts/train_embedded.py [--epochs 6] [--out-dir src/mixq/data]

The ONNX graph is written by hand with ``onnx.helper`` (no torch.onnx
exporter) so that BatchNormalization stays a separate node after every Conv:
mixq's BN folding pass must have something to fold.

Model input: ``image`` float32 [N,1,28,28], raw pixels / 255 in [0, 1].
The Fashion-MNIST normalization ``(x - 0.2860) / 0.3530`` is the first op
of the graph (Sub, Mul). Output: ``logits`` float32 [N,10].
"""
from __future__ import annotations

import argparse
import gzip
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

# Determinism knobs must be set before torch initialises its thread pools.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
MEAN = 0.2860
STD = 0.3530
CLASS_NAMES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
SEED = 20240611
N_CALIB = 256
N_TEST = 500
OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17


# --------------------------------------------------------------------------- data
def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    ndim = magic & 0xFF
    assert (magic >> 8) == 0x08, f"{path}: expected unsigned byte idx data"
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist(data_dir: Path = DATA_DIR):
    if not (data_dir / "train-images-idx3-ubyte.gz").exists():
        sys.exit(f"Fashion-MNIST not found in {data_dir}: "
                 "apt-get install -y dataset-fashion-mnist")
    xtr = _read_idx(data_dir / "train-images-idx3-ubyte.gz")
    ytr = _read_idx(data_dir / "train-labels-idx1-ubyte.gz")
    xte = _read_idx(data_dir / "t10k-images-idx3-ubyte.gz")
    yte = _read_idx(data_dir / "t10k-labels-idx1-ubyte.gz")
    return xtr, ytr.astype(np.int64), xte, yte.astype(np.int64)


# --------------------------------------------------------------------------- model
class ConvBN(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class FashionCNN(nn.Module):
    """image[N,1,28,28] in [0,1] -> logits[N,10]; ~117k parameters.

    norm -> c1(1->16) relu -> maxpool -> c2(16->32) relu
    -> c3(32->32) relu -> c4(32->32) + c2 (residual Add) relu -> maxpool
    -> c5(32->64) relu -> c6(64->128) relu -> GAP -> flatten -> fc(128->10)
    """

    def __init__(self):
        super().__init__()
        self.c1 = ConvBN(1, 16)
        self.c2 = ConvBN(16, 32)
        self.c3 = ConvBN(32, 32)
        self.c4 = ConvBN(32, 32)
        self.c5 = ConvBN(32, 64)
        self.c6 = ConvBN(64, 128)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        x = (x - MEAN) * np.float32(1.0 / STD)
        x = F.relu(self.c1(x))
        x = F.max_pool2d(x, 2)
        r = F.relu(self.c2(x))
        x = F.relu(self.c3(r))
        x = F.relu(self.c4(x) + r)
        x = F.max_pool2d(x, 2)
        x = F.relu(self.c5(x))
        x = F.relu(self.c6(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


# --------------------------------------------------------------------------- train
def set_determinism(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    # Denormals make CPU training crawl after the first epoch; flushing them is
    # deterministic too.
    torch.set_flush_denormal(True)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, bs: int = 1000) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), bs):
            correct += (model(x[i:i + bs]).argmax(1) == y[i:i + bs]).sum().item()
    return correct / len(x)


def train(model, xtr, ytr, xte, yte, epochs: int, batch: int, lr: float, seed: int):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=5e-4)
    steps_per_epoch = len(xtr) // batch
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=lr, epochs=epochs, steps_per_epoch=steps_per_epoch, pct_start=0.25)
    for ep in range(epochs):
        t0 = time.time()
        model.train()
        perm = torch.randperm(len(xtr), generator=gen)
        flips = torch.rand(len(xtr), generator=gen) < 0.5
        tot = 0.0
        for s in range(steps_per_epoch):
            idx = perm[s * batch:(s + 1) * batch]
            xb = xtr[idx]
            fb = flips[idx]
            xb = torch.where(fb[:, None, None, None], xb.flip(3), xb)  # h-flip aug
            loss = F.cross_entropy(model(xb), ytr[idx], label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            tot += loss.item()
            if (s + 1) % 100 == 0:
                print(f"  step {s + 1}/{steps_per_epoch} loss {tot / (s + 1):.4f} "
                      f"({time.time() - t0:.1f}s)", flush=True)
        acc = evaluate(model, xte, yte)
        print(f"epoch {ep + 1}/{epochs}: loss {tot / steps_per_epoch:.4f} "
              f"test top-1 {acc * 100:.2f}%  ({time.time() - t0:.1f}s)", flush=True)
    return model


# --------------------------------------------------------------------------- export
def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def export_onnx(model: FashionCNN) -> onnx.ModelProto:
    model.eval()
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    init("norm.mean", np.array(MEAN, dtype=np.float32))
    init("norm.inv_std", np.array(1.0 / STD, dtype=np.float32))
    nodes.append(helper.make_node("Sub", ["image", "norm.mean"], ["norm.sub"], name="norm_sub"))
    nodes.append(helper.make_node("Mul", ["norm.sub", "norm.inv_std"], ["norm.out"], name="norm_mul"))

    def conv_bn(prefix: str, m: ConvBN, x: str) -> str:
        w = init(f"{prefix}.conv.weight", _np(m.conv.weight))
        nodes.append(helper.make_node(
            "Conv", [x, w], [f"{prefix}.conv.out"], name=f"{prefix}_conv",
            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1))
        bn = m.bn
        ins = [f"{prefix}.conv.out",
               init(f"{prefix}.bn.scale", _np(bn.weight)),
               init(f"{prefix}.bn.bias", _np(bn.bias)),
               init(f"{prefix}.bn.mean", _np(bn.running_mean)),
               init(f"{prefix}.bn.var", _np(bn.running_var))]
        nodes.append(helper.make_node(
            "BatchNormalization", ins, [f"{prefix}.bn.out"], name=f"{prefix}_bn",
            epsilon=float(bn.eps), momentum=float(1.0 - bn.momentum)))
        return f"{prefix}.bn.out"

    def relu(x: str, out: str) -> str:
        nodes.append(helper.make_node("Relu", [x], [out], name=out.replace(".", "_")))
        return out

    def maxpool(x: str, out: str) -> str:
        nodes.append(helper.make_node("MaxPool", [x], [out], name=out.replace(".", "_"),
                                      kernel_shape=[2, 2], strides=[2, 2]))
        return out

    x = relu(conv_bn("c1", model.c1, "norm.out"), "c1.relu")
    x = maxpool(x, "pool1")
    r = relu(conv_bn("c2", model.c2, x), "c2.relu")
    x = relu(conv_bn("c3", model.c3, r), "c3.relu")
    x = conv_bn("c4", model.c4, x)
    nodes.append(helper.make_node("Add", [x, r], ["res.add"], name="res_add"))
    x = relu("res.add", "res.relu")
    x = maxpool(x, "pool2")
    x = relu(conv_bn("c5", model.c5, x), "c5.relu")
    x = relu(conv_bn("c6", model.c6, x), "c6.relu")
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    nodes.append(helper.make_node(
        "Gemm", ["flat", init("fc.weight", _np(model.fc.weight)), init("fc.bias", _np(model.fc.bias))],
        ["logits"], name="fc", alpha=1.0, beta=1.0, transA=0, transB=1))

    graph = helper.make_graph(
        nodes, "fashion_cnn",
        inputs=[helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 28, 28])],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                          producer_name="mixq/scripts/train_embedded.py", producer_version="1")
    m.ir_version = IR_VERSION
    m.doc_string = ("Fashion-MNIST CNN (mixq embedded default model). Input 'image' float32 "
                    "[N,1,28,28] = pixels/255 in [0,1]; output 'logits' [N,10]. Classes: "
                    + ", ".join(CLASS_NAMES))
    helper.set_model_props(m, {"classes": "\n".join(CLASS_NAMES),
                               "normalization": f"(x - {MEAN}) / {STD} (inside the graph)",
                               "dataset": "Fashion-MNIST (Zalando Research, MIT)"})
    onnx.checker.check_model(m, full_check=True)
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--out-dir", type=Path,
                    default=Path(__file__).resolve().parents[1] / "src" / "mixq" / "data")
    args = ap.parse_args(argv)

    t_start = time.time()
    set_determinism(args.seed)
    xtr_u8, ytr, xte_u8, yte = load_fashion_mnist()
    xtr = torch.from_numpy(xtr_u8.astype(np.float32)[:, None] / 255.0)
    xte = torch.from_numpy(xte_u8.astype(np.float32)[:, None] / 255.0)
    ytr_t, yte_t = torch.from_numpy(ytr), torch.from_numpy(yte)

    model = FashionCNN()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"FashionCNN: {n_params} parameters; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    train(model, xtr, ytr_t, xte, yte_t, args.epochs, args.batch, args.lr, args.seed)
    model.eval()
    full_acc = evaluate(model, xte, yte_t)
    t_train = time.time() - t_start
    print(f"training done in {t_train:.1f}s; full test top-1 (torch) {full_acc * 100:.2f}%")

    # ---- samples: calib from TRAIN split, test from TEST split (disjoint by split)
    rng = np.random.default_rng(args.seed)
    calib_idx = np.sort(rng.choice(len(xtr_u8), N_CALIB, replace=False))
    test_idx = np.sort(rng.choice(len(xte_u8), N_TEST, replace=False))
    calib_u8 = np.ascontiguousarray(xtr_u8[calib_idx][:, None])
    test_u8 = np.ascontiguousarray(xte_u8[test_idx][:, None])
    test_labels = yte[test_idx].astype(np.int64)

    # ---- export + verify against torch
    onnx_model = export_onnx(model)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out_dir / "fashion_cnn.onnx"
    onnx.save(onnx_model, onnx_path)

    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    test_f = test_u8.astype(np.float32) / np.float32(255.0)
    calib_f = calib_u8.astype(np.float32) / np.float32(255.0)
    for name, arr in (("test", test_f), ("calib", calib_f)):
        ort_out = sess.run(["logits"], {"image": arr})[0]
        with torch.no_grad():
            ref = model(torch.from_numpy(arr)).numpy()
        diff = float(np.abs(ort_out - ref).max())
        print(f"onnxruntime vs torch on {name} samples: max |diff| = {diff:.2e}")
        if diff > 1e-4:
            raise SystemExit(f"ONNX export mismatch: {diff}")
    ort_logits = sess.run(["logits"], {"image": test_f})[0]
    n_correct = int((ort_logits.argmax(1) == test_labels).sum())

    np.savez_compressed(
        args.out_dir / "fashion_samples.npz",
        calib_images=calib_u8, calib_indices=calib_idx.astype(np.int64),
        test_images=test_u8, test_labels=test_labels, test_indices=test_idx.astype(np.int64),
        class_names=np.array(CLASS_NAMES),
    )
    print(f"wrote {onnx_path} ({onnx_path.stat().st_size} bytes)")
    npz = args.out_dir / "fashion_samples.npz"
    print(f"wrote {npz} ({npz.stat().st_size} bytes)")
    print(f"float top-1 on the {N_TEST} shipped test images (onnxruntime): "
          f"{n_correct}/{N_TEST} = {n_correct / N_TEST * 100:.2f}%")
    print(f"total time {time.time() - t_start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
