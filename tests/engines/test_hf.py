from __future__ import annotations

import pytest
import torch

from app.core.errors import VocabMismatchError
from app.engines.base import IncrementalDetokenizer, check_tokenizers
from app.engines.hf import HFEngine
from app.engines.registry import resolve


@pytest.fixture(scope="module")
def smol():
    return HFEngine(resolve("smollm2-135m-instruct"))


@pytest.mark.slow
def test_engine_facts(smol):
    assert smol.vocab_size == 49152 and smol.device == "cpu" and smol.dtype == "float32"
    assert 2 in smol.eos_ids  # <|im_end|>
    ids = smol.encode_prompt("hi")
    assert smol.tokenizer.decode(ids).count("<|im_start|>") >= 2  # chat template applied
    assert smol.encode_prompt("hi", chat=False) != ids


@pytest.mark.slow
def test_forward_crop_matches_a_fresh_pass(smol):
    """k-token forward + crop (rejected drafts) leaves the cache as if the rejected tokens never came."""
    ids = smol.encode_prompt("def square(x):", chat=False)
    s = smol.new_state()
    s.forward(ids[:-1])
    logits_k = s.forward([ids[-1], 100, 200, 300])  # [4, V]
    assert logits_k.shape == (4, smol.vocab_size) and s.length == len(ids) + 3
    s.crop(len(ids) + 1)  # keep token 100, drop 200 and 300
    after = s.forward([555], last_only=True)
    fresh = smol.new_state()
    ref = fresh.forward([*ids, 100, 555])
    assert torch.allclose(after[-1], ref[-1], atol=1e-4)
    assert torch.allclose(logits_k[0], ref[len(ids) - 1], atol=1e-4)
    with pytest.raises(ValueError):
        s.crop(s.length + 1)


@pytest.mark.slow
def test_incremental_detokenizer_is_right_for_multibyte(smol):
    text = "naïve café → 世界 🚀 done"
    ids = smol.tokenizer.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(smol.decode, [])
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) == text
    assert any(p == "" for p in pieces)  # some tokens complete no character on their own (byte-level BPE)
    assert all("\ufffd" not in p for p in pieces)
    d2 = IncrementalDetokenizer(smol.decode, [])
    for i in ids[:3]:
        d2.push(i)
    peeked = d2.peek(ids[3:6])
    assert d2.push(ids[3]) == peeked[0]  # peek does not consume


@pytest.mark.slow
def test_tokenizer_mismatch_is_refused(smol, tmp_path):
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(str(smol.folder))
    other.add_tokens(["<extra_a>", "<extra_b>"])
    check_tokenizers("t", smol.tokenizer, "d", AutoTokenizer.from_pretrained(str(smol.folder)))
    with pytest.raises(VocabMismatchError) as e:
        check_tokenizers("target-x", smol.tokenizer, "draft-y", other)
    assert "target-x" in str(e.value) and "draft-y" in str(e.value) and "49154" in str(e.value)


def test_cuda_request_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from app.core.errors import EngineError

    with pytest.raises(EngineError, match="--device cpu"):
        HFEngine(resolve("smollm2-135m-instruct"), device="cuda")


@pytest.mark.slow
@pytest.mark.parametrize("activations", ["token", "tensor"])
def test_int8_engine_quantizes_the_linears_int8_tolerates(smol, monkeypatch, activations):
    """dtype="int8" (draft precision on CPU): the load-time check reads a probe in one forward and keeps in fp32 the
    worst layers until the next-token distributions are within TV 0.2 of fp32's. With each token's activations
    quantized on its own scale in such a forward (the default: cpu_kernels.Int8Linear) every SmolLM2 layer passes;
    with fbgemm's per-tensor quantization (SPECDECK_INT8_ACTIVATIONS=tensor, as before) the prompt's first tokens
    set the others' resolution, and its worst layers stay fp32 (packed for oneDNN). Close to fp32, not equal."""
    monkeypatch.setenv("SPECDECK_INT8_ACTIVATIONS", activations)
    q = HFEngine(resolve("smollm2-135m-instruct"), dtype="int8")
    n_lin = 30 * 7 + 1  # 30 layers x (q, k, v, o, gate, up, down) + lm_head
    assert q.dtype == "int8" and q.vocab_size == 49152
    assert not any(type(m) is torch.nn.Linear for m in q.model.modules())  # the kept ones are packed for oneDNN
    kinds = {type(m).__name__ for m in q.model.modules() if type(m).__name__ in ("Int8Linear", "PackedLinear")}
    assert q.packed_linears == n_lin - q.int8_linears
    if activations == "token":
        assert q.int8_linears == n_lin and kinds == {"Int8Linear"}
    else:
        assert n_lin // 2 < q.int8_linears < n_lin and kinds == {"Int8Linear", "PackedLinear"}  # the worst are not
    ids = smol.encode_prompt("Write a function that adds two numbers.\n\ndef add(a, b):\n    return a + b\n", chat=False)
    a = smol.new_state().forward(ids)
    b = q.new_state().forward(ids)
    assert b.shape == a.shape and b.dtype == torch.float32
    tv = 0.5 * (a.softmax(-1) - b.softmax(-1)).abs().sum(-1).mean().item()
    assert 0.0 < tv < 0.3, tv  # close, not equal: this is why only drafts use it
    assert 0.0 < q.int8_tv <= 0.2  # what the load-time check measured on its probe


def test_int8_refuses_cuda_with_the_fix():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the int8-on-CUDA refusal is tested without one")
    from app.core.errors import EngineError

    with pytest.raises(EngineError, match="--device cpu"):  # no CUDA at all: the device error comes first
        HFEngine(resolve("smollm2-135m-instruct"), device="cuda", dtype="int8")


def test_a_broken_config_json_is_an_engine_error_naming_the_file(tiny_pair, tmp_path):
    import shutil

    from app.core.errors import EngineError

    folder = shutil.copytree(tiny_pair[0], tmp_path / "broken")
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": 64,')  # cut short
    with pytest.raises(EngineError) as e:
        HFEngine(resolve(str(folder)))
    assert str(folder / "config.json") in e.value.message and "not a valid model config" in e.value.message
    assert e.value.fix and "replace" in e.value.fix
    (folder / "config.json").write_text("[1, 2]")  # JSON, but not a config
    with pytest.raises(EngineError, match="not an object"):
        HFEngine(resolve(str(folder)))


def test_bfloat16_from_an_fp32_folder_equals_transformers_own_load(tiny_pair):
    """The engine converts the mapped fp32 weights one at a time; the model is the one from_pretrained(dtype=…)
    builds, to the bit."""
    from transformers import AutoModelForCausalLM

    from app.engines.cpu_kernels import weight_bytes

    e = HFEngine(resolve(str(tiny_pair[0])), dtype="bfloat16")
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_pair[0]), dtype=torch.bfloat16)
    assert e.dtype == "bfloat16" and e.model.config.dtype == torch.bfloat16
    assert e.model.lm_head.weight.dtype == torch.bfloat16 and weight_bytes(e.model) == weight_bytes(ref)
    for (n, a), (_, b) in zip(list(e.model.state_dict().items()), list(ref.state_dict().items()), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), n
    for (n, a), (_, b) in zip(e.model.named_buffers(), ref.named_buffers(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), n  # rotary inv_freq stays fp32 in both
    ids = e.encode_prompt("def add(a, b):", chat=False)
    with torch.inference_mode():
        assert torch.equal(e.new_state().forward(ids), ref(input_ids=torch.tensor([ids])).logits[0].float())
