#!/usr/bin/env python3
"""Reference fixtures for the model families (Qwen2, Qwen3, Llama), made with Hugging Face
transformers.

Runs where torch and transformers are installed (the project's GPU machine: torch 2.11,
transformers 5.x; no network needed; on a CPU the same script runs, only slower). For each
fixture it builds a small random model of its family with transformers, saves it as safetensors (bf16, so the files stay small) with its config and the
project's demo tokenizer (written by `cubellm make-demo-model`), and records, computed in f32 from
exactly the saved bf16 values:

- reference.safetensors: `prompt_ids` (i32 [T]), `logits` (f32 [T, V], every prompt position),
  `greedy_ids` (i32 [32]);
- reference.json: the prompt, its ids, the greedy ids, the top-1/top-2 logit margin of every
  greedy step, and the versions used.

The greedy continuation comes from `model.generate(do_sample=False)` with eos disabled (so it is
always 32 tokens); `greedy_logits` (f32 [32, V]) are the logits of each of those steps, for
checking decode steps and not only their argmax.

Random models have near-ties between their top logits, where bf16/f16 rounding flips an argmax
and every later token differs. Two measures keep the fixtures decisive: the output rows of
ACTIVE tokens (drawn per seed) are scaled up by BOOST, so that a few candidates compete instead of
a thousand (the top-2 gap of a few Gaussians is a sizeable fraction of their spread); and seeds
(and weight scales) are tried until (a) transformers' own bf16 and f16 runs of the same weights
produce the same 32 greedy tokens as f32, and (b) every f32 greedy step's top-1/top-2 margin is
at least MARGIN_FACTOR times the largest |bf16 - f32| logit difference on the prompt. Random
models like to fall into repeating one token, which would not show a decode step that feeds the
wrong token; among the seeds that pass, the search keeps the one whose continuation has the most
distinct tokens (stopping early at WANT_DISTINCT, else after SEARCH_SECONDS). The margins, that
error and the seed are recorded.

    python3 scripts/make_hf_fixtures.py --tokenizer DIR --out crates/model/tests/fixtures/hf
    python3 scripts/make_hf_fixtures.py --big --tokenizer DIR --out /tmp/qwen2-1.5b-random

`--big` builds the DeepSeek-R1-Distill-Qwen-1.5B shape (hidden 1536, 28 layers, 12/2 heads,
intermediate 8960, vocab 151936, untied, bf16) with random weights on the GPU, for speed tests
and the 32-token greedy agreement check (never committed: 3.5 GB), and records its greedy
continuation and last-position logits computed in f32 (from the saved bf16 weights) by transformers.
`--big-layers N` keeps that shape with N decoder layers (per-layer kernel profiles that load in a
fraction of the time; end-to-end numbers need all 28).
"""
import argparse
import copy
import json
import os
import shutil
import sys
import time

import torch

PROMPT = "The quick brown fox jumps over the lazy dog. 水🙂 Once upon a time"
NEW_TOKENS = 32
ACTIVE = 16
BOOST = 3.0
MARGIN_FACTOR = 4.0
SEARCH_SECONDS = 60  # per fixture
WANT_DISTINCT = 8    # stop searching once a continuation has this many distinct tokens
STDS = (0.1, 0.2, 0.3)
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]

# name -> config overrides (vocab 1024 = the demo tokenizer's size unless said otherwise); the
# family is the name's prefix (see ARCHS).
FIXTURES = {
    # like the target: untied embeddings, GQA (4 query heads per KV head... here 2)
    "qwen2-gqa-untied": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                             rope_theta=10000.0, rms_norm_eps=1e-6),
    # like Qwen2.5: tied embeddings, rope_theta 1e6, head_dim 32, 4 query heads per KV head
    "qwen25-tied-theta1e6": dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=1,
                                 tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2-1layer": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         rope_theta=10000.0, rms_norm_eps=1e-5),
    # 4 layers, plain multi-head attention (no GQA)
    "qwen2-4layer": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                         rope_theta=10000.0, rms_norm_eps=1e-6),
    # odd vocabulary (larger than the tokenizer, as Qwen pads its embeddings), odd widths
    "qwen2-odd-vocab": dict(hidden_size=48, intermediate_size=112, num_hidden_layers=2,
                            num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=False,
                            rope_theta=10000.0, rms_norm_eps=1e-6, vocab_size=1031),
    # Qwen3: q/k RMSNorm per head, no qkv bias, head_dim 32 wider than hidden / heads (as the
    # released Qwen3 models: 0.6B has hidden 1024, 16 heads of 128), tied, theta 1e6
    "qwen3-gqa-tied": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # Qwen3 untied, plain multi-head attention, three layers
    "qwen3-mha-untied": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                             tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6),
    # Llama 3.x: the llama3 RoPE scaling with an original context small enough that the three
    # frequency bands (kept, smoothed, divided by the factor) all occur at head_dim 16; tied as
    # Llama-3.2-1B, theta 500000, GQA
    "llama3-rope-scaled": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5,
                               rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                 low_freq_factor=1.0, high_freq_factor=4.0,
                                                 original_max_position_embeddings=64)),
    # Llama with attention biases (q, k, v and o), untied, default RoPE, one KV head
    "llama-bias-untied": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1,
                              tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6,
                              attention_bias=True),
}

# family prefix -> (config class, model class) in transformers
ARCHS = {
    "qwen25": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
}


def arch_classes(name):
    """The transformers classes of a fixture, from the family its name starts with."""
    import transformers
    for key, (cfg_cls, model_cls) in ARCHS.items():
        if name.startswith(key):
            return getattr(transformers, cfg_cls), getattr(transformers, model_cls)
    raise KeyError(f"{name}: the name starts with no family of {list(ARCHS)}")


def make_config(cls, cfg):
    """A config with rope_theta (and the RoPE scaling, if any) in force whether this transformers
    reads `rope_theta` / `rope_scaling` (4.x) or `rope_parameters` (5.x)."""
    cfg = dict(cfg)
    scaling = cfg.pop("rope_scaling", None)
    config = cls(**cfg)
    if hasattr(config, "rope_parameters"):
        params = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
        if scaling:
            params.update(scaling)
        config.rope_parameters = params
    elif scaling:
        config.rope_scaling = scaling
    return config


def expected_inv_freq(cfg):
    """The rotary inverse frequencies the fixture's config asks for, computed here from the
    published formulas (default, and Llama 3's frequency-band scaling)."""
    import math
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    s = cfg.get("rope_scaling")
    if s and s["rope_type"] == "llama3":
        old = s["original_max_position_embeddings"]
        low_wl, high_wl = old / s["low_freq_factor"], old / s["high_freq_factor"]
        out = []
        for f in inv.tolist():
            wl = 2 * math.pi / f
            if wl < high_wl:
                out.append(f)
            elif wl > low_wl:
                out.append(f / s["factor"])
            else:
                t = (old / wl - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
                out.append((1 - t) * f / s["factor"] + t * f)
        inv = torch.tensor(out, dtype=torch.float64)
    return inv.float()


def check_rope(model, cfg):
    """The model's rotary frequencies are those of the wanted theta and scaling."""
    inv = model.model.rotary_emb.inv_freq.float().cpu()
    want = expected_inv_freq(cfg)
    assert torch.allclose(inv, want, rtol=1e-5), f"rope not in force: {inv} vs {want}"


def versions():
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def encode(tokenizer_dir):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    # add_special_tokens=True like a raw prompt in the CLI (the demo tokenizer adds none)
    return tok.encode(PROMPT, add_special_tokens=True).ids, tok.get_vocab_size(with_added_tokens=True)


def randomize(model, seed, tok_vocab, std=0.1):
    """Seeded random weights: normal(0, std) matrices and biases, norms around 1, and the output
    rows (lm_head, or the tied embedding) of ACTIVE random ids scaled by BOOST (one of them past
    the tokenizer's vocabulary when the model's is larger). Rounded to bf16 (the saved precision)
    so that the f32 reference sees exactly the saved values. Returns the active ids."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    active = (3 + torch.randperm(tok_vocab - 3, generator=g)[:ACTIVE]).tolist()
    if vocab > tok_vocab:
        active[-1] = tok_vocab + int(torch.randint(vocab - tok_vocab, (1,), generator=g))
    out_name = "model.embed_tokens.weight" if model.config.tie_word_embeddings else "lm_head.weight"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            else:
                v = std * torch.randn(p.shape, generator=g)
            if name == out_name:
                v[active] *= BOOST
            p.copy_(v.to(torch.bfloat16).to(p.dtype))
    return sorted(active)


def greedy(model, ids):
    from transformers import GenerationConfig
    gc = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=0,
                          eos_token_id=None, pad_token_id=0, bos_token_id=None)
    out = model.generate(ids, generation_config=gc, output_scores=True, output_logits=True,
                         return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1]:]
    margins = []
    for step in out.logits:
        top = torch.topk(step[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    step_logits = torch.stack([step[0].float() for step in out.logits])
    return new, margins, step_logits


def check_greedy_by_hand(model, ids, new):
    """The same continuation from full forward passes (no cache), as a sanity check of generate."""
    seq = ids
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            nxt = model(seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    return torch.equal(seq[0, ids.shape[1]:], new)


def make_fixture(name, overrides, tokenizer_dir, out_dir, device):
    from safetensors.torch import save_file
    config_cls, model_cls = arch_classes(name)

    prompt_ids, tok_vocab = encode(tokenizer_dir)
    cfg = dict(vocab_size=tok_vocab, max_position_embeddings=256, hidden_act="silu",
               bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    if name.startswith("qwen"):
        cfg["use_sliding_window"] = False
    cfg.update(overrides)
    assert cfg["vocab_size"] >= tok_vocab, "the model must cover the tokenizer's ids"
    config = make_config(config_cls, cfg)
    ids = torch.tensor([prompt_ids], device=device)
    tries, best, start = 0, None, time.time()
    for seed in range(1, 100000):
        if best is not None and (best[0] >= WANT_DISTINCT or time.time() - start > SEARCH_SECONDS):
            break
        if best is None and time.time() - start > 4 * SEARCH_SECONDS:
            raise RuntimeError(f"{name}: no seed gave decisive greedy steps")
        tries += 1
        std = STDS[seed % len(STDS)]
        torch.manual_seed(seed)
        model = model_cls(config).to(device=device, dtype=torch.float32).eval()
        active = randomize(model, seed, tok_vocab, std)
        check_rope(model, cfg)
        new, margins, step_logits = greedy(model, ids)
        distinct = len(set(new.tolist()))
        if best is not None and distinct <= best[0]:
            continue
        with torch.no_grad():
            logits = model(ids).logits[0].float()
            low_err = {}
            for dt in (torch.bfloat16, torch.float16):
                low = copy.deepcopy(model).to(dt)
                low_err[str(dt)] = float((low(ids).logits[0].float() - logits).abs().max())
                del low
        if min(margins) < MARGIN_FACTOR * max(low_err.values()):
            continue
        # Candidates only: transformers' own half-precision greedy runs must agree.
        ok = True
        for dt in (torch.bfloat16, torch.float16):
            low = copy.deepcopy(model).to(dt)
            low_new, _, _ = greedy(low, ids)
            ok = ok and torch.equal(low_new, new)
            del low
        if ok:
            best = (distinct, seed, std, model, active, new, margins, step_logits, logits, low_err)
    distinct, seed, std, model, active, new, margins, step_logits, logits, low_err = best
    assert check_greedy_by_hand(model, ids, new), f"{name}: generate() and a manual greedy loop differ"

    d = os.path.join(out_dir, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokenizer_dir, f), d)
    for extra in ["generation_config.json"]:
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)
    save_file({
        "prompt_ids": torch.tensor(prompt_ids, dtype=torch.int32),
        "logits": logits.cpu().contiguous(),
        "greedy_ids": new.to(torch.int32).cpu().contiguous(),
        "greedy_logits": step_logits.cpu().contiguous(),
    }, os.path.join(d, "reference.safetensors"))
    meta = {
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "greedy_ids": new.tolist(),
        "greedy_margins": [round(m, 4) for m in margins],
        "min_margin": round(min(margins), 4),
        "max_abs_logit_error_of_transformers_in": {k: round(v, 5) for k, v in low_err.items()},
        "logit_range": [round(float(logits.min()), 3), round(float(logits.max()), 3)],
        "boosted_ids": active,
        "seed": seed,
        "weight_std": std,
        "distinct_greedy_tokens": distinct,
        "seeds_tried": tries,
        "reference_dtype": "float32 (from the saved bf16 weights)",
        "overrides": overrides,
        "versions": versions(),
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    with open(os.path.join(d, "config.json")) as f:
        print(f"{name}/config.json: {json.dumps(json.load(f), sort_keys=True)}", flush=True)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{name}: seed {seed} std {std} ({tries} tried), {distinct} distinct, min margin {min(margins):.3f}, half-precision "
          f"errors {low_err}, {size / 1e6:.2f} MB, greedy {new.tolist()[:8]}...", flush=True)


def make_big(tokenizer_dir, out_dir, device, layers=28):
    """The 1.5B shape (with `layers` decoder layers) with random bf16 weights (built on the
    GPU), plus its greedy reference."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from safetensors.torch import save_file

    config = make_config(Qwen2Config, dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=layers, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=131072,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
        use_sliding_window=False, bos_token_id=None, eos_token_id=None,
        attn_implementation="sdpa"))
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    active = torch.randperm(1024, generator=g)[:ACTIVE]  # ids the demo tokenizer can show
    with torch.no_grad():
        model.lm_head.weight[active.to(device)] *= BOOST  # decisive greedy steps, as in the fixtures
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokenizer_dir, f), out_dir)
    prompt_ids, _ = encode(tokenizer_dir)
    ids = torch.tensor([prompt_ids], device=device)
    # The reference is computed in f32 from the saved bf16 values: random weights leave small
    # top-1/top-2 margins that bf16 rounding (of any implementation) would flip.
    model = model.float()
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
    new, margins, _ = greedy(model, ids)
    save_file({"prompt_ids": torch.tensor(prompt_ids, dtype=torch.int32),
               "last_logits": logits.cpu().contiguous(),
               "greedy_ids": new.to(torch.int32).cpu().contiguous()},
              os.path.join(out_dir, "reference.safetensors"))
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump({"prompt": PROMPT, "prompt_ids": prompt_ids, "greedy_ids": new.tolist(),
                   "greedy_margins": [round(m, 4) for m in margins],
                   "reference_dtype": "float32 (from the saved bf16 weights)", "versions": versions()},
                  f, indent=1)
    print(f"big model written to {out_dir}; greedy {new.tolist()[:8]}..., "
          f"min margin {min(margins):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True,
                    help="directory with the demo tokenizer (cubellm make-demo-model --out DIR)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--big", action="store_true", help="build the 1.5B-shaped random model")
    ap.add_argument("--big-layers", type=int, default=28,
                    help="decoder layers of the --big model (default 28, the real model's)")
    ap.add_argument("--only", nargs="*", help="fixture names to build (default: all)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Deterministic f32 matmuls for the reference (no TF32).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"device {device}, {versions()}", flush=True)
    if args.big:
        make_big(args.tokenizer, args.out, device, args.big_layers)
        return
    names = args.only or list(FIXTURES)
    failed = []
    for name in names:
        try:
            make_fixture(name, FIXTURES[name], args.tokenizer, args.out, device)
        except Exception:  # report, and go on with the others
            import traceback
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"FAILED: {failed}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
