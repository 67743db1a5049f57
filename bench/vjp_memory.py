"""Peak memory of the reverse (vjp) Jacobian engine at D ≥ 50,000 (issue #47): a transformers Mamba of
6 layers (hidden 256, state 16, expand 2: D = 58,368 state numbers, H = 256 output rows), J = ∂h_T/∂z_p
of one sequence by the vjp engine. Baseline: the adapters' state unpacked by one slice per entry (each
slice's backward writes its gradient into zeros of z's full width); gradscope: one torch.split.
Each variant runs in its own process (ru_maxrss is a process's peak). Prints one table:

    python bench/vjp_memory.py
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, warnings
import torch, transformers
import gradscope
from gradscope.analysis.jacobian import state_jacobian
from gradscope.models.adapters import base
warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
if sys.argv[1] == "slices":  # the engine before issue #47
    def unpack(self, z):
        return {e.name: z[:, self._slices[e.name]].reshape(z.shape[0], *e.shape) for e in self.entries}
    base.LibraryCore.unpack = unpack
torch.manual_seed(0)
cfg = transformers.MambaConfig(vocab_size=100, hidden_size=256, state_size=16, num_hidden_layers=6, expand=2,
                               conv_kernel=4)
model = gradscope.wrap(transformers.MambaForCausalLM(cfg).eval())
tokens = torch.randint(0, 100, (1, 12))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
res = state_jacobian(model, tokens, position=6, method="vjp")
print(json.dumps({"D": model.core.state_dim, "H": model.core.out_dim,
                  "jac_mb": res.jac.numel() * res.jac.element_size() / 2**20,
                  "rise_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


def run(variant: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, variant], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    rows = {"baseline (a slice per entry)": run("slices"), "gradscope (one split)": run("split")}
    first = next(iter(rows.values()))
    print(f"vjp Jacobian of a transformers Mamba, D = {first['D']:,}, H = {first['H']}; J itself "
          f"{first['jac_mb']:.0f} MB; one D-vector per row {first['H'] * first['D'] * 4 / 2**20:.0f} MB")
    print("| engine | peak memory rise of the Jacobian (MB) | ÷ J |\n|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['rise_mb']:.0f} | {r['rise_mb'] / r['jac_mb']:.1f} |")


if __name__ == "__main__":
    main()
