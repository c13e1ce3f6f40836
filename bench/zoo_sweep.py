"""Robustness sweep: every preset on small, randomly initialised architectures mixq was never
tuned on (built offline from `transformers` configs, exported with torch.onnx).

    python -m bench.zoo_sweep [--models bert,vit,...] [--presets A8W8,...] [--half] [--out FILE.json]
    python -m bench.zoo_sweep --auto [--models ...]   # `mixq auto --metric cosine --target 0.01`

The weights are random (nothing is downloaded), so the metrics say little about accuracy;
what the sweep checks is that every preset either writes a model that runs in stock
onnxruntime with its default optimizations, with the guard's verdict, or stops with a clear
mixq error, never an internal one. Prints one table (model x preset: the output SQNR of the
guard, `broken` or `likely loss` where it warns, or the error's class). `--half` exports the float16 model
(`.half()`: float16 weights, inputs and outputs).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: Models whose random-init signal fades to ~1e-45 through BatchNorms of unit statistics: their
#: BatchNorm statistics are taken from the calibration data before export. (Other CNNs keep the
#: unit statistics: with data statistics their random float networks turn chaotic, BF16 alone
#: reading 12 dB on MobileNetV2.)
DATA_BATCHNORM = {"mobilevit"}

PRESETS = ("XINT8", "A8W8", "A16W8", "U8S8", "S16S16", "BF16", "BFP16", "MXFP4", "MX9")
SEQ, IMG = 16, 64


def _text(name: str, cfg_cls: str, model_cls: str, **cfg: Any) -> tuple[str, Callable[[], Any], str]:
    return name, lambda: (cfg_cls, model_cls, cfg), "text"


def _vision(name: str, cfg_cls: str, model_cls: str, **cfg: Any) -> tuple[str, Callable[[], Any], str]:
    return name, lambda: (cfg_cls, model_cls, cfg), "vision"


def _audio(name: str, cfg_cls: str, model_cls: str, **cfg: Any) -> tuple[str, Callable[[], Any], str]:
    return name, lambda: (cfg_cls, model_cls, cfg), "audio"


def _mel(name: str, cfg_cls: str, model_cls: str, **cfg: Any) -> tuple[str, Callable[[], Any], str]:
    return name, lambda: (cfg_cls, model_cls, cfg), "mel"


_T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
          vocab_size=500)
MODELS = [
    _text("bert", "BertConfig", "BertModel", **_T),
    _text("distilbert", "DistilBertConfig", "DistilBertModel", dim=64, n_layers=2, n_heads=4,
          hidden_dim=128, vocab_size=500),
    _text("gpt2", "GPT2Config", "GPT2Model", n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=64,
          bos_token_id=0, eos_token_id=0, pad_token_id=0),
    _text("clip_text", "CLIPTextConfig", "CLIPTextModel", max_position_embeddings=SEQ, **_T),
    _text("bart_encoder", "BartConfig", "BartModel", d_model=64, encoder_layers=2, decoder_layers=2,
          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
          vocab_size=500),
    _text("llama", "LlamaConfig", "LlamaModel", num_key_value_heads=2, **_T),
    _text("qwen2", "Qwen2Config", "Qwen2Model", num_key_value_heads=2, **_T),
    _text("t5_encoder", "T5Config", "T5EncoderModel", d_model=64, d_kv=16, d_ff=128, num_layers=2,
          num_heads=4, vocab_size=500),
    _text("albert", "AlbertConfig", "AlbertModel", embedding_size=32, **_T),
    _text("mobilebert", "MobileBertConfig", "MobileBertModel", hidden_size=64, num_hidden_layers=2,
          num_attention_heads=4, intermediate_size=64, embedding_size=32, intra_bottleneck_size=32,
          true_hidden_size=32, vocab_size=500),
    _text("electra", "ElectraConfig", "ElectraModel", embedding_size=32, **_T),
    _text("roberta", "RobertaConfig", "RobertaModel", **_T),
    _text("deberta_v2", "DebertaV2Config", "DebertaV2Model", relative_attention=True, pos_att_type=["p2c", "c2p"],
          max_relative_positions=32, position_buckets=8, **_T),
    _text("mpnet", "MPNetConfig", "MPNetModel", **_T),
    _text("squeezebert", "SqueezeBertConfig", "SqueezeBertModel", embedding_size=64, q_groups=2, k_groups=2,
          v_groups=2, post_attention_groups=2, intermediate_groups=4, output_groups=4, **_T),
    _text("opt", "OPTConfig", "OPTModel", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
          ffn_dim=128, word_embed_proj_dim=64, vocab_size=500, max_position_embeddings=64),
    _text("bloom", "BloomConfig", "BloomModel", hidden_size=64, n_layer=2, n_head=4, vocab_size=500),
    _text("gpt_neo", "GPTNeoConfig", "GPTNeoModel", hidden_size=64, num_layers=2, num_heads=4,
          attention_types=[[["global", "local"], 1]], window_size=8, vocab_size=500, max_position_embeddings=64),
    _text("phi", "PhiConfig", "PhiModel", partial_rotary_factor=0.5, **_T),
    _text("gemma", "GemmaConfig", "GemmaModel", num_key_value_heads=1, head_dim=16, **_T),
    _text("xlnet", "XLNetConfig", "XLNetModel", d_model=64, n_layer=2, n_head=4, d_inner=128, vocab_size=500),
    _text("mamba", "MambaConfig", "MambaModel", hidden_size=64, num_hidden_layers=2, state_size=8,
          vocab_size=500, use_mambapy=True),
    _text("ibert", "IBertConfig", "IBertModel", quant_mode=False, **_T),
    _vision("vit", "ViTConfig", "ViTModel", image_size=IMG, patch_size=16, **{k: v for k, v in _T.items() if k != "vocab_size"}),
    _vision("convnext", "ConvNextConfig", "ConvNextModel", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    _vision("swin", "SwinConfig", "SwinModel", image_size=IMG, patch_size=4, embed_dim=16, depths=[1, 1],
            num_heads=[2, 2], window_size=4),
    _vision("mobilenet_v2", "MobileNetV2Config", "MobileNetV2Model", image_size=IMG, depth_multiplier=0.35),
    _vision("beit", "BeitConfig", "BeitModel", image_size=IMG, patch_size=16, use_relative_position_bias=True,
            **{k: v for k, v in _T.items() if k != "vocab_size"}),
    _vision("yolos", "YolosConfig", "YolosModel", image_size=[IMG, IMG], patch_size=16, num_detection_tokens=10,
            **{k: v for k, v in _T.items() if k != "vocab_size"}),
    _vision("resnet", "ResNetConfig", "ResNetModel", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
            embedding_size=16),
    _vision("regnet", "RegNetConfig", "RegNetModel", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
            embedding_size=16, groups_width=8),
    _vision("segformer", "SegformerConfig", "SegformerModel", hidden_sizes=[16, 32, 64, 128],
            depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 4, 8], decoder_hidden_size=64),
    _vision("levit", "LevitConfig", "LevitModel", image_size=IMG),
    _vision("dinov2", "Dinov2Config", "Dinov2Model", image_size=IMG, patch_size=16,
            **{k: v for k, v in _T.items() if k != "vocab_size"}),
    _vision("dpt", "DPTConfig", "DPTForDepthEstimation", image_size=IMG, patch_size=16,
            neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32, backbone_out_indices=[0, 1, 2, 3],
            reassemble_factors=[4, 2, 1, 0.5], **{**{k: v for k, v in _T.items() if k != "vocab_size"},
                                                   "num_hidden_layers": 4}),
    _vision("mobilevit", "MobileViTConfig", "MobileViTModel", image_size=IMG, hidden_sizes=[32, 48, 64],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]),
    _vision("mobilenet_v1", "MobileNetV1Config", "MobileNetV1Model", image_size=IMG, depth_multiplier=0.25),
    _vision("poolformer", "PoolFormerConfig", "PoolFormerModel", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    _vision("convnextv2", "ConvNextV2Config", "ConvNextV2Model", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    _vision("bit", "BitConfig", "BitModel", hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], embedding_size=32, num_groups=4),
    _vision("swinv2", "Swinv2Config", "Swinv2Model", image_size=IMG, patch_size=4, embed_dim=16, depths=[1, 1],
            num_heads=[2, 2], window_size=4),
    _vision("pvt_v2", "PvtV2Config", "PvtV2Model", image_size=IMG, hidden_sizes=[16, 32, 64, 128],
            depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 4, 8]),
    _vision("cvt", "CvtConfig", "CvtModel", embed_dim=[16, 32, 64], num_heads=[1, 2, 4], depth=[1, 2, 3]),
    _vision("glpn", "GLPNConfig", "GLPNForDepthEstimation", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
            num_attention_heads=[1, 2, 4, 8], decoder_hidden_size=16),
    _mel("whisper_encoder", "WhisperConfig", "WhisperModel.encoder", d_model=64, encoder_layers=2,
         decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
         decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=50, vocab_size=500, pad_token_id=0,
         bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
    _audio("hubert", "HubertConfig", "HubertModel", hidden_size=64, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
           conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
    _audio("wavlm", "WavLMConfig", "WavLMModel", hidden_size=64, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
           conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
    _audio("wav2vec2", "Wav2Vec2Config", "Wav2Vec2Model", hidden_size=64, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
           conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
]


def build(name: str, spec: Callable[[], Any], kind: str, d: Path, half: bool = False, opset: int = 17
          ) -> tuple[str, list[dict[str, np.ndarray]]]:
    """Export the model to d/NAME.onnx (float16 with `half`, at `opset`); returns (path,
    calibration feeds)."""
    import warnings

    import torch
    import transformers

    cfg_cls, model_cls, cfg = spec()
    torch.manual_seed(0)
    config = getattr(transformers, cfg_cls)(**cfg)
    cls_name, _, part = model_cls.partition(".")  # "WhisperModel.encoder": a submodule
    model = getattr(transformers, cls_name)(config)
    model = (getattr(model, part) if part else model).eval()
    fdt = torch.float16 if half else torch.float32
    rng = np.random.default_rng(0)
    path = str(d / f"{name}.onnx")
    if kind == "text":
        names = ["input_ids", "attention_mask"]
        ids = torch.tensor(rng.integers(0, 500, (1, SEQ)), dtype=torch.long)
        args: tuple = (ids, torch.ones(1, SEQ, dtype=torch.long))
        feeds = []
        for i in range(16):
            mask = np.ones((2, SEQ), np.int64)
            mask[1, SEQ - 1 - i % 8:] = 0  # padded rows: an additive mask in the graph
            feeds.append({"input_ids": rng.integers(0, 500, (2, SEQ)).astype(np.int64), "attention_mask": mask})
        dyn = {"input_ids": {0: "N", 1: "S"}, "attention_mask": {0: "N", 1: "S"}}
    elif kind == "vision":
        names = ["pixel_values"]
        args = (torch.zeros(1, 3, IMG, IMG, dtype=fdt),)
        feeds = [{"pixel_values": rng.standard_normal((2, 3, IMG, IMG)).astype(np.float32)} for _ in range(16)]
        dyn = {"pixel_values": {0: "N"}}
    elif kind == "mel":
        names = ["input_features"]
        args = (torch.zeros(1, 16, 100, dtype=fdt),)
        feeds = [{"input_features": rng.standard_normal((2, 16, 100)).astype(np.float32)} for _ in range(16)]
        dyn = {"input_features": {0: "N"}}
    else:
        names = ["input_values"]
        args = (torch.zeros(1, 4000, dtype=fdt),)
        feeds = [{"input_values": rng.standard_normal((2, 4000)).astype(np.float32)} for _ in range(16)]
        dyn = {"input_values": {0: "N", 1: "T"}}

    class First(torch.nn.Module):  # the first output only (last hidden state)
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, *a: Any) -> Any:
            if kind == "text":  # by keyword: GPT-2's second positional argument is its cache
                out = self.m(input_ids=a[0], attention_mask=a[1], return_dict=False)
            else:
                out = self.m(*a, return_dict=False)
            return out[0]

    wrapped = First(model)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if name in DATA_BATCHNORM:  # statistics of the data, as training leaves them
        assert norms, name
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative mean over the batches below
            m.train()
        with torch.no_grad():
            for f in feeds[:8]:
                wrapped(*(torch.from_numpy(f[n]) for n in names))
        model.eval()
    if half:
        model = model.half()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, args, path, opset_version=opset, dynamo=False, input_names=names,
                          output_names=["out"], dynamic_axes={**dyn, "out": {0: "N"}} if dyn else None)
    return path, feeds


def run_one(path: str, feeds: list[dict[str, np.ndarray]], preset: str, d: Path) -> dict[str, Any]:
    import onnxruntime as ort

    import mixq
    from mixq.errors import MixqError

    out = d / f"{Path(path).stem}_{preset}.onnx"
    t = time.perf_counter()
    try:
        res = mixq.quantize(path, preset, calibration_data=feeds, output_path=str(out))
    except MixqError as exc:
        return {"status": "error", "kind": type(exc).__name__, "message": str(exc)[:400]}
    except Exception as exc:  # noqa: BLE001 - an internal error is what the sweep looks for
        return {"status": "crash", "kind": type(exc).__name__, "message": str(exc)[:400],
                "trace": traceback.format_exc()[-2500:]}
    row: dict[str, Any] = {"status": "ok", "s": round(time.perf_counter() - t, 2)}
    fid = getattr(res, "fidelity", None)
    if fid is not None and getattr(fid, "outputs", None):
        row["sqnr"] = round(min(o.sqnr_db for o in fid.outputs), 1)
        row["broken"] = bool(fid.broken)
        row["likely_loss"] = fid.likely_loss is not None
        row["named"] = len(fid.culprits) + len(getattr(fid, "damage_groups", []) or [])
        if fid.runtime_sqnr_db is not None:  # the same model at default optimizations (fused kernels)
            row["runtime_sqnr"] = round(fid.runtime_sqnr_db, 1)
            row["runtime_disagrees"] = fid.runtime_disagrees
    elif fid is not None:
        row["not_checked"] = getattr(fid, "not_checked", "")
    try:  # the user's runtime: stock onnxruntime, default optimizations
        so = ort.SessionOptions()
        so.log_severity_level = 3
        s = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
        f16 = {i.name for i in s.get_inputs() if i.type == "tensor(float16)"}
        got = s.run(None, {k: v.astype(np.float16) if k in f16 else v for k, v in feeds[0].items()})[0]
        row["finite"] = bool(np.all(np.isfinite(got)))
    except Exception as exc:  # noqa: BLE001
        row["status"] = "does not run"
        row["message"] = str(exc)[:400]
    return row


def run_auto(path: str, feeds: list[dict[str, np.ndarray]], d: Path) -> dict[str, Any]:
    """`mixq auto` (the CLI, default candidates) to a 0.01 cosine drop: exit code and the
    chosen row of its table, or the internal error."""
    import contextlib
    import io

    from mixq.cli.main import main as cli

    calib = d / f"{Path(path).stem}_feeds.npz"
    np.savez(calib, **{f"{i:05d}/{k}": v for i, f in enumerate(feeds) for k, v in f.items()})
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli(["auto", path, str(d / f"{Path(path).stem}_auto.onnx"), "--calib", str(calib),
                      "--metric", "cosine", "--target", "0.01", "--no-cache", "-q"])
    except Exception as exc:  # noqa: BLE001 - an internal error is what the sweep looks for
        return {"status": "crash", "kind": type(exc).__name__, "message": str(exc)[:400],
                "trace": traceback.format_exc()[-2500:]}
    chosen = [ln for ln in (out.getvalue() + err.getvalue()).splitlines() if "**chosen**" in ln]
    return {"status": "ok" if rc == 0 else f"exit {rc}", "chosen": chosen[-1] if chosen else "",
            "message": err.getvalue()[-400:] if rc else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(m[0] for m in MODELS))
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--half", action="store_true", help="export float16 models")
    ap.add_argument("--opset", type=int, default=17, help="export opset (default 17)")
    ap.add_argument("--auto", action="store_true", help="run mixq auto (cosine drop 0.01) instead of the presets")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    want = args.models.split(",")
    presets = args.presets.split(",")
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mixq_zoo_") as tmp:
        d = Path(tmp)
        for name, spec, kind in MODELS:
            if name not in want:
                continue
            try:
                path, feeds = build(name, spec, kind, d, half=args.half, opset=args.opset)
            except Exception as exc:  # noqa: BLE001 - an architecture this torch cannot export
                rows[name] = {"build": f"{type(exc).__name__}: {str(exc)[:200]}"}
                print(f"{name}: not built ({type(exc).__name__}: {str(exc)[:120]})", flush=True)
                continue
            rows[name] = {}
            if args.auto:
                r = run_auto(path, feeds, d)
                rows[name]["auto"] = r
                print(f"{name} auto: {r['status']} {r.get('chosen', '')} {r.get('message', '')}", flush=True)
                continue
            for p in presets:
                r = run_one(path, feeds, p, d)
                rows[name][p] = r
                brief = r.get("sqnr", r.get("kind", r.get("not_checked", "")))
                print(f"{name} {p}: {r['status']} {brief}{' broken' if r.get('broken') else (' likely loss' if r.get('likely_loss') else '')}"
                      f"{' RUNTIME ' + str(r['runtime_sqnr']) if r.get('runtime_disagrees') else ''}"
                      f"{' NONFINITE' if r.get('finite') is False else ''}", flush=True)
                if r["status"] != "ok":
                    print("   ", r.get("message", ""), flush=True)
    if args.auto:
        presets = ["auto"]
    print()
    print("| model | " + " | ".join(presets) + " |")
    print("|---|" + "---|" * len(presets))
    for name, r in rows.items():
        if "build" in r:
            print(f"| {name} | not built: {r['build'][:60]} |")
            continue
        cells = []
        for p in presets:
            c = r[p]
            if p == "auto":
                row = [x.strip() for x in c.get("chosen", "").strip("|").split("|")]
                cells.append(f"{c['status']}: cosine {row[1]}, {row[3]} MB of weights" if len(row) > 3
                             else f"**{c['status']}**: {c.get('kind', '')}")
            elif c["status"] == "ok":
                cells.append(f"{c.get('sqnr', '-')}{' broken' if c.get('broken') else (' likely loss' if c.get('likely_loss') else '')}"
                             f"{' (runtime ' + str(c['runtime_sqnr']) + ')' if c.get('runtime_disagrees') else ''}"
                             f"{'' if c.get('finite', True) else ' non-finite'}")
            else:
                cells.append(f"**{c['status']}**: {c.get('kind', '')}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    bad = sum(1 for r in rows.values() for c in r.values() if isinstance(c, dict) and c.get("status") in ("crash", "does not run"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
