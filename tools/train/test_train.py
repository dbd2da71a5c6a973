"""Tests of tools/train: the task, the tokenizer, the model reference and the checkpoint format.

    python3 -m unittest discover -s tools/train -p 'test_*.py'          # standard library parts
    /path/to/venv/bin/python -m unittest discover -s tools/train -p 'test_*.py'   # + torch parts

The torch tests are skipped where torch is missing; the transformers checks (every family's checkpoint
loads in transformers' own class with the same logits; AutoTokenizer gives the same ids) where
transformers is.
Routing is checked against independently written per-token formulations (sorting, plain loops)
and the MoE loop against a dense formulation (every expert on every token, a dense weight matrix).
"""

import json
import os
import struct
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import task  # noqa: E402
from tokenizer import CharTokenizer  # noqa: E402

try:
    import torch
    import model as M
    import train as T
except ImportError:  # the standard-library tests still run
    torch = None

try:
    import transformers
except ImportError:
    transformers = None


class TaskTest(unittest.TestCase):
    def test_splits_are_deterministic_exact_and_disjoint(self):
        task.check_splits(n_train=5000)

    def test_committed_test_file_is_the_generated_split(self):
        got = task.read_jsonl(os.path.join(ROOT, "models", "data", "arith_test.jsonl"))
        self.assertEqual(got, task.test_split())

    def test_extract_answer(self):
        self.assertEqual(task.extract_answer(" 3+4=7. #### 7"), 7)
        self.assertEqual(task.extract_answer("####12 #### 13"), 12)
        self.assertEqual(task.extract_answer("#### -5"), -5)
        self.assertIsNone(task.extract_answer(" 3+4=7."))
        self.assertIsNone(task.extract_answer("#### x"))

    def test_operation_counts(self):
        steps = {p["steps"] for p in task.test_split()}
        self.assertEqual(steps, {2, 3, 4})


class TokenizerTest(unittest.TestCase):
    def setUp(self):
        self.tok = CharTokenizer.default()

    def test_round_trip(self):
        text = task.test_split(1)[0]["prompt"]
        self.assertEqual(self.tok.decode(self.tok.encode(text)), text)
        self.assertEqual(len(self.tok), 99)

    def test_specials(self):
        ids = [self.tok.bos_id] + self.tok.encode("1+1=2") + [self.tok.eos_id, self.tok.pad_id]
        self.assertEqual(self.tok.decode(ids), "1+1=2")

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, r"U\+00E9 at position 1"):
            self.tok.encode("a\u00e9")
        with self.assertRaisesRegex(ValueError, "outside"):
            self.tok.decode([99])
        sp = ["<pad>", "<bos>", "<eos>"]
        with self.assertRaisesRegex(ValueError, "one character"):
            CharTokenizer(sp + ["ab"], {"pad": 0, "bos": 1, "eos": 2})
        with self.assertRaisesRegex(ValueError, "duplicates"):
            CharTokenizer(sp + ["a", "a"], {"pad": 0, "bos": 1, "eos": 2})
        with self.assertRaisesRegex(ValueError, "exactly"):
            CharTokenizer(sp, {"pad": 0, "bos": 1, "eos": 2, "unk": 2})
        with self.assertRaisesRegex(ValueError, "must be '<bos>'"):
            CharTokenizer(["<pad>", "<b>", "<eos>"], {"pad": 0, "bos": 1, "eos": 2})
        bad = self.tok.to_json()
        bad["model"]["type"] = "BPE"
        with self.assertRaisesRegex(ValueError, "WordLevel"):
            CharTokenizer.from_json(bad)

    def test_special_token_text_is_the_token(self):
        # As in Hugging Face: an added token's text in the input is that token.
        self.assertEqual(self.tok.encode("a<eos>"), self.tok.encode("a") + [self.tok.eos_id])
        self.assertEqual(self.tok.encode("<bos"), self.tok.encode("<") + self.tok.encode("bos"))

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_auto_tokenizer_gives_the_same_ids(self):
        from transformers import AutoTokenizer
        with tempfile.TemporaryDirectory() as d:
            self.tok.save_pretrained(d, 512)
            hf = AutoTokenizer.from_pretrained(d)
        with open(os.path.join(ROOT, "tests", "data", "tokenizer_golden.json")) as f:
            cases = json.load(f)["cases"]
        for c in cases:
            self.assertEqual(hf.encode(c["text"], add_special_tokens=False), c["ids"], c["text"])
            self.assertEqual(hf.decode(c["ids"], skip_special_tokens=True), self.tok.decode(c["ids"]))
        self.assertEqual(hf.encode("1+1", add_special_tokens=True), [self.tok.bos_id] + self.tok.encode("1+1"))
        self.assertEqual((hf.bos_token_id, hf.eos_token_id, hf.pad_token_id), (1, 2, 0))
        with self.assertRaises(Exception):  # "<unk>" is not in the vocabulary: an error, not a dropped character
            hf.encode("a\u00e9")

    def test_json_round_trip_and_golden_file(self):
        again = CharTokenizer.from_json(json.loads(json.dumps(self.tok.to_json())))
        self.assertEqual(again.vocab, self.tok.vocab)
        with open(os.path.join(ROOT, "tests", "data", "tokenizer_golden.json")) as f:
            gold = json.load(f)
        self.assertEqual(gold["tokenizer"], self.tok.to_json())
        for c in gold["cases"]:
            self.assertEqual(self.tok.encode(c["text"]), c["ids"])


@unittest.skipIf(torch is None, "torch is not installed")
class ModelTest(unittest.TestCase):
    def small(self, family, **kw):
        name = {"mixtral": "mixtral-tiny", "deepseek": "deepseek-v3-tiny", "llama4": "llama4-tiny"}[family]
        return M.replace(M.smoke_config(M.PRESETS[name]), vocab_size=99, **kw)

    def random_model(self, cfg, std=0.1, seed=0):
        torch.manual_seed(seed)
        m = M.MoeForCausalLM(cfg)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if not n.endswith("norm.weight"):
                    p.normal_(0, std)
                else:
                    p.uniform_(0.5, 1.5)
            for b in m.moe_blocks():
                if cfg.family == "deepseek":
                    b.gate.e_score_correction_bias.normal_(0, 0.3)
        return m.eval()

    def test_mixtral_routing_matches_a_sort(self):
        blk = self.random_model(self.small("mixtral")).moe_blocks()[0]
        logits = torch.randn(50, 4)
        ids, w = blk.route(logits)
        for t in range(50):
            p = torch.softmax(logits[t].double(), 0).tolist()
            order = sorted(range(4), key=lambda e: -p[e])[:2]
            self.assertEqual(ids[t].tolist(), order)
            total = sum(p[e] for e in order)
            self.assertTrue(torch.allclose(w[t].double(), torch.tensor([p[e] / total for e in order], dtype=torch.float64)))

    def test_deepseek_routing_matches_a_per_token_loop(self):
        cfg = self.small("deepseek", num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
                         routed_scaling_factor=2.5)
        blk = self.random_model(cfg).moe_blocks()[0]
        bias = blk.gate.e_score_correction_bias.double().tolist()
        logits = torch.randn(60, 8) * 2
        ids, w = blk.route(logits)
        for t in range(60):
            s = [1 / (1 + pow(2.718281828459045, -v)) for v in logits[t].double().tolist()]
            b = [s[e] + bias[e] for e in range(8)]
            groups = [sorted(b[2 * g:2 * g + 2], reverse=True) for g in range(4)]
            gscore = [sum(x[:2]) for x in groups]
            kept = sorted(range(4), key=lambda g: -gscore[g])[:2]
            cand = [e for e in range(8) if e // 2 in kept]
            pick = sorted(cand, key=lambda e: -b[e])[:3]
            self.assertEqual(sorted(ids[t].tolist()), sorted(pick))
            total = sum(s[e] for e in pick)
            want = {e: 2.5 * s[e] / total for e in pick}
            for e, v in zip(ids[t].tolist(), w[t].tolist()):
                self.assertAlmostEqual(v, want[e], places=5)

    def test_llama4_routing_is_sigmoid_top1(self):
        blk = self.random_model(self.small("llama4")).moe_blocks()[0]
        logits = torch.randn(40, 4)
        ids, w = blk.route(logits)
        self.assertEqual(ids[:, 0].tolist(), logits.argmax(1).tolist())
        self.assertTrue(torch.allclose(w[:, 0], torch.sigmoid(logits.max(1).values)))

    @torch.no_grad() if torch else (lambda f: f)
    def test_moe_loop_matches_a_dense_formulation(self):
        for family in M.FAMILIES:
            with self.subTest(family=family):
                blk = self.random_model(self.small(family)).moe_blocks()[0]
                x = torch.randn(33, blk.cfg.hidden_size)
                got = blk(x)
                ids, w = blk.route(x @ blk.router_weight().T)
                dense = torch.zeros(33, blk.cfg.num_experts).scatter(1, ids, w)  # [T, E] weight, 0 if unused
                want = torch.zeros_like(x)
                for e in range(blk.cfg.num_experts):
                    if family == "llama4":
                        y = blk.expert(e, x * dense[:, e:e + 1])
                        want += (dense[:, e:e + 1] != 0) * y
                    else:
                        want += dense[:, e:e + 1] * blk.expert(e, x)
                if family == "deepseek":
                    want += blk.shared_experts(x)
                if family == "llama4":
                    want += blk.shared_expert(x)
                self.assertLess(float((got - want).abs().max()), 1e-5)
                self.assertEqual(int(blk.load.sum()), ids.numel())

    def test_safetensors_writer(self):
        tensors = {"b": torch.randn(3, 5).to(torch.bfloat16), "a": torch.randn(4), "i": torch.arange(6, dtype=torch.int32),
                   "z": torch.zeros(0, 3)}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.safetensors")
            M.write_safetensors(path, tensors, {"format": "pt"})
            with open(path, "rb") as f:
                raw = f.read()
            n = struct.unpack("<Q", raw[:8])[0]
            self.assertEqual(n % 8, 0)
            header = json.loads(raw[8:8 + n])
            spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
            self.assertEqual(spans[0][0], 0)
            self.assertTrue(all(a[1] == b[0] for a, b in zip(spans, spans[1:])))
            self.assertEqual(spans[-1][1], len(raw) - 8 - n)
            back = M.read_safetensors(path)
            for k, v in tensors.items():
                self.assertTrue(torch.equal(back[k], v), k)
            try:
                from safetensors.torch import load_file
            except ImportError:
                return
            for k, v in load_file(path).items():
                self.assertTrue(torch.equal(v, tensors[k]), k)

    def test_checkpoint_round_trip_and_names(self):
        for family in M.FAMILIES:
            with self.subTest(family=family):
                cfg = self.small(family)
                m = self.random_model(cfg)
                with tempfile.TemporaryDirectory() as d:
                    M.save_model(m, d, CharTokenizer.default())
                    state = M.read_safetensors(os.path.join(d, "model.safetensors"))
                    back = M.load_model(d)
                    self.assertEqual(back.cfg, M.replace(cfg, name=os.path.basename(d)))
                e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
                moe = "model.layers.1." + M.MOE_ATTR[family]
                expect = {"mixtral": {moe + ".gate.weight": [e, h], moe + ".experts.3.w1.weight": [i, h],
                                      moe + ".experts.3.w2.weight": [h, i], moe + ".experts.3.w3.weight": [i, h]},
                          "deepseek": {moe + ".gate.weight": [e, h], moe + ".gate.e_score_correction_bias": [e],
                                       moe + ".experts.3.gate_proj.weight": [i, h],
                                       moe + ".shared_experts.down_proj.weight": [h, i]},
                          "llama4": {moe + ".router.weight": [e, h], moe + ".experts.gate_up_proj": [e, h, 2 * i],
                                     moe + ".experts.down_proj": [e, i, h], moe + ".shared_expert.up_proj.weight": [i, h]},
                          }[family]
                for name, shape in expect.items():
                    self.assertEqual(list(state[name].shape), shape, name)
                if family == "deepseek":
                    self.assertEqual(list(state["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape),
                                     [cfg.kv_lora_rank + cfg.qk_rope_head_dim, h])
                else:
                    self.assertEqual(list(state["model.layers.0.self_attn.k_proj.weight"].shape),
                                     [cfg.num_key_value_heads * cfg.head_dim, h])
                for name, t in state.items():
                    want = torch.float32 if name.endswith("e_score_correction_bias") else torch.bfloat16
                    self.assertEqual(t.dtype, want, name)
                # The reloaded model is the original with its weights rounded to bf16.
                rounded = self.random_model(cfg)
                with torch.no_grad():
                    for p in rounded.parameters():
                        p.copy_(p.to(torch.bfloat16).float())
                ids = torch.randint(3, 99, (2, 17))
                self.assertTrue(torch.allclose(back(ids), rounded(ids), atol=1e-5))

    def assert_transformers_matches(self, d, ours, atol, min_peak):
        from transformers import AutoModelForCausalLM
        hf, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertFalse(info.get(k), (k, info.get(k)))
        self.assertEqual(type(hf).__name__, M.ARCHITECTURE[ours.cfg.family])
        ids = torch.randint(3, 99, (2, 64), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            a, b = ours(ids), hf.eval()(ids).logits.float()
        self.assertGreater(float(a.abs().max()), min_peak)
        self.assertLess(float((a - b).abs().max()), atol)

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_checkpoints_load_in_transformers(self):
        # Each family's folder is a checkpoint of transformers' own class, with the same logits.
        for family in M.FAMILIES:
            with self.subTest(family=family), tempfile.TemporaryDirectory() as d:
                M.save_model(self.random_model(self.small(family)), d, CharTokenizer.default())
                self.assert_transformers_matches(d, M.load_model(d), 1e-4, 1.0)

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_committed_models_load_in_transformers(self):
        # The trained checkpoints of models/ and the smoke models, as committed.
        dirs = [os.path.join(ROOT, "models", n) for n in M.PRESETS]
        dirs += [os.path.join(ROOT, "tests", "data", "models", n + "-smoke") for n in M.PRESETS]
        for d in dirs:
            with self.subTest(model=d):
                self.assert_transformers_matches(d, M.load_model(d), 1e-3, 0.1)

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_transformers_agrees_with_the_reference_logits(self):
        # reference_logits.safetensors is what the C++ runner is held to (tests/test_model_runner.cpp):
        # transformers' own class gives the same argmax at >= 99% of the positions, in f32.
        from transformers import AutoModelForCausalLM
        for n in M.PRESETS:
            d = os.path.join(ROOT, "models", n)
            with self.subTest(model=n):
                ref = M.read_safetensors(os.path.join(d, "reference_logits.safetensors"))
                hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
                ids, lens = ref["input_ids"][:16].long(), ref["lengths"][:16]
                with torch.no_grad():
                    am = hf(ids).logits.argmax(-1)
                mask = torch.arange(ids.shape[1])[None, :] < lens[:, None]
                agree = float((am == ref["argmax"][:16].long())[mask].float().mean())
                self.assertGreaterEqual(agree, 0.99, agree)

    def test_smoke_training_writes_everything(self):
        with tempfile.TemporaryDirectory() as d:
            T.main(["--smoke", "--model", "llama4-tiny", "--out", d])
            out = os.path.join(d, "llama4-tiny-smoke")
            self.assertEqual(sorted(os.listdir(out)), ["config.json", "generation_config.json", "model.safetensors",
                                                       "reference_logits.safetensors", "tokenizer.json",
                                                       "tokenizer_config.json", "train_report.json"])
            with open(os.path.join(out, "train_report.json")) as f:
                report = json.load(f)
            self.assertEqual(report["test"]["n"], 16)
            self.assertEqual(CharTokenizer.load(os.path.join(out, "tokenizer.json")).vocab, CharTokenizer.default().vocab)
            ref = M.read_safetensors(os.path.join(out, "reference_logits.safetensors"))
            model = M.load_model(out)
            n, s = ref["input_ids"].shape
            self.assertEqual(n, 16)
            with torch.no_grad():
                logits = model(ref["input_ids"].long())
            for r in range(n):
                length = int(ref["lengths"][r])
                self.assertTrue(torch.equal(ref["argmax"][r, :length], logits[r, :length].argmax(-1).int()))
                self.assertTrue((ref["argmax"][r, length:] == -1).all())
            self.assertTrue(torch.allclose(ref["logits"], logits[:2], atol=1e-5))


if __name__ == "__main__":
    unittest.main()
