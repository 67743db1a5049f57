"""Library models as gradscope cores: ``gradscope.wrap(model)`` recognises these classes by name and
module (the libraries are optional extras, imported only by the adapter that needs them):

========================  ==========================================================  =================
library                   classes                                                     adapter module
========================  ==========================================================  =================
transformers              ``MambaForCausalLM``, ``MambaModel``, ``FalconMamba…``      ``hf_mamba``
transformers              ``RwkvForCausalLM``, ``RwkvModel``                          ``hf_rwkv``
transformers              ``xLSTMForCausalLM``, ``xLSTMModel`` (mLSTM)                ``hf_xlstm``
transformers              ``RecurrentGemmaForCausalLM``, ``RecurrentGemmaModel``       ``hf_recurrent_gemma``
transformers              ``Mamba2ForCausalLM``, ``Mamba2Model``                      ``hf_mamba2``
transformers              ``Qwen3NextForCausalLM``, ``Qwen3NextModel``                ``hf_qwen3_next``
transformers              ``LlamaForCausalLM``, ``LlamaModel``, ``Qwen3…``            ``hf_llama``
transformers              ``BambaForCausalLM``, ``BambaModel``                        ``hf_bamba``
transformers              ``NemotronHForCausalLM``, ``NemotronHModel``                ``hf_nemotron_h``
transformers              ``FalconH1ForCausalLM``, ``FalconH1Model``                  ``hf_falcon_h1``
transformers              ``JambaForCausalLM``, ``JambaModel``                        ``hf_jamba``
transformers              ``Zamba2ForCausalLM``, ``Zamba2Model``                      ``hf_zamba2``
transformers              ``KimiLinearForCausalLM``, ``KimiLinearModel``              ``hf_kimi_linear``
mambapy                   ``Mamba``, ``LM``                                           ``mambapy``
========================  ==========================================================  =================

Each adapter module has ``adapt(model) → Adapted`` (:mod:`gradscope.models.adapters.base`); one whose model
has attention layers also takes ``positions``, its attention caches' slots
(:mod:`gradscope.models.adapters.attention`).
:func:`gradscope.models.wrap.wrap_library` builds the wrapped model, compares it with the library's own
forward and runs the protocol checks (:mod:`gradscope.models.protocol`).
"""

from __future__ import annotations

ADAPTERS: dict[tuple[str, str], str] = {
    ("transformers", "MambaForCausalLM"): "hf_mamba",
    ("transformers", "MambaModel"): "hf_mamba",
    ("transformers", "FalconMambaForCausalLM"): "hf_mamba",
    ("transformers", "FalconMambaModel"): "hf_mamba",
    ("transformers", "RwkvForCausalLM"): "hf_rwkv",
    ("transformers", "RwkvModel"): "hf_rwkv",
    ("transformers", "xLSTMForCausalLM"): "hf_xlstm",
    ("transformers", "xLSTMModel"): "hf_xlstm",
    ("transformers", "RecurrentGemmaForCausalLM"): "hf_recurrent_gemma",
    ("transformers", "RecurrentGemmaModel"): "hf_recurrent_gemma",
    ("transformers", "Mamba2ForCausalLM"): "hf_mamba2",
    ("transformers", "Mamba2Model"): "hf_mamba2",
    ("transformers", "Qwen3NextForCausalLM"): "hf_qwen3_next",
    ("transformers", "Qwen3NextModel"): "hf_qwen3_next",
    ("transformers", "LlamaForCausalLM"): "hf_llama",
    ("transformers", "LlamaModel"): "hf_llama",
    ("transformers", "Qwen3ForCausalLM"): "hf_llama",
    ("transformers", "Qwen3Model"): "hf_llama",
    ("transformers", "BambaForCausalLM"): "hf_bamba",
    ("transformers", "BambaModel"): "hf_bamba",
    ("transformers", "NemotronHForCausalLM"): "hf_nemotron_h",
    ("transformers", "NemotronHModel"): "hf_nemotron_h",
    ("transformers", "FalconH1ForCausalLM"): "hf_falcon_h1",
    ("transformers", "FalconH1Model"): "hf_falcon_h1",
    ("transformers", "JambaForCausalLM"): "hf_jamba",
    ("transformers", "JambaModel"): "hf_jamba",
    ("transformers", "Zamba2ForCausalLM"): "hf_zamba2",
    ("transformers", "Zamba2Model"): "hf_zamba2",
    ("transformers", "KimiLinearForCausalLM"): "hf_kimi_linear",
    ("transformers", "KimiLinearModel"): "hf_kimi_linear",
    ("mambapy", "Mamba"): "mambapy",
    ("mambapy", "LM"): "mambapy",
    ("mambapy", "Mamba2"): "mambapy",  # refused there, in one line: it runs only through mamba_ssm's GPU kernels
}


def adapter_for(model: object) -> str | None:
    """The adapter module name for ``model``'s class (or a base class), else None."""
    for cls in type(model).__mro__:
        key = (cls.__module__.split(".")[0], cls.__name__)
        if key in ADAPTERS:
            return ADAPTERS[key]
    return None


def class_names(library: str) -> list[str]:
    """The class names an adapter exists for in ``library`` ("transformers" or "mambapy")."""
    return [name for lib, name in ADAPTERS if lib == library]


__all__ = ["ADAPTERS", "adapter_for", "class_names"]
