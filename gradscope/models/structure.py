"""How a core's step Jacobian J_t = ∂z_t/∂z_{t−1} is built: the structure a core may declare.

The state z (D real numbers) is cut into consecutive *blocks* (a core's layers, say). J_t is block
lower-triangular over them: block i's new state reads the old state of blocks j ≤ i only (a stack
of layers, each reading the layer below at the same step). Each block's own diagonal block of J_t
has a *form*:

- ``dense``: a full n × n matrix (an RNN layer);
- ``diagonal``: real diagonal, one entry per coordinate (minGRU, RG-LRU, a real diagonal SSM);
- ``complex_diagonal``: complex diagonal on the real view: coordinates (2m, 2m+1) hold the real and
  imaginary parts of mode m, and the block is a 2 × 2 rotation-scaling [[a, −b], [b, a]] per mode
  (S4D, with dA = a + ib);
- ``block_diagonal``: ``size`` × ``size`` blocks along the diagonal, one per head (mLSTM-style); with
  ``repeat`` > 1, each run of ``repeat`` consecutive blocks is one block repeated: M_t ⊗ I, as the gated
  delta rule's S_t = M_t S_{t−1} + … acts on a head's d_v columns of d_k (the state laid out (d_v, d_k)
  per head), so its exponents are the d_k of M's cocycle, each with multiplicity d_v.

A core says so with ``jacobian_structure()`` and gives the compact diagonal blocks with
``diagonal_blocks(x, z)``: one tensor per block, (B, n) real for ``diagonal``, (B, n/2) complex for
``complex_diagonal``, (B, n/size, size, size) for ``block_diagonal``, (B, n, n) for ``dense``. A core
that declares nothing is one dense block, and the dense engines treat it as they always have.

Why it matters. For a block-triangular cocycle, the subspace of states that are zero in blocks
1 … i−1 is invariant, so (Oseledets) its Lyapunov spectrum is the union of the spectra of the
diagonal-block cocycles, whatever the blocks below the diagonal are, provided log⁺‖J_t‖ and
log⁺‖J_t^{−1}‖ restricted to each block are integrable along the driven trajectory (a standard
result on cocycles with an invariant flag; e.g. L. Arnold, *Random Dynamical Systems*, §3.4). For
diagonal forms, those spectra are the time averages of log|diagonal entries|: exact, O(D) per step.
On a finite window the Benettin/QR estimate of the full matrix differs from the union by O(1/T)
(the frame's transient), not by more.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradscope.errors import check

FORMS = ("dense", "diagonal", "complex_diagonal", "block_diagonal")
DEFAULT_FORM = "dense"  # a state block's form unless it declares one: J_t's full block on it


@dataclass(frozen=True)
class StateBlock:
    """One block of the state: ``z[start:stop]`` and the form of J_t's own block on it."""

    name: str
    start: int
    stop: int
    form: str = DEFAULT_FORM
    size: int = 1  # block_diagonal: the width of each head's block; diagonal: how many consecutive entries
    # share one value (a scalar per head, e.g. Mamba-2's exp(Δ_h A_h) over a head's P·N entries)
    repeat: int = 1  # block_diagonal: how many consecutive blocks are the same block (M_t ⊗ I_repeat)
    held: bool = False  # an attention layer's keys and values: no fixed-size state of its own, so the Lyapunov and
    # step spectra hold it as an input along the trajectory and report the other blocks only

    def __post_init__(self) -> None:
        check(self.form in FORMS, f"form: got {self.form!r}; valid forms are {', '.join(FORMS)}")
        check(0 <= self.start < self.stop, f"block {self.name}: got [{self.start}, {self.stop}); need 0 <= start < stop")
        n = self.stop - self.start
        check(self.form != "complex_diagonal" or n % 2 == 0,
              f"block {self.name}: a complex_diagonal block needs an even width (re/im pairs); got {n}")
        check(self.form not in ("block_diagonal", "diagonal") or (self.size >= 1 and n % self.size == 0),
              f"block {self.name}: {self.form} size {self.size} does not divide its width {n}")
        check(self.form in ("block_diagonal", "diagonal") or self.size == 1,
              f"block {self.name}: a {self.form} block takes no size; got {self.size}")
        tiles = self.form == "block_diagonal" and n % (self.size * self.repeat) == 0
        check(self.repeat == 1 or (self.repeat > 1 and tiles),
              f"block {self.name}: repeat {self.repeat} needs a block_diagonal block whose width {n} is a multiple "
              f"of size × repeat")

    @property
    def width(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class JacobianStructure:
    """The blocks of the state in order; J_t is block lower-triangular over them."""

    blocks: tuple[StateBlock, ...]

    def __post_init__(self) -> None:
        check(len(self.blocks) >= 1, "blocks: a structure needs at least one block")
        for a, b in zip(self.blocks, self.blocks[1:]):
            check(a.stop == b.start, f"blocks: {a.name} ends at {a.stop} but {b.name} starts at {b.start}; "
                                     f"blocks must tile the state in order")
        check(self.blocks[0].start == 0, f"blocks: the first block must start at 0; got {self.blocks[0].start}")

    @property
    def state_dim(self) -> int:
        return self.blocks[-1].stop

    @property
    def is_dense(self) -> bool:
        """One dense block: nothing to exploit."""
        return len(self.blocks) == 1 and self.blocks[0].form == "dense"

    @property
    def is_diagonal(self) -> bool:
        """J_t itself is (block-)diagonal: one block of a diagonal form, nothing below the diagonal."""
        return len(self.blocks) == 1 and self.blocks[0].form != "dense"

    def describe(self) -> str:
        """One line, e.g. ``lower-triangular over 2 blocks: modes1 complex_diagonal, modes2 complex_diagonal``;
        layers named ``l0/…``, ``l1/…`` are said once per kind of layer (``24 layers × (conv block_diagonal(3),
        ssm diagonal)``; a hybrid's ``9 layers × (…), 3 layers × (…)``), a run of per-head blocks once
        (``delta ×6 heads``), and held blocks as such, so a real-size model's plan stays one readable line."""
        def one(name: str, b: StateBlock) -> str:
            return f"{name} {b.form}" + (f"({b.size}{f', ×{b.repeat}' if b.repeat > 1 else ''})" if b.form == "block_diagonal" else
                                         f"(×{b.size})" if b.form == "diagonal" and b.size > 1 else "") + \
                (" held" if b.held else "")

        parts = ", ".join(one(b.name, b) for b in self.blocks)
        if len(self.blocks) == 1:
            return parts
        layers: list[list[StateBlock]] = []
        for b in self.blocks:
            head, sep, rest = b.name.partition("/")
            if not (sep and head[:1] == "l" and head[1:].isdigit()):
                layers = []
                break
            index = int(head[1:])
            if index == len(layers):
                layers.append([])
            elif index != len(layers) - 1:
                layers = []
                break
            layers[-1].append(b)
        if len(layers) > 1:
            kinds: dict[str, int] = {}
            for layer in layers:
                kinds[self._layer_kind(layer, one)] = kinds.get(self._layer_kind(layer, one), 0) + 1
            if len(kinds) == 1 or sum(len(layer) for layer in layers) > len(kinds) * 2:
                parts = ", ".join(f"{n} layer{'s' if n > 1 else ''} × ({k})" for k, n in kinds.items())
        return f"lower-triangular over {len(self.blocks)} blocks: {parts}"

    @staticmethod
    def _layer_kind(layer: list[StateBlock], one) -> str:  # noqa: ANN001 - describe's block formatter
        """A layer's blocks without its index; a run of blocks ``<name>/h<j>`` of one form said once (``×n heads``)."""
        out: list[tuple[str, int]] = []
        for b in layer:
            rest = b.name.partition("/")[2]
            stem, sep, tail = rest.rpartition("/h")
            text = one(stem if sep and tail.isdigit() else rest, b)
            if sep and tail.isdigit() and out and out[-1][0] == text:
                out[-1] = (text, out[-1][1] + 1)
            else:
                out.append((text, 1))
        return ", ".join(t if n == 1 else f"{t} ×{n} heads" for t, n in out)


def dense_structure(state_dim: int) -> JacobianStructure:
    """What a core that declares nothing has: one dense block."""
    return JacobianStructure((StateBlock("z", 0, state_dim, "dense"),))


def structure_of(core: object) -> JacobianStructure:
    """The core's declared structure (checked against its state width), else one dense block."""
    method = getattr(core, "jacobian_structure", None)
    structure = method() if callable(method) else None
    D = int(getattr(core, "state_dim"))
    if structure is None:
        return dense_structure(D)
    check(isinstance(structure, JacobianStructure),
          f"jacobian_structure: {type(core).__name__} returned {type(structure).__name__}; expected a JacobianStructure")
    check(structure.state_dim == D, f"jacobian_structure: {type(core).__name__}'s blocks cover {structure.state_dim} "
                                    f"state entries; its state_dim is {D}")
    return structure
