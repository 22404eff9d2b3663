"""GPU figures, measured side by side in one run (needs a CUDA device):

1. trainer throughput on real photographs (`zoo example photos`, 2,000 per class): `zoo
   finetune` with the decode-once image cache (built first by `zoo check --cache-for`, timed
   apart) and without it (PIL), against the same loop on synthetic tensors already on the
   GPU (`bench/hand_train.py --synthetic`: the compute ceiling), as processes: resnet18 from
   scratch, batch 256, bf16 autocast, channels_last, every CPU but one as loader workers.
   Both keep torch's TF32 defaults (zoo sets none); the hand loop reports its flags.
2. inference latency: eager vs torch.compile at batch 1 and 64, fp32 with TF32 set explicitly
   (``--tf32 off`` by default: true fp32 matmuls *and* convolutions; torch's default runs
   cuDNN convolutions in TF32);
3. parity of each CUDA path against CPU eager on real images (real ImageNet weights), same TF32
   setting.

    python bench/gpu_bench.py --out-dir docs/bench     (bench/run_gpu_checks.sh runs it)

Writes ``gpu_bench_<device>.json`` (e.g. gpu_bench_h200.json) with the provenance of the run.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import torch
from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import hand_train, timed, zoo_cmd, zoo_finetune
from hand_train import set_tf32
from provenance import RESULTS_DIR, Recording, headline
from torch import nn

from zoo import create_model
from zoo.deploy.bench.harness import time_session
from zoo.factory import info_of
from zoo.samples import sample_image_paths, write_photo_folder
from zoo.system import available_cpus
from zoo.transforms import eval_transform


def latency() -> list[dict[str, object]]:
    out = []
    for dtype in (torch.float32,):
        model = create_model("resnet18", weights="none").cuda().eval().to(dtype)
        compiled = torch.compile(model)
        for bs in (1, 64):
            x = torch.randn(bs, 3, 224, 224, device="cuda", dtype=dtype)
            with torch.inference_mode():
                t0 = time.perf_counter()
                compiled(x)
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
                e = time_session(lambda m=model, x=x: m(x), cuda=True, min_seconds=0.5)
                c = time_session(lambda m=compiled, x=x: m(x), cuda=True, min_seconds=0.5)
            out.append(
                {
                    "dtype": str(dtype).split(".")[1],
                    "batch": bs,
                    "eager_p50_ms": e["p50_ms"],
                    "compiled_p50_ms": c["p50_ms"],
                    "speedup": round(e["p50_ms"] / c["p50_ms"], 2),
                    "compile_s": round(compile_s, 1),
                }
            )
    return out


def parity() -> dict[str, object]:
    info = info_of(create_model("mobilenet_v2"))
    tf = eval_transform(info)
    from PIL import Image

    x = torch.stack([tf(Image.open(p)) for p in sample_image_paths()])
    cpu = create_model("mobilenet_v2")
    with torch.inference_mode():
        ref = cpu(x)
        gpu = create_model("mobilenet_v2").cuda()
        paths = {
            "eager": gpu,
            "compile": torch.compile(create_model("mobilenet_v2").cuda()),
            "torchscript": torch.jit.trace(gpu, x.cuda()),
            "bf16_autocast": lambda t: _autocast(gpu, t),
        }
        result = {}
        for name, fn in paths.items():
            y = fn(x.cuda()).float().cpu()
            result[name] = {
                "max_abs": float((y - ref).abs().max()),
                "top1_agree": bool(torch.equal(y.argmax(1), ref.argmax(1))),
            }
    return result


def _autocast(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return model(x)


def device_slug(name: str) -> str:
    """ "NVIDIA H200" → "h200": the file name part for one kind of device."""
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower().replace("nvidia", "")).strip("_")
    return slug or "unknown"


def trainer(args: argparse.Namespace, device: str, tmp: Path) -> dict[str, object]:
    """zoo finetune on real photographs with the image cache (uint8 crops from the workers,
    jittered and normalised on the GPU) and without it (PIL decode and augmentation in the workers), against
    the same loop on synthetic tensors already on the device (the compute ceiling)."""
    t0 = time.perf_counter()
    data = write_photo_folder(tmp / "photos", per_class=args.per_class, workers=available_cpus())
    folder_s = time.perf_counter() - t0
    env = {"ZOO_CACHE": str(tmp / "cache")}
    build = timed([*zoo_cmd(), "check", str(data), "--cache-for", "resnet18"], env=env)
    common = ["--epochs", str(args.epochs), "--image-size", str(args.image_size)]
    hand_opts = ["--model", "resnet18", "--batch", str(args.batch), "--workers", str(args.workers)]
    hand_opts += ["--augment", "--channels-last", "--device", device, *common]
    if device == "cuda":
        hand_opts.append("--bf16")
    zoo_opts = ["--weights", "none", "--strategy", "full", "-b", str(args.batch), *common]
    zoo_opts += ["--num-workers", str(args.workers), "--channels-last", "--device", device]
    zoo_opts += ["--no-progress"] + (["--amp", "bf16"] if device == "cuda" else [])
    ceiling = hand_train(data, tmp / "synthetic", *hand_opts, "--synthetic")
    variants = {
        "on": ("on", {}),
        "off": ("off", {}),
    }
    runs = {
        name: zoo_finetune(
            "resnet18",
            data,
            tmp / "runs" / name,
            *zoo_opts,
            "--image-cache",
            mode,
            env={**env, **extra},
        )
        for name, (mode, extra) in variants.items()
    }
    ceiling_ips = round(ceiling.extra["rows"][-1]["img_per_s"])
    rows = {mode: proc.extra["rows"][-1] for mode, proc in runs.items()}
    return {
        "model": "resnet18",
        "batch": args.batch,
        "workers": args.workers,
        "epochs": args.epochs,
        "image_size": args.image_size,
        "data": f"zoo example photos, {args.per_class} per class (7 classes)",
        "photo_folder_s": round(folder_s, 1),
        "train_images": ceiling.extra["summary"]["train_images"],
        "cache_build_command": "zoo check DIR --cache-for resnet18",
        "cache_build_s": round(build.seconds, 1),
        "zoo_command": "zoo finetune resnet18 --data DIR "
        + " ".join(zoo_opts)
        + " --image-cache on|off",
        "ceiling_command": "python bench/hand_train.py --data DIR --synthetic "
        + " ".join(hand_opts),
        "synthetic_ceiling_img_per_s": ceiling_ips,
        "img_per_s": {m: round(r["img_per_s"]) for m, r in rows.items()},
        "data_wait": {m: round(r["data_wait"], 3) for m, r in rows.items()},
        "val_acc": {m: round(r["val/acc"], 4) for m, r in rows.items()},
        "whole_process_s": {m: round(p.seconds, 1) for m, p in runs.items()},
        "ratio_cache_vs_ceiling": round(rows["on"]["img_per_s"] / ceiling_ips, 3),
        "ratio_pil_vs_ceiling": round(rows["off"]["img_per_s"] / ceiling_ips, 3),
        "tf32_hand_loop": ceiling.extra["summary"]["tf32"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", default=None, help=f"default: {RESULTS_DIR}")
    p.add_argument("--per-class", type=int, default=2000, help="photos per class (7 classes)")
    p.add_argument("--workers", type=int, default=max(1, available_cpus() - 1))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--tf32", choices=["off", "on"], default="off", help="latency and parity")
    p.add_argument(
        "--smoke-cpu",
        action="store_true",
        help="tiny CPU run (1 epoch, 32 px, 1 worker) that only checks the script works; "
        "writes to ./gpu-smoke unless --out-dir",
    )
    args = p.parse_args()
    if args.smoke_cpu:
        args.per_class, args.workers, args.epochs, args.batch, args.image_size = 20, 1, 1, 32, 64
    out_dir = Path(args.out_dir or ("gpu-smoke" if args.smoke_cpu else RESULTS_DIR))
    rec = Recording("gpu_bench")
    device = "cpu" if args.smoke_cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_bench.py needs a CUDA device (or --smoke-cpu to check the script)")
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    report: dict[str, object] = {"device": name, "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        report["trainer"] = trainer(args, device, Path(tmp))
    print(report, flush=True)
    report["tf32"] = set_tf32(args.tf32)
    if device == "cuda":
        report["latency"] = latency()
        report["parity"] = parity()
    tr = report["trainer"]
    report["headlines"] = [
        headline(
            f"GPU trainer img/s with the image cache vs the synthetic-tensor ceiling ({name})",
            "trainer.ratio_cache_vs_ceiling",
            tr["ratio_cache_vs_ceiling"],  # type: ignore[index]
            ">=",
            0.8,
        )
    ]
    out = out_dir / f"gpu_bench_{device_slug(name)}.json"
    print(rec.write(report, out).read_text())


if __name__ == "__main__":
    main()
