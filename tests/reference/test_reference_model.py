#!/usr/bin/python3
"""Self-checks for reference_model.py.

Run: /usr/bin/python3 -m unittest discover -s tests/reference
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference_model as rm  # noqa: E402

SCRIPT = os.path.join(HERE, "reference_model.py")


# --------------------------------------------------------------------------
# tiny safetensors writer + random model builder
# --------------------------------------------------------------------------

def f32_to_bf16_bits(a):
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    """tensors: {name: float array}; dtype F32 / F16 / BF16 for all of them."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        a = np.asarray(tensors[name], dtype=np.float32)
        if dtype == "F32":
            b = a.astype("<f4").tobytes()
        elif dtype == "F16":
            b = a.astype("<f2").tobytes()
        elif dtype == "BF16":
            b = f32_to_bf16_bits(a).astype("<u2").tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def base_config(arch, **kw):
    cfg = {
        "architectures": [arch],
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "max_position_embeddings": 256,
    }
    if arch == "Qwen3ForCausalLM":
        cfg["head_dim"] = 16
    if arch == "MistralForCausalLM":
        cfg["sliding_window"] = None
    cfg.update(kw)
    return cfg


def make_weights(cfg, seed=0, scale=0.2):
    rng = np.random.RandomState(seed)
    c = rm.parse_config(cfg)
    H, I, V = c.hidden_size, c.intermediate_size, c.vocab_size
    qd, kvd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

    def r(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": r(V, H) * 5, "model.norm.weight": norm_w(H)}
    if not c.tie_word_embeddings:
        w["lm_head.weight"] = r(V, H)
    for i in range(c.num_layers):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = norm_w(H)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
        w[p + "self_attn.q_proj.weight"] = r(qd, H)
        w[p + "self_attn.k_proj.weight"] = r(kvd, H)
        w[p + "self_attn.v_proj.weight"] = r(kvd, H)
        w[p + "self_attn.o_proj.weight"] = r(H, qd)
        w[p + "mlp.gate_proj.weight"] = r(I, H)
        w[p + "mlp.up_proj.weight"] = r(I, H)
        w[p + "mlp.down_proj.weight"] = r(H, I)
        if c.qkv_bias:
            w[p + "self_attn.q_proj.bias"] = r(qd)
            w[p + "self_attn.k_proj.bias"] = r(kvd)
            w[p + "self_attn.v_proj.bias"] = r(kvd)
        if c.o_bias:
            w[p + "self_attn.o_proj.bias"] = r(H)
        if c.qk_norm:
            w[p + "self_attn.q_norm.weight"] = norm_w(c.head_dim)
            w[p + "self_attn.k_norm.weight"] = norm_w(c.head_dim)
    return w


def save_model(d, cfg, weights, dtype="F32", shards=1):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), weights, dtype,
                          metadata={"format": "pt"})
        return d
    names = sorted(weights)
    weight_map = {}
    for s in range(shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = {n: weights[n] for n in names[s::shards]}
        write_safetensors(os.path.join(d, fn), part, dtype)
        for n in part:
            weight_map[n] = fn
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return d


ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class TmpDirCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="refmodel_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def build(self, name, cfg, weights=None, **kw):
        if weights is None:
            weights = make_weights(cfg)
        d = save_model(os.path.join(self.tmp, name), cfg, weights, **kw)
        return rm.load_model(d), d


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------

class TestSafetensors(TmpDirCase):
    def test_bf16_bit_patterns(self):
        bits = np.array([0x0000, 0x8000, 0x3F80, 0xBF80, 0xC000, 0x3FC0, 0x4049,
                         0x7F80, 0xFF80, 0x0001, 0x7F7F], dtype=np.uint16)
        got = rm.bf16_bits_to_float32(bits)
        want = [0.0, -0.0, 1.0, -1.0, -2.0, 1.5, 3.140625, math.inf, -math.inf,
                2.0 ** -133, 3.3895313892515355e38]
        self.assertEqual(got.dtype, np.float32)
        for g, w in zip(got.tolist(), want):
            self.assertEqual(g, w)
        self.assertTrue(np.signbit(got[1]))
        self.assertTrue(np.isnan(rm.bf16_bits_to_float32(np.array([0x7FC0], np.uint16))[0]))

    def test_parse_bf16_f16_f32_files(self):
        # hand-built file: BF16 [1.0, -2.0, 0.15625] and F16 [0.5, -65504, 2^-24]
        bf = struct.pack("<3H", 0x3F80, 0xC000, 0x3E20)
        f16 = struct.pack("<3H", 0x3800, 0xFBFF, 0x0001)
        f32 = struct.pack("<2f", 0.1, -7.25)
        header = {
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
            "b": {"dtype": "F16", "shape": [1, 3], "data_offsets": [6, 12]},
            "c": {"dtype": "F32", "shape": [2, 1], "data_offsets": [12, 20]},
        }
        h = json.dumps(header).encode()
        path = os.path.join(self.tmp, "x.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + bf + f16 + f32)
        t = rm.read_safetensors(path)
        self.assertEqual(sorted(t), ["a", "b", "c"])
        self.assertEqual(t["a"].tolist(), [1.0, -2.0, 0.15625])
        self.assertEqual(t["b"].shape, (1, 3))
        self.assertEqual(t["b"].tolist(), [[0.5, -65504.0, 2.0 ** -24]])
        self.assertEqual(t["c"].shape, (2, 1))
        self.assertEqual(t["c"].ravel().tolist(), [float(np.float32(0.1)), -7.25])

    def test_writer_roundtrip(self):
        rng = np.random.RandomState(1)
        a = rng.standard_normal((5, 7)).astype(np.float32)
        for dt in ("F32", "F16", "BF16"):
            p = os.path.join(self.tmp, dt + ".safetensors")
            write_safetensors(p, {"w": a}, dt)
            got = rm.read_safetensors(p)["w"]
            tol = {"F32": 0, "F16": 1e-3, "BF16": 1e-2}[dt]
            np.testing.assert_allclose(got, a, rtol=tol, atol=tol)


class TestRope(unittest.TestCase):
    def test_head_dim2_rotation(self):
        theta = 500000.0
        inv = rm.rope_inv_freq(2, theta)
        self.assertEqual(inv.tolist(), [1.0])  # theta ** 0
        x = np.array([[[0.3, -1.2]] * 4])  # [1 head, 4 positions, 2]
        cos, sin = rm.rope_cos_sin(np.arange(4), inv)
        y = rm.apply_rope(x, cos, sin)
        for p in range(4):
            a, b = 0.3, -1.2
            want = [a * math.cos(p) - b * math.sin(p), b * math.cos(p) + a * math.sin(p)]
            np.testing.assert_allclose(y[0, p], want, rtol=0, atol=1e-15)

    def test_rotate_half_not_interleaved(self):
        theta = 100.0
        inv = rm.rope_inv_freq(4, theta)
        np.testing.assert_allclose(inv, [1.0, 0.1], rtol=1e-15)
        cos, sin = rm.rope_cos_sin([3], inv)
        # element 0 pairs with element 2 (rotate-half), not with element 1
        y = rm.apply_rope(np.array([[[1.0, 0.0, 0.0, 0.0]]]), cos, sin)[0, 0]
        np.testing.assert_allclose(y, [math.cos(3), 0, math.sin(3), 0], atol=1e-15)
        y = rm.apply_rope(np.array([[[0.0, 1.0, 0.0, 0.0]]]), cos, sin)[0, 0]
        np.testing.assert_allclose(y, [0, math.cos(0.3), 0, math.sin(0.3)], atol=1e-15)
        y = rm.apply_rope(np.array([[[0.0, 0.0, 0.0, 1.0]]]), cos, sin)[0, 0]
        np.testing.assert_allclose(y, [0, -math.sin(0.3), 0, math.cos(0.3)], atol=1e-15)

    def test_linear_scaling(self):
        inv = rm.rope_inv_freq(4, 100.0, {"type": "linear", "factor": 4.0})
        np.testing.assert_allclose(inv, [0.25, 0.025], rtol=1e-15)

    def test_llama3_scaling_hand_computed(self):
        # head_dim 8, theta 1e4 -> inv_freq [1, .1, .01, .001],
        # wavelengths 2pi*[1, 10, 100, 1000]. old ctx 1000, low 1, high 4:
        # low_freq_wavelen 1000, high_freq_wavelen 250.
        sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 1000}
        inv = rm.rope_inv_freq(8, 10000.0, sc)
        s = (1000.0 / (2 * math.pi * 100.0) - 1.0) / 3.0  # 0.19718...
        self.assertAlmostEqual(s, 0.1971831436396512, places=15)
        want = [1.0, 0.1,  # high frequency: unchanged
                (1 - s) * 0.01 / 8 + s * 0.01,  # medium: smoothed
                0.001 / 8]  # low frequency: divided by factor
        np.testing.assert_allclose(inv, want, rtol=1e-13)
        # the "type" key is accepted too
        sc2 = dict(sc)
        del sc2["rope_type"]
        sc2["type"] = "llama3"
        np.testing.assert_allclose(rm.rope_inv_freq(8, 10000.0, sc2), want, rtol=1e-13)

    def test_llama31_real_config(self):
        # Llama 3.1 8B config; head_dim 128, theta 5e5.
        sc = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192, "rope_type": "llama3"}
        base = rm.rope_inv_freq(128, 500000.0)
        inv = rm.rope_inv_freq(128, 500000.0, sc)
        wl = 2 * math.pi / base
        hi = wl < 8192 / 4.0
        lo = wl > 8192 / 1.0
        self.assertTrue(hi.any() and lo.any() and (~hi & ~lo).any())
        np.testing.assert_array_equal(inv[hi], base[hi])
        np.testing.assert_allclose(inv[lo], base[lo] / 8.0, rtol=1e-15)
        mid = ~hi & ~lo
        # medium band lies strictly between scaled and unscaled
        self.assertTrue(np.all(inv[mid] < base[mid]) and np.all(inv[mid] > base[mid] / 8))

    def test_config_plumbing(self):
        cfg = base_config("LlamaForCausalLM", rope_theta=1234.0, head_dim=8,
                          rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 1000})
        c = rm.parse_config(cfg)
        self.assertEqual(c.head_dim, 8)
        m = rm.Model(c, make_weights(cfg))
        np.testing.assert_allclose(m.inv_freq, rm.rope_inv_freq(8, 1234.0, cfg["rope_scaling"]))
        self.assertFalse(np.allclose(m.inv_freq, rm.rope_inv_freq(8, 1234.0)))
        # rope_scaling with rope_type "default" == none
        c = rm.parse_config(base_config("LlamaForCausalLM", rope_scaling={"rope_type": "default"}))
        self.assertIsNone(c.rope_scaling)

    def test_unsupported_rope_type(self):
        with self.assertRaises(rm.ReferenceError_):
            rm.parse_config(base_config("LlamaForCausalLM",
                                        rope_scaling={"type": "dynamic", "factor": 2.0}))

    def test_yarn_follows_transformers(self):
        # Qwen3's 128K setting; values from _compute_yarn_parameters evaluated by hand (the same
        # ones tests/engine/model/rope_test.cc checks the engine against).
        sc = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
        inv = rm.rope_inv_freq(128, 1e6, sc)
        self.assertAlmostEqual(inv[23], 0.006978305848598663, delta=1e-15)
        self.assertAlmostEqual(inv[24], 0.005375321490790102, delta=1e-15)
        self.assertAlmostEqual(inv[40], 4.445698525097307e-05, delta=1e-17)
        self.assertAlmostEqual(rm.rope_attention_factor(sc), 0.1 * math.log(4.0) + 1.0)
        self.assertEqual(rm.rope_attention_factor({"rope_type": "linear", "factor": 4.0}), 1.0)


class TestModel(TmpDirCase):
    def test_causality_all_archs(self):
        rng = np.random.RandomState(7)
        for arch in ARCHS:
            with self.subTest(arch=arch):
                m, _ = self.build(arch, base_config(arch))
                ids = rng.randint(0, 96, size=20).tolist()
                full = m.forward(ids)
                self.assertEqual(full.shape, (20, 96))
                for p in (1, 2, 5, 13, 20):
                    np.testing.assert_allclose(m.forward(ids[:p])[-1], full[p - 1],
                                               rtol=1e-12, atol=1e-12)
                # and the future does matter for later positions
                ids2 = list(ids)
                ids2[3] = (ids2[3] + 1) % 96
                full2 = m.forward(ids2)
                np.testing.assert_array_equal(full2[:3], full[:3])
                self.assertFalse(np.allclose(full2[3:], full[3:]))

    def test_single_token_is_v_path(self):
        # With one token softmax is [1]: attention output = o(v(x)) per q head
        # (v repeated across the GQA group), RoPE irrelevant.
        for arch in ARCHS:
            with self.subTest(arch=arch):
                cfg = base_config(arch, num_hidden_layers=1)
                w = make_weights(cfg, seed=3)
                m, _ = self.build(arch, cfg, w)
                c = m.c
                W = {k: v.astype(np.float64) for k, v in w.items()}
                p = "model.layers.0."
                tok = 17
                h = W["model.embed_tokens.weight"][tok]

                def rms(x, g):
                    return g * x / np.sqrt(np.mean(x * x) + 1e-6)

                x = rms(h, W[p + "input_layernorm.weight"])
                v = W[p + "self_attn.v_proj.weight"] @ x
                if c.qkv_bias:
                    v = v + W[p + "self_attn.v_proj.bias"]
                v = v.reshape(c.num_kv_heads, c.head_dim)
                rep = c.num_heads // c.num_kv_heads
                attn_in = np.concatenate([v[hh // rep] for hh in range(c.num_heads)])
                h = h + W[p + "self_attn.o_proj.weight"] @ attn_in
                x = rms(h, W[p + "post_attention_layernorm.weight"])
                g = W[p + "mlp.gate_proj.weight"] @ x
                u = W[p + "mlp.up_proj.weight"] @ x
                h = h + W[p + "mlp.down_proj.weight"] @ (g / (1 + np.exp(-g)) * u)
                logits = W["lm_head.weight"] @ rms(h, W["model.norm.weight"])
                np.testing.assert_allclose(m.forward([tok])[0], logits, rtol=1e-12, atol=1e-12)

    def test_gqa_equals_mha_with_duplicated_kv(self):
        cfg = base_config("LlamaForCausalLM", num_attention_heads=4, num_key_value_heads=2)
        w = make_weights(cfg, seed=5)
        gqa, _ = self.build("gqa", cfg, w)
        hd = gqa.c.head_dim
        cfg_mha = dict(cfg, num_key_value_heads=4)
        w_mha = dict(w)
        for i in range(cfg["num_hidden_layers"]):
            for n in ("k", "v"):
                key = "model.layers.%d.self_attn.%s_proj.weight" % (i, n)
                blocks = w[key].reshape(2, hd, -1)
                # q head h uses kv head h // 2  -> [kv0, kv0, kv1, kv1]
                w_mha[key] = np.concatenate([blocks[h // 2] for h in range(4)], axis=0)
        mha, _ = self.build("mha", cfg_mha, w_mha)
        ids = [5, 9, 1, 77, 3, 3, 40, 12]
        np.testing.assert_allclose(gqa.forward(ids), mha.forward(ids), rtol=1e-12, atol=1e-12)
        # the wrong grouping ([kv0, kv1, kv0, kv1], i.e. tile) must differ
        w_bad = dict(w)
        for i in range(cfg["num_hidden_layers"]):
            for n in ("k", "v"):
                key = "model.layers.%d.self_attn.%s_proj.weight" % (i, n)
                blocks = w[key].reshape(2, hd, -1)
                w_bad[key] = np.concatenate([blocks[h % 2] for h in range(4)], axis=0)
        bad, _ = self.build("bad", cfg_mha, w_bad)
        self.assertFalse(np.allclose(gqa.forward(ids), bad.forward(ids)))

    def test_explicit_head_dim(self):
        # head_dim 12 != hidden 32 / heads 4
        cfg = base_config("LlamaForCausalLM", head_dim=12)
        m, _ = self.build("hd", cfg)
        self.assertEqual(m.layers[0]["q"].shape, (48, 32))
        self.assertEqual(m.forward([1, 2, 3]).shape, (3, 96))
        # Qwen3 head_dim defaults to 128 when absent
        c = rm.parse_config({k: v for k, v in base_config("Qwen3ForCausalLM").items()
                             if k != "head_dim"})
        self.assertEqual(c.head_dim, 128)

    def test_qwen3_qk_norm_per_head(self):
        # tiny eps so that scaling a head is an exact no-op up to rounding
        cfg = base_config("Qwen3ForCausalLM", rms_norm_eps=1e-14)
        w = make_weights(cfg, seed=11)
        for i in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d.self_attn." % i
            w[p + "q_norm.weight"] = np.ones(16, np.float32)
            w[p + "k_norm.weight"] = np.ones(16, np.float32)
        m, _ = self.build("q3", cfg, w)
        # direct check: with unit weights each head's normalised q has RMS 1
        x = np.random.RandomState(0).standard_normal((5, 4, 16)) * 3.7
        y = rm.rms_norm(x, np.ones(16), 1e-6)
        np.testing.assert_allclose(np.sqrt(np.mean(y * y, axis=-1)), 1.0, rtol=1e-6)
        ids = [4, 8, 15, 16, 23, 42]
        ref = m.forward(ids)
        # scaling ONE head's q rows (or one kv head's k rows) leaves logits
        # unchanged because the norm is per head (would fail if normalised
        # over the whole q projection or skipped).
        for proj, rows in (("q", slice(16, 32)), ("k", slice(0, 16))):
            w2 = dict(w)
            key = "model.layers.0.self_attn.%s_proj.weight" % proj
            a = w[key].copy()
            a[rows] *= 8.0  # power of two: exact in float32
            w2[key] = a
            m2, _ = self.build("q3" + proj, cfg, w2)
            np.testing.assert_allclose(m2.forward(ids), ref, rtol=1e-9, atol=1e-9)
        # the same change does matter for a Qwen2 / Llama style model
        cfg_l = base_config("LlamaForCausalLM", head_dim=16)
        wl = {k: v for k, v in w.items() if not k.endswith(("q_norm.weight", "k_norm.weight"))}
        ml, _ = self.build("l", cfg_l, wl)
        w3 = dict(wl)
        a = wl["model.layers.0.self_attn.q_proj.weight"].copy()
        a[16:32] *= 8.0
        w3["model.layers.0.self_attn.q_proj.weight"] = a
        ml3, _ = self.build("l3", cfg_l, w3)
        self.assertFalse(np.allclose(ml.forward(ids), ml3.forward(ids)))
        # non-unit q_norm weights matter
        w4 = dict(w)
        w4["model.layers.0.self_attn.q_norm.weight"] = np.linspace(0.5, 2, 16).astype(np.float32)
        m4, _ = self.build("q3w", cfg, w4)
        self.assertFalse(np.allclose(m4.forward(ids), ref))

    def test_qwen3_norm_before_rope(self):
        # 1 layer, 1 head, head_dim 4; check the attention scores with an
        # explicit norm-then-rope computation against norm-after-rope.
        cfg = base_config("Qwen3ForCausalLM", num_hidden_layers=1, num_attention_heads=1,
                          num_key_value_heads=1, head_dim=4, rope_theta=10.0)
        w = make_weights(cfg, seed=2)
        w["model.layers.0.self_attn.q_norm.weight"] = np.array([1, 3, 0.5, 2], np.float32)
        w["model.layers.0.self_attn.k_norm.weight"] = np.array([2, 0.25, 1, 1], np.float32)
        m, _ = self.build("nr", cfg, w)
        c = m.c
        ids = [3, 50, 7]
        W = {k: v.astype(np.float64) for k, v in w.items()}
        p = "model.layers.0."
        h = W["model.embed_tokens.weight"][ids]

        def rms(x, g):
            return g * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)

        def run(norm_first):
            x = rms(h, W[p + "input_layernorm.weight"])
            q = x @ W[p + "self_attn.q_proj.weight"].T
            k = x @ W[p + "self_attn.k_proj.weight"].T
            v = x @ W[p + "self_attn.v_proj.weight"].T
            cos, sin = rm.rope_cos_sin(range(3), rm.rope_inv_freq(4, 10.0))
            rot = lambda t: t * cos + np.concatenate([-t[:, 2:], t[:, :2]], 1) * sin
            if norm_first:
                q, k = rot(rms(q, W[p + "self_attn.q_norm.weight"])), \
                    rot(rms(k, W[p + "self_attn.k_norm.weight"]))
            else:
                q, k = rms(rot(q), W[p + "self_attn.q_norm.weight"]), \
                    rms(rot(k), W[p + "self_attn.k_norm.weight"])
            s = q @ k.T / 2.0
            s = np.where(np.tril(np.ones((3, 3))) > 0, s, -np.inf)
            pr = np.exp(s - s.max(1, keepdims=True))
            pr /= pr.sum(1, keepdims=True)
            hh = h + (pr @ v) @ W[p + "self_attn.o_proj.weight"].T
            x = rms(hh, W[p + "post_attention_layernorm.weight"])
            g = x @ W[p + "mlp.gate_proj.weight"].T
            u = x @ W[p + "mlp.up_proj.weight"].T
            hh = hh + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
            return rms(hh, W["model.norm.weight"]) @ W["lm_head.weight"].T

        self.assertEqual(c.head_dim, 4)
        got = m.forward(ids)
        np.testing.assert_allclose(got, run(True), rtol=1e-12, atol=1e-12)
        self.assertFalse(np.allclose(got, run(False)))

    def test_qwen2_biases(self):
        cfg = base_config("Qwen2ForCausalLM")
        w = make_weights(cfg, seed=4)
        m, _ = self.build("q2", cfg, w)
        w0 = dict(w)
        for k in list(w0):
            if k.endswith("_proj.bias"):
                w0[k] = np.zeros_like(w0[k])
        m0, _ = self.build("q2zero", cfg, w0)
        ids = [1, 2, 3, 4]
        self.assertFalse(np.allclose(m.forward(ids), m0.forward(ids)))
        # k bias alone (pre-RoPE) changes the result too
        w1 = dict(w0)
        w1["model.layers.0.self_attn.k_proj.bias"] = w["model.layers.0.self_attn.k_proj.bias"]
        m1, _ = self.build("q2k", cfg, w1)
        self.assertFalse(np.allclose(m1.forward(ids), m0.forward(ids)))
        # missing required bias -> error
        w2 = dict(w)
        del w2["model.layers.1.self_attn.v_proj.bias"]
        d = save_model(os.path.join(self.tmp, "q2miss"), cfg, w2)
        with self.assertRaises(rm.ReferenceError_):
            rm.load_model(d)

    def test_llama_attention_bias(self):
        cfg = base_config("LlamaForCausalLM", attention_bias=True)
        c = rm.parse_config(cfg)
        self.assertTrue(c.qkv_bias and c.o_bias)
        w = make_weights(cfg, seed=6)
        self.assertIn("model.layers.0.self_attn.o_proj.bias", w)
        m, _ = self.build("lb", cfg, w)
        self.assertEqual(m.forward([1, 2]).shape, (2, 96))

    def test_bf16_and_f16_models(self):
        cfg = base_config("LlamaForCausalLM")
        w = make_weights(cfg, seed=8)
        ids = [10, 20, 30, 40, 50]
        # bf16 file == f32 file holding the bf16-rounded values, exactly
        mb, _ = self.build("bf16", cfg, w, dtype="BF16")
        wr = {k: rm.bf16_bits_to_float32(f32_to_bf16_bits(v)) for k, v in w.items()}
        mr, _ = self.build("bf16ref", cfg, wr)
        np.testing.assert_array_equal(mb.forward(ids), mr.forward(ids))
        mh, _ = self.build("f16", cfg, w, dtype="F16")
        wh = {k: v.astype(np.float16).astype(np.float32) for k, v in w.items()}
        mhr, _ = self.build("f16ref", cfg, wh)
        np.testing.assert_array_equal(mh.forward(ids), mhr.forward(ids))
        # a qwen3 bf16 model loads and runs
        cq = base_config("Qwen3ForCausalLM")
        mq, _ = self.build("q3bf16", cq, dtype="BF16")
        self.assertTrue(np.all(np.isfinite(mq.forward(ids))))

    def test_sharded_equals_single(self):
        cfg = base_config("Qwen2ForCausalLM")
        w = make_weights(cfg, seed=9)
        m1, _ = self.build("single", cfg, w)
        m3, d3 = self.build("sharded", cfg, w, shards=3)
        self.assertFalse(os.path.exists(os.path.join(d3, "model.safetensors")))
        ids = [0, 95, 42, 42]
        np.testing.assert_array_equal(m1.forward(ids), m3.forward(ids))

    def test_tied_embeddings(self):
        cfg = base_config("Qwen3ForCausalLM", tie_word_embeddings=True)
        w = make_weights(cfg, seed=10)
        self.assertNotIn("lm_head.weight", w)
        m, _ = self.build("tied", cfg, w)
        cfg_u = dict(cfg, tie_word_embeddings=False)
        wu = dict(w, **{"lm_head.weight": w["model.embed_tokens.weight"]})
        mu, _ = self.build("untied", cfg_u, wu)
        ids = [7, 8, 9]
        np.testing.assert_array_equal(m.forward(ids), mu.forward(ids))
        # tied wins even if a (stale) lm_head tensor is present
        wt = dict(w, **{"lm_head.weight": np.zeros((96, 32), np.float32)})
        mt, _ = self.build("tied_stale", cfg, wt)
        np.testing.assert_array_equal(m.forward(ids), mt.forward(ids))

    def test_sliding_window(self):
        # Mistral with sliding_window 3, one layer: last logits depend only on
        # the last 3 tokens.
        cfg = base_config("MistralForCausalLM", num_hidden_layers=1, sliding_window=3)
        m, _ = self.build("sw", cfg)
        a = m.forward([1, 2, 3, 4, 5, 6])
        b = m.forward([9, 9, 9, 4, 5, 6])
        np.testing.assert_allclose(a[-1], b[-1], rtol=1e-12, atol=1e-12)
        self.assertFalse(np.allclose(a[3], b[3]))
        # Qwen2 with use_sliding_window False ignores sliding_window
        c = rm.parse_config(base_config("Qwen2ForCausalLM", sliding_window=3,
                                        use_sliding_window=False, max_window_layers=0))
        self.assertEqual(c.layer_sliding, [None, None])
        c = rm.parse_config(base_config("Qwen2ForCausalLM", sliding_window=3,
                                        use_sliding_window=True, max_window_layers=1))
        self.assertEqual(c.layer_sliding, [None, 3])


class TestCli(TmpDirCase):
    def run_cli(self, *args):
        return subprocess.run([sys.executable, SCRIPT] + list(args),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True)

    def test_cli_generation(self):
        cfg = base_config("LlamaForCausalLM", rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
        w = make_weights(cfg, seed=12)
        m, d = self.build("cli", cfg, w)
        out = os.path.join(self.tmp, "out.json")
        r = self.run_cli("--model", d, "--prompt-ids", "3,1,4,1,5", "--max-new-tokens", "6",
                         "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            res = json.load(f)
        self.assertEqual(set(res), {"prompt_logits", "all_prompt_logits", "generated",
                                    "step_logits"})
        self.assertEqual(len(res["all_prompt_logits"]), 5)
        self.assertEqual(len(res["prompt_logits"]), 96)
        self.assertEqual(res["prompt_logits"], res["all_prompt_logits"][-1])
        self.assertEqual(len(res["generated"]), 6)
        self.assertEqual(len(res["step_logits"]), 6)
        self.assertEqual(res["step_logits"][0], res["prompt_logits"])
        full = m.forward([3, 1, 4, 1, 5])
        # full precision preserved through JSON
        self.assertEqual(res["all_prompt_logits"], full.tolist())
        seq = [3, 1, 4, 1, 5]
        for tok, logits in zip(res["generated"], res["step_logits"]):
            self.assertEqual(logits, m.forward(seq)[-1].tolist())
            self.assertEqual(tok, int(np.argmax(logits)))
            seq.append(tok)

    def test_argmax_ties_lowest_id(self):
        # all-zero lm_head -> all logits equal -> token 0 every step
        cfg = base_config("Qwen2ForCausalLM")
        w = make_weights(cfg, seed=13)
        w["lm_head.weight"] = np.zeros_like(w["lm_head.weight"])
        m, _ = self.build("ties", cfg, w)
        _, gen, _ = m.generate([5, 6], 3)
        self.assertEqual(gen, [0, 0, 0])

    def test_cli_errors(self):
        out = os.path.join(self.tmp, "o.json")
        cfg = base_config("LlamaForCausalLM")
        w = make_weights(cfg)
        d = save_model(os.path.join(self.tmp, "gpt"), dict(cfg, architectures=["GPT2LMHeadModel"],
                                                           model_type="gpt2"), w)
        r = self.run_cli("--model", d, "--prompt-ids", "1", "--out", out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unsupported architecture", r.stderr)
        w2 = dict(w)
        del w2["model.layers.1.mlp.up_proj.weight"]
        d = save_model(os.path.join(self.tmp, "miss"), cfg, w2)
        r = self.run_cli("--model", d, "--prompt-ids", "1", "--out", out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("model.layers.1.mlp.up_proj.weight", r.stderr)
        d = save_model(os.path.join(self.tmp, "ok"), cfg, w)
        r = self.run_cli("--model", d, "--prompt-ids", "1,96", "--out", out)
        self.assertEqual(r.returncode, 2)
        r = self.run_cli("--model", os.path.join(self.tmp, "nope"), "--prompt-ids", "1",
                         "--out", out)
        self.assertEqual(r.returncode, 2)
        self.assertFalse(os.path.exists(out))

    def test_speed_target_size(self):
        # vocab 512, hidden 64, 64 tokens, 16 new tokens: must stay quick
        import time
        cfg = base_config("Qwen3ForCausalLM", vocab_size=512, hidden_size=64,
                          intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16)
        m, _ = self.build("speed", cfg)
        t = time.time()
        m.generate(list(range(64)), 16)
        self.assertLess(time.time() - t, 10.0)


if __name__ == "__main__":
    unittest.main()
