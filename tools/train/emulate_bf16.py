"""An independent PyTorch formulation of the C++ runner's bf16 scheme, to explain its logit diffs.

The runner's bf16 scheme (docs/models.md) rounds the MoE input, the intermediate act(g) * u and the
fused_moe output to bf16, routing in f32 on the unrounded input. This script does the same with a
per-token loop in PyTorch (the model of tools/train/model.py, weights of models/<name>) on the two
sequences whose full logits reference_logits.safetensors holds, and prints the max abs logit diff
against that f32 reference and the top-1 agreement: the numbers `moekit eval --scheme bf16` reports
in its `max abs diff` column come from the rounding itself if the two agree.

    python3 tools/train/emulate_bf16.py     # needs torch
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


def moe_bf16(self: M.MoE, x: torch.Tensor) -> torch.Tensor:
    """MoE.forward with the runner's bf16 roundings, one token and slot at a time."""
    cfg = self.cfg
    ids, w = self.route(F.linear(x.float(), self.router_weight().float()))
    xb = bf16(x)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if cfg.family == "llama4":  # router weight on the input
                g, u = ((xb[t] * w[t, j]) @ self.experts.gate_up_proj[e]).chunk(2)
                out[t] += bf16(F.silu(g) * u) @ self.experts.down_proj[e]
                continue
            ex = self.experts[e]
            gate, up, down = (ex.w1, ex.w3, ex.w2) if cfg.family == "mixtral" else (ex.gate_proj, ex.up_proj, ex.down_proj)
            out[t] += w[t, j] * down(bf16(F.silu(gate(xb[t])) * up(xb[t])))
    out = bf16(out)
    if cfg.family != "mixtral":  # the shared expert: a second fused_moe call (E = 1, weight 1)
        sh = self.shared_experts if cfg.family == "deepseek" else self.shared_expert
        out = out + bf16(sh.down_proj(bf16(F.silu(sh.gate_proj(xb)) * sh.up_proj(xb))))
    return out


def main() -> None:
    M.MoE.forward = moe_bf16
    for name in ["mixtral-tiny", "deepseek-v3-tiny", "llama4-tiny"]:
        d = os.path.join(ROOT, "models", name)
        ref = M.read_safetensors(os.path.join(d, "reference_logits.safetensors"))
        m = M.load_model(d).float().eval()
        for n in range(ref["logits"].shape[0]):
            n_pos = int(ref["lengths"][n])
            with torch.no_grad():
                lg = m(ref["input_ids"][n:n + 1, :n_pos].long())[0]
            r = ref["logits"][n, :n_pos]
            diff = (lg - r).abs()
            pos = int(diff.max(-1).values.argmax())
            print(f"{name} sequence {n}: max abs diff {float(diff.max()):.4f} at position {pos}"
                  f" (|logit| up to {float(r[pos].abs().max()):.2f} there), top-1 agreement"
                  f" {float((lg.argmax(-1) == r.argmax(-1)).float().mean()):.4f}")


if __name__ == "__main__":
    main()
