"""The chat page's script (pyllm/webui.html) run by Node against a real server: a stand-in for
the few DOM calls it makes, the browser's fetch (Node's own) aimed at the server, a file chosen
in its Sound and Image buttons, a message sent, the reply streamed back and saved. Without Node
the test is skipped (the page is still served and checked by tests/test_server.py)."""
import base64
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from pyllm import Model
from pyllm.audio import wav_bytes

NODE = shutil.which("node")
PAGE = Path(__file__).resolve().parent.parent / "pyllm" / "webui.html"

HARNESS = r'''
const fs = require("fs"), vm = require("vm");
const [base, pagePath, choicesPath] = process.argv.slice(2);
const choices = fs.readFileSync(choicesPath, "utf8");
const page = fs.readFileSync(pagePath, "utf8");
const script = page.slice(page.indexOf("<script>") + 8, page.indexOf("</script>"));
function fake() {    // an element: what the script sets is kept, what it calls does nothing
  const t = { listeners: {}, hidden: false, value: "", files: [], textContent: "", firstChild: { textContent: "" },
              classList: { toggle() {} }, addEventListener(type, f) { (this.listeners[type] ||= []).push(f); } };
  return new Proxy(t, { get: (o, k) => (k in o ? o[k] : () => undefined), set: (o, k, v) => { o[k] = v; return true; } });
}
const elements = {}, stored = {};
globalThis.document = { getElementById: (id) => (elements[id] ||= fake()), createElement: () => fake() };
for (const [id, text] of [["attach", "Image"], ["attach-audio", "Sound"]]) {   // as the page's markup has them
  Object.assign(document.getElementById(id), { hidden: true, firstChild: { textContent: text } });
}
globalThis.localStorage = { getItem: (k) => stored[k] ?? null, setItem: (k, v) => { stored[k] = v; } };
globalThis.FileReader = class { readAsDataURL(f) { this.result = `data:${f.type};base64,${f.b64}`; setTimeout(() => this.onload(), 0); } };
const realFetch = fetch;
globalThis.fetch = (url, opts) => realFetch(base + url, opts);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
(async () => {
  vm.runInThisContext(script);
  await sleep(500);                                   // /props and /v1/models
  const $ = (id) => document.getElementById(id);
  const shown = { image: !$("attach").hidden, sound: !$("attach-audio").hidden };
  for (const [input, file] of JSON.parse(choices)) {  // files chosen in the page's buttons
    $(input).files = [file];
    $(input).listeners.change.forEach((f) => f());
    await sleep(20);
  }
  const labels = () => [$("attach").firstChild.textContent, $("attach-audio").firstChild.textContent];
  const chosen = labels();
  $("input").value = "what is it?";
  $("form").listeners.submit.forEach((f) => f({ preventDefault() {} }));
  for (let i = 0; i < 600 && JSON.parse(stored.pyllm || "{}").messages?.length !== 2; i++) await sleep(100);
  console.log(JSON.stringify({ shown, chosen, sent: labels(), messages: JSON.parse(stored.pyllm).messages }));
})();
'''


def run_page(tmp_path, url: str, choices: list) -> dict:
    """The page's script against the server at url, the files `choices` ([button's input id, {type,
    b64}]) chosen, "what is it?" sent: {shown: the buttons the page shows, the buttons' labels when
    chosen and when sent, the messages saved}."""
    (tmp_path / "harness.js").write_text(HARNESS)
    (tmp_path / "choices.json").write_text(json.dumps(choices))
    r = subprocess.run([NODE, str(tmp_path / "harness.js"), url, str(PAGE), str(tmp_path / "choices.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(NODE is None, reason="node is not installed: the page's script is not run here")
def test_the_page_sends_a_sound_and_shows_the_reply(tmp_path):
    from test_server import served
    lm = synth.write_llama(tmp_path / "lm.gguf", QT.F32, n_vocab=512, image_tokens="audio", context_length=2048)
    mm = synth.write_audio_mmproj(tmp_path / "mm.gguf", projector="voxtral", stack=4)
    t = np.arange(16000) / 16000
    wav = wav_bytes(0.3 * np.sin(2 * np.pi * 440 * t))
    with Model(lm, mmproj=mm, n_ctx=1024, n_threads=2) as m, served(m) as server:
        out = run_page(tmp_path, server.url, [["audio", {"type": "audio/wav", "b64": base64.b64encode(wav).decode()}]])
    assert out["shown"] == {"image": False, "sound": True}       # the server says it hears, not sees
    assert out["chosen"] == ["Image", "Sound (1)"] and out["sent"] == ["Image", "Sound"]
    user, answer = out["messages"]
    assert user["content"][0] == {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(),
                                                                          "format": "wav"}}
    assert user["content"][1] == {"type": "text", "text": "what is it?"}
    assert answer["role"] == "assistant" and answer["content"]      # streamed back and saved


@pytest.mark.skipif(NODE is None, reason="node is not installed: the page's script is not run here")
def test_the_page_sends_a_picture(tmp_path):
    from PIL import Image

    from test_server import served
    lm = synth.write_gemma3(tmp_path / "lm.gguf", QT.F32, n_vocab=512)
    mm = synth.write_mmproj(tmp_path / "mm.gguf", n_out=256, qtype=QT.F32)
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
    png = base64.b64encode(buf.getvalue()).decode()
    with Model(lm, mmproj=mm, n_ctx=256, n_threads=2) as m, served(m) as server:
        out = run_page(tmp_path, server.url, [["image", {"type": "image/png", "b64": png}]] * 2)
    assert out["shown"] == {"image": True, "sound": False}
    assert out["chosen"] == ["Image (2)", "Sound"] and out["sent"] == ["Image", "Sound"]
    user, answer = out["messages"]
    assert [p["type"] for p in user["content"]] == ["image_url", "image_url", "text"]
    assert user["content"][0]["image_url"]["url"] == "data:image/png;base64," + png
    assert answer["role"] == "assistant" and answer["content"]
