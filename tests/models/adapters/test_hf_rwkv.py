"""gradscope.wrap(transformers RwkvForCausalLM) against a float64 brute force through transformers' own
RWKV forward and state (tests/helpers/adapterkit.py). transformers' one-token path broadcasts wrongly for a batch
of more than one, so the brute force feeds single tokens one sequence at a time."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import gradscope  # noqa: E402
from tests.helpers.adapterkit import (Family, check_gradient_flow, check_lyapunov_sum, check_stability,  # noqa: E402
                        check_state_jacobian)

B, T, V = 3, 6, 20
RTOL = 2e-6  # transformers keeps the keys and the wkv state in float32 even in float64


def tiny(hidden: int = 8, rescale_every: int = 1) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.RwkvConfig(vocab_size=V, hidden_size=hidden, num_hidden_layers=2, attention_hidden_size=hidden,
                                  intermediate_size=2 * hidden, context_length=32, rescale_every=rescale_every)
    model = transformers.RwkvForCausalLM(cfg).eval().double()
    with torch.no_grad():  # spread the decays so that both branches of the running maximum occur
        for block in model.rwkv.blocks:
            block.attention.time_decay.uniform_(-3.0, 1.0, generator=torch.Generator().manual_seed(2))
    return model


def family(model: torch.nn.Module) -> Family:
    """RWKV's state in the documented layout: per layer att_shift, max, num, den, ffn_shift (transformers'
    state list is [ffn_shift, att_shift, num, den, max], each (B, H, layers))."""
    bb = model.rwkv
    L = len(bb.blocks)
    order = (1, 4, 2, 3, 0)

    def read(state) -> list[torch.Tensor]:  # noqa: ANN001
        return [state[k][:, :, l] for l in range(L) for k in order]

    def state(tokens: torch.Tensor) -> list[torch.Tensor]:
        rows = [tokens[r:r + 1] for r in range(tokens.shape[0])] if tokens.shape[1] == 1 else [tokens]
        return [torch.cat(q) for q in zip(*(read(bb(input_ids=r, use_cache=True).state) for r in rows))]

    def step(parts: list[torch.Tensor], columns: torch.Tensor, t0: int):  # noqa: ANN202
        lib = [None] * 5
        for j, k in enumerate(order):
            lib[k] = torch.stack([parts[5 * l + j] for l in range(L)], dim=-1)
        rows = range(columns.shape[0]) if columns.shape[1] == 1 else [slice(None)]  # one token: one sequence a call
        ys, news = [], []
        for r in rows:
            sel = slice(r, r + 1) if isinstance(r, int) else r
            out = bb(input_ids=columns[sel], state=[s[sel].clone() for s in lib], use_cache=True)
            ys.append(out.last_hidden_state[:, -1])
            news.append(read(out.state))
        return torch.cat(ys), [torch.cat(q) for q in zip(*news)]

    return Family(model, state, step, V, reverse=False)


@pytest.fixture(scope="module")
def rwkv():  # noqa: ANN201
    model = tiny()
    return model, gradscope.wrap(model), family(model)


def tokens(seed: int, n: int = B, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def test_wrap_runs_on_the_model_itself(rwkv) -> None:  # noqa: ANN001
    model, wrapped, _ = rwkv
    assert wrapped.core.model is model.rwkv and wrapped.readout is model.head
    ours = {p.data_ptr() for p in wrapped.parameters()}
    assert all(p.data_ptr() in ours for p in model.parameters())
    assert list(wrapped.core.state_layout())[:5] == ["l0/att_shift", "l0/max", "l0/num", "l0/den", "l0/ffn_shift"]
    assert model.rwkv.layers_are_rescaled  # rescale_every=1: the eval-mode halving path is the one tested
    z0 = wrapped.core.init_state(2, torch.zeros(1, dtype=torch.float64))
    assert (z0[:, wrapped.core.state_layout()["l1/max"]] == -1e30).all()
    with torch.no_grad():
        assert float((wrapped(tokens(9)) - model(input_ids=tokens(9), use_cache=False).logits).abs().max()) < 1e-5


@pytest.mark.parametrize("p,method", [(1, "vjp"), (3, "func"), (T - 2, "auto")])
def test_state_jacobian_matches_the_library(rwkv, p: int, method: str) -> None:  # noqa: ANN001
    model, wrapped, fam = rwkv
    check_state_jacobian(fam, wrapped, tokens(1), p, method, RTOL)


def test_stability_gradient_flow_and_lyapunov_sum(rwkv) -> None:  # noqa: ANN001
    model, wrapped, fam = rwkv
    check_stability(fam, wrapped, L=5, p=2, rtol=1e-6)
    check_gradient_flow(fam, wrapped, tokens(2, n=1), rtol=RTOL)
    small = tiny(hidden=4)
    check_lyapunov_sum(family(small), gradscope.wrap(small), tokens(3, n=2, length=6), warmup=2, atol=1e-6)


def test_the_librarys_one_token_batch_bug_is_caught_by_the_protocol_check() -> None:
    """A core that steps through transformers' own one-token path mixes sequences for B > 1: refused."""
    from gradscope.errors import GradscopeError

    model = tiny()

    class OneTokenPath(torch.nn.Module):
        state_dim, out_dim, in_dim = 5 * 8 * 2, 8, 8

        def __init__(self) -> None:
            super().__init__()
            self.rwkv = model.rwkv

        def step(self, x, z):  # noqa: ANN001, ANN202
            s = list(z.reshape(z.shape[0], 5, 8, 2).unbind(1))
            out = self.rwkv(inputs_embeds=x[:, None], state=[q.clone() for q in s], use_cache=True)
            y = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])[: x.shape[0]]
            return y, torch.stack(out.state, 1).reshape(z.shape[0], -1)

    with pytest.raises(GradscopeError, match="batched step = per-sample step") as err:
        gradscope.wrap(OneTokenPath())
    assert "\n" not in str(err.value)
