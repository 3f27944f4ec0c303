#!/usr/bin/python3
"""Train a tiny Llama on a long-range key/value retrieval (copy) task.

The model is the test fixture tests/fixtures/retrieval_model/: its greedy
answers depend on tokens far back in the context at *every* decode step, so
it measures whether a sparse (top-k pages) KV cache keeps quality.

Runs on CPU with Debian's python3-torch (1.13; no transformers/safetensors
needed):

  /usr/bin/python3 tools/train_retrieval_model.py --out DIR --work /tmp/retrieval_work
  /usr/bin/python3 tools/train_retrieval_model.py --out DIR --write-eval
  /usr/bin/python3 tools/train_retrieval_model.py --out DIR --eval-model [--cli build/tools/specula-cli]

Task (token ids only; the text rendering does not matter). Ids 507..511 are
the tokenizer's specials and never appear except BOS (507) at position 0.

  markers  REC=8  VAL=9  SEP=10  QUERY=11
  filler   ids 32..255   random runs plus copies of earlier filler n-grams
  keys/values  ids 256..506, all distinct within one context

  context = BOS, filler with records `REC k1 k2 VAL v1 .. v8 SEP` scattered in
  it, then `QUERY k1 k2 VAL v1` of one earlier record; the answer is
  `v2 .. v8` (7 tokens), produced by greedy decoding. Every answer token is
  the token that follows the previous one inside the far-away record.

An example of context length C has exactly C tokens: prompt (C - 7) + answer (7).
Eval sets put the queried record in the first half of the context.

Training has two phases (see train()): phase A forms induction heads on short
repeated random sequences (the loss plateaus for ~1600 steps, then drops within
~100); phase B trains the task at 256/512/1024 tokens. Checkpoints go to
--work/ckpt.pt every --eval-every steps; rerunning without --fresh resumes
(the data of each step is seeded by (seed, step)).
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import time

# Passive OpenMP waiting: with the 2 cores shared (e.g. with compiler jobs),
# spinning OpenMP threads made each step 3-10x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------
# Task
# --------------------------------------------------------------------------

BOS = 507
EOS_IDS = [508, 511]
REC, VAL, SEP, QUERY = 8, 9, 10, 11
FILLER_LO, FILLER_HI = 32, 256      # [lo, hi)
KV_LO, KV_HI = 256, 507             # [lo, hi)
NKEY, NVAL = 2, 8
ANSWER_LEN = NVAL - 1               # v2..v8
REC_LEN = 1 + NKEY + 1 + NVAL + 1   # REC k.. VAL v.. SEP = 13
QPROMPT_LEN = 1 + NKEY + 1 + 1      # QUERY k.. VAL v1 = 5
IQ_LEN = 1 + NKEY + 1 + NVAL        # intermediate (training) query with answer = 12

EVAL_SEED_BASE = 1_000_000          # eval rngs never collide with training step rngs


def make_filler(rng, n):
    """Random filler runs, with copies of earlier n-grams (so induction heads
    have something to do in the filler too)."""
    out = []
    while len(out) < n:
        if len(out) >= 16 and rng.random() < 0.3:
            L = int(rng.integers(3, 11))
            s = int(rng.integers(0, len(out) - L + 1)) if len(out) > L else 0
            out.extend(out[s:s + L])
        else:
            L = int(rng.integers(1, 9))
            out.extend(rng.integers(FILLER_LO, FILLER_HI, L).tolist())
    return out[:n]


def n_records_range(ctx):
    return max(2, ctx // 96), max(3, ctx // 48)


def make_example(rng, ctx, n_iq=0, far=False):
    """Returns (tokens[ctx], weight-1 target mask over tokens, answer start).

    mask[i] = True means token i is a supervised copy target (answer tokens of
    the final query and of intermediate queries).
    far: the final query asks a record that starts in the first half.
    """
    lo, hi = n_records_range(ctx)
    n_rec = int(rng.integers(lo, hi + 1))
    n_rec = min(n_rec, (KV_HI - KV_LO) // (NKEY + NVAL))
    n_iq = min(n_iq, n_rec - 1)
    body_len = ctx - 1 - QPROMPT_LEN - ANSWER_LEN
    filler_len = body_len - n_rec * REC_LEN - n_iq * IQ_LEN
    assert filler_len >= 0, (ctx, n_rec, n_iq)
    kv = rng.choice(np.arange(KV_LO, KV_HI), size=n_rec * (NKEY + NVAL), replace=False)
    kv = kv.reshape(n_rec, NKEY + NVAL).tolist()
    filler = make_filler(rng, filler_len)
    rec_pts = sorted(rng.integers(0, filler_len + 1, n_rec).tolist())
    iq_recs = rng.permutation(n_rec)[:n_iq].tolist() if n_iq else []
    events = []  # (filler point, kind, seq, record)
    for r, p in enumerate(rec_pts):
        events.append((p, 0, r, r))
    for j, r in enumerate(iq_recs):
        p = int(rng.integers(rec_pts[r], filler_len + 1))
        events.append((p, 1, n_rec + j, r))
    events.sort()
    toks, mask = [BOS], [False]
    rec_start = {}
    fi = 0
    for p, kind, _, r in events:
        toks.extend(filler[fi:p]); mask.extend([False] * (p - fi)); fi = p
        keys, vals = kv[r][:NKEY], kv[r][NKEY:]
        if kind == 0:
            rec_start[r] = len(toks)
            seg = [REC] + keys + [VAL] + vals + [SEP]
            toks.extend(seg); mask.extend([False] * len(seg))
        else:
            seg = [QUERY] + keys + [VAL] + vals
            toks.extend(seg)
            mask.extend([False] * (len(seg) - ANSWER_LEN) + [True] * ANSWER_LEN)
    toks.extend(filler[fi:]); mask.extend([False] * (filler_len - fi))
    cands = [r for r in range(n_rec) if r not in iq_recs]
    if far:
        near = [r for r in cands if rec_start[r] < ctx // 2]
        cands = near if near else [min(cands, key=lambda r: rec_start[r])]
    q = cands[int(rng.integers(0, len(cands)))]
    keys, vals = kv[q][:NKEY], kv[q][NKEY:]
    toks.extend([QUERY] + keys + [VAL] + vals)
    mask.extend([False] * QPROMPT_LEN + [True] * ANSWER_LEN)
    assert len(toks) == ctx and len(mask) == ctx, (len(toks), ctx)
    return toks, mask


def make_repeat_example(rng, ctx):
    """Auxiliary training sequence: BOS, random tokens, then the same tokens
    again. Every repeated token after the first is predictable by induction,
    which gives a dense signal that makes induction heads form quickly."""
    n = int(rng.integers(max(4, ctx // 16), ctx // 2 + 1))  # random period: no positional shortcut
    seg = rng.integers(FILLER_LO, KV_HI, n).tolist()
    toks = [BOS] + seg
    while len(toks) < ctx:
        toks.extend(seg)
    toks = toks[:ctx]
    mask = [False] * (n + 2) + [True] * (ctx - n - 2)
    return toks, mask


def make_eval_set(seed, ctx, n=32):
    rng = np.random.default_rng([seed, EVAL_SEED_BASE + ctx])
    exs = []
    for _ in range(n):
        toks, _ = make_example(rng, ctx, n_iq=0, far=True)
        exs.append({"prompt_ids": toks[:-ANSWER_LEN], "answer_ids": toks[-ANSWER_LEN:]})
    return {"context_tokens": ctx, "examples": exs}


# --------------------------------------------------------------------------
# Model (HF LlamaForCausalLM semantics, parameter names as in HF)
# --------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        H = c["hidden_size"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)   # HF repeat_kv: q head h reads kv head h // rep
        v = v.repeat_interleave(rep, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)
        s = s + mask
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        o = torch.matmul(p, v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        hd = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.register_buffer("inv_freq", inv, persistent=False)
        std = c["initializer_range"]
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)

    def forward(self, ids):
        B, T = ids.shape
        pos = torch.arange(T, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))


def model_config(args):
    with open(os.path.join(args.tiny, "config.json")) as f:
        c = json.load(f)
    c.update({
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "max_position_embeddings": args.max_position_embeddings,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "vocab_size": 512,
        "bos_token_id": BOS,
        "eos_token_id": EOS_IDS,
    })
    return c


def runtime_config(c):
    r = dict(c)
    r["head_dim"] = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return r


# --------------------------------------------------------------------------
# safetensors I/O (no safetensors package)
# --------------------------------------------------------------------------

def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name].detach().cpu().contiguous().float().numpy().astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        a = np.frombuffer(raw, dtype="<f4", count=(e - b) // 4, offset=8 + n + b)
        out[name] = torch.from_numpy(a.reshape(info["shape"]).copy())
    return out


def load_exported(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    m = LlamaForCausalLM(runtime_config(c))
    m.load_state_dict(read_safetensors(os.path.join(model_dir, "model.safetensors")))
    m.eval()
    return m


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------

def parse_lengths(spec):
    out = []
    for part in spec.split(","):
        ctx, p = part.split(":")
        out.append((int(ctx), float(p)))
    s = sum(p for _, p in out)
    return [(c, p / s) for c, p in out]


def make_batch(seed, step, lengths, tokens_per_step, iq_max, min_batch=1, rep_frac=0.0):
    rng = np.random.default_rng([seed, step])
    ctxs = [c for c, _ in lengths]
    ctx = ctxs[int(rng.choice(len(ctxs), p=[p for _, p in lengths]))]
    bs = max(min_batch, tokens_per_step // ctx)
    toks, masks = [], []
    for _ in range(bs):
        if rng.random() < rep_frac:
            t, m = make_repeat_example(rng, ctx)
        else:
            n_iq = int(rng.integers(0, iq_max + 1))
            t, m = make_example(rng, ctx, n_iq=n_iq)
        toks.append(t); masks.append(m)
    return torch.tensor(toks), torch.tensor(masks)


def loss_fn(model, toks, mask, lm_weight):
    logits = model(toks[:, :-1])
    tgt = toks[:, 1:]
    m = mask[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
    ce = ce.view(tgt.shape)
    ans = ce[m].mean()
    loss = ans + lm_weight * ce.mean()
    return loss, ans


@torch.no_grad()
def teacher_forced_eval(model, es):
    """Exact match == all 7 teacher-forced argmaxes right (same as greedy)."""
    model.eval()
    ids = torch.tensor([e["prompt_ids"] + e["answer_ids"] for e in es["examples"]])
    logits = model(ids[:, :-1])
    pred = logits[:, -ANSWER_LEN:].argmax(-1)
    ok = pred == ids[:, -ANSWER_LEN:]
    model.train()
    return ok.all(-1).float().mean().item(), ok.float().mean().item()


@torch.no_grad()
def greedy_decode(model, prompts, n):
    ids = torch.tensor(prompts)
    out = []
    for _ in range(n):
        nxt = model(ids)[:, -1].argmax(-1)
        out.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return torch.stack(out, 1).tolist()


def lr_at(step, b_start, args):
    """Warmup, constant lr in phase A, then cosine over --steps-b steps of phase B."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    if b_start is None:
        return args.lr
    t = min(1.0, (step - b_start) / max(1, args.steps_b))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def save_ckpt(path, model, opt, st):
    st = dict(st, model=model.state_dict(), opt=opt.state_dict(), torch_rng=torch.get_rng_state())
    torch.save(st, path + ".tmp")
    os.replace(path + ".tmp", path)


def train(args):
    """Phase A (induction warm-up): short sequences (--warm-lengths), mostly
    repeat sequences (--rep-frac), constant lr, until the running answer loss
    drops below --switch-ce (induction heads formed) or --warm-steps.
    Phase B: the retrieval task at --lengths (plus --rep-frac-late repeats),
    cosine lr over --steps-b steps. Stops early at --stop-em or --time-budget."""
    torch.manual_seed(args.seed)
    c = runtime_config(model_config(args))
    model = LlamaForCausalLM(c)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    os.makedirs(args.work, exist_ok=True)
    ckpt = os.path.join(args.work, "ckpt.pt")
    st = {"step": 0, "elapsed": 0.0, "history": [], "b_start": None, "recent": []}
    if os.path.exists(ckpt) and not args.fresh:
        loaded = torch.load(ckpt)
        model.load_state_dict(loaded["model"]); opt.load_state_dict(loaded["opt"])
        torch.set_rng_state(loaded["torch_rng"])
        st = {k: loaded[k] for k in st}
        print("resumed at step %d (%.0fs elapsed)" % (st["step"], st["elapsed"]), flush=True)
    print("params %d  config %s" % (nparams, {k: c[k] for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim")}), flush=True)
    evals = {ctx: make_eval_set(args.seed + 1, ctx, args.train_eval_n) for ctx in args.eval_ctx}
    lengths = parse_lengths(args.lengths)
    warm_lengths = parse_lengths(args.warm_lengths)
    model.train()
    t0 = time.time() - st["elapsed"]
    run_loss, run_ans, run_n = 0.0, 0.0, 0
    while True:
        step, b_start = st["step"], st["b_start"]
        if b_start is not None and step >= b_start + args.steps_b:
            break
        if st["elapsed"] > args.time_budget:
            print("time budget reached", flush=True)
            break
        if b_start is None:
            toks, mask = make_batch(args.seed, step, warm_lengths, args.warm_tokens_per_step,
                                    args.iq_max, args.min_batch, args.rep_frac)
        else:
            toks, mask = make_batch(args.seed, step, lengths, args.tokens_per_step,
                                    args.iq_max, args.min_batch, args.rep_frac_late)
        lr = lr_at(step, b_start, args)
        for g in opt.param_groups:
            g["lr"] = lr
        loss, ans = loss_fn(model, toks, mask, args.lm_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        st["step"] = step = step + 1
        st["elapsed"] = time.time() - t0
        st["recent"] = (st["recent"] + [ans.item()])[-20:]
        run_loss += loss.item(); run_ans += ans.item(); run_n += 1
        if step % args.log_every == 0:
            print("step %5d  %s  ctx %4d x %2d  lr %.2e  loss %.4f  answer_ce %.4f  %.0fs" % (
                step, "A" if b_start is None else "B", toks.shape[1], toks.shape[0], lr,
                run_loss / run_n, run_ans / run_n, st["elapsed"]), flush=True)
            run_loss, run_ans, run_n = 0.0, 0.0, 0
        if b_start is None and ((len(st["recent"]) == 20 and np.mean(st["recent"]) < args.switch_ce)
                                or step >= args.warm_steps):
            st["b_start"] = step
            st["history"].append({"step": step, "elapsed": round(st["elapsed"], 1),
                                  "event": "phase B starts"})
            print("phase B starts at step %d (%.0fs)" % (step, st["elapsed"]), flush=True)
        if step % args.eval_every == 0:
            res = {ctx: teacher_forced_eval(model, es) for ctx, es in evals.items()}
            st["history"].append({"step": step, "elapsed": round(st["elapsed"], 1),
                                  "eval": {str(k): v for k, v in res.items()}})
            print("  eval " + "  ".join("ctx%d em %.3f tok %.3f" % (k, v[0], v[1])
                                        for k, v in res.items()), flush=True)
            save_ckpt(ckpt, model, opt, st)
            if (st["b_start"] is not None and args.stop_em
                    and all(v[0] >= args.stop_em for v in res.values())):
                print("stop: all eval exact-match >= %.2f" % args.stop_em, flush=True)
                break
    save_ckpt(ckpt, model, opt, st)
    export(args, model, st["step"], st["elapsed"], st["history"])


def export(args, model, step, elapsed, history):
    os.makedirs(args.out, exist_ok=True)
    cfg = model_config(args)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(args.out, "model.safetensors"), model.state_dict())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(args.tiny, name), os.path.join(args.out, name))
    gen = {"bos_token_id": BOS, "eos_token_id": EOS_IDS, "do_sample": False,
           "transformers_version": "4.51.0"}
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.work, "train_summary.json"), "w") as f:
        json.dump({"steps": step, "elapsed_s": round(elapsed, 1), "history": history}, f, indent=1)
    print("exported step %d to %s" % (step, args.out), flush=True)


# --------------------------------------------------------------------------
# Eval of the exported model (torch, and optionally the C++ engine)
# --------------------------------------------------------------------------

def cli_greedy(cli, model_dir, prompt, n):
    r = subprocess.run([cli, "generate", "--offline", "--model", model_dir,
                        "--prompt_ids", ",".join(map(str, prompt)), "--max_tokens", str(n),
                        "--temperature", "0", "--ignore_eos", "--logprobs", "0",
                        "--threads", "1", "--kv_cache_tokens", "4096"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("specula-cli failed: %s" % r.stderr[-2000:])
    return [int(l.split("token=")[1].split()[0]) for l in r.stderr.splitlines()
            if l.startswith("logprob token=")]


def eval_model(args):
    model = load_exported(args.out)
    results = {}
    for ctx in args.eval_ctx:
        path = os.path.join(args.out, "eval_%d.json" % ctx)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            es = json.load(f)
        prompts = [e["prompt_ids"] for e in es["examples"]]
        answers = [e["answer_ids"] for e in es["examples"]]
        tg = greedy_decode(model, prompts, ANSWER_LEN)
        row = {"torch_em": np.mean([a == b for a, b in zip(tg, answers)]),
               "torch_tok": np.mean([x == y for a, b in zip(tg, answers) for x, y in zip(a, b)])}
        if args.cli:
            cg = [cli_greedy(args.cli, args.out, p, ANSWER_LEN) for p in prompts]
            row["cli_em"] = np.mean([a == b for a, b in zip(cg, answers)])
            row["cli_tok"] = np.mean([x == y for a, b in zip(cg, answers) for x, y in zip(a, b)])
            row["cli_eq_torch"] = np.mean([a == b for a, b in zip(cg, tg)])
        results[ctx] = row
        print("ctx %5d  " % ctx + "  ".join("%s %.4f" % kv for kv in row.items()), flush=True)
    return results


def write_eval(args):
    os.makedirs(args.out, exist_ok=True)
    for ctx in args.eval_ctx:
        es = make_eval_set(args.seed, ctx, 32)
        with open(os.path.join(args.out, "eval_%d.json" % ctx), "w") as f:
            json.dump(es, f, separators=(",", ":"))
        print("wrote eval_%d.json" % ctx)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/retrieval_model")
    ap.add_argument("--work", default="/tmp/retrieval_work", help="checkpoints (resume) and logs")
    ap.add_argument("--tiny", default="/tmp/tiny_llama",
                    help="make-tiny-model --arch llama output (tokenizer files, config keys)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    ap.add_argument("--write-eval", action="store_true", help="only write eval_<ctx>.json")
    ap.add_argument("--eval-model", action="store_true", help="only evaluate the exported model")
    ap.add_argument("--export-only", action="store_true", help="export the checkpoint in --work")
    ap.add_argument("--cli", default="", help="specula-cli binary: also evaluate via the C++ engine")
    ap.add_argument("--eval-ctx", default="256,512,1024")
    ap.add_argument("--threads", type=int, default=2)
    # model
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=344)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--max-position-embeddings", type=int, default=4096)
    # optimisation
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--min-batch", type=int, default=8, help="fewest sequences per step")
    ap.add_argument("--iq-max", type=int, default=3, help="max intermediate queries per training sequence")
    ap.add_argument("--lm-weight", type=float, default=0.1, help="weight of the all-token LM loss")
    # phase A: induction warm-up
    ap.add_argument("--warm-lengths", default="128:1", help="phase A ctx:prob,...")
    ap.add_argument("--warm-tokens-per-step", type=int, default=2048)
    ap.add_argument("--rep-frac", type=float, default=0.75, help="phase A fraction of repeat sequences")
    ap.add_argument("--switch-ce", type=float, default=1.0,
                    help="start phase B when the 20-step mean answer loss is below this")
    ap.add_argument("--warm-steps", type=int, default=4000, help="phase A at most this many steps")
    # phase B: the retrieval task at full lengths
    ap.add_argument("--lengths", default="256:0.35,512:0.45,1024:0.2", help="phase B ctx:prob,...")
    ap.add_argument("--tokens-per-step", type=int, default=4096)
    ap.add_argument("--rep-frac-late", type=float, default=0.15, help="phase B fraction of repeat sequences")
    ap.add_argument("--steps-b", type=int, default=1200, help="phase B steps (cosine lr)")
    ap.add_argument("--time-budget", type=float, default=2700, help="seconds of training")
    ap.add_argument("--stop-em", type=float, default=0.97,
                    help="phase B: stop when every in-training eval ctx reaches this exact match")
    ap.add_argument("--train-eval-n", type=int, default=32, help="held-out examples per ctx for the in-training eval")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=200)
    args = ap.parse_args()
    args.eval_ctx = [int(x) for x in args.eval_ctx.split(",")]
    torch.set_num_threads(args.threads)
    if args.write_eval:
        write_eval(args)
    elif args.eval_model:
        eval_model(args)
    elif args.export_only:
        st = torch.load(os.path.join(args.work, "ckpt.pt"))
        model = LlamaForCausalLM(runtime_config(model_config(args)))
        model.load_state_dict(st["model"])
        export(args, model, st["step"], st["elapsed"], st["history"])
    else:
        train(args)


if __name__ == "__main__":
    main()
