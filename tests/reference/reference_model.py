#!/usr/bin/python3
"""Independent NumPy reference implementation of HF decoder-only LLMs.

Follows Hugging Face transformers modeling semantics for
LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM
(no KV cache: every step recomputes the whole sequence, in float64).

Usage:
  reference_model.py --model DIR --prompt-ids 1,2,3 [--max-new-tokens N] --out OUT.json

Output JSON:
  prompt_logits      logits (vocab floats) at the last prompt position
  all_prompt_logits  logits for every prompt position
  generated          N greedy token ids (argmax, ties -> lowest id)
  step_logits        logits that produced each generated token
                     (step_logits[0] == prompt_logits)

Errors (unsupported architecture / config, missing tensors, bad files) exit
with status 2 and a message on stderr.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np


class ReferenceError_(Exception):
    """Configuration / file error -> exit code 2."""


SUPPORTED_ARCHS = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)

# --------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------

_DTYPES = {
    "F64": (np.dtype("<f8"), 8),
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
}


def bf16_bits_to_float32(bits):
    """uint16 bfloat16 bit patterns -> float32 (exact: bf16 is the top half)."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def read_safetensors(path, names=None):
    """Parse a .safetensors file. Returns {name: np.ndarray (float32/float64/int)}.

    F16 -> np.float16 -> float32, BF16 -> uint16 << 16 viewed as float32.
    If `names` is given, only those tensors are decoded.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ReferenceError_("cannot read %s: %s" % (path, e))
    if len(raw) < 8:
        raise ReferenceError_("%s: file too small to be safetensors" % path)
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        raise ReferenceError_("%s: header length %d exceeds file size" % (path, hlen))
    try:
        header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ReferenceError_("%s: bad safetensors JSON header: %s" % (path, e))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if names is not None and name not in names:
            continue
        dt = info.get("dtype")
        if dt not in _DTYPES:
            raise ReferenceError_("%s: tensor %s has unsupported dtype %s" % (path, name, dt))
        npdt, size = _DTYPES[dt]
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * size or base + end > len(raw):
            raise ReferenceError_("%s: tensor %s has inconsistent data_offsets" % (path, name))
        arr = np.frombuffer(raw, dtype=npdt, count=count, offset=base + begin).reshape(shape)
        if dt == "BF16":
            arr = bf16_bits_to_float32(arr)
        elif dt == "F16":
            arr = arr.astype(np.float32)
        else:
            arr = arr.copy()
        out[name] = arr
    return out


def load_model_tensors(model_dir):
    """Load all tensors of a HF model dir (single file or sharded index)."""
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        return read_safetensors(single)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ReferenceError_("bad index %s: %s" % (index, e))
        tensors = {}
        by_shard = {}
        for name, shard in weight_map.items():
            by_shard.setdefault(shard, set()).add(name)
        for shard, names in sorted(by_shard.items()):
            part = read_safetensors(os.path.join(model_dir, shard), names)
            missing = names - set(part)
            if missing:
                raise ReferenceError_("shard %s lacks tensors listed in index: %s"
                                      % (shard, sorted(missing)[:5]))
            tensors.update(part)
        return tensors
    raise ReferenceError_("no model.safetensors or model.safetensors.index.json in %s" % model_dir)


# --------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------

class Config(object):
    pass


def parse_config(cfg):
    """Normalise a HF config.json dict, applying each architecture's defaults."""
    archs = cfg.get("architectures") or []
    arch = None
    for a in archs:
        if a in SUPPORTED_ARCHS:
            arch = a
            break
    if arch is None:
        mt = cfg.get("model_type")
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}.get(mt)
        if arch is None or archs:
            raise ReferenceError_("unsupported architecture %r (model_type %r); supported: %s"
                                  % (archs, mt, ", ".join(SUPPORTED_ARCHS)))
    c = Config()
    c.arch = arch
    try:
        c.vocab_size = int(cfg["vocab_size"])
        c.hidden_size = int(cfg["hidden_size"])
        c.intermediate_size = int(cfg["intermediate_size"])
        c.num_layers = int(cfg["num_hidden_layers"])
        c.num_heads = int(cfg["num_attention_heads"])
    except KeyError as e:
        raise ReferenceError_("config.json lacks required key %s" % e)
    kv = cfg.get("num_key_value_heads")
    # The config classes' defaults: Mistral 8, Qwen2/Qwen3 32, Llama num_attention_heads.
    default_kv = {"MistralForCausalLM": 8, "Qwen2ForCausalLM": 32,
                  "Qwen3ForCausalLM": 32}.get(arch, c.num_heads)
    c.num_kv_heads = int(kv) if kv is not None else default_kv
    if c.num_heads % c.num_kv_heads != 0:
        raise ReferenceError_("num_attention_heads %d not divisible by num_key_value_heads %d"
                              % (c.num_heads, c.num_kv_heads))
    hd = cfg.get("head_dim")
    if hd is None:
        # Qwen3Config defaults head_dim to 128; the others derive it.
        hd = 128 if arch == "Qwen3ForCausalLM" else c.hidden_size // c.num_heads
    c.head_dim = int(hd)
    c.rms_norm_eps = float(cfg.get("rms_norm_eps", 1e-6))
    c.hidden_act = cfg.get("hidden_act", "silu")
    if c.hidden_act not in ("silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new"):
        raise ReferenceError_("unsupported hidden_act %r" % c.hidden_act)
    c.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))

    # Biases: Qwen2 always has q/k/v bias (o_proj none). Llama/Qwen3 use
    # attention_bias for q/k/v/o; Llama mlp_bias for gate/up/down.
    if arch == "Qwen2ForCausalLM":
        c.qkv_bias, c.o_bias = True, False
    elif arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
        ab = bool(cfg.get("attention_bias", False))
        c.qkv_bias, c.o_bias = ab, ab
    else:  # Mistral: no biases
        c.qkv_bias, c.o_bias = False, False
    c.mlp_bias = bool(cfg.get("mlp_bias", False)) if arch == "LlamaForCausalLM" else False
    c.qk_norm = arch == "Qwen3ForCausalLM"

    # RoPE: transformers >= 4.5x may use `rope_parameters` instead of
    # rope_theta + rope_scaling.
    rp = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(rp, dict):
        if theta is None:
            theta = rp.get("rope_theta")
        if scaling is None:
            scaling = rp
    c.rope_theta = float(theta if theta is not None else 10000.0)
    c.partial_rotary_factor = float(cfg.get("partial_rotary_factor", 1.0))
    c.rope_scaling = None
    if scaling:
        rtype = scaling.get("rope_type", scaling.get("type", "default"))
        if rtype not in ("default", "linear", "llama3", "yarn"):
            raise ReferenceError_("unsupported rope_scaling type %r" % rtype)
        if rtype != "default":
            c.rope_scaling = dict(scaling)
            c.rope_scaling["rope_type"] = rtype
    c.max_position_embeddings = int(cfg.get("max_position_embeddings", 2048))

    # Sliding-window attention, HF layer_types semantics.
    c.layer_sliding = [None] * c.num_layers
    if arch == "MistralForCausalLM":
        sw = cfg.get("sliding_window", 4096)
        if sw is not None:
            c.layer_sliding = [int(sw)] * c.num_layers
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        sw = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
        lt = cfg.get("layer_types")
        if sw is not None:
            mwl = int(cfg.get("max_window_layers", c.num_layers))
            if lt is None:
                lt = ["sliding_attention" if i >= mwl else "full_attention"
                      for i in range(c.num_layers)]
            c.layer_sliding = [int(sw) if t == "sliding_attention" else None for t in lt]
    return c


def load_config(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ReferenceError_("cannot read %s: %s" % (path, e))
    return parse_config(cfg)


# --------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------

def rope_inv_freq(head_dim, theta, rope_scaling=None, partial_rotary_factor=1.0,
                  max_position_embeddings=None):
    """inv_freq (float64, length dim/2) following HF modeling_rope_utils."""
    dim = int(head_dim * partial_rotary_factor)
    inv_freq = 1.0 / (float(theta) ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float64) / dim))
    if not rope_scaling:
        return inv_freq
    rtype = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rtype == "default":
        return inv_freq
    if rtype == "linear":
        # HF divides positions by factor; equivalently inv_freq / factor.
        return inv_freq / float(rope_scaling["factor"])
    if rtype == "llama3":
        factor = float(rope_scaling["factor"])
        low = float(rope_scaling["low_freq_factor"])
        high = float(rope_scaling["high_freq_factor"])
        old_ctx = float(rope_scaling["original_max_position_embeddings"])
        low_freq_wavelen = old_ctx / low
        high_freq_wavelen = old_ctx / high
        wavelen = 2.0 * math.pi / inv_freq
        # long wavelengths (low frequency): divide by factor
        out = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        # medium band: interpolate between scaled and unscaled
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1.0 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return np.where(medium, smoothed, out)
    if rtype == "yarn":
        # transformers 5, modeling_rope_utils.py, _compute_yarn_parameters.
        factor = float(rope_scaling["factor"])
        orig = float(rope_scaling.get("original_max_position_embeddings") or max_position_embeddings)
        beta_fast = float(rope_scaling.get("beta_fast") or 32)
        beta_slow = float(rope_scaling.get("beta_slow") or 1)

        def correction_dim(rotations):
            return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rope_scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        return (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    raise ReferenceError_("unsupported rope type %r" % rtype)


def rope_attention_factor(rope_scaling):
    """What transformers multiplies cos and sin by: yarn's attention factor, else 1."""
    if not rope_scaling or rope_scaling.get("rope_type", rope_scaling.get("type")) != "yarn":
        return 1.0
    if rope_scaling.get("attention_factor") is not None:
        return float(rope_scaling["attention_factor"])
    factor = float(rope_scaling["factor"])

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    mscale, mscale_all_dim = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    return get_mscale(factor)


def rope_cos_sin(positions, inv_freq):
    """cos/sin tables [T, dim] with HF's cat(freqs, freqs) layout."""
    freqs = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x, cos, sin):
    """x: [heads, T, head_dim]; rotate-half convention (NOT interleaved).

    If the rotary dim is smaller than head_dim (partial rotary), only the
    leading part is rotated.
    """
    rd = cos.shape[-1]
    xr, xp = x[..., :rd], x[..., rd:]
    out = xr * cos[None] + rotate_half(xr) * sin[None]
    return np.concatenate([out, xp], axis=-1) if xp.shape[-1] else out


# --------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------

def rms_norm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def silu(x):
    return x / (1.0 + np.exp(-x))


def _act(name, x):
    if name in ("silu", "swish"):
        return silu(x)
    if name == "gelu":
        from math import erf
        verf = np.vectorize(erf)
        return 0.5 * x * (1.0 + verf(x / math.sqrt(2.0)))
    # tanh approximation
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


class Model(object):
    def __init__(self, config, tensors):
        self.c = c = config
        self.w = {}

        def get(name, shape, required=True):
            t = tensors.get(name)
            if t is None:
                if required:
                    raise ReferenceError_("missing tensor %s" % name)
                return None
            if tuple(t.shape) != tuple(shape):
                raise ReferenceError_("tensor %s has shape %s, expected %s"
                                      % (name, list(t.shape), list(shape)))
            return np.asarray(t, dtype=np.float64)

        H, I, V = c.hidden_size, c.intermediate_size, c.vocab_size
        qd, kvd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.embed = get("model.embed_tokens.weight", (V, H))
        self.norm = get("model.norm.weight", (H,))
        lm = None if c.tie_word_embeddings else get("lm_head.weight", (V, H), required=False)
        if lm is None:
            if not c.tie_word_embeddings:
                sys.stderr.write("reference_model: lm_head.weight absent; using tied "
                                 "embeddings\n")
            lm = self.embed
        self.lm_head = lm
        self.layers = []
        for i in range(c.num_layers):
            p = "model.layers.%d." % i
            L = {
                "in_norm": get(p + "input_layernorm.weight", (H,)),
                "post_norm": get(p + "post_attention_layernorm.weight", (H,)),
                "q": get(p + "self_attn.q_proj.weight", (qd, H)),
                "k": get(p + "self_attn.k_proj.weight", (kvd, H)),
                "v": get(p + "self_attn.v_proj.weight", (kvd, H)),
                "o": get(p + "self_attn.o_proj.weight", (H, qd)),
                "gate": get(p + "mlp.gate_proj.weight", (I, H)),
                "up": get(p + "mlp.up_proj.weight", (I, H)),
                "down": get(p + "mlp.down_proj.weight", (H, I)),
            }
            # Biases: required where the config says so; also honoured if
            # present in the checkpoint (HF would refuse/ignore otherwise,
            # but a present bias is what the weights mean).
            for nm, sub, dim, req in (("q", "self_attn.q_proj", qd, c.qkv_bias),
                                      ("k", "self_attn.k_proj", kvd, c.qkv_bias),
                                      ("v", "self_attn.v_proj", kvd, c.qkv_bias),
                                      ("o", "self_attn.o_proj", H, c.o_bias),
                                      ("gate", "mlp.gate_proj", I, c.mlp_bias),
                                      ("up", "mlp.up_proj", I, c.mlp_bias),
                                      ("down", "mlp.down_proj", H, c.mlp_bias)):
                L[nm + "_b"] = get(p + sub + ".bias", (dim,), required=req)
            if c.qk_norm:
                L["q_norm"] = get(p + "self_attn.q_norm.weight", (c.head_dim,))
                L["k_norm"] = get(p + "self_attn.k_norm.weight", (c.head_dim,))
            self.layers.append(L)
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling,
                                      c.partial_rotary_factor, c.max_position_embeddings)
        self.attention_factor = rope_attention_factor(c.rope_scaling)

    @staticmethod
    def _lin(x, w, b):
        y = x @ w.T
        return y + b if b is not None else y

    def attention(self, L, x, cos, sin, sliding):
        c = self.c
        T = x.shape[0]
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        q = self._lin(x, L["q"], L["q_b"]).reshape(T, nh, hd)
        k = self._lin(x, L["k"], L["k_b"]).reshape(T, nkv, hd)
        v = self._lin(x, L["v"], L["v_b"]).reshape(T, nkv, hd)
        if c.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
            q = rms_norm(q, L["q_norm"], c.rms_norm_eps)
            k = rms_norm(k, L["k_norm"], c.rms_norm_eps)
        q = q.transpose(1, 0, 2)  # [nh, T, hd]
        k = k.transpose(1, 0, 2)
        v = v.transpose(1, 0, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = nh // nkv  # repeat_kv: kv head j serves q heads j*rep .. j*rep+rep-1
        k = np.repeat(k, rep, axis=0)
        v = np.repeat(v, rep, axis=0)
        scores = (q @ k.transpose(0, 2, 1)) * (1.0 / math.sqrt(hd))
        i = np.arange(T)[:, None]
        j = np.arange(T)[None, :]
        allowed = j <= i
        if sliding is not None:
            allowed &= (i - j) < sliding
        scores = np.where(allowed[None], scores, -np.inf)
        probs = softmax(scores, axis=-1)
        out = (probs @ v).transpose(1, 0, 2).reshape(T, nh * hd)
        return self._lin(out, L["o"], L["o_b"])

    def mlp(self, L, x):
        g = self._lin(x, L["gate"], L["gate_b"])
        u = self._lin(x, L["up"], L["up_b"])
        return self._lin(_act(self.c.hidden_act, g) * u, L["down"], L["down_b"])

    def forward(self, ids):
        """ids: sequence of token ids -> logits [T, vocab] (float64)."""
        c = self.c
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ReferenceError_("need a non-empty 1-D token sequence")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ReferenceError_("token id out of range [0, %d)" % c.vocab_size)
        h = self.embed[ids]
        cos, sin = rope_cos_sin(np.arange(ids.size), self.inv_freq)
        cos, sin = cos * self.attention_factor, sin * self.attention_factor
        for li, L in enumerate(self.layers):
            h = h + self.attention(L, rms_norm(h, L["in_norm"], c.rms_norm_eps), cos, sin,
                                   c.layer_sliding[li])
            h = h + self.mlp(L, rms_norm(h, L["post_norm"], c.rms_norm_eps))
        h = rms_norm(h, self.norm, c.rms_norm_eps)
        return h @ self.lm_head.T

    def generate(self, prompt_ids, max_new_tokens):
        """Greedy decode by full recomputation. Returns (all_prompt_logits,
        generated ids, step_logits)."""
        seq = [int(t) for t in prompt_ids]
        all_prompt = self.forward(seq)
        last = all_prompt[-1]
        generated, steps = [], []
        for n in range(max_new_tokens):
            if n > 0:
                last = self.forward(seq)[-1]
            tok = int(np.argmax(last))  # first maximal index = lowest id on ties
            steps.append(last)
            generated.append(tok)
            seq.append(tok)
        return all_prompt, generated, steps


def load_model(model_dir):
    config = load_config(model_dir)
    return Model(config, load_model_tensors(model_dir))


def _floats(a):
    return [float(x) for x in np.asarray(a, dtype=np.float64).ravel()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-new-tokens", type=int, default=0)
    ap.add_argument("--out", required=True, help="output JSON path")
    args = ap.parse_args(argv)
    try:
        try:
            ids = [int(t) for t in args.prompt_ids.replace(" ", "").split(",") if t != ""]
        except ValueError:
            raise ReferenceError_("--prompt-ids must be comma-separated integers")
        if not ids:
            raise ReferenceError_("--prompt-ids is empty")
        if args.max_new_tokens < 0:
            raise ReferenceError_("--max-new-tokens must be >= 0")
        model = load_model(args.model)
        all_prompt, generated, steps = model.generate(ids, args.max_new_tokens)
    except ReferenceError_ as e:
        sys.stderr.write("reference_model: error: %s\n" % e)
        return 2
    result = {
        "prompt_logits": _floats(all_prompt[-1]),
        "all_prompt_logits": [_floats(r) for r in all_prompt],
        "generated": generated,
        "step_logits": [_floats(r) for r in steps],
    }
    with open(args.out, "w") as f:
        json.dump(result, f)  # json writes floats with repr (round-trip exact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
