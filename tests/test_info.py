"""`pyllm info` and the data behind it (pyllm/info.py), on both real models
and on synthetic files of the other families."""
import json
import sys
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as QT
from typer.testing import CliRunner

import synth
from pyllm.info import model_info

MiB = 1 << 20


def cli_app():
    try:
        from pyllm.cli.main import app
    except ImportError:  # a checkout that is not installed: cli/ is the package
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from cli.main import app
    return app


@pytest.mark.model
def test_info_gemma3(gemma3_path):
    i = model_info(gemma3_path)
    assert (i.architecture, i.name, i.file_type) == ("gemma3", "Gemma 3 270m", "Q4_K_M")
    assert i.n_params == 268_098_176
    assert i.tensor_types == {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
    assert (i.n_layer, i.n_embd, i.n_head, i.n_head_kv, i.head_dim, i.n_ff) == (18, 640, 4, 1, 256, 2048)
    assert (i.n_ctx_train, i.n_ctx) == (32768, 4096)
    assert i.rope_mode.startswith("NEOX") and i.rope_dims == 256 and i.attn_scale == 1 / 16
    local, glob = i.layer_groups
    assert local.layers == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16] and local.window == 512
    assert local.rope_base == 10000 and glob.layers == [5, 11, 17] and glob.rope_base == 1e6 and glob.window == 0
    assert (i.vocab_type, i.n_vocab, i.chat_template) == ("SentencePiece", 262144, False)
    # KV: 18 layers x 4096 positions x (K + V) x 1 head of 256 x 2 bytes
    assert i.kv_bytes == 18 * 4096 * 2 * 256 * 2 == 72 * MiB
    assert i.weight_bytes == 246_587_904 and i.file_bytes == 253_113_024
    assert i.total_bytes == i.weight_bytes + i.kv_bytes + i.activation_bytes
    # the logits rows (32 x 262144 floats) are most of the activations
    assert 32 * 262144 * 4 < i.activation_bytes < 64 * MiB
    assert model_info(gemma3_path, n_ctx=100).kv_bytes == 18 * 128 * 2 * 256 * 2   # whole blocks of 32


@pytest.mark.model
def test_info_cli_on_both_models(smollm2_path, gemma3_path):
    app = cli_app()
    r = CliRunner().invoke(app, ["info", "-m", smollm2_path, "-c", "2048"])
    assert r.exit_code == 0, r.output
    lines = dict(line.split(None, 1) if not line.startswith(" ") else ("", line.strip())
                 for line in r.output.splitlines() if line.strip() and not line.startswith("chat"))
    assert lines["architecture"].startswith("llama: 30 layers, 576 wide, 9 heads of 64, 3 KV heads")
    assert lines["parameters"] == "134.5 M (134,515,008)"
    assert lines["tensor"] == "types   Q4_1 210, F32 61, Q8_0 1 (file type Q4_1)"
    assert lines["context"] == "8192 trained, 2048 chosen (-c)"
    assert "normal (adjacent pairs), 64 of 64 dims rotated" in lines["RoPE"]
    assert "all layers: base 100000; attention over whole context" in r.output
    assert lines["vocabulary"] == "BPE (GPT-2 style), 49152 tokens"
    assert "chat template  present\n" in r.output   # SmolLM2's has no enable_thinking switch
    assert "KV cache 45.0 MiB" in lines["memory"]          # 30 x 2048 x 2 x 192 x 2 bytes

    r = CliRunner().invoke(app, ["info", "-m", gemma3_path, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["architecture"] == "gemma3" and d["n_vocab"] == 262144 and d["chat_template"] is False
    assert d["kv_bytes"] == 72 * MiB and d["total_bytes"] == d["weight_bytes"] + d["kv_bytes"] + d["activation_bytes"]
    assert [g["window"] for g in d["layer_groups"]] == [512, 0]

    r = CliRunner().invoke(app, ["info", "-m", "/nonexistent.gguf"])
    assert r.exit_code == 2 and "no model file" in r.output
    # ollama's `show NAME`: the model as an argument, the same report
    r = CliRunner().invoke(app, ["show", gemma3_path, "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == d
    r = CliRunner().invoke(app, ["show", gemma3_path, "-m", smollm2_path])
    assert r.exit_code == 2 and "two models given" in r.output


def test_info_other_families(tmp_path):
    p3 = model_info(synth.write_phi3(tmp_path / "p.gguf", QT.Q8_0, long_rope=True), n_ctx=1024)
    assert p3.architecture == "phi3" and p3.layer_groups[0].rope_freq_factors and p3.vocab_type.startswith("BPE")
    assert p3.attn_scale == pytest.approx(1.1902380714238083 ** 2 / 8)
    q3 = model_info(synth.write_qwen3(tmp_path / "q.gguf", QT.F32), n_ctx=64)
    assert q3.head_dim == 128 and q3.kv_bytes == 2 * 64 * 2 * 2 * 128 * 2 and q3.tensor_types == {"F32": 25}
    mi = model_info(synth.write_mistral(tmp_path / "m.gguf", QT.Q4_K, window=16), n_ctx=64)
    assert mi.layer_groups[0].window == 16 and "llama.cpp ignores" in mi.notes[0]
    g2 = model_info(synth.write_gemma2(tmp_path / "g2.gguf", QT.Q8_0, window=16), n_ctx=64)
    assert (g2.attn_softcap, g2.final_softcap) == (0.5, 30.0) and g2.attn_scale == 1 / 8
    assert [(grp.layers, grp.window) for grp in g2.layer_groups] == [([0, 2], 16), ([1, 3], 0)]
    assert "attention      softmax scale 0.125, scores soft-capped at 0.5 (c * tanh(s / c)); logits soft-capped at 30" \
        in g2.format()
    s3 = model_info(synth.write_smollm3(tmp_path / "s3.gguf", QT.Q8_0, n_layer=8), n_ctx=64)
    assert [(grp.layers, grp.rope_dims) for grp in s3.layer_groups] == [([0, 1, 2, 4, 5, 6], 64), ([3, 7], 0)]
    assert "layers 3,7: no RoPE; attention over whole context" in s3.format()
    gr = model_info(synth.write_granite(tmp_path / "gr.gguf", QT.Q8_0), n_ctx=64).format()
    assert "softmax scale 0.015625" in gr
    assert "embeddings x 12, each block's output x 0.22 into the residual, logits x 0.125" in gr
    q3vl = model_info(synth.write_qwen3vl(tmp_path / "q3vl.gguf", QT.Q8_0, n_layer=4,
                                          keys={"num_deepstack_layers": 3}), n_ctx=64).format()
    assert "M-RoPE: an image row's time, height and width positions turn 24, 20, 20 pairs of each head, " \
        "interleaved (text: plain RoPE)" in q3vl
    assert "DeepStack: an image row carries 3 more slices of 256, added to the residual after layers 0..2" in q3vl
    assert "DeepStack" not in model_info(synth.write_qwen2vl(tmp_path / "q2vl.gguf", QT.Q8_0), n_ctx=64).format()
    p2 = model_info(synth.write_phi2(tmp_path / "p2.gguf", QT.Q8_0), n_ctx=64)
    assert p2.block == "LayerNorm before attention and FFN, side by side (one norm); FFN gelu_tanh(up), not gated"
    assert model_info(synth.write_olmo2(tmp_path / "o2.gguf", QT.Q8_0), n_ctx=64).block == \
        "RMSNorm after attention and FFN (no input norms); FFN silu(gate) * up; q/k RMSNorm over all heads"
    assert g2.block == "RMSNorm before attention and FFN, and after each; FFN gelu_tanh(gate) * up"


def test_info_families_of_this_kind(tmp_path):
    """What `pyllm info` says of latent attention, chunks and a q temperature, experts in later
    layers, and routers on the layer's input; MLA's KV cache is the latent and k_pe alone."""
    ds = model_info(synth.write_deepseek2(tmp_path / "d.gguf", QT.Q8_0), n_ctx=64)
    assert ds.kv_bytes == 2 * 64 * (256 + 32) * 2   # 2 layers, one f16 row of latent + rotated dims
    assert "latent attention (MLA): a 256-dim latent and 32 rotated dims cached per position, heads of 96 key " \
           "and 64 value dims" in ds.block
    assert "4 of 16 experts per token" in ds.block and "in layers 1, dense elsewhere" in ds.block
    l4 = model_info(synth.write_llama4(tmp_path / "l.gguf", QT.Q8_0), n_ctx=64).format()
    assert "layers 0-2: base 500000; attention over chunks of 8192" in l4
    assert "layer 3: no RoPE; attention over whole context, q times 1 + 0.1 ln(1 + floor((p + 1) / 8192))" in l4
    assert "router sigmoids (the weight scaling the expert's input)" in l4
    st = model_info(synth.write_smallthinker(tmp_path / "s.gguf", QT.Q8_0), n_ctx=64)
    assert "relu(gate) * up" in st.block and "routed by the layer's input" in st.block
    assert [(grp.layers, grp.window) for grp in st.layer_groups] == [([0, 4], 0), ([1, 2, 3], 4096)]


def test_info_of_rwkv(tmp_path):
    """RWKV: linear-attention heads, the state per layer, no RoPE or softmax rows; QRWKV's shared k/v heads."""
    rw = model_info(synth.write_rwkv6(tmp_path / "r.gguf", QT.Q8_0), n_ctx=64)
    text = rw.format()
    assert "rwkv6: 3 layers, 256 wide, 4 linear-attention heads of 64, FFN 512" in text
    assert "RoPE" not in text and "softmax" not in text and rw.kv_bytes == 0
    # per layer: two token shifts of one row, 4 heads of a 64 x 64 state
    assert rw.state_bytes == 3 * 4 * (2 * 256 + 4 * 64 * 64)
    assert rw.block == ("LayerNorm before attention and FFN; RWKV channel mix, sigmoid(Wr x_r) * Wv relu(Wk x_k)^2; "
                        "RWKV time mix in place of attention, 4 heads of 64 (a 64x64 state each)")
    q = model_info(synth.write_rwkv6qwen2(tmp_path / "q.gguf", QT.Q8_0), n_ctx=64)
    assert q.block.endswith("8 heads of 32 (a 32x32 state each, keys and values of 2 heads; gated linear attention)")
    r7 = model_info(synth.write_rwkv7(tmp_path / "r7.gguf", QT.Q8_0), n_ctx=64)
    assert r7.block.endswith("RWKV 7 time mix in place of attention, 4 heads of 64 (a 64x64 state each), the first "
                             "layer's values mixed into every later layer's")
    assert "RWKV channel mix, Wv relu(Wk x_k)^2" in r7.block


def test_info_names_a_thinking_switch(tmp_path):
    """A chat template with enable_thinking is reported as one --think / --no-think can set."""
    import synth
    from pyllm.info import model_info
    plain = synth.write_llama(tmp_path / "p.gguf")
    assert model_info(plain).thinking_switch is False
    p = synth.rewrite_metadata(plain, tmp_path / "t.gguf",
                               {"tokenizer.chat_template": "{{ 'T' if enable_thinking else 'N' }}"})
    info = model_info(p)
    assert info.thinking_switch and "chat template  present, with a thinking switch (--think / --no-think)" in info.format()

