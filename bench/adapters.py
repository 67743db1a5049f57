"""Library adapters (issue #25): state width D of each family at a tiny and at a published size, and the
time of ``state_jacobian``, ``stability`` and ``dynamics`` on the tiny model. One run, printed as a table
(docs/models-from-libraries.md); not a timed test.

    python bench/adapters.py [--threads 1]

Published sizes are computed from the published configurations (no download): D counts every state entry
of the adapter's layout. The timings use random tiny models (float32), B = 8 sequences of T = 32 tokens,
p = 16; stability: 8 probe triplets of length 32 at p = 16; dynamics: every part, 8 probe sequences of 32
tokens, 2 trajectories of 200 steps (and only flow + lyapunov, the parts that use the declared structure
for a multi-block core). Each time is printed as 'wall (CPU)'.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch


def tiny_models() -> dict[str, torch.nn.Module]:
    import transformers as tf
    from mambapy.mamba import Mamba, MambaConfig

    torch.manual_seed(0)
    return {
        "Mamba (transformers)": tf.MambaForCausalLM(tf.MambaConfig(
            vocab_size=64, hidden_size=16, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)),
        "RWKV (transformers)": tf.RwkvForCausalLM(tf.RwkvConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=2, attention_hidden_size=16, intermediate_size=32,
            context_length=64)),
        "xLSTM (transformers)": tf.xLSTMForCausalLM(tf.xLSTMConfig(
            vocab_size=64, hidden_size=16, num_heads=2, num_hidden_layers=2)),
        "RecurrentGemma (transformers, recurrent blocks)": tf.RecurrentGemmaForCausalLM(tf.RecurrentGemmaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_hidden_layers=2,
            block_types=["recurrent"], attention_window_size=16)),
        "Mamba (mambapy)": Mamba(MambaConfig(d_model=16, n_layers=2, d_state=8, d_conv=4)),
    }


PUBLISHED = {  # the adapter's D from each published configuration (layout: see the adapter's docstring)
    "Mamba (transformers)": ("mamba-130m-hf: 24 layers × I 1536 × (K−1 3 + N 16)", 24 * 1536 * (3 + 16)),
    "RWKV (transformers)": ("rwkv-4-169m-pile: 12 layers × 5 × 768", 12 * 5 * 768),
    "xLSTM (transformers)": ("xLSTM-7b: 32 blocks × 8 heads × (1 + 256·512 + 256)", 32 * 8 * (1 + 256 * 512 + 256)),
    "RecurrentGemma (transformers, recurrent blocks)": ("recurrentgemma-2b: refused (attention blocks); its 18 "
                                                        "recurrent blocks alone: 18 × 2560 × (3 + 1)", 18 * 2560 * 4),
    "Mamba (mambapy)": ("mamba-130m configuration", 24 * 1536 * (3 + 16)),
}


def timed(fn) -> str:  # noqa: ANN001
    """'wall s (CPU s)': on a shared machine the process's CPU time is the steadier figure."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return f"{time.perf_counter() - start:.2f} s ({time.process_time() - cpu:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import gradscope

    print(f"# {platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}")
    print("| family | D tiny | D published | wrap | state_jacobian | stability | dynamics, every part | "
          "dynamics, flow + lyapunov |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model in tiny_models().items():
        model.eval()
        wrap_s = timed(lambda: gradscope.wrap(model))
        wrapped = gradscope.wrap(model)
        if wrapped.inputs is None:  # mambapy's bare Mamba: token ids through an embedding
            emb = torch.nn.Embedding(64, 16)
            wrapped = gradscope.wrap(model, inputs=emb)
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, 64, (8, 32), generator=g)
        probes = torch.randint(0, 64, (8, 3, 32), generator=g)
        probes[:, 1, :16] = probes[:, 0, :16]
        probes[:, 2, 16:] = probes[:, 0, 16:]
        traj = torch.randint(0, 64, (2, 200), generator=g)
        jac_s = timed(lambda: gradscope.state_jacobian(wrapped, tokens, 16))
        stab_s = timed(lambda: gradscope.stability(wrapped, probes=probes, target_pos=16))
        dyn_s = timed(lambda: gradscope.dynamics(wrapped, tokens=tokens, trajectory_tokens=traj, steps=200,
                                                 trajectories=2))
        fast_s = timed(lambda: gradscope.dynamics(wrapped, tokens=tokens, trajectory_tokens=traj, steps=200,
                                                  trajectories=2, parts="flow,lyapunov"))
        note, published = PUBLISHED[name]
        print(f"| {name} | {wrapped.core.state_dim:,} | {published:,} ({note}) | {wrap_s} | {jac_s} | {stab_s} | "
              f"{dyn_s} | {fast_s} |")


if __name__ == "__main__":
    main()
