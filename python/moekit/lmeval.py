"""lm-eval with moekit's experts: `python -m moekit.lmeval <lm_eval's own arguments>`.

lm-eval's CLI, unchanged, after two registrations it cannot make itself (nothing imports moekit in
a plain `lm_eval` process):
  - `import moekit` adds "moekit" and "moekit_fp8_{tensor,channel,block}" to transformers'
    experts implementations (moekit.hf), so `--model hf --model_args ...,experts_implementation=moekit`
    runs every MoE layer that goes through transformers' ExpertsInterface on moekit;
  - lm-eval model "hf-moekit": lm-eval's HF backend (HFLM) that, after loading, also swaps the MoE
    blocks transformers does not route through that interface (Llama-4's Llama4TextMoe) for
    moekit.MoELayer with the same scheme, and prints how each MoE layer runs. With no moekit
    experts_implementation it is plain HFLM (the transformers baseline).
Example (from the repository root; scripts/lm_eval.sh runs the whole table):
    python -m moekit.lmeval --model hf-moekit --include_path eval/lm_eval --tasks moekit_arith \\
        --model_args pretrained=models/llama4-tiny,experts_implementation=moekit_fp8_block,dtype=bfloat16
Tests: tests/python/test_lm_eval.py. Docs: docs/models.md ("lm-eval").
"""

from __future__ import annotations

import sys
from typing import Dict

from torch import nn

from . import hf

MODEL_NAME = "hf-moekit"


def describe(model: nn.Module) -> Dict[str, int]:
    """How the MoE layers of a loaded transformers model run: counts per path."""
    from .layer import MoELayer
    out: Dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, MoELayer):
            key = f"moekit.MoELayer (quant={m.quant})"
        elif type(m).__name__ in hf.UNREACHED_BLOCKS:
            key = f"{type(m).__name__} (transformers)"
        elif hasattr(m, "is_concatenated") and hasattr(m, "config"):  # set by @use_experts_implementation
            key = f"experts_implementation={m.config._experts_implementation}"
        else:
            continue
        out[key] = out.get(key, 0) + 1
    return out


_model_registered = False


def register() -> None:
    """moekit's experts with transformers (moekit.hf.register) and the lm-eval model "hf-moekit"
    (idempotent)."""
    global _model_registered
    hf.register()
    if _model_registered:
        return
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM

    class MoekitHFLM(HFLM):
        """HFLM, plus a moekit swap of the MoE blocks transformers' ExpertsInterface misses."""

        def _create_model(self, pretrained, **kwargs):
            super()._create_model(pretrained, **kwargs)
            impl = kwargs.get("experts_implementation")
            if impl in hf.SCHEMES:
                hf.swap_moe_blocks(self._model, quant=impl, only=hf.UNREACHED_BLOCKS)
            print(f"moekit.lmeval: {pretrained}: MoE layers {describe(self._model)}", flush=True)

    register_model(MODEL_NAME)(MoekitHFLM)
    _model_registered = True


def main() -> None:
    register()
    from lm_eval.__main__ import cli_evaluate
    cli_evaluate()


if __name__ == "__main__":
    sys.argv[0] = "python -m moekit.lmeval"
    main()
