#!/usr/bin/env python3
"""Hugging Face transformers' speed on the same model and prompt as `cubellm bench-generate`:
prefill tokens/s (one forward over the prompt) and decode tokens/s (`generate`, greedy, the
prefill time subtracted), medians of a few runs after a warm-up. One JSON line on stdout.

    python3 scripts/bench_hf_generate.py --model DIR [--prompt-len 512] [--new-tokens 128]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--attn", default="sdpa")
    args = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                 attn_implementation=args.attn).cuda().eval()
    shown = min(len(AutoTokenizer.from_pretrained(args.model)), model.config.vocab_size)
    ids = torch.tensor([[(i * 7 + 3) % shown for i in range(args.prompt_len)]], device="cuda")

    def prefill():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model(ids)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def gen(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    gen(8)
    pre, dec = [], []
    for _ in range(args.runs):
        p = prefill()
        g = gen(args.new_tokens)
        pre.append(args.prompt_len / p)
        dec.append((args.new_tokens - 1) / max(g - p, 1e-9))
    pre.sort()
    dec.sort()
    print(json.dumps({"impl": "transformers", "attn": args.attn, "dtype": "bf16",
                      "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                      "prefill_tok_s": round(pre[len(pre) // 2], 1),
                      "decode_tok_s": round(dec[len(dec) // 2], 2)}), flush=True)


if __name__ == "__main__":
    main()
