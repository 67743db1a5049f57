"""Library adapters: each family's state width D, tiny and published, and its analyses' times.

D of a tiny random model and of a published configuration, and the time of ``wrap``, ``state_jacobian``,
``stability`` and ``dynamics`` on the tiny model. One run, printed as a table (docs/models-from-libraries.md); not
a timed test.

    python bench/adapters.py [--threads 1] [--kinds mamba,bamba,...] [--quick]

Rows: Mamba, RWKV, xLSTM, RecurrentGemma (recurrent blocks), mambapy's Mamba, then the classes the adapters
gained since: Mamba-2, Qwen3-Next (Gated DeltaNet + attention), Bamba, Nemotron-H, Falcon-H1, Jamba, Zamba2,
Kimi Linear, and the pure transformers Llama and Qwen3. ``--kinds`` takes row names or their short keys
(``python bench/adapters.py --kinds qwen3next,llama``); the default runs every row.

Tiny models: random (seed 0 before each model), float32, vocabulary 64, hidden 16, 2–4 layers; the new rows'
configurations are their adapter tests' ``tiny()`` (tests/models/adapters/test_hf_<x>.py, copied here: the bench
imports no test), every hybrid with at least one attention layer. Timings: B = 8 sequences of T = 32 tokens, p = 16;
stability: 8 probe triplets of length 32 at p = 16; dynamics: every part, exactly (``budget_seconds`` 3600: the
default 60 s would estimate the grid and spectra matrix-free), 8 probe sequences of 32 tokens, 2 trajectories of
200 steps (and only flow + lyapunov, the parts that use the declared structure for a multi-block
core). Each time is printed as 'wall (CPU)'. ``--quick`` (a smoke check, not figures): 2 sequences, 2 probe
triplets, 2 probe sequences and trajectories of 20 steps.

Columns, for a model with attention layers (the hybrids, Llama, Qwen3), whose state at p holds each attention
layer's keys and values at positions ≤ p (gradscope/models/adapters/attention.py):

- **D tiny**: the wrapped core's state width with 32 cache slots (``gradscope.wrap(model, positions=32)``, the
  longest sequence that ``state_jacobian``, ``stability`` and the probes read); **D published**: the same count
  from the published configuration's numbers, the keys and values at 32 positions (``stability --length 32``);
- **wrap**: ``gradscope.wrap(model, positions=32)``, with its check against the library's own forward;
- **state_jacobian**, **stability**: over the whole state, caches included;
- **dynamics**: the flow and the (t, T) grid use the whole state; the step spectra, gates and Lyapunov spectrum
  are the recurrent layers' own, with the caches along each trajectory *held* as inputs
  (gradscope/analysis/held.py). ``dynamics`` sizes the probes' caches to them (32 slots) and the Lyapunov
  trajectories' caches to their length itself: a trajectory of 200 steps holds 200 slots per attention layer
  (at the tiny sizes 2·200·H_kv·d = 1,600–12,800 numbers a layer, small beside the step Jacobians the "every part"
  column forms; at a published size it is 200/32 times the attention share of D published). So the trajectories
  keep the recurrent rows' 200 steps.
- A pure transformer (Llama, Qwen3) has no recurrent state: ``dynamics`` leaves the step spectra, gates and
  Lyapunov spectrum out of its default parts and refuses them when asked; the "every part" column runs
  ``parts="flow,grid"`` and the "flow + lyapunov" column shows the refusal (the first 40 characters of its
  message).
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import torch

LENGTH, TARGET, VOCAB = 32, 16, 64  # the sequences' and probes' length, p, and the tiny models' vocabulary
BUDGET = 3600.0  # dynamics' budget: high enough that its plan leaves no part out and computes every value exactly


def mambapy_model(tf: ModuleType) -> torch.nn.Module:  # noqa: ARG001 - every builder takes transformers
    from mambapy.mamba import Mamba, MambaConfig

    return Mamba(MambaConfig(d_model=16, n_layers=2, d_state=8, d_conv=4))


# each adapter test's tiny() configuration (vocabulary 64; Mamba-2's and Zamba2's hidden 8 → 16, so their heads'
# widths double), float32, the library's own initialisation
def qwen3_next(tf: ModuleType) -> torch.nn.Module:
    return tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=4,
        linear_value_head_dim=3, linear_conv_kernel_dim=3, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=8, shared_expert_intermediate_size=8, decoder_sparse_step=2, max_position_embeddings=64,
        experts_implementation="eager", attn_implementation="eager"))


def falcon_h1(tf: ModuleType) -> torch.nn.Module:
    multipliers = dict(embedding_multiplier=1.7, lm_head_multiplier=0.6, mlp_multipliers=[1.4, 0.7], key_multiplier=1.3,
                       attention_in_multiplier=1.2, attention_out_multiplier=0.8, ssm_in_multiplier=1.1,
                       ssm_out_multiplier=0.75, ssm_multipliers=[0.9, 1.3, 0.7, 1.6, 1.2])
    return tf.FalconH1ForCausalLM(tf.FalconH1Config(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=24, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=4, mamba_d_conv=3,
        mamba_n_groups=2, mamba_chunk_size=4, attn_implementation="eager", **multipliers))


def jamba(tf: ModuleType) -> torch.nn.Module:
    return tf.JambaForCausalLM(tf.JambaConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4, attn_layer_period=3, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=24, mamba_d_state=4, mamba_d_conv=3, mamba_expand=2,
        mamba_dt_rank=2, attn_implementation="eager", experts_implementation="eager"))


def kimi_linear(tf: ModuleType) -> torch.nn.Module:
    return tf.KimiLinearForCausalLM(tf.KimiLinearConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, moe_intermediate_size=8, num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"], num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=6,
        q_lora_rank=None, qk_rope_head_dim=2, qk_nope_head_dim=4, v_head_dim=3, num_local_experts=6,
        num_experts_per_tok=2, n_group=3, topk_group=2, linear_head_dim=4, linear_num_heads=2,
        linear_conv_kernel_dim=3, initializer_range=0.2,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,  # the defaults (163839, …) exceed the vocabulary
        experts_implementation="eager", attn_implementation="eager"))


def llama_like(kind: str) -> Callable[[ModuleType], torch.nn.Module]:
    def build(tf: ModuleType) -> torch.nn.Module:
        common = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=64,
                      attn_implementation="eager")
        if kind == "llama":
            return tf.LlamaForCausalLM(tf.LlamaConfig(**common, attention_bias=True))
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**common))
    return build


@dataclass(frozen=True)
class Row:
    """One family: its table name, short key (``--kinds``), tiny model, published D and what that counts."""

    name: str
    key: str
    build: Callable[[ModuleType], torch.nn.Module]  # transformers → the tiny model (seeded by the caller)
    note: str  # the published configuration and the formula of its D (the adapter's state layout)
    published: int
    attention: bool = False  # attention caches: wrapped with positions=LENGTH
    transformer: bool = False  # no recurrent state: dynamics runs flow + grid, Lyapunov is refused


# Published D from the published configurations' numbers (no download), per the adapter's state layout (its
# docstring): conv windows K−1 inputs a channel, SSM/delta states, and attention keys + values at 32 positions.
# Sources of the numbers: the models' config.json files (Bamba-9B, Zamba2-1.2B, Kimi-Linear-48B-A3B-Instruct,
# Falcon-H1-0.5B's G and K), model cards (Qwen3-Next-80B-A3B; Llama-3.2-1B; Qwen3-0.6B), NVIDIA's Megatron-Bridge
# table for Nemotron-H-8B (its pattern, heads, state), transformers 5.24's config defaults where they are the
# published model's (Qwen3NextConfig, JambaConfig = Jamba-v0.1, NemotronHConfig's n_groups 8) and its Falcon-H1
# size table; mamba2-130m as docs/models-from-libraries.md. Each equals the adapter's own ``state_dim`` on a
# meta-device model of that configuration (checked by hand when these rows were added).
P = LENGTH
ROWS = [
    Row("Mamba (transformers)", "mamba",
        lambda tf: tf.MambaForCausalLM(tf.MambaConfig(
            vocab_size=VOCAB, hidden_size=16, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)),
        "mamba-130m-hf: 24 layers × I 1536 × (K−1 3 + N 16)", 24 * 1536 * (3 + 16)),
    Row("RWKV (transformers)", "rwkv",
        lambda tf: tf.RwkvForCausalLM(tf.RwkvConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, attention_hidden_size=16, intermediate_size=32,
            context_length=64)),
        "rwkv-4-169m-pile: 12 layers × 5 × 768", 12 * 5 * 768),
    Row("xLSTM (transformers)", "xlstm",
        lambda tf: tf.xLSTMForCausalLM(tf.xLSTMConfig(vocab_size=VOCAB, hidden_size=16, num_heads=2,
                                                      num_hidden_layers=2)),
        "xLSTM-7b: 32 blocks × 8 heads × (1 + 256·512 + 256)", 32 * 8 * (1 + 256 * 512 + 256)),
    Row("RecurrentGemma (transformers, recurrent blocks)", "rgemma",
        lambda tf: tf.RecurrentGemmaForCausalLM(tf.RecurrentGemmaConfig(
            vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_hidden_layers=2,
            block_types=["recurrent"], attention_window_size=16)),
        "recurrentgemma-2b: refused (attention blocks); its 18 recurrent blocks alone: 18 × 2560 × (3 + 1)",
        18 * 2560 * 4),
    Row("Mamba (mambapy)", "mambapy", mambapy_model, "mamba-130m configuration", 24 * 1536 * (3 + 16)),
    Row("Mamba-2 (transformers)", "mamba2",
        lambda tf: tf.Mamba2ForCausalLM(tf.Mamba2Config(
            vocab_size=VOCAB, hidden_size=16, state_size=3, num_hidden_layers=2, expand=2, conv_kernel=3,
            num_heads=4, head_dim=8, n_groups=2, chunk_size=4, use_conv_bias=True, residual_in_fp32=False)),
        "mamba2-130m: 24 layers × (24 heads·P 64·N 128 + (I 1536 + 2·G 1·N 128)·(K−1 3))",
        24 * (24 * 64 * 128 + (1536 + 2 * 128) * 3)),
    Row("Qwen3-Next (transformers, Gated DeltaNet + attention)", "qwen3next", qwen3_next,
        f"Qwen3-Next-80B-A3B: 36 Gated DeltaNet layers × ((2·H_k 16·d_k 128 + H_v 32·d_v 128)·(K−1 3) + "
        f"32·128·128) + 12 attention layers × 2 × {P} positions × H_kv 2 × d 256",
        36 * ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128) + 12 * 2 * P * 2 * 256, attention=True),
    Row("Bamba (transformers)", "bamba",
        lambda tf: tf.BambaForCausalLM(tf.BambaConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=3, attn_layer_indices=[1], mamba_n_heads=4,
            mamba_d_head=8, mamba_n_groups=2, mamba_d_state=4, mamba_d_conv=3, mamba_expand=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=24, mamba_chunk_size=4, attn_implementation="eager")),
        f"Bamba-9B: 29 Mamba-2 layers × ((I 8192 + 2·G 1·N 128)·(K−1 3) + 128 heads·P 64·N 128) + 3 attention "
        f"layers × 2 × {P} positions × H_kv 8 × d 128",
        29 * ((8192 + 2 * 128) * 3 + 128 * 64 * 128) + 3 * 2 * P * 8 * 128, attention=True),
    Row("Nemotron-H (transformers)", "nemotronh",
        lambda tf: tf.NemotronHForCausalLM(tf.NemotronHConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4, hybrid_override_pattern="M*-M", mamba_num_heads=4,
            mamba_head_dim=8, n_groups=2, ssm_state_size=4, conv_kernel=3, expand=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=4, intermediate_size=24, chunk_size=4, use_conv_bias=True,
            attn_implementation="eager")),
        f"Nemotron-H-8B (M-M-M-M*-…: 24 Mamba-2, 4 attention, 24 MLP blocks): 24 × ((I 8192 + 2·G 8·N 128)·(K−1 3) "
        f"+ 128 heads·P 64·N 128) + 4 × 2 × {P} positions × H_kv 8 × d 128",
        24 * ((8192 + 2 * 8 * 128) * 3 + 128 * 64 * 128) + 4 * 2 * P * 8 * 128, attention=True),
    Row("Falcon-H1 (transformers)", "falconh1", falcon_h1,
        f"Falcon-H1-0.5B: 36 layers × ((I 1536 + 2·G 1·N 128)·(K−1 3) + 24 heads·P 64·N 128 + 2 × {P} positions "
        f"× H_kv 2 × d 64)",
        36 * ((1536 + 2 * 128) * 3 + 24 * 64 * 128 + 2 * P * 2 * 64), attention=True),
    Row("Jamba (transformers)", "jamba", jamba,
        f"Jamba-v0.1: 28 Mamba layers × I 8192 × (K−1 3 + N 16) + 4 attention layers × 2 × {P} positions × H_kv 8 "
        f"× d 128",
        28 * 8192 * (3 + 16) + 4 * 2 * P * 8 * 128, attention=True),
    Row("Zamba2 (transformers)", "zamba2",
        lambda tf: tf.Zamba2ForCausalLM(tf.Zamba2Config(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4,
            layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"], mamba_d_state=4,
            mamba_d_conv=3, mamba_expand=2, mamba_ngroups=2, n_mamba_heads=4, num_attention_heads=2,
            num_key_value_heads=2, intermediate_size=12, num_mem_blocks=1, use_shared_attention_adapter=True,
            adapter_rank=3, use_mem_rope=True, chunk_size=4, attn_implementation="eager")),
        f"Zamba2-1.2B: 38 Mamba-2 layers × ((I 4096 + 2·G 1·N 128)·(K−1 3) + 64 heads·P 64·N 128) + 6 hybrid "
        f"layers' attention × 2 × {P} positions × H_kv 32 × d (2·2048/32) 128",
        38 * ((4096 + 2 * 128) * 3 + 64 * 64 * 128) + 6 * 2 * P * 32 * 128, attention=True),
    Row("Kimi Linear (transformers, KDA + MLA)", "kimi", kimi_linear,
        f"Kimi-Linear-48B-A3B: 20 KDA layers × (3·H 32·d 128·(K−1 3) + 32·128·128) + 7 MLA layers × {P} "
        f"positions × (kv_lora_rank 512 + qk_rope_head_dim 64)",
        20 * (3 * 32 * 128 * 3 + 32 * 128 * 128) + 7 * P * (512 + 64), attention=True),
    Row("Llama (transformers)", "llama", llama_like("llama"),
        f"Llama-3.2-1B: 16 layers × 2 × {P} positions × H_kv 8 × d 64", 16 * 2 * P * 8 * 64,
        attention=True, transformer=True),
    Row("Qwen3 (transformers)", "qwen3", llama_like("qwen3"),
        f"Qwen3-0.6B: 28 layers × 2 × {P} positions × H_kv 8 × d 128", 28 * 2 * P * 8 * 128,
        attention=True, transformer=True),
]


def timed(fn) -> str:  # noqa: ANN001
    """'wall s (CPU s)': on a shared machine the process's CPU time is the steadier figure."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return f"{time.perf_counter() - start:.2f} s ({time.process_time() - cpu:.2f})"


def timed_or_refused(fn, why: str = "") -> str:  # noqa: ANN001
    """:func:`timed`, or 'refused: …' with the first 40 characters of gradscope's one-line refusal."""
    from gradscope import GradscopeError

    try:
        return timed(fn)
    except GradscopeError as err:
        return f"refused{': ' + why if why else ''} ({str(err)[:40]}…)"


def selected(kinds: str | None) -> list[Row]:
    """The rows ``--kinds`` names (row names or short keys, comma-separated, any case); every row for None."""
    if kinds is None:
        return ROWS
    wanted = [k.strip().lower() for k in kinds.split(",") if k.strip()]
    by = {r.key: r for r in ROWS} | {r.name.lower(): r for r in ROWS}
    unknown = [k for k in wanted if k not in by]
    if unknown:
        raise SystemExit(f"--kinds: unknown {', '.join(unknown)}; expected some of {', '.join(r.key for r in ROWS)} "
                         f"or the row names")
    return [r for r in ROWS if r in {by[k] for k in wanted}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kinds", default=None, help="comma-separated row keys or names (default: every row): "
                                                       + ", ".join(r.key for r in ROWS))
    parser.add_argument("--quick", action="store_true", help="a smoke check: 2 sequences, 2 probe triplets, "
                                                             "2 probe sequences, trajectories of 20 steps")
    args = parser.parse_args()
    rows = selected(args.kinds)
    torch.set_num_threads(args.threads)
    import transformers as tf

    import gradscope

    n, steps = (2, 20) if args.quick else (8, 200)
    print(f"# {platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}"
          f"{' (--quick: a smoke check, not figures)' if args.quick else ''}")
    print(f"# {n} sequences of {LENGTH} tokens, p = {TARGET}; {n} probe triplets; dynamics: {n} probe sequences, "
          f"2 trajectories of {steps} steps; attention caches: {LENGTH} slots ({steps} for the trajectories)")
    print("| family | D tiny | D published | wrap | state_jacobian | stability | dynamics, every part | "
          "dynamics, flow + lyapunov |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        torch.manual_seed(0)
        model = row.build(tf).eval()
        positions = {"positions": LENGTH} if row.attention else {}
        wrap_s = timed(lambda: gradscope.wrap(model, **positions))
        wrapped = gradscope.wrap(model, **positions)
        if wrapped.inputs is None:  # mambapy's bare Mamba: token ids through an embedding
            emb = torch.nn.Embedding(VOCAB, 16)
            wrapped = gradscope.wrap(model, inputs=emb)
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, VOCAB, (n, LENGTH), generator=g)
        probes = torch.randint(0, VOCAB, (n, 3, LENGTH), generator=g)
        probes[:, 1, :TARGET] = probes[:, 0, :TARGET]
        probes[:, 2, TARGET:] = probes[:, 0, TARGET:]
        traj = torch.randint(0, VOCAB, (2, steps), generator=g)
        jac_s = timed(lambda: gradscope.state_jacobian(wrapped, tokens, TARGET))
        stab_s = timed(lambda: gradscope.stability(wrapped, probes=probes, target_pos=TARGET))
        # no recurrent state: the defined parts, and no trajectories (dynamics refuses options no part reads)
        # every defined part, exactly: under the default 60 s budget the plan estimates the grid and spectra
        # matrix-free where exact would not fit, or leaves a part out
        every = {"parts": "flow,grid"} if row.transformer else dict(trajectory_tokens=traj, steps=steps,
                                                                     trajectories=2, budget_seconds=BUDGET)
        dyn_s = timed_or_refused(lambda: gradscope.dynamics(wrapped, tokens=tokens, **every))
        if row.transformer:
            dyn_s += " (flow, grid)"
        fast_s = timed_or_refused(lambda: gradscope.dynamics(wrapped, tokens=tokens, trajectory_tokens=traj,
                                                             steps=steps, trajectories=2, parts="flow,lyapunov"),
                                  "no recurrent state" if row.transformer else "")
        print(f"| {row.name} | {wrapped.core.state_dim:,} | {row.published:,} ({row.note}) | {wrap_s} | {jac_s} | "
              f"{stab_s} | {dyn_s} | {fast_s} |", flush=True)


if __name__ == "__main__":
    main()
