"""Train the default model (preset ``small``, byte-level) on the text shipped in data/*.txt.

Writes models/weights/small.pt (a tensors-only state dict), which ``load_model()`` loads for the preset.
Deterministic: seeded, one thread, deterministic algorithms, a fixed number of steps (``--minutes`` only caps
the run; a capped run says so, since it then depends on the machine's speed).

    python scripts/train_default.py                      # the shipped weights: 1400 steps, ~5-10 min on one core
    python scripts/train_default.py --steps 50 -o /tmp/w.pt
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mhaexport.models.config import PRESETS  # noqa: E402
from mhaexport.models.decoder import DecoderLM  # noqa: E402


def load_corpus(folder: Path) -> bytes:
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise SystemExit(f"no *.txt in {folder}")
    return b"\n\n".join(f.read_bytes() for f in files)


def batches(data: torch.Tensor, block: int, batch: int, gen: torch.Generator):
    """Random windows of block + 1 bytes: inputs (B, T) and next-byte targets (B, T)."""
    while True:
        starts = torch.randint(0, len(data) - block - 1, (batch,), generator=gen)
        win = torch.stack([data[s:s + block + 1] for s in starts.tolist()])  # (B, T + 1)
        yield win[:, :-1], win[:, 1:]


def loss_of(model: DecoderLM, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    mask = torch.ones_like(x)  # (B, T): no padding
    logits, _ = model(x, mask, None)  # (B, T, vocab)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model: DecoderLM, data: torch.Tensor, block: int) -> float:
    """Mean next-byte loss over consecutive windows of ``data``."""
    model.eval()
    n = (len(data) - 1) // block
    x = data[: n * block].view(n, block)
    y = data[1: n * block + 1].view(n, block)
    loss = loss_of(model, x, y).item()
    model.train()
    return loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--data", type=Path, default=ROOT / "data")
    ap.add_argument("--steps", type=int, default=1400)
    ap.add_argument("--minutes", type=float, default=None, help="stop early after this long (not reproducible)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--block", type=int, default=256,
                    help="window length (capped at max_positions): every position the model accepts gets trained")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-o", "--output", type=Path, default=None, help="default: models/weights/{preset}.pt")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    cfg = PRESETS[args.preset]
    if cfg.vocab_size != 256:
        raise SystemExit(f"preset {args.preset} has vocab_size {cfg.vocab_size}: this script trains byte-level models")
    block = min(args.block, cfg.max_positions)
    raw = torch.tensor(list(load_corpus(args.data)), dtype=torch.int64)
    split = int(len(raw) * 0.95)
    train, val = raw[:split], raw[split:]

    model = DecoderLM(cfg)  # deterministic init from cfg.seed
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10 %
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    gen = torch.Generator().manual_seed(args.seed)
    stream = batches(train, block, args.batch, gen)
    started = time.perf_counter()
    curve = []
    avg = None
    step = 0
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = next(stream)
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        avg = loss.item() if avg is None else 0.95 * avg + 0.05 * loss.item()
        if step % 100 == 0 or step == args.steps - 1:
            val_loss = evaluate(model, val, block)
            elapsed = time.perf_counter() - started
            curve.append({"step": step, "train": round(avg, 4), "val": round(val_loss, 4), "s": round(elapsed, 1)})
            print(f"step {step:5d}  train {avg:.3f}  val {val_loss:.3f}  ({elapsed:.0f} s)", flush=True)
        if args.minutes is not None and time.perf_counter() - started > args.minutes * 60:
            print(f"stopped by --minutes {args.minutes} at step {step}: not the reproducible {args.steps} steps")
            break

    out = args.output or ROOT / "models" / "weights" / f"{args.preset}.pt"
    out.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    torch.save(model.state_dict(), out)
    summary = {"preset": args.preset, "steps": step + 1, "batch": args.batch, "block": block, "lr": args.lr,
               "seed": args.seed, "corpus_bytes": len(raw), "seconds": round(time.perf_counter() - started, 1),
               "curve": curve}
    (out.with_suffix(".json")).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
