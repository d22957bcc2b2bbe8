"""A conversation's KV cache on disk (pyllm/state.py): Model.save_state / load_state,
`pyllm run --prompt-cache`, and the server's POST /slots/ID?action=save|restore|erase."""
import json

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_cli import pyllm
from test_server import call, served
from pyllm import Model
from pyllm.errors import InvalidArgumentError, ModelFileError, UnsupportedModelError

PROMPT = [int(t) for t in np.random.default_rng(5).integers(3, 500, 70)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return synth.write_llama(tmp_path_factory.mktemp("state") / "m.gguf", QT.Q8_0)


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_a_saved_prompt_continues_as_computed(llama, tmp_path, cache):
    """Save the prompt's cache, load it into a fresh model: the same reply, the prompt read
    from the file (all but the one token a step must compute)."""
    with Model(llama, n_threads=2, cache_type_k=cache, cache_type_v=cache) as m:
        want = m.generate(PROMPT, max_tokens=12, temperature=0)
        assert m.save_state(tmp_path / "s.npz", n_tokens=len(PROMPT)) > 0
    with Model(llama, n_threads=2, cache_type_k=cache, cache_type_v=cache) as m:
        assert m.load_state(tmp_path / "s.npz") == len(PROMPT)
        got = m.generate(PROMPT, max_tokens=12, temperature=0)
        assert got.tokens == want.tokens and got.metrics.reused_tokens == len(PROMPT) - 1
        # the whole conversation (prompt and reply) saved, then a longer prompt goes on from it
        m.save_state(tmp_path / "all.npz")
    with Model(llama, n_threads=2, cache_type_k=cache, cache_type_v=cache) as m:
        assert m.load_state(tmp_path / "all.npz") == len(PROMPT) + len(want.tokens) - 1
        longer = PROMPT + want.tokens + [7, 8]
        c = m.generate(longer, max_tokens=4, temperature=0)
        assert c.metrics.reused_tokens == len(PROMPT) + len(want.tokens) - 1
    with Model(llama, n_threads=2, cache_type_k=cache, cache_type_v=cache) as m:
        assert m.generate(longer, max_tokens=4, temperature=0).tokens == c.tokens


def test_a_state_only_loads_where_it_was_made(llama, tmp_path):
    with Model(llama, n_threads=2) as m:
        m.generate(PROMPT, max_tokens=2, temperature=0)
        m.save_state(tmp_path / "s.npz")
    with Model(llama, n_threads=2, cache_type_k="q8_0", cache_type_v="q8_0") as m:
        with pytest.raises(InvalidArgumentError, match="kv_types"):
            m.load_state(tmp_path / "s.npz")
    other = synth.write_llama(tmp_path / "other.gguf", QT.F16)
    with Model(other, n_threads=2) as m:
        with pytest.raises(InvalidArgumentError, match="another setup"):
            m.load_state(tmp_path / "s.npz")
        with pytest.raises(InvalidArgumentError, match="no saved state"):
            m.load_state(tmp_path / "missing.npz")
        (tmp_path / "junk.npz").write_bytes(b"not a zip")
        with pytest.raises(ModelFileError, match="not a saved pyllm state"):
            m.load_state(tmp_path / "junk.npz")
    with Model(llama, n_threads=2, n_ctx=32) as m:   # more tokens than its context holds
        with pytest.raises(Exception, match="do not fit"):
            m.load_state(tmp_path / "s.npz")


def test_recurrent_and_split_models_refuse(tmp_path, llama):
    mamba = synth.write_mamba2(tmp_path / "mamba.gguf", QT.F32)
    with Model(mamba, n_threads=2) as m:
        with pytest.raises(UnsupportedModelError, match="recurrent"):
            m.save_state(tmp_path / "x.npz")
    with Model(llama, n_threads=2, device="sim", n_gpu_layers=1) as m:
        with pytest.raises(UnsupportedModelError, match="on the CPU"):
            m.save_state(tmp_path / "x.npz")


def test_cli_prompt_cache(smollm2_path, tmp_path):
    text = "The history of the city begins in the Roman era, when a small settlement grew along the river."
    common = ["run", "-m", smollm2_path, "-p", text, "-n", "6", "--temp", "0", "--json", "--prompt-cache",
              str(tmp_path / "pc.npz")]
    runs = [json.loads(pyllm(*common).stdout) for _ in range(2)]
    assert runs[0]["reused_tokens"] == 0 and runs[1]["reused_tokens"] == runs[1]["prompt_tokens"] - 1
    assert runs[0]["text"] == runs[1]["text"]
    before = (tmp_path / "pc.npz").stat().st_mtime_ns
    r = pyllm(*common, "--prompt-cache-ro")
    assert json.loads(r.stdout)["reused_tokens"] > 0 and (tmp_path / "pc.npz").stat().st_mtime_ns == before
    other = synth.write_llama(tmp_path / "other.gguf", QT.F16)
    r = pyllm("run", "-m", other, "-p", "hello", "-n", "2", "--prompt-cache", str(tmp_path / "pc.npz"))
    assert r.returncode == 0 and "--prompt-cache not used" in r.stderr


def test_server_slot_save_restore_erase(llama, tmp_path):
    with Model(llama, n_threads=2) as m:
        with served(m, parallel=1, slot_save_path=tmp_path) as server:
            def post(path, body):
                status, out = call(server.url, path, body)
                assert status == 200, out
                return out
            ask = {"prompt": PROMPT, "n_predict": 4, "temperature": 0, "return_tokens": True}
            first = post("/completion", ask)
            n = call(server.url, "/slots")[1][0]["n_past"]
            assert n == len(PROMPT) + 3
            saved = post("/slots/0?action=save", {"filename": "conv.bin"})
            assert saved["n_saved"] == n and saved["n_written"] == (tmp_path / "conv.bin").stat().st_size
            assert post("/slots/0?action=erase", {}) == {"id_slot": 0, "n_erased": n}
            assert call(server.url, "/slots")[1][0]["n_past"] == 0
            assert post("/slots/0?action=restore", {"filename": "conv.bin"})["n_restored"] == n
            assert call(server.url, "/slots")[1][0]["n_past"] == n
            again = post("/completion", ask)
            assert again["tokens"] == first["tokens"] and again["timings"]["cache_n"] == len(PROMPT) - 1
            for path, body in (("/slots/0?action=save", {"filename": "../x"}), ("/slots/5?action=save", {"filename": "x"}),
                               ("/slots/0?action=fly", {}), ("/slots/0?action=restore", {"filename": "none.bin"})):
                assert call(server.url, path, body)[0] == 400, path
        with served(m, parallel=3, slot_save_path=tmp_path) as server:   # id_slot picks the slot
            status, out = call(server.url, "/completion", {"prompt": PROMPT[:9], "n_predict": 2, "id_slot": 2})
            assert status == 200 and out["id_slot"] == 2
            assert [s["n_past"] for s in call(server.url, "/slots")[1]] == [0, 0, 10]
            assert call(server.url, "/slots/2?action=save", {"filename": "two.bin"})[1]["n_saved"] == 10
            assert call(server.url, "/completion", {"prompt": PROMPT[:9], "id_slot": 7})[0] == 400
        with served(m, parallel=1) as server:   # no --slot-save-path
            status, out = call(server.url, "/slots/0?action=save", {"filename": "a"})
            assert status == 501 and "--slot-save-path" in out["error"]["message"]
