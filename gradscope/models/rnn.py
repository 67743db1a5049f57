"""What the Elman, GRU and LSTM cores share: a fused ``nn.RNN/GRU/LSTM`` module for training, its
functional twin on a flat real state, and the reverse chain of the analytic Jacobian engine.

A subclass (one file per core: ``elman.py``, ``gru.py``, ``lstm.py``) names its fused module type,
its cell, its cell VJP, its gates and how many H-wide vectors one layer's state holds. The state z
is every layer's state concatenated, layer 1 first; an LSTM layer holds [h, c]. The same class
wraps a user's own ``nn.RNN/GRU/LSTM`` (``gradscope.wrap``): it keeps the module itself, so the
analysis runs on its weights, with no copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import Tensor, nn

from gradscope.models.core import Core

Weights = tuple[Tensor, Tensor, Tensor, Tensor]
Cell = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
# Cell VJP: (x (B, in), old layer state s (B, S), weights, cotangent rows g (B, R, S) on the new
# layer state (a spent buffer it may overwrite), out (B, R, S) for the rows on s, need_input) →
# the rows on x (B, R, in) when asked (layers above the first), else None. Writing into
# preallocated buffers matters on CPU: a fresh multi-MB tensor per step (a torch.cat) measured at
# half a bmm's time, and in-place baddbmm_ into a strided view fell back to one addmm per sequence.
CellVJP = Callable[[Tensor, Tensor, Weights, Tensor, Tensor, bool], "Tensor | None"]
# Cell Jacobian: (x (B, in), old layer state s (B, S), weights, need_input) → (∂s'/∂s (B, S, S),
# ∂s'/∂x (B, S, in) when asked, else None), formed analytically.
CellJacobian = Callable[[Tensor, Tensor, Weights, bool], "tuple[Tensor, Tensor | None]"]
# Cell terms: the same two Jacobians split by path through the cell: name (one of the core's
# ``gate_names``) → (term of ∂s'/∂s (B, S, S), term of ∂s'/∂x (B, S, in), or None for a path that
# does not read x or when need_input is False). The terms sum to the cell Jacobian.
CellTerms = Callable[[Tensor, Tensor, Weights, bool], "dict[str, tuple[Tensor, Tensor | None]]"]


@dataclass(frozen=True, kw_only=True)
class RNNConfig:
    """Settings of an Elman, GRU or LSTM core beyond the shared sizes: none yet."""


class RNNCore(Core):
    """A stack of ``num_layers`` layers of one fused PyTorch RNN type. Attribute ``rnn`` (the
    fused module) matches the paper's state-dict names."""

    fused: ClassVar[type[nn.RNNBase]]
    state_factor: ClassVar[int] = 1  # H-wide vectors in one layer's state (LSTM: h and c)
    gates: ClassVar[tuple[str, ...]] = ()  # row blocks of W_hh, in PyTorch's order
    Config: ClassVar[type] = RNNConfig

    @staticmethod
    def cell(x: Tensor, s: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    @staticmethod
    def cell_vjp(x: Tensor, s: Tensor, w: Weights, g: Tensor, out: Tensor, need_input: bool) -> Tensor | None:
        raise NotImplementedError

    @staticmethod
    def cell_jacobian(x: Tensor, s: Tensor, w: Weights, need_input: bool) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    @staticmethod
    def cell_terms(x: Tensor, s: Tensor, w: Weights, need_input: bool) -> dict[str, tuple[Tensor, Tensor | None]]:
        raise NotImplementedError

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, *, module: nn.RNNBase | None = None) -> None:
        super().__init__()
        self.rnn = module if module is not None else self.fused(input_size, hidden_size, num_layers, batch_first=True)
        self.hidden_size = self.rnn.hidden_size
        self.num_layers = self.rnn.num_layers
        self.layer_state = self.hidden_size * self.state_factor

    @classmethod
    def build(cls, input_size: int, hidden_size: int, num_layers: int, config: object) -> "RNNCore":
        """The core of a :class:`~gradscope.models.config.ModelConfig` (``config`` is its core config)."""
        return cls(input_size, hidden_size, num_layers)

    @property
    def state_dim(self) -> int:  # type: ignore[override]
        """D: real width of the full recurrent state z."""
        return self.layer_state * self.num_layers

    @property
    def out_dim(self) -> int:  # type: ignore[override]
        return self.hidden_size

    def state_layout(self) -> dict[str, slice]:
        names = ("h", "c")[:self.state_factor]
        return {f"{n}{layer + 1}": slice(layer * self.layer_state + k * self.hidden_size,
                                          layer * self.layer_state + (k + 1) * self.hidden_size)
                for layer in range(self.num_layers) for k, n in enumerate(names)}

    def forward(self, x: Tensor) -> Tensor:
        """Fused path. x (B, T, in) → top-layer hidden states (B, T, H)."""
        if not self.rnn.batch_first:
            return self.rnn(x.transpose(0, 1))[0].transpose(0, 1)
        return self.rnn(x)[0]

    def layer_weights(self, layer: int) -> Weights:
        """(W_ih, W_hh, b_ih, b_hh) of one layer; zero biases for a module built with bias=False."""
        w_ih, w_hh = getattr(self.rnn, f"weight_ih_l{layer}"), getattr(self.rnn, f"weight_hh_l{layer}")
        if self.rnn.bias:
            return w_ih, w_hh, getattr(self.rnn, f"bias_ih_l{layer}"), getattr(self.rnn, f"bias_hh_l{layer}")
        zero = w_hh.new_zeros(w_hh.shape[0])
        return w_ih, w_hh, zero, zero

    def step(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """Functional step. x (B, in), z (B, D) → (top output (B, H), z' (B, D))."""
        new = []
        inp = x
        for layer, part in enumerate(z.split(self.layer_state, dim=-1)):
            inp, state = self.cell(inp, part, *self.layer_weights(layer))
            new.append(state)
        return inp, torch.cat(new, dim=-1)

    def readout(self, x: Tensor, z: Tensor) -> Tensor:
        """The top layer's h. x (B, in) unused, z (B, D) → (B, H)."""
        top = (self.num_layers - 1) * self.layer_state
        return z[:, top:top + self.hidden_size]

    def analytic_unsupported(self) -> str | None:
        if "cell" in vars(self):
            return f"its {self.name!r} core has a replaced cell function"
        return None

    def analytic_jacobian(self, x: Tensor, zs: Tensor, p: int) -> Tensor:
        """G ← G · J_t from G = ∂y_T/∂z_T, layer by layer from the top within each step. → (B, H, D)."""
        B, T, _ = x.shape
        H, S, L = self.hidden_size, self.layer_state, self.num_layers
        weights = [self.layer_weights(layer) for layer in range(L)]
        G = x.new_zeros(B, H, self.state_dim)
        G[:, :, (L - 1) * S:(L - 1) * S + H] = torch.eye(H, dtype=x.dtype, device=x.device)
        spare = torch.empty_like(G)
        for t in range(T - 1, p - 1, -1):  # 0-based step t maps zs[:, t−1] to zs[:, t]
            states = zs[:, t - 1].split(S, dim=-1)
            inputs = [x[:, t]]
            for layer in range(L - 1):
                inputs.append(self.cell(inputs[-1], states[layer], *weights[layer])[0])
            g_in = None
            for layer in reversed(range(L)):
                cols = slice(layer * S, (layer + 1) * S)
                if g_in is not None:  # layer+1 read this layer's new h within the same step
                    G[..., layer * S:layer * S + H] += g_in
                g_in = self.cell_vjp(inputs[layer], states[layer], weights[layer], G[..., cols], spare[..., cols],
                                     layer > 0)
            G, spare = spare, G
        return G

    # --- step Jacobian (docs/definitions.md §7) -------------------------------------------------------------------
    # Layer l+1 reads layer l's NEW h within the same step, so J_t is block lower-triangular over
    # layers: ∂s'_{l+1}/∂s_m = (∂s'_{l+1}/∂x_{l+1}) · (∂h'_l/∂s_m) for m ≤ l, where ∂h'_l/∂s_m is the
    # first H rows of layer l's block row, already formed when layer l+1 is reached.

    def step_jacobian(self, x: Tensor, z: Tensor) -> Tensor:
        """J_t = ∂z_t/∂z_{t−1}: x (B, in), z (B, D) the state before the step → (B, D, D). Per layer
        the cell's analytic ∂s'/∂s (O(H²) elementwise); below the diagonal one (S × H)·(H × l·S)
        bmm per layer l ≥ 1. A replaced cell function falls back to the generic ``torch.func`` form."""
        if self.analytic_unsupported() is not None:
            return super().step_jacobian(x, z)
        S, H = self.layer_state, self.hidden_size
        J = z.new_zeros(z.shape[0], self.state_dim, self.state_dim)
        inp = x
        for layer, part in enumerate(z.split(S, dim=-1)):
            weights = self.layer_weights(layer)
            rows = slice(layer * S, (layer + 1) * S)
            j_s, j_x = self.cell_jacobian(inp, part, weights, layer > 0)
            J[:, rows, rows] = j_s
            if j_x is not None:
                J[:, rows, :layer * S] = j_x @ J[:, (layer - 1) * S:(layer - 1) * S + H, :layer * S]
            if layer + 1 < self.num_layers:
                inp = self.cell(inp, part, *weights)[0]
        return J

    def gate_terms(self, x: Tensor, z: Tensor) -> dict[str, Tensor]:
        """J_t split by path through the cell: ``gate_names`` → (B, D, D), summing to
        :meth:`step_jacobian`. Within a layer each term is the cell's own (see the core's file); a
        path that crosses layers (below the diagonal) belongs to the gate through which it enters
        the upper layer: term_k[l+1, m] = (∂s'_{l+1}/∂x through gate k) · (∂h'_l/∂s_m, all paths).
        A replaced cell function gives the generic single term ``step``."""
        if self.analytic_unsupported() is not None:
            return super().gate_terms(x, z)
        S, H, D = self.layer_state, self.hidden_size, self.state_dim
        if self.num_layers == 1:  # the cell's terms are the whole answer: no copies
            return {name: j_s for name, (j_s, _) in self.cell_terms(x, z, self.layer_weights(0), False).items()}
        terms = {name: z.new_zeros(z.shape[0], D, D) for name in self.gate_names}
        total = z.new_zeros(z.shape[0], D, D)  # J so far: the lower layers' rows feed the cross terms
        inp = x
        for layer, part in enumerate(z.split(S, dim=-1)):
            weights = self.layer_weights(layer)
            rows, below = slice(layer * S, (layer + 1) * S), slice(0, layer * S)
            lower_h = total[:, (layer - 1) * S:(layer - 1) * S + H, below] if layer > 0 else None
            for name, (j_s, j_x) in self.cell_terms(inp, part, weights, layer > 0).items():
                terms[name][:, rows, rows] = j_s
                if j_x is not None:
                    terms[name][:, rows, below] = j_x @ lower_h
                total[:, rows] += terms[name][:, rows]
            if layer + 1 < self.num_layers:
                inp = self.cell(inp, part, *weights)[0]
        return terms

    def recurrent_blocks(self) -> dict[str, Tensor]:
        """Each gate's row block of W_hh per layer, ``"l<layer>/<gate>"`` (1-based layer, PyTorch's gate
        order) → (H, H), views of the weights (detached), for their spectral norm and radius."""
        return {f"l{layer + 1}/{gate}": block
                for layer in range(self.num_layers)
                for gate, block in zip(self.gates, self.layer_weights(layer)[1].detach().chunk(len(self.gates)))}
