"""Time of loading a transformers model the exact way (gradscope.models.adapters.load.load_hf: headers,
meta-device check, build, fill) against ``from_pretrained``, on a saved random model (no download).

    python bench/hf_load.py [--hidden 768 --layers 24 --vocab 50280]   # mamba-130m's sizes

Prints one row per loader: seconds (best of 3) and the model's size.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import transformers

from gradscope.models.adapters.load import load_hf
from gradscope.models.adapters.weights import read_headers, weight_files


def best(f, n: int = 3) -> float:  # noqa: ANN001
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=50280)
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers)
    model = transformers.MambaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "m"
        model.save_pretrained(d)
        del model
        transformers.logging.set_verbosity_error()
        rows = [("headers only (read_headers)", best(lambda: read_headers(*weight_files(d)))),
                ("gradscope load_hf (exact)", best(lambda: load_hf("hf", d))),
                ("from_pretrained", best(lambda: transformers.MambaForCausalLM.from_pretrained(d, local_files_only=True)))]
    print(f"MambaForCausalLM hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}: {n / 1e6:.1f} M parameters, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, t in rows:
        print(f"{name:32s} {t:8.3f} s")


if __name__ == "__main__":
    main()
