"""`gradscope stability --model hf` at the size researchers train (issue #37): wall time and peak memory.

Builds transformers Mamba at mamba-130m's configuration and RWKV at RWKV-4-169m's (random init,
nothing downloaded), saves each with ``save_pretrained``, and runs

    gradscope stability DIR --model hf --token-counts C --length 32 --triplets 64

in a subprocess, printing its wall time, peak resident memory (the child's ``ru_maxrss``), the plan
line it printed (exact or sketch, and why) and the machine's load (``uptime``), beside the same at
the tests' tiny sizes. The goal on the shared 2-core CPU: ≤ 5 min and ≤ 8 GB each.

``measure_stability(name, directory)`` is the function ``bench/realsize.py`` imports; run this file
for the table (``--sizes tiny`` for a quick check, ``--families mamba`` for one family).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIGS = {  # name → (transformers config class, its arguments)
    "mamba-130m": ("MambaConfig", dict(hidden_size=768, num_hidden_layers=24, vocab_size=50280, state_size=16,
                                       expand=2, conv_kernel=4)),
    "mamba2-130m": ("Mamba2Config", dict(hidden_size=768, num_hidden_layers=24, vocab_size=50288, state_size=128,
                                         head_dim=64, num_heads=24, expand=2, n_groups=1, conv_kernel=4)),
    "mamba2-tiny": ("Mamba2Config", dict(hidden_size=16, num_hidden_layers=2, vocab_size=64, state_size=8, head_dim=16,
                                         num_heads=2, expand=2, n_groups=1, conv_kernel=4)),
    # issue #49: a Qwen3-Next hybrid (Gated DeltaNet ×3, then gated attention, ×3 = 12 layers; dense MLPs) of
    # 124,894,956 parameters: per delta layer 6 value heads of 128 × 128 states, per attention layer the KV cache
    "qwen3next-125m": ("Qwen3NextConfig", dict(hidden_size=768, num_hidden_layers=12, vocab_size=50288,
                                               intermediate_size=2048, num_experts=0, num_attention_heads=8,
                                               num_key_value_heads=2, head_dim=128, linear_num_value_heads=6,
                                               linear_num_key_heads=3, linear_key_head_dim=128,
                                               linear_value_head_dim=128, linear_conv_kernel_dim=4,
                                               tie_word_embeddings=True)),
    "qwen3next-tiny": ("Qwen3NextConfig", dict(hidden_size=16, num_hidden_layers=4, vocab_size=64, intermediate_size=32,
                                               num_experts=0, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                               linear_num_value_heads=2, linear_num_key_heads=1,
                                               linear_key_head_dim=8, linear_value_head_dim=8,
                                               linear_conv_kernel_dim=4)),
    # issue #49: Mamba-2 hybrids of ~130 M parameters (hidden 768, Mamba-2 mixers of 24 heads of 64 × 128 as
    # mamba2-130m's, attention of 12 heads and 4 KV heads of 64, every third or fourth layer; vocabulary 50,288)
    "bamba-130m": ("BambaConfig", dict(hidden_size=768, num_hidden_layers=12, vocab_size=50288, attn_layer_indices=[3, 7, 11],
                                       mamba_n_heads=24, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128,
                                       mamba_d_conv=4, mamba_expand=2, num_attention_heads=12, num_key_value_heads=4,
                                       intermediate_size=2048, tie_word_embeddings=True)),
    "nemotronh-130m": ("NemotronHConfig", dict(hidden_size=768, num_hidden_layers=18, vocab_size=50288,
                                               hybrid_override_pattern="M-M-M*-M-M-M*-M-M-", mamba_num_heads=24,
                                               mamba_head_dim=64, n_groups=1, ssm_state_size=128, conv_kernel=4,
                                               expand=2, num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                                               intermediate_size=3072, tie_word_embeddings=True)),
    "falconh1-130m": ("FalconH1Config", dict(hidden_size=768, num_hidden_layers=8, vocab_size=50288, mamba_d_ssm=1536,
                                             mamba_n_heads=24, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128,
                                             mamba_d_conv=4, num_attention_heads=12, num_key_value_heads=4,
                                             head_dim=64, intermediate_size=2048, tie_word_embeddings=True)),
    "bamba-tiny": ("BambaConfig", dict(hidden_size=16, num_hidden_layers=4, vocab_size=64, attn_layer_indices=[3],
                                       mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8,
                                       mamba_d_conv=4, mamba_expand=2, num_attention_heads=2, num_key_value_heads=1,
                                       intermediate_size=32)),
    "nemotronh-tiny": ("NemotronHConfig", dict(hidden_size=16, num_hidden_layers=4, vocab_size=64,
                                               hybrid_override_pattern="M-M*", mamba_num_heads=4, mamba_head_dim=8,
                                               n_groups=1, ssm_state_size=8, conv_kernel=4, expand=2,
                                               num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                               intermediate_size=32)),
    "falconh1-tiny": ("FalconH1Config", dict(hidden_size=16, num_hidden_layers=2, vocab_size=64, mamba_d_ssm=32,
                                             mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8,
                                             mamba_d_conv=4, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                             intermediate_size=32)),
    "rwkv-169m": ("RwkvConfig", dict(hidden_size=768, num_hidden_layers=12, vocab_size=50277,
                                     attention_hidden_size=768, intermediate_size=3072)),
    "mamba-tiny": ("MambaConfig", dict(hidden_size=32, num_hidden_layers=2, vocab_size=64, state_size=4, expand=2,
                                       conv_kernel=4)),
    "rwkv-tiny": ("RwkvConfig", dict(hidden_size=32, num_hidden_layers=2, vocab_size=64, attention_hidden_size=32,
                                     intermediate_size=64)),
}
MODELS = {"MambaConfig": "MambaForCausalLM", "Mamba2Config": "Mamba2ForCausalLM", "RwkvConfig": "RwkvForCausalLM",
          "Qwen3NextConfig": "Qwen3NextForCausalLM", "BambaConfig": "BambaForCausalLM",
          "NemotronHConfig": "NemotronHForCausalLM", "FalconH1Config": "FalconH1ForCausalLM"}


def save_model(name: str, directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """A randomly initialised model of configuration ``name`` saved with save_pretrained under
    ``directory``, and a token-counts file (Zipf-like, every id seen) beside it."""
    import torch
    import transformers

    cls, kwargs = CONFIGS[name]
    torch.manual_seed(seed)
    config = getattr(transformers, cls)(**kwargs)
    model = getattr(transformers, MODELS[cls])(config).eval()
    out = directory / name
    model.save_pretrained(out)
    counts = (1e6 / np.arange(1, kwargs["vocab_size"] + 1)).astype(np.int64) + 1
    np.save(directory / f"{name}-counts.npy", counts)
    return out, directory / f"{name}-counts.npy"


def measure_stability(name: str, directory: Path, *, triplets: int = 64, length: int = 32,
                      extra: tuple[str, ...] = (), timeout: float | None = None) -> dict[str, object]:
    """Run ``gradscope stability`` on model ``name`` (a key of CONFIGS) saved under ``directory``: its
    wall time (s), peak memory (GB), exit status, plan line and the load average before and after."""
    model, counts = save_model(name, directory)
    store = directory / f"{name}-stability.zarr"
    cmd = [sys.executable, "-c", "import atexit, resource, sys; atexit.register(lambda: print('MAXRSS', resource."
                                 "getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)); "
                                 "from gradscope.cli.app import main; sys.argv[0] = 'gradscope'; main()",
           "stability", str(model), "--model", "hf", "--token-counts",
           str(counts), "--length", str(length), "--triplets", str(triplets), "-q", "-o", str(store), "--overwrite",
           *extra]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        plan = next((line for line in out.splitlines() if line.startswith("stability:")), "")
        return {"model": name, "seconds": time.perf_counter() - start, "peak_gb": float("nan"), "rc": 124,
                "plan": plan, "load": (load, os.getloadavg()[0]), "tail": f"killed after {timeout:g} s; {plan}"}
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = [line.split()[1] for line in proc.stderr.splitlines() if line.startswith("MAXRSS ")]
    peak = int(own[-1]) * 1024 / 1e9 if own else float("nan")  # this command's own peak (not the largest child so far)
    plan = next((line for line in proc.stdout.splitlines() if line.startswith("stability:")), "")
    estimate = float("nan")
    if "~" in plan:
        try:
            estimate = float(plan.split("~", 1)[1].split(" s", 1)[0].replace(",", ""))
        except ValueError:
            pass
    D = 0
    if proc.returncode == 0 and store.exists():  # D from the model's config (a store does not record it)
        cfg = json.loads((model / "config.json").read_text())
        if "linear_num_value_heads" in cfg:  # Qwen3-Next: delta layers' conv windows and states; attention KV caches
            kinds = cfg["layer_types"]
            conv = 2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"] + \
                cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
            delta = conv * (cfg["linear_conv_kernel_dim"] - 1) + cfg["linear_num_value_heads"] * \
                cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"]
            kv = 2 * length * cfg["num_key_value_heads"] * cfg["head_dim"]
            D = sum(delta if k == "linear_attention" else kv for k in kinds)
        elif "state_size" in cfg:  # Mamba: per layer a conv window (I, K − 1) and an SSM state (I, N)
            inner = cfg.get("intermediate_size") or cfg["expand"] * cfg["hidden_size"]
            D = cfg["num_hidden_layers"] * inner * (cfg["conv_kernel"] - 1 + cfg["state_size"])
        else:  # RWKV: per layer two shifts (H) and the WKV numerator, denominator and maximum (A)
            A = cfg.get("attention_hidden_size") or cfg["hidden_size"]
            D = cfg["num_hidden_layers"] * (2 * cfg["hidden_size"] + 3 * A)
    return {"model": name, "seconds": wall, "peak_gb": peak, "rc": proc.returncode, "plan": plan,
            "estimate_s": estimate, "D": D, "cpu_s": usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime,
            "load": (load, os.getloadavg()[0]), "tail": "\n".join(line for line in (proc.stdout + proc.stderr).splitlines()
                              if not line.startswith("MAXRSS "))[-600:]}  # the command's own lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="tiny,real", help="tiny, real or both (comma-separated)")
    parser.add_argument("--families", default="mamba,rwkv")
    parser.add_argument("--triplets", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--args", default="", help="further stability options, e.g. '--checkpoint-budget-seconds 3600 "
                                                   "--sketch-units 4' (default: none, as a user runs it)")
    args = parser.parse_args()
    sizes, families = args.sizes.split(","), args.families.split(",")
    names = [n for n in CONFIGS if n.split("-")[0] in families and ("tiny" if n.endswith("tiny") else "real") in sizes]
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    print(f"{'model':12} {'seconds':>8} {'peak GB':>8} {'rc':>3}  load before/after  plan", flush=True)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            r = measure_stability(name, Path(tmp), triplets=args.triplets, length=args.length,
                                  extra=tuple(args.args.split()))
        print(f"{r['model']:12} {r['seconds']:8.1f} {r['peak_gb']:8.2f} {r['rc']:3}  "
              f"{r['load'][0]:.1f}/{r['load'][1]:.1f}  {r['plan']}", flush=True)
        if r["rc"]:
            print(r["tail"], flush=True)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
