"""Images in prompts: the vision encoder of an mmproj file (pyllm/vision.py) against a
slow loop-by-loop numpy version written here, the image store, the prompt layout
(llama.cpp's mtmd: Gemma 3's <start_of_image> rows <end_of_image>; SmolVLM's tiles
and overview between marker tokens), and a whole prompt with an image against the
numpy reference with the same rows (Gemma 3: the rows see each other; SmolVLM: causal).
benchmarks/compare_vision.py compares the same files with llama.cpp's mtmd.
"""
import base64
import io
import math

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT
from PIL import Image

import synth
from pyllm import Model
from pyllm.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError
from pyllm.vision import (MediaStore, VisionEncoder, fit_square, image_bytes, load_image,
                          scaled_to_longest_edge)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision")
    return {"lm": synth.write_gemma3(d / "lm.gguf", QT.F32, n_vocab=512),
            "mm": synth.write_mmproj(d / "mm.gguf", n_out=256, qtype=QT.F32),
            "mm16": synth.write_mmproj(d / "mm16.gguf", n_out=256),
            "swapped": synth.write_mmproj(d / "swapped.gguf", n_out=256, qtype=QT.F32, swapped_ffn=True),
            "narrow": synth.write_mmproj(d / "narrow.gguf", n_out=128), "dir": d,
            # SmolVLM's: a llama model with the image tokens, images scaled to 64 and cut in tiles of 32
            "smol": synth.write_llama(d / "smol.gguf", QT.F32, n_vocab=512, image_tokens=True),
            "idefics3": synth.write_mmproj(d / "idefics3.gguf", n_out=256, qtype=QT.F32, projector="idefics3",
                                           merge=2, longest_edge=64)}


def picture(seed: int = 0, shape=(32, 32, 3)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def ln(f, v, name, eps):
    return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + eps) * f(name + ".weight") + \
        f(name + ".bias")


def lin(f, v, name):
    return v @ f(name + ".weight").T + f(name + ".bias")


def gelu(u):
    return 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))


def gelu_erf(u):
    """The exact GELU, x Phi(x)."""
    return 0.5 * u * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))


def slow_patches(enc: VisionEncoder, pixels: np.ndarray) -> np.ndarray:
    """The patch convolution, patch by patch (no positions yet): [rows * cols, n_embd]."""
    p, W = enc.patch, enc.floats("v.patch_embd.weight")          # [n, 3, p, p]
    gh, gw = pixels.shape[1] // p, pixels.shape[2] // p
    x = np.zeros((gh * gw, enc.n_embd))
    for r in range(gh):
        for c in range(gw):
            x[r * gw + c] = np.einsum("ocij,cij->o", W, pixels[:, r * p:(r + 1) * p, c * p:(c + 1) * p])
    return x + enc.floats("v.patch_embd.bias") if enc.mf.has_tensor("v.patch_embd.bias") else x


def slow_tower(enc: VisionEncoder, x: np.ndarray) -> np.ndarray:
    """The layers, attention row by row, and the norms around them."""
    f, eps = enc.floats, enc.eps
    if enc.mf.has_tensor("v.pre_ln.weight"):
        x = ln(f, x, "v.pre_ln", eps)
    H, d = enc.n_head, enc.n_embd // enc.n_head
    for i in range(enc.n_layer):
        b = f"v.blk.{i}."
        h = ln(f, x, b + "ln1", eps)
        q, k, v = lin(f, h, b + "attn_q"), lin(f, h, b + "attn_k"), lin(f, h, b + "attn_v")
        att = np.zeros_like(h)
        for head in range(H):
            s = slice(head * d, (head + 1) * d)
            for t in range(len(h)):
                scores = k[:, s] @ q[t, s] / math.sqrt(d)
                w = np.exp(scores - scores.max())
                att[t, s] = (w / w.sum()) @ v[:, s]
        ls1, ls2 = (f(b + m + ".weight") if enc.mf.has_tensor(b + m + ".weight") else 1.0 for m in ("ls1", "ls2"))
        x = x + lin(f, att, b + "attn_out") * ls1
        up, down = b + "ffn_up", b + "ffn_down"
        if f(up + ".weight").shape[1] != x.shape[1]:    # old conversions' names: fc1 called ffn_down
            up, down = down, up
        u = lin(f, ln(f, x, b + "ln2", eps), up)
        x = x + lin(f, gelu(u) if enc.gelu else u / (1 + np.exp(-1.702 * u)), down) * ls2
    return ln(f, x, "v.post_ln", eps) if enc.mf.has_tensor("v.post_ln.weight") else x


def side_by_side(x: np.ndarray, rows: int, cols: int, k: int) -> np.ndarray:
    """Each k x k patches' rows in one row, row by row (the pixel shuffle)."""
    return np.array([np.concatenate([x[(r * k + i) * cols + c * k + j] for i in range(k) for j in range(k)])
                     for r in range(rows // k) for c in range(cols // k)])


def slow_encode(enc: VisionEncoder, pixels: np.ndarray) -> np.ndarray:
    """The encoder written out plainly: a convolution patch by patch, attention row by row,
    pooling window by window."""
    f, n, side = enc.floats, enc.n_embd, enc.side
    x = slow_tower(enc, slow_patches(enc, pixels.astype(np.float64)) + f("v.position_embd.weight"))
    k_, out_side = enc.merge, side // enc.merge
    if enc.projector == "idefics3":
        return side_by_side(x, side, side, k_) @ f("mm.model.fc.weight").T
    pooled = np.zeros((out_side * out_side, n))
    for r in range(out_side):
        for c in range(out_side):
            cells = [x[(r * k_ + i) * side + c * k_ + j] for i in range(k_) for j in range(k_)]
            pooled[r * out_side + c] = np.mean(cells, axis=0)
    pooled = pooled / np.sqrt((pooled ** 2).mean(-1, keepdims=True) + enc.eps) * f("mm.soft_emb_norm.weight")
    return pooled @ f("mm.input_projection.weight")


def test_encoder_matches_the_plain_loops(files):
    enc = VisionEncoder(files["mm"])
    px = enc.pixels(picture())
    got, want = enc.encode_pixels(px), slow_encode(enc, px.astype(np.float64))
    assert got.shape == (16, 256) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    enc.close()


def test_any_thread_count_gives_the_plain_loops(files):
    """Rows, (head, block) pairs and weight rows split among 1, 3 or 5 threads; quick-GELU and a
    pre-norm as some projectors have them."""
    path = synth.write_mmproj(files["dir"] / "quick.gguf", n_out=256, qtype=QT.F32, use_gelu=False, pre_ln=True)
    px = None
    for threads in (1, 3, 5):
        enc = VisionEncoder(path, n_threads=threads)
        px = enc.pixels(picture(4)) if px is None else px
        want = slow_encode(enc, px.astype(np.float64))
        np.testing.assert_allclose(enc.encode_pixels(px), want, rtol=0, atol=2e-4 * np.abs(want).max())
        enc.close()


def test_attention_in_blocks_of_rows(files):
    enc = VisionEncoder(files["mm"])
    h = np.random.default_rng(1).standard_normal((16, enc.n_embd)).astype(np.float32)
    whole = enc.attention(h, enc.layers[0])
    for block in (1, 5, 16):    # 16 rows in blocks of 5: a last block of 1
        np.testing.assert_allclose(enc.attention(h, enc.layers[0], block=block), whole, rtol=0, atol=1e-5)
    enc.close()


def test_pixels_are_normalized_channels_first(files):
    enc = VisionEncoder(files["mm"])
    img = picture(3)
    px = enc.pixels(img)
    raw = np.asarray(img, np.float32)
    assert px.shape == (3, 32, 32)
    np.testing.assert_allclose(px[1, 5, 7], (raw[5, 7, 1] / 255 - 0.5) / 0.5, rtol=1e-6)
    enc.close()


def test_old_ffn_names_are_swapped_back(files):
    a, b = VisionEncoder(files["mm"]), VisionEncoder(files["swapped"])
    img = picture(1)
    np.testing.assert_array_equal(a.encode(img), b.encode(img))   # same seed: the same weights, other names
    a.close()
    b.close()


def test_f16_projector_close_to_f32(files):
    a, b = VisionEncoder(files["mm"]), VisionEncoder(files["mm16"])
    x, y = a.encode(picture(2)), b.encode(picture(2))
    assert np.abs(x - y).max() < 0.02 * np.abs(x).max()
    assert not np.array_equal(x, y)
    a.close()
    b.close()


def test_a_wide_image_keeps_its_shape_on_black():
    img = Image.new("RGB", (40, 20), (255, 255, 255))
    sq = np.asarray(fit_square(img, 32))
    assert sq.shape == (32, 32, 3)
    assert (sq[:7] == 0).all() and (sq[-7:] == 0).all()     # 16 rows of picture in the middle
    assert (sq[9:23] == 255).all()
    same = picture()
    assert fit_square(same, 32) is same


def test_image_sources(tmp_path):
    data = png(picture())
    path = tmp_path / "x.png"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    for src in (data, str(path), path, b64, "data:image/png;base64," + b64):
        assert image_bytes(src) == data
    assert load_image(data).size == (32, 32)
    with pytest.raises(InvalidArgumentError, match="does not fetch"):
        image_bytes("https://example.com/a.png")
    with pytest.raises(InvalidArgumentError, match="neither an image file nor base64"):
        image_bytes("not base64 at all!")
    with pytest.raises(InvalidArgumentError, match="cannot decode the image"):
        load_image(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(InvalidArgumentError, match="must be base64"):
        image_bytes("data:image/png,abc")


def test_media_store_ids():
    store = MediaStore(keep=2)
    rows = {k: np.full((3, 4), i, np.float32) for i, k in enumerate((b"a", b"b", b"c"))}
    a = store.ids(b"a", lambda: rows[b"a"])
    assert a == [-1, -2, -3]
    assert store.ids(b"a", lambda: pytest.fail("encoded twice")) == a
    b = store.ids(b"b", lambda: rows[b"b"])
    assert b == [-4, -5, -6]
    np.testing.assert_array_equal(store.rows(b[1:]), rows[b"b"][1:])
    assert store.image_of(a[2]) == 0 and store.image_of(b[0]) == 3
    store.ids(b"c", lambda: rows[b"c"])            # keeps 2: "a" goes
    with pytest.raises(InvalidArgumentError, match="no longer holds"):
        store.rows(a)
    again = store.ids(b"a", lambda: rows[b"a"])
    assert again == [-10, -11, -12]                 # new ids: the old ones may be in a cached prefix


def test_bad_projector_files(files, tmp_path):
    with pytest.raises(InvalidArgumentError, match="not a multimodal projector"):
        VisionEncoder(files["lm"])
    broken = synth.write_mmproj(tmp_path / "broken.gguf", drop_tensor="v.blk.1.attn_k.weight")
    with pytest.raises(ModelFileError, match="attn_k.weight is missing"):
        VisionEncoder(broken)
    other = synth.write_mmproj(tmp_path / "other.gguf", projector="resampler")    # MiniCPM-V's
    with pytest.raises(UnsupportedModelError, match="resampler"):
        VisionEncoder(other)
    with pytest.raises(InvalidArgumentError, match="is a multimodal projector .* --mmproj"):
        Model(files["mm"])
    with pytest.raises(InvalidArgumentError, match="belongs to another model"):
        Model(files["lm"], mmproj=files["narrow"], n_ctx=128)


def test_prompt_layout(files):
    m = Model(files["lm"], mmproj=files["mm"], n_ctx=256)
    begin, end = m.tokenize("<start_of_image>", special=True, add_bos=False), \
        m.tokenize("<end_of_image>", special=True, add_bos=False)
    ids = m.media_prompt("look: <__media__> now", [picture()])
    first = next(i for i, t in enumerate(ids) if t < 0)
    rows = [t for t in ids if t < 0]
    assert len(rows) == 16 and rows == list(range(rows[0], rows[0] - 16, -1))
    assert ids[:first] == m.tokenize("look: <start_of_image>", special=True)
    assert ids[first + 16:] == m.tokenize("<end_of_image> now", special=True, add_bos=False)
    assert ids[first - len(begin):first] == begin and ids[first + 16:first + 16 + len(end)] == end
    no_marker = m.media_prompt("now", [picture()])     # the images go first; the same picture: the same rows
    assert [t for t in no_marker if t < 0] == rows
    with pytest.raises(InvalidArgumentError, match="marks 2 images"):
        m.media_prompt("<__media__> and <__media__>", [picture()])
    m.close()


def test_text_only_model_refuses_images(files):
    m = Model(files["lm"], n_ctx=128)
    msg = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    with pytest.raises(InvalidArgumentError, match="--mmproj"):
        m.chat(msg, max_tokens=1)
    with pytest.raises(InvalidArgumentError, match="--mmproj"):
        m.generate("hi", images=[png(picture())], max_tokens=1)
    m.close()


def reference_logits(path: str, tokens: list, rows: np.ndarray, span: tuple) -> np.ndarray:
    from pyllm.arch import load_architecture
    from pyllm.model_file import ModelFile
    from pyllm.reference import Reference
    mf = ModelFile(path)
    ref = Reference(load_architecture(mf))
    local = [t if t >= 0 else -1 - (i - span[0]) for i, t in enumerate(tokens)]
    out = ref.forward(np.array(local), media=rows, bidirectional=[span])
    mf.close()
    return out


def test_a_prompt_with_an_image_matches_the_reference(files):
    m = Model(files["lm"], mmproj=files["mm"], n_ctx=256)
    img = picture(4)
    ids = m.media_prompt("what is <__media__> this", [img])
    start = next(i for i, t in enumerate(ids) if t < 0)
    rows = m.engine.media.rows(ids[start:start + 16])
    np.testing.assert_array_equal(rows, VisionEncoder(files["mm"]).encode(img))
    logits, _ = m.engine.prefill(m.engine.new_sequence(), ids)
    want = reference_logits(files["lm"], ids, rows, (start, start + 16))[-1]
    spread = want.max() - want.min()
    assert np.abs(logits - want).max() < 2e-4 * spread
    causal = reference_logits(files["lm"], ids, rows, (start, start + 1))[-1]   # a span of one: causal
    assert np.abs(causal - want).max() > 2e-3 * spread        # the rows seeing each other matters here
    m.close()


def test_generate_and_chat_with_an_image(files):
    m = Model(files["lm"], mmproj=files["mm"], n_ctx=256)
    data = png(picture(5))
    a = m.generate("describe", images=[data], max_tokens=4, temperature=0)
    b = m.generate("<__media__>describe", images=["data:image/png;base64," + base64.b64encode(data).decode()],
                   max_tokens=4, temperature=0)
    assert a.tokens == b.tokens and a.metrics.prompt_tokens == b.metrics.prompt_tokens
    assert b.metrics.reused_tokens == b.metrics.prompt_tokens - 1       # the same image: its rows were cached
    other = m.generate("describe", images=[png(picture(6))], max_tokens=1, temperature=0)
    assert other.metrics.reused_tokens < a.metrics.prompt_tokens - 16   # another image: computed again
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," +
                                                                            base64.b64encode(data).decode()}},
                                         {"type": "text", "text": "describe"}]}]
    c = m.chat(msgs, max_tokens=3, temperature=0)
    assert c.metrics.prompt_tokens == len(m.chat_tokens(msgs))
    ollama_style = [{"role": "user", "content": "describe", "images": [base64.b64encode(data).decode()]}]
    assert m.chat_tokens(ollama_style) == m.chat_tokens(msgs)
    m.close()


def test_chat_session_keeps_the_image(files):
    from pyllm.chat import ChatSession
    m = Model(files["lm"], mmproj=files["mm"], n_ctx=256)
    s = ChatSession(m, max_tokens=3, temperature=0)
    first = s.send("what is this", images=[png(picture(7))]).run()
    assert first.metrics.prompt_tokens > 16
    second = s.send("and now").run()
    assert second.metrics.reused_tokens >= first.metrics.prompt_tokens   # the image's rows stay cached
    assert "images" in s.messages[0]
    m.close()


def test_a_saved_state_refuses_image_rows(files, tmp_path):
    m = Model(files["lm"], mmproj=files["mm"], n_ctx=256)
    m.generate("hi", images=[png(picture())], max_tokens=1)
    with pytest.raises(InvalidArgumentError, match="images cannot be saved"):
        m.save_state(tmp_path / "s.npz")
    m.close()


def test_served_images(files):
    from test_server import call, served
    m = Model(files["lm"], mmproj=files["mm"], n_ctx=256)
    data = png(picture(8))
    b64 = base64.b64encode(data).decode()
    parts = [{"type": "text", "text": "describe"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}]
    want = m.chat([{"role": "user", "content": parts}], max_tokens=4, temperature=0)
    assert want.text
    with served(m, name="vision") as server:
        status, body = call(server.url, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": parts}], "max_tokens": 4, "temperature": 0})
        assert status == 200 and body["choices"][0]["message"]["content"] == want.text
        assert body["usage"]["prompt_tokens"] == want.metrics.prompt_tokens
        ollama = [{"role": "user", "content": "describe", "images": [b64]}]
        status, body = call(server.url, "/api/chat", {"messages": ollama, "stream": False,
                                                      "options": {"temperature": 0, "num_predict": 4}})
        assert status == 200 and body["prompt_eval_count"] == len(m.chat_tokens(ollama))
        status, body = call(server.url, "/api/generate", {"prompt": "describe", "images": [b64], "stream": False,
                                                          "options": {"temperature": 0, "num_predict": 4}})
        assert status == 200 and body["prompt_eval_count"] == len(m.chat_tokens(ollama))
        source = {"type": "base64", "media_type": "image/png", "data": b64}
        status, body = call(server.url, "/v1/messages", {"max_tokens": 4, "temperature": 0, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "describe"}, {"type": "image", "source": source}]}]})
        assert status == 200 and body["content"][0]["text"] == want.text
        status, body = call(server.url, "/v1/responses", {"max_output_tokens": 4, "temperature": 0, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "describe"},
                                         {"type": "input_image", "image_url": "data:image/png;base64," + b64}]}]})
        assert status == 200 and body["output"][-1]["content"][0]["text"] == want.text
        assert call(server.url, "/props")[1]["modalities"]["vision"] is True
        assert "vision" in call(server.url, "/api/show", {"model": "vision"})[1]["capabilities"]
        status, body = call(server.url, "/api/generate", {"prompt": "x", "images": ["not an image"]})
        assert status == 400 and "neither an image or sound file nor base64" in body["error"]
    m.close()


def test_command_line(files):
    from test_cli import one_error_line, pyllm
    img = files["dir"] / "pic.png"
    img.write_bytes(png(picture(9)))
    m = Model(files["lm"], mmproj=files["mm"], n_ctx=256)
    want = m.generate("describe", images=[str(img)], max_tokens=3, temperature=0)
    chat = m.chat([{"role": "user", "content": "describe", "images": [str(img)]}], max_tokens=3, temperature=0)
    m.close()
    r = pyllm("run", "-m", files["lm"], "--mmproj", files["mm"], "--image", str(img), "-p", "describe", "-n", "3",
              "--temp", "0", "--json", "-c", "256")
    assert r.returncode == 0, r.stderr
    import json
    out = json.loads(r.stdout)
    assert out["tokens"] == want.tokens and out["prompt_tokens"] == want.metrics.prompt_tokens
    r = pyllm("run", files["lm"], f"describe {img}", "--mmproj", files["mm"], "-n", "3", "--temp", "0", "-c", "256")
    assert r.returncode == 0 and r.stdout.strip() == chat.text.strip(), r.stderr   # ollama run's way
    assert "note: image encoded in " in r.stderr and ": 16 rows" in r.stderr          # a long pause explained
    r = pyllm("info", files["mm"], "--json")
    facts = json.loads(r.stdout)
    assert r.returncode == 0 and (facts["projector"], facts["image_tokens"], facts["n_embd_out"]) == ("gemma3", 16, 256)
    one_error_line(pyllm("run", "-m", files["lm"], "--image", str(img), "-p", "x"), "--mmproj")
    one_error_line(pyllm("run", "-m", files["lm"], "--mmproj", files["mm"], "--image", "/nonexistent.png",
                         "-p", "x"), "cannot read the image /nonexistent.png")
    script = f"/image {img}\n/set parameter temperature 0\n/set parameter num_predict 3\ndescribe\n/image /nope.png\n"
    r = pyllm("chat", "-m", files["lm"], "--mmproj", files["mm"], "-c", "256", input=script)
    assert r.returncode == 0, r.stderr
    assert chat.text and "attached to the next message (1 image)" in r.stderr and chat.text in r.stdout
    assert "cannot read the image /nope.png" in r.stderr
    r = pyllm("chat", "-m", files["lm"], "--mmproj", files["mm"], "-c", "256",
              input=f"/set parameter temperature 0\n/set parameter num_predict 3\ndescribe {img}\n")
    assert r.returncode == 0, r.stderr
    assert "[1 image from the message]" in r.stderr and chat.text in r.stdout   # ollama's: the path shows it
    r = pyllm("chat", "-m", files["lm"], "-c", "256", input=f"/image {img}\n")
    assert "start the chat with --mmproj" in r.stderr


def test_offloaded_model_keeps_the_embedding_on_the_host(files):
    """On a (simulated) GPU with every layer there, the token embedding stays on the host, where a
    prompt's image rows are; the reply is the CPU's."""
    data = png(picture(10))
    with Model(files["lm"], mmproj=files["mm"], n_ctx=256) as cpu:
        want = cpu.generate("describe", images=[data], max_tokens=4, temperature=0)
    with Model(files["lm"], mmproj=files["mm"], n_ctx=256, device="sim", n_gpu_layers="all") as gpu:
        assert gpu.plan is not None and gpu.plan.units["embed"] == "cpu" and gpu.plan.units["head"] == "gpu"
        assert gpu.generate("describe", images=[data], max_tokens=4, temperature=0).tokens == want.tokens
    with Model(files["lm"], mmproj=files["mm"], n_ctx=256, device="sim", n_gpu_layers=3) as half:
        assert half.plan.units[5] == "gpu" and half.plan.units[0] == "cpu"
        assert half.generate("describe", images=[data], max_tokens=4, temperature=0).tokens == want.tokens


def test_image_paths_in_a_message(tmp_path):
    from cli.common import images_in
    (tmp_path / "a b.png").write_bytes(b"A")
    (tmp_path / "c.JPG").write_bytes(b"C")
    text, found = images_in(f"compare {tmp_path}/c.JPG with '{tmp_path}/a b.png' please")
    assert (text, found) == ("compare with please", [b"C", b"A"])
    assert images_in(f"see {tmp_path}/missing.png") == (f"see {tmp_path}/missing.png", [])
    assert images_in("a file.png\nsecond line") == ("a file.png\nsecond line", [])


# -- Idefics3 (SmolVLM): tiles and an overview ------------------------------------------------------------

def test_idefics3_encoder_matches_the_plain_loops(files):
    enc = VisionEncoder(files["idefics3"], n_threads=3)
    px = enc.pixels(picture(5))
    want = slow_encode(enc, px.astype(np.float64))
    got = enc.encode_pixels(px)
    assert got.shape == (16, 256)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    enc.close()


def test_tiles_encoded_together_as_one_by_one(files):
    """Several tiles go through the layers together (larger matrix products); a tile's rows
    attend only to its own, in blocks of rows that need not divide it."""
    enc = VisionEncoder(files["idefics3"], n_threads=2)
    px = np.stack([enc.pixels(picture(s)) for s in (10, 11, 12)])
    together = enc.encode_pixels(px)
    alone = np.concatenate([enc.encode_pixels(t) for t in px])
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-5 * np.abs(alone).max())
    enc.tiles_at_once = 2                       # two, then one
    np.testing.assert_allclose(enc.encode_pixels(px), alone, rtol=0, atol=1e-5 * np.abs(alone).max())
    h = np.random.default_rng(2).standard_normal((3 * 64, enc.n_embd)).astype(np.float32)
    apart = np.concatenate([enc.attention(h[i * 64:(i + 1) * 64], enc.layers[0]) for i in range(3)])
    np.testing.assert_allclose(enc.attention(h, enc.layers[0], block=24, seq=64), apart, rtol=0, atol=1e-5)
    enc.close()


def test_idefics3_tiles(tmp_path):
    """transformers' resize to the longest edge (the short side truncated, then made even),
    mtmd's grid (each side rounded up to tiles), the overview made from the stretched image."""
    assert scaled_to_longest_edge(100, 70, 64) == (64, 44)
    assert scaled_to_longest_edge(99, 100, 64) == (64, 64)     # 63.36 -> 63, odd -> 64
    assert scaled_to_longest_edge(60, 200, 64) == (20, 64)
    assert scaled_to_longest_edge(300, 2, 64) == (64, 1)       # 0.43 -> 0: at least one row
    path = synth.write_mmproj(tmp_path / "t.gguf", projector="idefics3", merge=2, longest_edge=64)
    enc = VisionEncoder(path)
    assert enc.grid(45, 20) == (2, 1) and enc.grid(20, 45) == (1, 2) and enc.grid(9, 13) == (2, 2)
    assert enc.grid(32, 32) == (2, 2) and enc.grid(640, 10) == (2, 1)
    img = picture(6, (20, 45, 3))
    tiles = enc.tiles(img)
    assert len(tiles) == 3 and all(t.shape == (32, 32, 3) for t in tiles)
    stretched = img.resize((64, 28), Image.LANCZOS).resize((64, 32), Image.LANCZOS)
    np.testing.assert_array_equal(np.hstack(tiles[:2]), np.asarray(stretched))
    np.testing.assert_array_equal(tiles[2], np.asarray(stretched.resize((32, 32), Image.LANCZOS)))
    assert enc.encode(img).shape == (3 * 16, 256)
    enc.close()


def test_idefics3_prompt_layout(files):
    """mtmd's: per tile <fake_token_around_image><row_r_col_c> and its rows, a newline between
    rows of tiles, then \n\n <fake_token_around_image><global-img>, the overview's rows,
    <fake_token_around_image>; every piece tokenized on its own."""
    m = Model(files["smol"], mmproj=files["idefics3"], n_ctx=512)

    def tok(text):
        return m.tokenize(text, special=True, add_bos=False)
    fake, glob, nl, nl2 = tok("<fake_token_around_image>"), tok("<global-img>"), tok("\n"), tok("\n\n")
    assert len(fake) == len(glob) == len(nl) == len(nl2) == 1      # one token each, as mtmd looks them up
    ids = m.media_prompt("look: <__media__> now", [picture(7, (20, 45, 3))])    # 2 x 1 tiles
    rows = [t for t in ids if t < 0]
    assert len(rows) == 48 and rows == list(range(rows[0], rows[0] - 48, -1))
    want = m.tokenize("look: ", special=True)
    for k, (r, c) in enumerate([(1, 1), (1, 2)]):
        want += fake + tok(f"<row_{r}_col_{c}>") + rows[16 * k:16 * (k + 1)]
    want += nl2 + fake + glob + rows[32:] + fake + tok(" now")
    assert ids == want
    tall = m.media_prompt("<__media__>", [picture(7, (45, 20, 3))])                # 1 x 2 tiles
    rows = [t for t in tall if t < 0]
    want = m.tokenize("", special=True) + fake + tok("<row_1_col_1>") + rows[:16] + nl + fake + \
        tok("<row_2_col_1>") + rows[16:32] + nl2 + fake + glob + rows[32:] + fake
    assert tall == want
    m.close()


def assert_prompt_matches_the_reference(m, lm: str, mm: str, img, then: tuple = ()) -> list:
    """The logits after "what is <image> this" (the image's rows stored as the encoder makes
    them), and after each token of `then` run one by one after it, against the numpy
    reference given the same rows (and, for M-RoPE, the engine's positions); returns the
    prompt's ids."""
    ids = m.media_prompt("what is <__media__> this", [img])
    rows = m.engine.media.rows([t for t in ids if t < 0])
    np.testing.assert_array_equal(rows, VisionEncoder(mm).encode(img))
    seq = m.engine.new_sequence()
    logits, _ = m.engine.prefill(seq, ids)
    got = [logits] + [m.engine._run(seq, [t])[-1].copy() for t in then]
    local, j = [], 0
    for t in ids:
        local.append(t if t >= 0 else -1 - j)
        j += t < 0
    from pyllm.arch import load_architecture
    from pyllm.model_file import ModelFile
    from pyllm.reference import Reference
    mf = ModelFile(lm)
    every = ids + list(then)
    rope_pos = m.engine.mrope_positions(every, 0) if m.engine.mrope else None
    want = Reference(load_architecture(mf)).forward(np.array(local + list(then)), media=rows, rope_pos=rope_pos)
    mf.close()
    for k, lg in enumerate(got):
        w = want[len(ids) - 1 + k]
        assert np.abs(lg - w).max() < 2e-4 * (w.max() - w.min())
    seq.release()
    return ids


def test_an_idefics3_prompt_matches_the_reference(files):
    """Causal: the image rows are a prompt's tokens like any other, in their tiles' runs."""
    m = Model(files["smol"], mmproj=files["idefics3"], n_ctx=512)
    img = picture(9, (40, 30, 3))
    ids = assert_prompt_matches_the_reference(m, files["smol"], files["idefics3"], img)
    out = m.generate("what is <__media__> this", images=[img], max_tokens=3, temperature=0)
    assert out.metrics.prompt_tokens == len(ids)
    m.close()


def test_bad_idefics3_files(tmp_path):
    no_fc = synth.write_mmproj(tmp_path / "nofc.gguf", projector="idefics3", drop_tensor="mm.model.fc.weight")
    with pytest.raises(ModelFileError, match="mm.model.fc.weight is missing"):
        VisionEncoder(no_fc)
    odd = synth.write_mmproj(tmp_path / "odd.gguf", projector="idefics3", merge=3)    # 8 patches a side
    with pytest.raises(ModelFileError, match="merge of 3"):
        VisionEncoder(odd)
    huge = synth.write_mmproj(tmp_path / "huge.gguf", projector="idefics3", longest_edge=1 << 20)
    with pytest.raises(ModelFileError, match="beyond any projector"):
        VisionEncoder(huge)


# -- LLaVA 1.5: CLIP (a class row, a pre-norm), every patch's row through an MLP ----------------------------

def slow_class_tower(enc: VisionEncoder, pixels: np.ndarray, class_last: bool = False) -> np.ndarray:
    """A CLIP-like tower with a class row (LLaVA's, InternVL's) as transformers runs it: the class
    row, then the patches, each with its position, through the layers; the patches' rows out.
    class_last: as llama.cpp's mtmd runs it at this writing (the class row after the patches,
    the positions in that order, and the first of the rows dropped instead of the class row)."""
    f = enc.floats
    x = slow_patches(enc, pixels)
    cls = f("v.class_embd")[None]
    x = np.concatenate([x, cls] if class_last else [cls, x]) + f("v.position_embd.weight")
    x = slow_tower(enc, x)
    return x[:-1] if class_last and enc.projector == "internvl" else x[1:]


def slow_llava_encode(enc: VisionEncoder, pixels: np.ndarray, class_last: bool = False) -> np.ndarray:
    """LLaVA's encoder as transformers runs it: the class row first, then the patches, each
    with its position; the file's layers; the patches' rows (not the class row's) through
    Linear, GELU, Linear (Yi-VL's with a layer norm after each). class_last: as llama.cpp's mtmd
    runs it at this writing (slow_class_tower; for LLaVA it drops the first patch's row, not the
    class row)."""
    f = enc.floats
    x = slow_class_tower(enc, pixels, class_last)
    if enc.mf.has_tensor("mm.3.weight"):
        h = gelu(ln(f, lin(f, x, "mm.0"), "mm.1", enc.eps))
        return ln(f, lin(f, h, "mm.3"), "mm.4", enc.eps)
    return lin(f, gelu(lin(f, x, "mm.0")), "mm.2")


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    d = tmp_path_factory.mktemp("llava")
    return {"lm": synth.write_llama(d / "lm.gguf", QT.F32, n_vocab=512), "dir": d,
            "mm": synth.write_mmproj(d / "mm.gguf", n_out=256, qtype=QT.F32, projector="mlp", use_gelu=False,
                                     n_layer=3),
            "yi": synth.write_mmproj(d / "yi.gguf", n_out=256, qtype=QT.F32, projector="mlp", use_gelu=False,
                                     mlp_norm=True)}


@pytest.mark.parametrize("which", ["mm", "yi"])
def test_llava_encoder_matches_the_plain_loops(llava, which):
    """Every stored layer runs (the converter already dropped CLIP's last), the class row goes
    first and is left out of the rows; 8 x 8 patches: 64 rows, 1 to 3 threads."""
    for threads in (1, 3):
        enc = VisionEncoder(llava[which], n_threads=threads)
        px = enc.pixels(picture(21, (45, 30, 3)))
        got, want = enc.encode_pixels(px), slow_llava_encode(enc, px.astype(np.float64))
        assert got.shape == (64, 256) and enc.image_tokens() == 64 and enc.merge == 1
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
        # the class row's place matters: mtmd's order gives other rows
        assert np.abs(slow_llava_encode(enc, px.astype(np.float64), class_last=True) - want).max() > \
            0.05 * np.abs(want).max()
        enc.close()


def test_llava_fits_the_image_on_its_grey():
    """A wide picture is scaled (bicubic) to the square's width and centred on LLaVA's padding
    colour (CLIP's mean), not black."""
    from pyllm.vision import LLAVA_PAD, fit
    sq = np.asarray(fit(Image.new("RGB", (40, 20), (255, 255, 255)), 32, 32, bicubic=True, pad=LLAVA_PAD))
    assert sq.shape == (32, 32, 3)
    assert (sq[:7] == LLAVA_PAD).all() and (sq[-7:] == LLAVA_PAD).all()
    assert (sq[9:23] == 255).all()


def test_a_llava_prompt_matches_the_reference(llava):
    """The image's rows alone in place of <__media__> (no marker tokens), causal like text."""
    m = Model(llava["lm"], mmproj=llava["mm"], n_ctx=512)
    img = picture(22, (50, 40, 3))
    ids = assert_prompt_matches_the_reference(m, llava["lm"], llava["mm"], img, then=(40, 41))
    first = next(i for i, t in enumerate(ids) if t < 0)
    assert ids[:first] == m.tokenize("what is ") and sum(t < 0 for t in ids) == 64
    assert ids[first + 64:] == m.tokenize(" this", add_bos=False)
    m.close()


def test_a_llava_chat_takes_vicuna_s_turns(llava):
    """A language model without a chat template, read with LLaVA's projector: Vicuna's turns
    (llama.cpp's "vicuna", LLaVA 1.5's), the picture's rows in the user's turn."""
    m = Model(llava["lm"], mmproj=llava["mm"], n_ctx=512)
    assert m.chat_template.name == "vicuna"
    msg = [{"role": "user", "content": "what is this?", "images": [png(picture(23))]}]
    assert m.apply_chat_template([{"role": "user", "content": "what is this?"}]) == "USER: what is this?\nASSISTANT:"
    out = m.chat(msg, max_tokens=2, temperature=0)
    assert out.metrics.prompt_tokens == len(m.tokenize("USER: ")) + 64 + len(m.tokenize("what is this?\nASSISTANT:",
                                                                                      add_bos=False))
    m.close()
    plain = Model(llava["lm"], n_ctx=128)     # the same model without the projector: ChatML, as any llama
    assert plain.chat_template.name == "chatml"
    plain.close()


PINPOINTS = [32, 64, 64, 32, 64, 64, 96, 32, 32, 96]    # LLaVA 1.6's grids at a 32-pixel square, (height, width)


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    d = tmp_path_factory.mktemp("llava_next")
    return {"lm": synth.write_llama(d / "lm.gguf", QT.F32, n_vocab=512),
            "mm": synth.write_mmproj(d / "mm.gguf", n_out=256, qtype=QT.F32, projector="mlp", use_gelu=False,
                                     keys={"image_grid_pinpoints": PINPOINTS}),
            "flat": synth.write_mmproj(d / "flat.gguf", n_out=256, qtype=QT.F32, projector="mlp", use_gelu=False,
                                       keys={"image_grid_pinpoints": PINPOINTS, "mm_patch_merge_type": "flat"})}


def test_llava_next_grids():
    """transformers' select_best_resolution: the size that shows most of the image fitted into it,
    the least wasted on a tie, the first on a tie of both."""
    from pyllm.vision import best_resolution
    sizes = list(zip(PINPOINTS[0::2], PINPOINTS[1::2]))
    assert best_resolution(45, 20, sizes) == (32, 64)     # 45 x 20 shows whole in 64 x 32 (w x h), least wasted
    assert best_resolution(20, 45, sizes) == (64, 32)
    assert best_resolution(50, 50, sizes) == (64, 64)
    assert best_resolution(100, 20, sizes) == (32, 96)    # shown at 96 x 19: more than 64 x 12 in 64 x 32
    assert best_resolution(500, 480, sizes) == (64, 64)   # none whole: the most shown (64 x 61)


def slow_llava_next_rows(enc: VisionEncoder, rows: np.ndarray, width: int, height: int) -> np.ndarray:
    """LLaVA-NeXT's packing written out: the whole image's rows, then the grid's patches row by row
    of the picture they make, those inside the image's own aspect ratio, a newline row after each
    row of the picture."""
    plan, side, P = enc.plan(width, height), enc.side, enc.n_tokens
    H, W = plan.rows * side, plan.cols * side
    at = {}    # (row, col) of the picture of patches -> its row of the encoder's output
    for ty in range(plan.rows):
        for tx in range(plan.cols):
            for r in range(side):
                for c in range(side):
                    at[ty * side + r, tx * side + c] = rows[(ty * plan.cols + tx) * P + r * side + c]
    keep_rows, keep_cols = range(H), range(W)
    if width * H > height * W:     # wider than the grid: its bands are rows above and below
        shown = int(round(height * W / width, 7))
        keep_rows = range((H - shown) // 2, H - (H - shown) // 2)
    else:
        shown = int(round(width * H / height, 7))
        keep_cols = range((W - shown) // 2, W - (W - shown) // 2)
    out = list(rows[plan.n_tiles * P:])
    for r in keep_rows:
        out += [at[r, c] for c in keep_cols] + [enc.floats("model.image_newline")]
    return np.array(out)


def test_llava_next_rows(llava_next):
    """The whole image's 64 rows first, then the grid's patches cut to the picture's aspect ratio
    with a newline row after each row of them (spatial_unpad); "flat": every tile's rows as they are."""
    enc, flat = VisionEncoder(llava_next["mm"]), VisionEncoder(llava_next["flat"])
    for size in ((45, 20), (20, 45), (50, 50), (100, 20)):
        img = picture(40, (size[1], size[0], 3))
        plan = enc.plan(*size)
        tiles = enc.encode_pixels([enc.normalize(t) for t in enc.tiles(img)])
        assert len(tiles) == (plan.n_tiles + 1) * 64
        got = enc.encode(img)
        np.testing.assert_array_equal(got, slow_llava_next_rows(enc, tiles, *size))
        np.testing.assert_array_equal(flat.encode(img), np.concatenate([tiles[-64:], tiles[:-64]]))
    # 45 x 20 in a 64 x 32 grid (16 x 8 patches) spans 7.1 rows of patches: (8 - 7) // 2 = 0 cut on each
    # side, all 8 kept (16 + 1 rows each); 100 x 20 in 96 x 32 (24 x 8): 4 rows shown, 2 cut each side
    assert len(enc.encode(picture(41, (20, 45, 3)))) == 64 + 8 * 17
    assert len(enc.encode(picture(41, (20, 100, 3)))) == 64 + 4 * 25
    enc.close()
    flat.close()


def test_a_llava_next_prompt_matches_the_reference(llava_next):
    m = Model(llava_next["lm"], mmproj=llava_next["mm"], n_ctx=512)
    ids = assert_prompt_matches_the_reference(m, llava_next["lm"], llava_next["mm"], picture(42, (20, 45, 3)))
    assert sum(t < 0 for t in ids) == 64 + 8 * 17
    m.close()


def test_bad_llava_files(tmp_path):
    for pins, what in (([32, 64, 64], "not a list"), ([32, 48], "not a list"), ([0, 32], "not a list")):
        odd = synth.write_mmproj(tmp_path / "odd.gguf", projector="mlp", keys={"image_grid_pinpoints": pins})
        with pytest.raises(ModelFileError, match=what):
            VisionEncoder(odd)
    merge = synth.write_mmproj(tmp_path / "merge.gguf", projector="mlp",
                               keys={"image_grid_pinpoints": [32, 64], "mm_patch_merge_type": "spatial"})
    with pytest.raises(UnsupportedModelError, match="patch merge of 'spatial'"):
        VisionEncoder(merge)
    no_newline = synth.write_mmproj(tmp_path / "nonl.gguf", projector="mlp", keys={"image_grid_pinpoints": [32, 64]},
                                    drop_tensor="model.image_newline")
    with pytest.raises(ModelFileError, match="image_newline tensor is missing"):
        VisionEncoder(no_newline)
    layers = synth.write_mmproj(tmp_path / "layers.gguf", projector="mlp", keys={"feature_layer": [1, 2]})
    with pytest.raises(UnsupportedModelError, match="several encoder layers"):
        VisionEncoder(layers)
    for tensor in ("mm.2.weight", "v.class_embd", "v.blk.1.ffn_down.weight"):
        path = synth.write_mmproj(tmp_path / "drop.gguf", projector="mlp", drop_tensor=tensor)
        if tensor == "v.class_embd":    # no class row: then the position table is one row too long
            with pytest.raises(ModelFileError, match=r"position_embd.weight has shape \[64, 65\], expected \[64, 64\]"):
                VisionEncoder(path)
        else:
            with pytest.raises(ModelFileError, match=tensor.replace(".", r"\.") + " is missing"):
                VisionEncoder(path)


# -- InternVL: InternViT (a class row, layer scales), tiles and an overview, 2 x 2 patches through an MLP ----

def slow_internvl_encode(enc: VisionEncoder, pixels: np.ndarray, class_last: bool = False) -> np.ndarray:
    """InternVL's encoder of one tile written out: the class tower, each 2 x 2 patches' rows in
    one row, a layer norm (eps 1e-5), Linear, GELU, Linear."""
    f, side = enc.floats, enc.side
    x = side_by_side(slow_class_tower(enc, pixels, class_last), side, side, enc.merge)
    return lin(f, gelu(lin(f, ln(f, x, "mm.model.mlp.0", 1e-5), "mm.model.mlp.1")), "mm.model.mlp.3")


@pytest.fixture(scope="module")
def internvl(tmp_path_factory):
    d = tmp_path_factory.mktemp("internvl")
    return {"lm": synth.write_qwen2(d / "lm.gguf", QT.F32, n_vocab=512, image_tokens="internvl"),
            "mm": synth.write_mmproj(d / "mm.gguf", n_out=256, qtype=QT.F32, projector="internvl", n_layer=3,
                                     keys={"preproc_max_tiles": 6})}


def test_internvl_encoder_matches_the_plain_loops(internvl):
    """The class row first (left out of the rows), the layer scales, 2 x 2 patches side by side,
    the MLP; 8 x 8 patches a tile: 16 rows; 1 or 3 threads."""
    for threads in (1, 3):
        enc = VisionEncoder(internvl["mm"], n_threads=threads)
        px = enc.pixels(picture(31, (30, 20, 3)))
        got, want = enc.encode_pixels(px), slow_internvl_encode(enc, px.astype(np.float64))
        assert got.shape == (16, 256)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
        assert np.abs(slow_internvl_encode(enc, px.astype(np.float64), class_last=True) - want).max() > \
            0.05 * np.abs(want).max()
        enc.close()


def test_internvl_grids_and_tiles(internvl):
    """An image within the square is read whole (stretched to it); a larger one as the tiles of the
    grid that shows most of it (the least wasted on a tie; at most the file's 6 tiles), cut from
    the image fitted into the grid on black, then the overview; 16 rows each."""
    from pyllm.vision import best_grid, internvl_grids
    grids = internvl_grids(1, 6)
    assert grids[:7] == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (2, 1)] and len(grids) == 14
    assert internvl_grids(2, 4) == [(2, 2)]    # mtmd's bounds: each side at least the fewest tiles
    assert best_grid(64, 64, grids, 32) == (2, 2)       # shown whole by 2 x 2 and larger: 2 x 2 wastes least
    # none of 6 tiles or fewer shows these whole: the most pixels (96 x 38 of 100 x 40 by 3 x 2, where
    # 4 x 1 shows 80 x 32; 71 x 64 of 1000 x 900, where 2 x 2 and 2 x 3 show 64 x 57)
    assert best_grid(100, 40, grids, 32) == (3, 2) and best_grid(40, 100, grids, 32) == (2, 3)
    assert best_grid(1000, 900, grids, 32) == (3, 2)
    enc = VisionEncoder(internvl["mm"])
    assert enc.plan(32, 20).n_tiles == 0 and enc.plan(33, 20).n_tiles == 2
    wide = Image.new("RGB", (100, 40), (255, 255, 255))
    tiles = enc.tiles(wide)
    assert len(tiles) == 7 and all(t.shape == (32, 32, 3) for t in tiles)
    # 96 x 39 fitted into the 96 x 64 grid: 12 black rows above, 13 below
    assert (tiles[0][:12] == 0).all() and (tiles[0][13:] == 255).all() and (tiles[4][-13:] == 0).all()
    assert (tiles[-1] == 255).all()                                          # the overview: stretched
    assert enc.encode(wide).shape == (7 * 16, 256)
    enc.close()


def test_an_internvl_prompt_matches_the_reference(internvl):
    """<img>, the tiles' rows, the overview's, </img>; causal like text."""
    m = Model(internvl["lm"], mmproj=internvl["mm"], n_ctx=512)
    img = picture(32, (40, 70, 3))     # 70 x 40: whole in 3 x 2 tiles (6 x 16 rows), then the overview
    ids = assert_prompt_matches_the_reference(m, internvl["lm"], internvl["mm"], img, then=(40,))
    first = next(i for i, t in enumerate(ids) if t < 0)
    assert sum(t < 0 for t in ids) == 7 * 16
    assert ids[:first] == m.tokenize("what is <img>", special=True)
    assert ids[first + 7 * 16:] == m.tokenize("</img> this", special=True, add_bos=False)
    m.close()


def test_bad_internvl_files(tmp_path):
    for tensor in ("v.class_embd", "mm.model.mlp.0.weight", "v.blk.1.ls2.weight"):
        path = synth.write_mmproj(tmp_path / "drop.gguf", projector="internvl", drop_tensor=tensor)
        if tensor.endswith("ls2.weight"):    # a layer scale is optional: without it, 1
            VisionEncoder(path).close()
            continue
        with pytest.raises(ModelFileError, match=tensor.replace(".", r"\.") + " is missing"):
            VisionEncoder(path)
    crossed = synth.write_mmproj(tmp_path / "crossed.gguf", projector="internvl",
                                 keys={"preproc_min_tiles": 5, "preproc_max_tiles": 2})
    with pytest.raises(ModelFileError, match="5 to 2 tiles"):
        VisionEncoder(crossed)


# -- LFM2-VL: any shape, learned positions resized; large images as tiles and a thumbnail -----------------

def slow_resize_grid(table: np.ndarray, side: int, rows: int, cols: int) -> np.ndarray:
    """A side x side grid of rows resized to rows x cols, one output at a time: each takes the
    inputs within its footprint (one input wide, or the shrink factor), weighted by a
    triangle, normalized (PyTorch's bilinear interpolate with antialias)."""
    grid = table.reshape(side, side, -1)

    def taps(n_out, i):
        scale = side / n_out
        reach = max(scale, 1.0)
        center = (i + 0.5) * scale
        ws = {j: max(0.0, 1 - abs(j + 0.5 - center) / reach) for j in range(side)}
        total = sum(ws.values())
        return {j: w / total for j, w in ws.items() if w > 0}
    out = np.zeros((rows, cols, grid.shape[2]))
    for r in range(rows):
        for c in range(cols):
            for y, wy in taps(rows, r).items():
                for x, wx in taps(cols, c).items():
                    out[r, c] += wy * wx * grid[y, x]
    return out.reshape(rows * cols, -1)


def slow_lfm2_encode(enc: VisionEncoder, pixels: np.ndarray) -> np.ndarray:
    """The LFM2 encoder written out plainly for one input of any shape."""
    f = enc.floats
    gh, gw = pixels.shape[1] // enc.patch, pixels.shape[2] // enc.patch
    x = slow_tower(enc, slow_patches(enc, pixels) + slow_resize_grid(f("v.position_embd.weight"), enc.side, gh, gw))
    merged = side_by_side(x, gh, gw, enc.merge)
    return lin(f, gelu(lin(f, ln(f, merged, "mm.input_norm", 1e-5), "mm.1")), "mm.2")


def slow_bilinear(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """mtmd's bilinear resampling written out: Pillow's filter (a triangle, widened when
    shrinking), weights in 22-bit fixed point, the width first then the height, each pass
    rounded to bytes."""
    def one_pass(src, n_out):           # resamples axis 1
        n_in = src.shape[1]
        scale = n_in / n_out
        reach = max(scale, 1.0)
        out = np.zeros((src.shape[0], n_out, 3), np.uint8)
        for o in range(n_out):
            center = (o + 0.5) * scale
            lo, hi = max(int(center - reach + 0.5), 0), min(int(center + reach + 0.5), n_in)
            ws = [max(0.0, 1 - abs((j - center + 0.5) / reach)) for j in range(lo, hi)]
            fixed = [int(w / sum(ws) * (1 << 22) + 0.5) for w in ws]
            acc = sum(src[:, j].astype(np.int64) * fw for j, fw in zip(range(lo, hi), fixed)) + (1 << 21)
            out[:, o] = np.clip(acc >> 22, 0, 255)
        return out
    if a.shape[1] != width:
        a = one_pass(a, width)
    return a if a.shape[0] == height else one_pass(a.transpose(1, 0, 2), height).transpose(1, 0, 2)


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    d = tmp_path_factory.mktemp("lfm2")
    return {"lm": synth.write_lfm2(d / "lm.gguf", QT.F32, n_vocab=512, image_tokens="lfm2"),
            "mm": synth.write_mmproj(d / "mm.gguf", n_out=256, qtype=QT.F32, projector="lfm2", image_size=64,
                                     patch=16), "dir": d}


def test_lfm2_sizes_and_tiles():
    """transformers' smart_resize (sides multiples of 32, 64 to 256 rows), mtmd's tiling rule
    (its test cases: halves round to even) and grids; the sizes checked against llama.cpp's
    layouts with benchmarks/compare_vision.py."""
    from pyllm.vision import lfm2_grid, lfm2_tiles, smart_resize
    budget = (64 * 32 * 32, 256 * 32 * 32)
    assert smart_resize(300, 200, 32, *budget) == (320, 224)       # too few rows: scaled up
    assert smart_resize(70, 45, 32, *budget) == (320, 224)
    assert smart_resize(600, 300, 32, *budget) == (608, 288)       # within: only aligned
    assert smart_resize(900, 700, 32, *budget) == (576, 448)       # too many: scaled down
    assert smart_resize(500, 1500, 32, *budget) == (288, 864)
    cases = {(704, 704): False, (720, 720): False, (736, 736): True, (1024, 977): True, (1056, 384): False}
    assert {size: lfm2_tiles(*size, 16, 32, budget[1]) for size in cases} == cases
    assert lfm2_grid(900, 700) == (3, 2) and lfm2_grid(500, 1500) == (1, 3) and lfm2_grid(800, 700) == (2, 2)
    assert lfm2_grid(4000, 100) == (10, 1)


def test_lfm2_resampling_is_mtmd_s():
    from pyllm.vision import fit, resample
    rng = np.random.default_rng(11)
    for (h, w), (tw, th) in (((17, 23), (30, 11)), ((30, 60), (61, 28)), ((12, 9), (40, 33))):
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        got = np.asarray(resample(Image.fromarray(a), tw, th))
        np.testing.assert_array_equal(got, slow_bilinear(a, tw, th))
    img = picture(12, (20, 40, 3))
    padded = np.asarray(fit(img, 100, 100))     # 100 x 50, centred: 25 black rows above and below
    assert padded.shape == (100, 100, 3) and not padded[:25].any() and not padded[75:].any()
    np.testing.assert_array_equal(padded[25:75], np.asarray(resample(img, 100, 50)))


def test_lfm2_encoder_matches_the_plain_loops(lfm2):
    """Inputs of other shapes than the learned 4 x 4 positions (resized both ways), through the
    shuffle and the projector's norm and MLP; several of one shape together."""
    enc = VisionEncoder(lfm2["mm"], n_threads=3)
    rng = np.random.default_rng(13)
    wide, tall = rng.uniform(-1, 1, (3, 32, 96)), rng.uniform(-1, 1, (3, 96, 64))
    for px in (wide, tall):
        want = slow_lfm2_encode(enc, px)
        np.testing.assert_allclose(enc.encode_pixels(px), want, rtol=0, atol=2e-4 * np.abs(want).max())
    both = enc.encode_pixels([wide, wide, tall])
    alone = np.concatenate([enc.encode_pixels(wide)] * 2 + [enc.encode_pixels(tall)])
    np.testing.assert_allclose(both, alone, rtol=0, atol=1e-5 * np.abs(alone).max())
    table = enc.floats("v.position_embd.weight")
    np.testing.assert_array_equal(enc.positions(4, 4), table)
    np.testing.assert_allclose(enc.positions(3, 7), slow_resize_grid(table, 4, 3, 7), rtol=0, atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="multiples of 32"):
        enc.encode_pixels(rng.uniform(-1, 1, (3, 40, 64)))
    enc.close()


def test_lfm2_prompt_layout(lfm2):
    """mtmd's: <|image_start|> rows <|image_end|> for an image read whole; a large one's tiles
    each after <|img_row_r_col_c|>, then <|img_thumbnail|> and the thumbnail's rows."""
    m = Model(lfm2["lm"], mmproj=lfm2["mm"], n_ctx=2048)

    def tok(text):
        got = m.tokenize(text, special=True, add_bos=False)
        assert len(got) == 1
        return got
    start, end, thumb = tok("<|image_start|>"), tok("<|image_end|>"), tok("<|img_thumbnail|>")
    ids = m.media_prompt("look: <__media__> now", [picture(14, (45, 70, 3))])    # 320 x 224: 10 x 7 rows
    rows = [t for t in ids if t < 0]
    assert ids == m.tokenize("look: ", special=True) + start + rows + end + m.tokenize(" now", special=True,
                                                                                        add_bos=False)
    assert len(rows) == 70
    tall = m.media_prompt("<__media__>", [picture(15, (1500, 500, 3))])      # 1 x 3 tiles, 288 x 864 thumbnail
    rows = [t for t in tall if t < 0]
    assert len(rows) == 3 * 256 + 9 * 27
    want = m.tokenize("", special=True) + start
    for r in range(3):
        want += tok(f"<|img_row_{r + 1}_col_1|>") + rows[256 * r:256 * (r + 1)]
    assert tall == want + thumb + rows[768:] + end
    m.close()


def test_an_lfm2_prompt_matches_the_reference(lfm2):
    """Causal, with LFM2's short convolutions: the image rows are tokens like any other."""
    m = Model(lfm2["lm"], mmproj=lfm2["mm"], n_ctx=512)
    assert_prompt_matches_the_reference(m, lfm2["lm"], lfm2["mm"], picture(16, (60, 90, 3)))
    m.close()


def test_bad_lfm2_files(tmp_path):
    no_mlp = synth.write_mmproj(tmp_path / "nomlp.gguf", projector="lfm2", image_size=64, patch=16,
                                drop_tensor="mm.2.weight")
    with pytest.raises(ModelFileError, match="mm.2.weight is missing"):
        VisionEncoder(no_mlp)
    coarse = synth.write_mmproj(tmp_path / "coarse.gguf", projector="lfm2", image_size=256, patch=64)
    with pytest.raises(ModelFileError, match="beyond LFM2's"):
        VisionEncoder(coarse)
    plain = synth.write_mmproj(tmp_path / "plain.gguf", projector="lfm2", image_size=64, patch=16, input_norm=False)
    enc = VisionEncoder(plain)                       # the projector's norm is optional (LFM2.5-VL has none)
    assert enc.input_norm is None and enc.encode(picture(17, (40, 40, 3))).shape[1] == 256
    enc.close()


# -- Pixtral (Mistral Small 3.x): 2D RoPE, RMS norms, gated FFN; merged patches and [IMG_BREAK] rows ------

def slow_pixtral_encode(enc: VisionEncoder, pixels: np.ndarray) -> np.ndarray:
    """Pixtral's encoder written out plainly for one input: each head's pair (2i, 2i + 1) turned
    by the patch's row (first half of the head) or column (second half); the break rows but for
    LightOnOCR's."""
    f, n, H, eps, k_ = enc.floats, enc.n_embd, enc.n_head, enc.eps, enc.merge
    d = n // H
    gh, gw = pixels.shape[1] // enc.patch, pixels.shape[2] // enc.patch
    x = slow_patches_no_bias(enc, pixels)

    def rms(v, name):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * f(name + ".weight")

    def turn(v):
        out = v.copy()
        for p in range(len(v)):
            for head in range(H):
                for i in range(d // 2):       # pair i: dims 2i, 2i + 1 of the head
                    if i < d // 4:
                        theta = (p // gw) * 10000.0 ** (-4 * i / d)
                    else:
                        theta = (p % gw) * 10000.0 ** (-(4 * (i - d // 4) + 2) / d)
                    a, b = v[p, head * d + 2 * i], v[p, head * d + 2 * i + 1]
                    out[p, head * d + 2 * i] = a * math.cos(theta) - b * math.sin(theta)
                    out[p, head * d + 2 * i + 1] = a * math.sin(theta) + b * math.cos(theta)
        return out
    x = rms(x, "v.pre_ln")
    for i in range(enc.n_layer):
        b = f"v.blk.{i}."
        h = rms(x, b + "ln1")
        q, k, v = (turn(h @ f(b + "attn_q.weight").T), turn(h @ f(b + "attn_k.weight").T), h @ f(b + "attn_v.weight").T)
        att = np.zeros_like(h)
        for head in range(H):
            s = slice(head * d, (head + 1) * d)
            scores = q[:, s] @ k[:, s].T / math.sqrt(d)
            w = np.exp(scores - scores.max(-1, keepdims=True))
            att[:, s] = (w / w.sum(-1, keepdims=True)) @ v[:, s]
        x = x + att @ f(b + "attn_out.weight").T
        h = rms(x, b + "ln2")
        g = h @ f(b + "ffn_gate.weight").T
        x = x + (g / (1 + np.exp(-g)) * (h @ f(b + "ffn_up.weight").T)) @ f(b + "ffn_down.weight").T
    if k_ > 1:     # each k x k patches: channel by channel, then row and column in the window (torch's unfold)
        x = rms(x, "mm.input_norm")
        x = np.array([[x[(r * k_ + ky) * gw + c * k_ + kx, ch] for ch in range(n) for ky in range(k_)
                       for kx in range(k_)] for r in range(gh // k_) for c in range(gw // k_)])
        x = x @ f("mm.patch_merger.weight").T
    x = lin(f, gelu(lin(f, x, "mm.1")), "mm.2")
    per_row, out = gw // k_, []
    for r in range(gh // k_):
        breaks = enc.projector == "pixtral" and r < gh // k_ - 1
        out += list(x[r * per_row:(r + 1) * per_row]) + ([f("v.token_embd.img_break")] if breaks else [])
    return np.array(out)


def slow_patches_no_bias(enc: VisionEncoder, pixels: np.ndarray) -> np.ndarray:
    p, W = enc.patch, enc.floats("v.patch_embd.weight")
    gh, gw = pixels.shape[1] // p, pixels.shape[2] // p
    return np.array([np.einsum("ocij,cij->o", W, pixels[:, r * p:(r + 1) * p, c * p:(c + 1) * p])
                     for r in range(gh) for c in range(gw)])


@pytest.fixture(scope="module")
def pixtral(tmp_path_factory):
    d = tmp_path_factory.mktemp("pixtral")
    return {"lm": synth.write_llama(d / "lm.gguf", QT.F32, n_vocab=512, image_tokens="pixtral"),
            "mm": synth.write_mmproj(d / "mm.gguf", n_out=256, qtype=QT.F32, projector="pixtral", merge=2),
            "mm1": synth.write_mmproj(d / "mm1.gguf", n_out=256, qtype=QT.F32, projector="pixtral", merge=1)}


def test_pixtral_encoder_matches_the_plain_loops(pixtral):
    """Mistral Small's (2 x 2 patches merged) and Pixtral 12B's (none), on inputs of other
    shapes than square; the 2D RoPE, the gated FFN, the unfolded merge and the break rows."""
    rng = np.random.default_rng(21)
    for name, shape in (("mm", (3, 24, 40)), ("mm1", (3, 12, 20))):
        enc = VisionEncoder(pixtral[name], n_threads=3)
        px = rng.uniform(-1, 1, shape)
        want = slow_pixtral_encode(enc, px)
        got = enc.encode_pixels(px)
        rows, cols = shape[1] // enc.align, shape[2] // enc.align
        assert got.shape == (rows * cols + rows - 1, 256) == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
        np.testing.assert_array_equal(got[cols], enc.floats("v.token_embd.img_break"))    # after the first row
        enc.close()


def test_pixtral_sizes_and_layout(pixtral):
    """mtmd's size (sides multiples of the merged patch, halves rounded away from zero, 8 to
    1024 rows), the image fitted into it (bicubic, black bands), then its rows and [IMG_END]."""
    from pyllm.vision import fit, smart_resize
    assert smart_resize(300, 200, 16, 8 * 256, 1024 * 256) == (304, 208)    # 12.5 -> 13, as mtmd
    m = Model(pixtral["lm"], mmproj=pixtral["mm"], n_ctx=512)
    enc = m.vision
    img = picture(22, (30, 45, 3))                 # 45 x 30 -> 48 x 32: 6 x 4 rows and 3 breaks
    assert enc.plan(45, 30).whole == (48, 32) and enc.describe()["image_tokens"].startswith("8 to 1024 ")
    np.testing.assert_array_equal(enc.tiles(img)[0], np.asarray(fit(img, 48, 32, bicubic=True)))
    ids = m.media_prompt("look <__media__> now", [img])
    rows = [t for t in ids if t < 0]
    assert len(rows) == 6 * 4 + 3
    assert ids == m.tokenize("look ", special=True) + rows + m.tokenize("[IMG_END]", special=True, add_bos=False) + \
        m.tokenize(" now", special=True, add_bos=False)
    assert_prompt_matches_the_reference(m, pixtral["lm"], pixtral["mm"], img)
    m.close()


def test_bad_pixtral_files(tmp_path):
    no_break = synth.write_mmproj(tmp_path / "nobreak.gguf", projector="pixtral", drop_tensor="v.token_embd.img_break")
    with pytest.raises(ModelFileError, match="img_break is missing"):
        VisionEncoder(no_break)
    half_gated = synth.write_mmproj(tmp_path / "gate.gguf", projector="pixtral", drop_tensor="v.blk.0.ffn_gate.weight")
    with pytest.raises(ModelFileError, match="some layers have an ffn_gate and some do not"):
        VisionEncoder(half_gated)
    odd_heads = synth.write_mmproj(tmp_path / "heads.gguf", projector="pixtral", n_embd=48, n_head=8)   # 6 a head
    with pytest.raises(ModelFileError, match="not a multiple of 4"):
        VisionEncoder(odd_heads)


def test_lightonocr_encoder_sizes_and_layout(tmp_path):
    """LightOnOCR's: Pixtral's encoder and merge without break rows; the image scaled (up or
    down) so its longer side is preproc_image_size, each side rounded up to the merged patch
    in float32 as mtmd computes it (300 x 200 to 320: 320.00003 wide, so 11 patches of 32);
    its rows between <|im_start|> and <|im_end|>."""
    from pyllm.vision import longest_edge_size
    mm = synth.write_mmproj(tmp_path / "mm.gguf", n_out=256, qtype=QT.F32, projector="lightonocr", image_size=1024,
                            patch=8, merge=2, longest_edge=96)
    enc = VisionEncoder(mm, n_threads=3)
    px = np.random.default_rng(23).uniform(-1, 1, (3, 32, 48))
    want, got = slow_pixtral_encode(enc, px), enc.encode_pixels(px)
    assert got.shape == (2 * 3, 256) == want.shape                  # no break rows
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    assert longest_edge_size(640, 480, 32, 320) == (320, 256) and longest_edge_size(100, 50, 32, 320) == (320, 160)
    assert longest_edge_size(300, 200, 32, 320) == (352, 224)       # mtmd's float32 rounding, as it runs
    assert longest_edge_size(640, 480, 32, 320, max_pixels=20 * 32 * 32) == (160, 96)     # 15 rows: floored
    assert enc.plan(150, 100).whole == (96, 64) and enc.describe()["image_tokens"].startswith("up to 36 (the image ")
    lm = synth.write_qwen3(tmp_path / "lm.gguf", QT.F32, n_vocab=512, image_tokens="chatml")
    m = Model(lm, mmproj=mm, n_ctx=512)
    img = picture(24, (100, 150, 3))                                 # 150 x 100 -> 96 x 64: 6 x 4 rows
    ids = m.media_prompt("look <__media__> now", [img])
    rows = [t for t in ids if t < 0]
    assert len(rows) == 24
    assert ids == m.tokenize("look <|im_start|>", special=True) + rows + \
        m.tokenize("<|im_end|> now", special=True, add_bos=False)
    assert_prompt_matches_the_reference(m, lm, mm, img)
    m.close()
    fewer = VisionEncoder(mm, max_tokens=6)                          # --image-max-tokens alone bounds it
    assert fewer.plan(150, 100).whole == (48, 32) and fewer.rows_of(48, 32) == 6
    with pytest.raises(InvalidArgumentError, match="at least 9 and at most 6 rows"):
        VisionEncoder(mm, min_tokens=9, max_tokens=6)
    enc.close()
    fewer.close()


@pytest.mark.parametrize("projector,tensor", [("qwen3vl_merger", "v.deepstack.0.fc2.weight"),
                                               ("qwen3vl_merger", "v.position_embd.weight"),
                                               ("qwen3vl_merger", "v.blk.1.attn_qkv.weight"),   # then q, k, v
                                               ("gemma4v", "v.blk.0.attn_q_norm.weight"),
                                               ("gemma4v", "v.blk.1.ffn_post_norm.weight"),
                                               ("gemma4v", "v.position_embd.weight"),
                                               ("gemma4v", "mm.input_projection.weight")])
def test_qwen3_and_gemma4_files_missing_a_tensor(tmp_path, projector, tensor):
    """A projector file without one of its tensors is refused when opened, naming it (without a fused
    qkv, the separate q, k and v it would then need)."""
    path = synth.write_mmproj(tmp_path / "mm.gguf", projector=projector, patch=16, image_size=64, merge=2,
                              n_embd=32, n_ff=48, n_head=4, drop_tensor=tensor)
    with pytest.raises(ModelFileError, match=tensor.replace("qkv", "q").replace(".", r"\.") + " is missing"):
        VisionEncoder(path)


def test_image_token_limits(tmp_path, files, caplog):
    """llama.cpp's --image-min-tokens / --image-max-tokens: where the projector sizes an image, its
    rows stay within them (a 150 x 100 picture: 15 rows by Qwen 3's own limits, at least 64 or at
    most 6 with them; one limit past the projector's other takes it along); Gemma 3's fixed tiles
    ignore them, saying so; nonsense is refused."""
    mm = synth.write_mmproj(tmp_path / "mm.gguf", projector="qwen3vl_merger", patch=16, image_size=64, n_embd=32,
                            n_ff=48, n_head=4)
    sizes = {}
    for lo, hi in ((None, None), (64, None), (None, 6)):
        enc = VisionEncoder(mm, min_tokens=lo, max_tokens=hi)
        w, h = enc.plan(150, 100).whole
        sizes[(lo, hi)] = (w // 32) * (h // 32)
        enc.close()
    assert sizes[(None, None)] == 15 and 64 <= sizes[(64, None)] < 80 and sizes[(None, 6)] <= 6
    for lo, hi, says in ((64, None, "64 to 4096 "), (None, 6, "6 to 6 "), (5000, None, "5000 to 5000 ")):
        enc = VisionEncoder(mm, min_tokens=lo, max_tokens=hi)   # the projector's other limit, moved aside
        assert enc.describe()["image_tokens"].startswith(says)
        enc.close()
    for lo, hi, why in ((0, None, "--image-min-tokens must be a positive"), (None, 2.5, "--image-max-tokens"),
                        (100, 50, "at least 100 and at most 50")):
        with pytest.raises(InvalidArgumentError, match=why):
            VisionEncoder(mm, min_tokens=lo, max_tokens=hi)
    with caplog.at_level("WARNING", logger="pyllm"):
        VisionEncoder(files["mm"], max_tokens=16).close()
    assert "image token limits are ignored" in caplog.text
    m = Model(synth.write_qwen3vl(tmp_path / "lm.gguf", QT.F32, image_tokens="qwen", n_layer=2,
                                  keys={"num_deepstack_layers": 1}), mmproj=mm,
              image_max_tokens=6)
    assert m.vision.pixel_budget[1] == 6 * 32 * 32
    m.close()


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="reads Linux's /proc")
def test_the_encoder_s_threads_leave_ctrl_c_to_the_main_thread(files):
    import signal
    import threading
    enc = VisionEncoder(files["mm"], n_threads=3)
    enc.encode(picture(23))
    workers = [t for t in threading.enumerate() if t.name.startswith("pyllm-encoder")]
    assert workers
    for t in workers:
        status = open(f"/proc/self/task/{t.native_id}/status").read()
        mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
        assert mask & (1 << (signal.SIGINT - 1)) and mask & (1 << (signal.SIGTERM - 1))
    enc.close()


# -- Qwen 2 / 2.5 / 3 VL: the encoders, and the language model's M-RoPE image positions --------------------

def slow_corner_resize(table: np.ndarray, side: int, rows: int, cols: int) -> np.ndarray:
    """A side x side grid of rows resized to rows x cols, one output at a time: output (r, c)
    reads the grid at (r (side - 1) / (rows - 1), c (side - 1) / (cols - 1)), bilinear between
    its four neighbours (PyTorch's interpolate with align_corners)."""
    grid = table.reshape(side, side, -1)

    def at(i, n_out):
        v = i * (side - 1) / (n_out - 1) if n_out > 1 else 0.0
        lo = min(int(math.floor(v)), side - 1)
        return lo, min(lo + 1, side - 1), v - lo
    out = np.zeros((rows, cols, grid.shape[2]))
    for r in range(rows):
        y0, y1, dy = at(r, rows)
        for c in range(cols):
            x0, x1, dx = at(c, cols)
            out[r, c] = (grid[y0, x0] * (1 - dx) + grid[y0, x1] * dx) * (1 - dy) + \
                (grid[y1, x0] * (1 - dx) + grid[y1, x1] * dx) * dy
    return out.reshape(rows * cols, -1)


def slow_plain_resize(table: np.ndarray, side: int, rows: int, cols: int) -> np.ndarray:
    """A side x side grid of rows resized to rows x cols by plain bilinear interpolation
    (PyTorch's, align_corners False, no antialiasing), one output at a time: output i of n
    sits at input coordinate (i + 0.5) side / n - 0.5, clamped to the edges, between two inputs."""
    grid = table.reshape(side, side, -1)

    def taps(n_out, i):
        x = min(max((i + 0.5) * side / n_out - 0.5, 0.0), side - 1)
        lo = math.floor(x)
        hi = min(lo + 1, side - 1)
        return [(lo, 1 - (x - lo)), (hi, x - lo)]
    out = np.zeros((rows, cols, grid.shape[2]))
    for r in range(rows):
        for c in range(cols):
            for y, wy in taps(rows, r):
                for x, wx in taps(cols, c):
                    out[r, c] += wy * wx * grid[y, x]
    return out.reshape(rows * cols, -1)


def slow_qwen_encode(enc: VisionEncoder, pixels: np.ndarray) -> np.ndarray:
    """Qwen's encoder written out plainly for one input: a head's pair (i, i + d/2) turned by the
    patch's row (first half of the pairs) or column, at 10000^(-4j/d); in Qwen 2.5 a patch of a
    windowed layer sees only the patches of its window of 4 x 4 cells of 2 x 2 patches; Qwen 3
    adds a patch bias and its learned positions resized to the image, and after each DeepStack
    layer puts that layer's rows through their own MLP, a slice of each output row. PaddleOCR-VL:
    one kernel with a bias, its positions resized (antialiased), each patch's row layer-normed
    before the 2 x 2 merge and an exact GELU between the projector's Linears."""
    f, n, H, eps = enc.floats, enc.n_embd, enc.n_head, enc.eps
    d, p = n // H, enc.patch
    gh, gw = pixels.shape[1] // p, pixels.shape[2] // p
    paddle = enc.projector == "paddleocr"
    W = f("v.patch_embd.weight") + (0 if paddle else f("v.patch_embd.weight.1"))
    x = np.array([np.einsum("ocij,cij->o", W, pixels[:, r * p:(r + 1) * p, c * p:(c + 1) * p])
                  for r in range(gh) for c in range(gw)])
    if paddle:
        x = x + f("v.patch_embd.bias") + slow_plain_resize(f("v.position_embd.weight"), enc.side, gh, gw)
    if enc.projector == "qwen3vl_merger":
        x = x + f("v.patch_embd.bias") + slow_corner_resize(f("v.position_embd.weight"), enc.side, gh, gw)
    stacked = []
    win = 112 // p // 2
    window = [((q // gw) // 2 // win, (q % gw) // 2 // win) for q in range(gh * gw)]

    def norm(v, name):
        if enc.rms:
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * f(name + ".weight")
        return ln(f, v, name, eps)

    def turn(v):
        out = v.copy()
        for q in range(len(v)):
            for head in range(H):
                for j in range(d // 2):
                    pos, jj = (q // gw, j) if j < d // 4 else (q % gw, j - d // 4)
                    theta = pos * 10000.0 ** (-4 * jj / d)
                    a, b = v[q, head * d + j], v[q, head * d + j + d // 2]
                    out[q, head * d + j] = a * math.cos(theta) - b * math.sin(theta)
                    out[q, head * d + j + d // 2] = a * math.sin(theta) + b * math.cos(theta)
        return out
    for i in range(enc.n_layer):
        b = f"v.blk.{i}."
        windowed = getattr(enc, "window_every", 0) and (i + 1) % enc.window_every
        h = norm(x, b + "ln1")
        if enc.mf.has_tensor(b + "attn_qkv.weight"):
            q, k, v = np.split(lin(f, h, b + "attn_qkv"), 3, axis=1)
        else:
            q, k, v = lin(f, h, b + "attn_q"), lin(f, h, b + "attn_k"), lin(f, h, b + "attn_v")
        q, k = turn(q), turn(k)
        att = np.zeros_like(h)
        for head in range(H):
            s = slice(head * d, (head + 1) * d)
            for t in range(len(h)):
                seen = [u for u in range(len(h)) if not windowed or window[u] == window[t]]
                scores = k[seen, s] @ q[t, s] / math.sqrt(d)
                w = np.exp(scores - scores.max())
                att[t, s] = (w / w.sum()) @ v[seen, s]
        x = x + lin(f, att, b + "attn_out")
        h = norm(x, b + "ln2")
        if enc.mf.has_tensor(b + "ffn_gate.weight"):
            g = lin(f, h, b + "ffn_gate")
            x = x + lin(f, g / (1 + np.exp(-g)) * lin(f, h, b + "ffn_up"), b + "ffn_down")
        else:
            u = lin(f, h, b + "ffn_up")
            x = x + lin(f, gelu(u) if enc.gelu else u / (1 + np.exp(-1.702 * u)), b + "ffn_down")
        ds = f"v.deepstack.{i}."
        if enc.mf.has_tensor(ds + "fc1.weight"):
            stacked.append(lin(f, gelu(lin(f, ln(f, side_by_side(x, gh, gw, 2), ds + "norm", eps), ds + "fc1")),
                               ds + "fc2"))
    x = norm(x, "v.post_ln")
    if paddle:
        return lin(f, gelu_erf(lin(f, side_by_side(ln(f, x, "mm.input_norm", 1e-5), gh, gw, 2), "mm.1")), "mm.2")
    return np.concatenate([lin(f, gelu(lin(f, side_by_side(x, gh, gw, 2), "mm.0")), "mm.2")] + stacked, axis=1)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen")
    return {p: synth.write_mmproj(d / f"{p}.gguf", n_out=64, qtype=QT.F32, projector=p, patch=14, image_size=56,
                                  n_embd=32, n_ff=48, n_head=4, n_layer=3, deepstack=(0, 2))
            for p in ("qwen2.5vl_merger", "qwen2vl_merger", "qwen3vl_merger")}


def test_qwen_windows():
    """Windows of 2 x 2 cells over a grid of 4 x 6 patches (2 x 3 cells): the right one cut."""
    from pyllm.vision import qwen_windows
    order, spans = qwen_windows(4, 6, 2)
    assert spans == [(0, 16), (16, 24)] and sorted(order) == list(range(24))
    assert order[:8] == [0, 1, 6, 7, 2, 3, 8, 9] and order[16:] == [4, 5, 10, 11, 16, 17, 22, 23]


def test_qwen_encoders_match_the_plain_loops(qwen):
    """Qwen 2.5 (windows of 4 x 4 cells in its first layer, the whole image in its second, cut
    windows at the edges), Qwen 2 (LayerNorm, quick-GELU, no windows) and Qwen 3 (a fused qkv,
    GELU, its 4 x 4 positions resized to 10 x 14, DeepStack after its first and last layers:
    rows of three slices)."""
    px = np.random.default_rng(24).uniform(-1, 1, (3, 140, 196))      # 10 x 14 patches: 5 x 7 cells
    for kind, path in qwen.items():
        enc = VisionEncoder(path, n_threads=3)
        want = slow_qwen_encode(enc, px)
        got = enc.encode_pixels(px)
        assert got.shape == (35, 64 * (3 if kind == "qwen3vl_merger" else 1)) == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
        enc.close()


def test_mrope_positions():
    """mtmd's: text at p in all three; an image of 3 x 2 rows from p = 2 at (2, 2 + row, 2 +
    column); the text after it from 2 + max(3, 2) = 5; an image without a grid as one row."""
    from pyllm.engine import Engine
    store = MediaStore()
    img = store.ids(b"a", lambda: np.zeros((6, 4), np.float32), (3, 2))
    flat = store.ids(b"b", lambda: np.zeros((2, 4), np.float32))
    engine = Engine.__new__(Engine)
    engine.media = store
    got = engine.mrope_positions([10, 11] + img + [12, 13] + flat + [14], 0)
    assert got.tolist() == [[0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 7, 9],
                            [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 7, 9],
                            [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9]]
    together = engine.mrope_positions([10] + img + flat + [11], 0)    # two images, their rows one run
    assert together.tolist() == [[0, 1, 1, 1, 1, 1, 1, 4, 4, 6], [0, 1, 1, 1, 2, 2, 2, 4, 4, 6],
                                 [0, 1, 2, 3, 1, 2, 3, 4, 5, 6]]
    tail = engine.mrope_positions([10, 11] + img + [12, 13], 5)      # a step from the image's 4th row on
    assert tail.tolist() == [[2, 2, 2, 5, 6], [3, 3, 3, 5, 6], [2, 3, 4, 5, 6]]
    with pytest.raises(InvalidArgumentError, match="cannot have"):
        store.ids(b"c", lambda: np.zeros((5, 4), np.float32), (3, 2))


def test_a_qwen_prompt_matches_the_reference(tmp_path):
    """Qwen 2.5 VL: the image's rows at M-RoPE positions (row and column), the text after them
    and the decode steps after that at positions behind the cache's index, against the numpy
    reference given the same positions; a model without M-RoPE refuses the projector."""
    mm = synth.write_mmproj(tmp_path / "mm.gguf", n_out=256, qtype=QT.F32, projector="qwen2.5vl_merger", patch=14,
                            image_size=56, n_embd=32, n_ff=48, n_head=4)
    lm = synth.write_qwen2vl(tmp_path / "lm.gguf", QT.F32, image_tokens="qwen")
    m = Model(lm, mmproj=mm, n_ctx=512)
    enc = m.vision
    img = picture(25, (100, 150, 3))
    assert enc.plan(150, 100).whole == (140, 112) and enc.mrope_grid(150, 100) == (5, 4)
    assert enc.describe()["image_tokens"].startswith("8 to 4096 ")
    assert enc.layout([-1, -2], img) == ["<|vision_start|>", [-1, -2], "<|vision_end|>"]
    ids = assert_prompt_matches_the_reference(m, lm, mm, img, then=(40, 41, 42))
    assert m.engine.mrope and len([t for t in ids if t < 0]) == 20
    m.close()
    with pytest.raises(UnsupportedModelError, match="M-RoPE"):
        Model(synth.write_llama(tmp_path / "llama.gguf"), mmproj=mm)
    wide = synth.write_qwen2vl(tmp_path / "wide.gguf", keys={"rope_dimension_sections": [16, 12, 12, 0]})   # 40 > 32
    with pytest.raises(ModelFileError, match="rope.dimension_sections"):
        Model(wide)


def test_paddleocr_encoder_sizes_and_prompt(tmp_path):
    """PaddleOCR-VL: the encoder against the plain loops on inputs of other shapes than its
    6 x 6 table of positions; mtmd's sizes (sides multiples of 28, the file's fewest and most
    pixels); the rows between <|IMAGE_START|> and <|IMAGE_END|> at M-RoPE positions, then text
    and decode steps, against the numpy reference (its ERNIE model with M-RoPE)."""
    mm = synth.write_mmproj(tmp_path / "mm.gguf", n_out=256, qtype=QT.F32, projector="paddleocr", patch=14,
                            image_size=84, n_embd=32, n_ff=48, n_head=4, n_layer=2,
                            keys={"image_min_pixels": 8 * 28 * 28, "image_max_pixels": 40 * 28 * 28})
    enc = VisionEncoder(mm, n_threads=3)
    assert enc.side == 6 and enc.mrope and not enc.bidirectional
    for shape in ((3, 56, 84), (3, 112, 56), (3, 84, 84), (3, 28, 196)):     # table shrunk, grown, kept
        px = np.random.default_rng(shape[1]).uniform(-1, 1, shape)
        want, got = slow_qwen_encode(enc, px), enc.encode_pixels(px)
        assert got.shape == want.shape == (shape[1] * shape[2] // 28 ** 2, 256)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    assert enc.plan(150, 100).whole == (140, 112) and enc.mrope_grid(150, 100) == (5, 4)
    assert enc.plan(600, 400).whole == (196, 140)                      # within 40 rows: 7 x 5
    assert enc.describe()["image_tokens"].startswith("8 to 40 ")
    enc.close()
    lm = synth.write_paddleocr(tmp_path / "lm.gguf", QT.F32, image_tokens="paddleocr")
    m = Model(lm, mmproj=mm, n_ctx=512)
    img = picture(26, (100, 150, 3))
    assert m.vision.layout([-1], img) == ["<|IMAGE_START|>", [-1], "<|IMAGE_END|>"]
    ids = assert_prompt_matches_the_reference(m, lm, mm, img, then=(40, 41))
    assert m.engine.mrope and len([t for t in ids if t < 0]) == 20
    m.close()
    with pytest.raises(UnsupportedModelError, match="paddleocr's images take M-RoPE positions"):
        Model(synth.write_llama(tmp_path / "llama.gguf"), mmproj=mm)


def test_a_qwen3_prompt_matches_the_reference(tmp_path):
    """Qwen 3 VL: rows of [row | two DeepStack slices], the slices added after the language
    model's first two layers, interleaved M-RoPE; the prompt and the decode steps after it
    against the numpy reference, which they would not match without either (so both count)."""
    from pyllm.arch import load_architecture
    from pyllm.model_file import ModelFile
    from pyllm.reference import Reference
    mm = synth.write_mmproj(tmp_path / "mm.gguf", n_out=256, qtype=QT.F32, projector="qwen3vl_merger", patch=16,
                            image_size=64, n_embd=32, n_ff=48, n_head=4, n_layer=3, deepstack=(0, 1))
    lm = synth.write_qwen3vl(tmp_path / "lm.gguf", QT.F32, image_tokens="qwen", n_layer=3,
                             keys={"num_deepstack_layers": 2})
    m = Model(lm, mmproj=mm, n_ctx=512)
    img = picture(27, (100, 150, 3))
    assert m.vision.n_out == 768 and m.arch.deepstack == 2 and m.engine.mrope
    assert m.vision.mrope_grid(150, 100) == (5, 3)
    ids = assert_prompt_matches_the_reference(m, lm, mm, img, then=(40, 41))
    rows = m.engine.media.rows([t for t in ids if t < 0])
    local, j = [], 0
    for t in ids:
        local.append(t if t >= 0 else -1 - j)
        j += t < 0
    seq = m.engine.new_sequence()
    got, _ = m.engine.prefill(seq, ids)
    seq.release()
    m.close()
    mf = ModelFile(lm)
    arch = load_architecture(mf)
    ref = Reference(arch)
    rope_pos = m.engine.mrope_positions(ids, 0)
    flat = rows.copy()
    flat[:, 256:] = 0       # DeepStack's slices off
    unstacked = ref.forward(np.array(local), media=flat, rope_pos=rope_pos)[-1]
    arch.mrope_interleaved = False    # the sections one after another, as Qwen 2 VL's
    plain = Reference(arch).forward(np.array(local), media=rows, rope_pos=rope_pos)[-1]
    mf.close()
    span = got.max() - got.min()
    assert np.abs(got - unstacked).max() > 1e-2 * span and np.abs(got - plain).max() > 1e-3 * span
    with pytest.raises(InvalidArgumentError, match="another model"):     # one DeepStack slice fewer
        Model(synth.write_qwen3vl(tmp_path / "one.gguf", QT.F32, image_tokens="qwen", n_layer=3,
                                  keys={"num_deepstack_layers": 1}), mmproj=mm)
    with pytest.raises(ModelFileError, match="n_deepstack_layers"):
        Model(synth.write_qwen3vl(tmp_path / "bad.gguf", QT.F32, n_layer=2, keys={"num_deepstack_layers": 2}))


# -- Gemma 4: any shape, 3 x 3 patches pooled; per-layer inputs of an image's rows --------------------------

def slow_gemma4_encode(enc: VisionEncoder, pixels: np.ndarray) -> np.ndarray:
    """Gemma 4's encoder written out plainly for one input: pixels in [-1, 1]; a patch's column's
    row of the first position table plus its row's of the second; per layer RMS norms before
    and after the attention and the FFN, each head of q and k RMS-normed (weights) and of v (none),
    q and k turned in pairs (i, i + d/4) of the head's first half by the patch's column, of its
    second half by its row, at 100^(-4i/d); scores unscaled; a gated FFN; the layer scaled; every
    matrix's input and output clamped where the file says; then 3 x 3 patches averaged, times
    sqrt(n), standardized, RMS-normed (no weights), projected (clamped)."""
    f, n, H, eps, p = enc.floats, enc.n_embd, enc.n_head, enc.eps, enc.patch
    d = n // H
    gh, gw = pixels.shape[1] // p, pixels.shape[2] // p
    W = f("v.patch_embd.weight")
    px = pixels * 2 - 1
    table = f("v.position_embd.weight")
    x = np.array([np.einsum("ocij,cij->o", W, px[:, r * p:(r + 1) * p, c * p:(c + 1) * p]) + table[0, c] + table[1, r]
                  for r in range(gh) for c in range(gw)])

    def rms(v, name=None):
        out = v / np.sqrt((v * v).mean(-1, keepdims=True) + eps)
        return out * f(name) if name else out

    def mm(v, name):
        lo, hi, out_lo, out_hi = enc.clamps.get(name + ".weight", (-np.inf, np.inf, -np.inf, np.inf))
        return np.clip(np.clip(v, lo, hi) @ f(name + ".weight").T, out_lo, out_hi)

    def turn(v):
        out = v.copy()
        for t in range(len(v)):
            r, c = divmod(t, gw)
            for head in range(H):
                for half, pos in ((0, c), (1, r)):
                    for i in range(d // 4):
                        a, b = head * d + half * d // 2 + i, head * d + half * d // 2 + i + d // 4
                        theta = pos * 100.0 ** (-4 * i / d)
                        out[t, a] = v[t, a] * math.cos(theta) - v[t, b] * math.sin(theta)
                        out[t, b] = v[t, a] * math.sin(theta) + v[t, b] * math.cos(theta)
        return out
    for i in range(enc.n_layer):
        b = f"v.blk.{i}."
        h = rms(x, b + "ln1.weight")
        q = rms(mm(h, b + "attn_q").reshape(-1, H, d), b + "attn_q_norm.weight").reshape(-1, n)
        k = rms(mm(h, b + "attn_k").reshape(-1, H, d), b + "attn_k_norm.weight").reshape(-1, n)
        v = rms(mm(h, b + "attn_v").reshape(-1, H, d)).reshape(-1, n)
        q, k = turn(q), turn(k)
        att = np.zeros_like(h)
        for head in range(H):
            s = slice(head * d, (head + 1) * d)
            for t in range(len(h)):
                scores = k[:, s] @ q[t, s]
                w = np.exp(scores - scores.max())
                att[t, s] = (w / w.sum()) @ v[:, s]
        x = x + rms(mm(att, b + "attn_out"), b + "attn_post_norm.weight")
        h = rms(x, b + "ln2.weight")
        g = mm(h, b + "ffn_gate")
        act = gelu(g) if enc.gelu else g / (1 + np.exp(-1.702 * g))
        x = (x + rms(mm(act * mm(h, b + "ffn_up"), b + "ffn_down"), b + "ffn_post_norm.weight")) * \
            f(b + "out_scale.weight")
    k_ = enc.merge
    pooled = np.array([np.mean([x[(r * k_ + a) * gw + c * k_ + e] for a in range(k_) for e in range(k_)], axis=0)
                       for r in range(gh // k_) for c in range(gw // k_)]) * math.sqrt(n)
    pooled = (pooled - f("v.std_bias")) * f("v.std_scale")
    return mm(rms(pooled), "mm.input_projection")


def test_gemma4_encoder_matches_the_plain_loops(tmp_path):
    """Gemma 4's encoder (quick-GELU as the converted files say, and GELU), 9 x 12 patches: 3 x 4 rows."""
    px = np.random.default_rng(28).uniform(0, 1, (3, 144, 192))
    for use_gelu in (False, True):
        enc = VisionEncoder(synth.write_mmproj(tmp_path / f"g4-{use_gelu}.gguf", n_out=48, qtype=QT.F32,
                                               projector="gemma4v", patch=16, image_size=224, merge=3, n_embd=32,
                                               n_ff=48, n_head=4, use_gelu=use_gelu), n_threads=3)
        assert len(enc.clamps) == 2 * 6 + 1 and enc.gelu == use_gelu    # all but v
        want = slow_gemma4_encode(enc, px)
        got = enc.encode_pixels(px)
        assert got.shape == (12, 48) == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
        enc.close()


def test_a_gemma4_prompt_matches_the_reference(tmp_path):
    """Gemma 4 with per-layer inputs (an image row's: the padding token's, and the row itself in
    their projection); the image's rows see each other but for E2B's and E4B's widths (mtmd's
    rule); its sizes: sides multiples of 48 pixels, 70 to 1120 rows."""
    mm = synth.write_mmproj(tmp_path / "mm.gguf", n_out=256, qtype=QT.F32, projector="gemma4v", patch=16,
                            image_size=224, merge=3, n_embd=32, n_ff=48, n_head=4)
    lm = synth.write_gemma4(tmp_path / "lm.gguf", QT.F32, image_tokens="gemma4")
    m = Model(lm, mmproj=mm, n_ctx=512)
    img = picture(29, (100, 150, 3))
    enc = m.vision
    assert enc.plan(150, 100).whole == (528, 336) and enc.rows_of(528, 336) == 77
    assert enc.describe()["image_tokens"].startswith("70 to 1120 ")
    assert enc.layout([-1], img) == ["<|image>", [-1], "<image|>"] and m.engine.media_bidirectional
    ids = m.media_prompt("what is <__media__> this", [img])
    start = next(i for i, t in enumerate(ids) if t < 0)
    rows = m.engine.media.rows(ids[start:start + 77])
    logits, _ = m.engine.prefill(m.engine.new_sequence(), ids)
    want = reference_logits(lm, ids, rows, (start, start + 77))[-1]
    assert np.abs(logits - want).max() < 2e-4 * (want.max() - want.min())
    m.close()
    wide = synth.write_gemma4(tmp_path / "e2b.gguf", QT.F32, image_tokens="gemma4", n_embd=1536, n_ff=128)
    m = Model(wide, mmproj=synth.write_mmproj(tmp_path / "mm2.gguf", n_out=1536, projector="gemma4v", patch=16,
                                              image_size=224, merge=3, n_embd=32, n_ff=48, n_head=4))
    assert not m.engine.media_bidirectional
    m.close()
    small = VisionEncoder(synth.write_mmproj(tmp_path / "mm3.gguf", projector="gemma4v", patch=16, image_size=224,
                                             merge=3, n_embd=32, n_ff=48, n_head=4, n_positions=40))
    with pytest.raises(InvalidArgumentError, match="75 x 18 patches is beyond the projector.s 40 positions a side: crop"):
        small.encode(picture(30, (300, 1200, 3)))
    small.close()


@pytest.mark.parametrize("projector", ["gemma3", "gemma4v", "idefics3", "lfm2", "pixtral", "qwen2.5vl_merger",
                                       "qwen3vl_merger"])
def test_every_projector_takes_tiny_and_extreme_images(projector, tmp_path):
    """A 1 x 1 picture, a line of 3000 x 1 and its transpose: sized, resampled, encoded and laid
    out, as many rows as the layout places."""
    kw = {"idefics3": dict(longest_edge=64), "lfm2": dict(image_size=64, patch=16),
          "qwen2.5vl_merger": dict(image_size=56, patch=14), "qwen3vl_merger": dict(image_size=64, patch=16),
          "gemma4v": dict(image_size=224, patch=16, merge=3)}.get(projector, {})
    enc = VisionEncoder(synth.write_mmproj(tmp_path / "mm.gguf", projector=projector, n_embd=32, n_ff=32, **kw))
    for shape in ((1, 1), (1, 3000), (3000, 1)):
        img = picture(26, shape + (3,))
        rows = enc.encode(img)
        ids = [-1 - i for i in range(len(rows))]
        placed = [t for part in enc.layout(ids, img) if isinstance(part, list) for t in part]
        assert placed == ids and np.isfinite(rows).all()
    enc.close()
