#!/usr/bin/env python3
"""The plain-PyTorch peer of `cubellm bench-generate`: the same Qwen2/Qwen3/Llama checkpoint
run with PyTorch ops only (cuBLAS through F.linear, SDPA, a static KV cache), the decode step
captured as one CUDA graph and replayed per token, greedy. One JSON line on stdout.

    python3 scripts/bench_torch_decode.py --model DIR [--prompt-len 512] [--new-tokens 128]
        [--runs 3] [--dtype bf16]

What it does per layer, as cubellm does: RMSNorm, one fused q/k/v projection (+ bias), RoPE
(rotate-half, from cos/sin tables), the k/v rows written into a preallocated cache at the
position held in a device tensor, SDPA over the whole cache with a mask hiding the positions
not yet written (static shapes, so the step can be captured), o_proj + residual, RMSNorm, one
fused gate/up projection, SiLU * up, down_proj + residual; then the final norm, the LM head
and argmax on the device. Prefill is one eager forward over the prompt (causal SDPA).
Decode tok/s counts the steps after the first token (which prefill produces).
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def load(model_dir, dtype, device):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tensors = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors") and f != "reference.safetensors":
            tensors.update(load_file(os.path.join(model_dir, f), device=device))
    t = {k.removeprefix("model."): v.to(dtype) for k, v in tensors.items()}
    return cfg, t


def rope_tables(cfg, max_len, device):
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind != "default":
        raise SystemExit(f"rope type {kind} is not implemented by this peer (default only)")
    theta = cfg.get("rope_theta") or rp.get("rope_theta", 10000.0)
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
    pos = torch.arange(max_len, dtype=torch.float64, device=device)
    ang = torch.outer(pos, inv)
    return torch.cos(ang).float(), torch.sin(ang).float(), d


class Model:
    def __init__(self, cfg, t, dtype, max_len, device):
        self.cfg, self.dtype, self.max_len = cfg, dtype, max_len
        self.h = cfg["hidden_size"]
        self.hq = cfg["num_attention_heads"]
        self.hkv = cfg.get("num_key_value_heads", self.hq)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.cos, self.sin, self.d = rope_tables(cfg, max_len, device)
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            p = f"layers.{i}."
            w = lambda n: t[p + n]
            b = lambda n: t.get(p + n)
            qkv_b = [b(f"self_attn.{x}_proj.bias") for x in "qkv"]
            self.layers.append(dict(
                ln1=w("input_layernorm.weight"), ln2=w("post_attention_layernorm.weight"),
                qkv=torch.cat([w(f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous(),
                qkv_b=torch.cat(qkv_b) if qkv_b[0] is not None else None,
                qn=b("self_attn.q_norm.weight"), kn=b("self_attn.k_norm.weight"),
                o=w("self_attn.o_proj.weight"), o_b=b("self_attn.o_proj.bias"),
                gu=torch.cat([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")]).contiguous(),
                down=w("mlp.down_proj.weight")))
        self.embed = t["embed_tokens.weight"]
        self.norm = t["norm.weight"]
        self.head = t.get("lm_head.weight", self.embed)
        shape = (cfg["num_hidden_layers"], 1, self.hkv, max_len, self.d)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def rope(self, x, pos):  # x [T, H, D], pos [T]
        c, s = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        a, b = x.float().chunk(2, dim=-1)
        return torch.cat([a * c - b * s, b * c + a * s], -1).to(x.dtype)

    def forward(self, ids, pos, mask):
        """ids [T], pos [T] (device), mask [T, max_len] additive (device); returns logits [T, V]."""
        T = ids.shape[0]
        x = self.embed[ids]
        q_dim, kv_dim = self.hq * self.d, self.hkv * self.d
        for li, L in enumerate(self.layers):
            h = self.rms(x, L["ln1"])
            qkv = F.linear(h, L["qkv"], L["qkv_b"])
            q, k, v = qkv.split([q_dim, kv_dim, kv_dim], dim=-1)
            q, k, v = q.view(T, self.hq, self.d), k.view(T, self.hkv, self.d), v.view(T, self.hkv, self.d)
            if L["qn"] is not None:
                q, k = self.rms(q, L["qn"]), self.rms(k, L["kn"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            self.k[li, 0].index_copy_(1, pos, k.transpose(0, 1))
            self.v[li, 0].index_copy_(1, pos, v.transpose(0, 1))
            a = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], self.k[li], self.v[li], attn_mask=mask[None, None],
                enable_gqa=True)
            x = x + F.linear(a[0].transpose(0, 1).reshape(T, q_dim), L["o"], L["o_b"])
            h = self.rms(x, L["ln2"])
            g, u = F.linear(h, L["gu"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, L["down"])
        return F.linear(self.rms(x, self.norm), self.head)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--device", default="cuda", help="cpu runs the steps eagerly (a check)")
    ap.add_argument("--check", action="store_true",
                    help="use the model dir's reference.safetensors prompt and compare the "
                         "greedy tokens with its greedy_ids")
    args = ap.parse_args()
    dev = args.device
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg, t = load(args.model, dtype, dev)
    if args.check:
        args.prompt_len = load_file(os.path.join(args.model, "reference.safetensors"))[
            "prompt_ids"].shape[0]
    max_len = args.prompt_len + args.new_tokens + 64
    m = Model(cfg, t, dtype, max_len, dev)
    vocab = m.head.shape[0]
    ids = torch.tensor([(i * 7 + 3) % min(vocab, 1024) for i in range(args.prompt_len)], device=dev)
    want = None
    if args.check:
        ref = load_file(os.path.join(args.model, "reference.safetensors"))
        ids = ref["prompt_ids"].long().to(dev)
        want = ref["greedy_ids"].tolist()
        args.prompt_len = ids.shape[0]
        args.new_tokens = len(want)
    neg = torch.finfo(torch.float32).min
    cols = torch.arange(max_len, device=dev)

    # Static decode-step buffers: the graph reads the token and position from them.
    tok = torch.zeros(1, dtype=torch.long, device=dev)
    pos = torch.zeros(1, dtype=torch.long, device=dev)
    mask = torch.zeros(1, max_len, dtype=dtype, device=dev)
    out_tok = torch.zeros(1, dtype=torch.long, device=dev)

    def step():
        mask.copy_(torch.where(cols[None] <= pos[:, None], 0.0, neg).to(dtype))
        logits = m.forward(tok, pos, mask)
        out_tok.copy_(logits.argmax(-1))

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def prefill():
        p = torch.arange(args.prompt_len, device=dev)
        pm = torch.where(cols[None] <= p[:, None], 0.0, neg).to(dtype)
        return m.forward(ids, p, pm)[-1].argmax()

    with torch.no_grad():
        first = prefill()
        run_step = step
        if dev == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            run_step = graph.replay

        pre, dec, tokens = [], [], []
        for _ in range(args.runs):
            sync()
            t0 = time.perf_counter()
            first = prefill()
            sync()
            pre.append(args.prompt_len / (time.perf_counter() - t0))
            tok.copy_(first.view(1))
            tokens = [int(first)] if want is not None else []
            sync()
            t0 = time.perf_counter()
            for i in range(args.new_tokens - 1):
                pos.fill_(args.prompt_len + i)
                run_step()
                tok.copy_(out_tok)
                if want is not None:
                    tokens.append(int(out_tok))
            sync()
            dec.append((args.new_tokens - 1) / (time.perf_counter() - t0))
    line = {"impl": "torch-graph", "dtype": args.dtype, "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens, "runs": args.runs,
            "prefill_tok_s": round(statistics.median(pre), 1),
            "decode_tok_s": round(statistics.median(dec), 2), "torch": torch.__version__}
    if want is not None:
        line["greedy_match"] = tokens == want
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
