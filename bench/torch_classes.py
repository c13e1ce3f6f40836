"""Model classes as torch.onnx writes them: small PyTorch modules (random weights, BatchNorm
statistics drawn away from 0 / 1) exported by the TorchScript exporter at opset 17, for
`bench.class_sweep` (`--models torch_mbv2,...`). What the hand-built graphs of the sweep do
not have: the exporter's own idioms (Identity-shared parameters, Gemm for a Linear on 2-D
inputs, MatMul + Add on 3-D ones, nn.MultiheadAttention's reshapes, GroupNorm through
InstanceNormalization, PixelShuffle as DepthToSpace, LSTM with its transposes).
Needs torch (the test extra)."""
from __future__ import annotations

import io
import warnings
from collections.abc import Callable

import numpy as np
import onnx

Feeds = Callable[[np.random.Generator, int], dict[str, np.ndarray]]


def _modules() -> dict[str, tuple[Callable[[], object], Feeds]]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()

            def block(i: int, o: int, e: int, s: int) -> nn.Sequential:
                h = i * e
                return nn.Sequential(nn.Conv2d(i, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
                                     nn.Conv2d(h, h, 3, s, 1, groups=h, bias=False), nn.BatchNorm2d(h),
                                     nn.ReLU6(), nn.Conv2d(h, o, 1, bias=False), nn.BatchNorm2d(o))
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
            self.b1, self.b2, self.head = block(16, 24, 6, 2), block(24, 24, 6, 1), nn.Linear(24, 10)

        def forward(self, x):
            x = self.b1(self.stem(x))
            return self.head((x + self.b2(x)).mean((2, 3)))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(32, 5)

        def forward(self, ids, mask):
            return self.head(self.enc(self.emb(ids), src_key_padding_mask=mask).mean(1))

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn, self.out = nn.MultiheadAttention(32, 4, batch_first=True), nn.Linear(32, 8)

        def forward(self, x):
            return self.out(self.attn(x, x, x, need_weights=False)[0])

    class GroupNormShuffle(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.gn = nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32)
            self.c2, self.shuffle = nn.Conv2d(32, 12, 3, padding=1), nn.PixelShuffle(2)

        def forward(self, x):
            return self.shuffle(self.c2(F.silu(self.gn(self.c1(x)))))

    class BiLSTM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(64, 4)

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.d1, self.d2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.up, self.bn, self.out = nn.ConvTranspose2d(32, 16, 2, 2), nn.BatchNorm2d(16), nn.Conv2d(32, 2, 1)

        def forward(self, x):
            a = F.relu(self.d1(x))
            u = F.relu(self.bn(self.up(F.relu(self.d2(a)))))
            return torch.sigmoid(self.out(torch.cat([a, u], 1)))

    class TabularBN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.bn, self.l2 = nn.Linear(20, 64), nn.BatchNorm1d(64), nn.Linear(64, 3)

        def forward(self, x):
            return F.softmax(self.l2(F.relu(self.bn(self.l1(x)))), -1)

    class Conv1dNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.bn = nn.Conv1d(1, 16, 9, stride=4), nn.BatchNorm1d(16)
            self.c2, self.head = nn.Conv1d(16, 16, 3, dilation=2), nn.Linear(16, 6)

        def forward(self, x):
            return self.head(F.gelu(self.c2(F.relu(self.bn(self.c1(x))))).amax(-1))

    class SqueezeExcite(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c, self.f1, self.f2 = nn.Conv2d(3, 32, 3, padding=1), nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)
            self.act, self.head = nn.Hardswish(), nn.Linear(32, 10)

        def forward(self, x):
            y = self.act(self.c(x))
            w = torch.sigmoid(self.f2(F.relu(self.f1(y.mean((2, 3), keepdim=True)))))
            return self.head((y * w).flatten(2).mean(-1))

    class ChannelsLastNorm(nn.Module):  # a ConvNeXt block: LayerNorm and Linears after a permute
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.dw = nn.Conv2d(3, 16, 4, 4), nn.Conv2d(16, 16, 7, padding=3, groups=16)
            self.ln, self.p1, self.p2 = nn.LayerNorm(16), nn.Linear(16, 64), nn.Linear(64, 16)

        def forward(self, x):
            x = self.stem(x)
            y = self.dw(x).permute(0, 2, 3, 1)
            return x + self.p2(F.gelu(self.p1(self.ln(y)))).permute(0, 3, 1, 2)

    def image(size: int) -> Feeds:
        return lambda r, n: {"x": r.standard_normal((n, 3, size, size)).astype(np.float32)}

    def tokens(r: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        mask = np.zeros((n, 12), bool)
        mask[:, 8:] = r.random((n, 1)) < 0.5  # half the samples padded after 8 tokens
        return {"ids": r.integers(0, 100, (n, 12)).astype(np.int64), "mask": mask}

    return {
        "mbv2": (MobileNetV2, image(32)),
        "encoder": (Encoder, tokens),
        "mha": (Attention, lambda r, n: {"x": r.standard_normal((n, 10, 32)).astype(np.float32)}),
        "groupnorm": (GroupNormShuffle, image(16)),
        "bilstm": (BiLSTM, lambda r, n: {"x": r.standard_normal((n, 7, 16)).astype(np.float32)}),
        "unet": (UNet, image(16)),
        "tabular_bn": (TabularBN, lambda r, n: {"x": r.standard_normal((n, 20)).astype(np.float32)}),
        "conv1d": (Conv1dNet, lambda r, n: {"x": r.standard_normal((n, 1, 400)).astype(np.float32)}),
        "squeeze_excite": (SqueezeExcite, image(16)),
        "channels_last_norm": (ChannelsLastNorm, image(32)),
    }


NAMES = ("mbv2", "encoder", "mha", "groupnorm", "bilstm", "unet", "tabular_bn", "conv1d", "squeeze_excite",
         "channels_last_norm")


def export(name: str, seed: int = 0) -> tuple[onnx.ModelProto, Feeds]:
    """Module `name` of `NAMES` (seeded random weights; BatchNorm statistics and affine drawn
    from trained-looking ranges) exported by torch.onnx at opset 17 with a dynamic batch, and
    its feed generator."""
    import torch

    make, feeds = _modules()[name]
    torch.manual_seed(seed)
    module = make().eval()  # type: ignore[attr-defined]
    with torch.no_grad():
        for mod in module.modules():
            if isinstance(mod, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.3, 0.3)
    sample = feeds(np.random.default_rng(0), 2)
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notices
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(torch.from_numpy(v) for v in sample.values()), buf, dynamo=False,
                          opset_version=17, input_names=list(sample), output_names=["y"],
                          dynamic_axes={k: {0: "N"} for k in sample})
    return onnx.load_from_string(buf.getvalue()), feeds


def builders() -> dict[str, Callable[..., tuple[onnx.ModelProto, Feeds]]]:
    """`bench.class_sweep` builders, one per module: torch_<name>(seed=0)."""
    def builder(name: str) -> Callable[..., tuple[onnx.ModelProto, Feeds]]:
        def build(seed: int = 0) -> tuple[onnx.ModelProto, Feeds]:
            return export(name, seed)
        build.__name__ = f"torch_{name}"
        build.__doc__ = f"torch.onnx's export of a {name} module (bench.torch_classes)."
        return build
    return {f"torch_{n}": builder(n) for n in NAMES}
