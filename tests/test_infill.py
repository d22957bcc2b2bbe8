"""Fill in the middle (pyllm/infill.py): the two prompt layouts, spelled out token by token
here, and the ways in: Model.infill, the server's /infill (llama-server's), OpenAI's and
ollama's `suffix`, and `pyllm run --suffix`.

No model in the registry was trained with FIM tokens, so the models here get them named
in their metadata (tokenizer.ggml.fim_*_token_id, as a converter writes them for a code
model). On SmolLM2 so marked, llama.cpp computes the same top tokens from the same
PSM prompt (checked by hand with llama-cpp-python when this was written: top-5 equal at
both positions looked at, logits within 0.4).
"""
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_cli import one_error_line, pyllm
from test_server import call, served
from pyllm import Model
from pyllm.errors import InvalidArgumentError, UnsupportedModelError
from pyllm.infill import CHUNK_SEPARATOR, psm_prompt, server_prompt

PRE, SUF, MID, REP, SEP = 300, 301, 302, 303, 304


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return synth.write_llama(tmp_path_factory.mktemp("fim") / "plain.gguf", QT.F32)


@pytest.fixture(scope="module")
def fim(tmp_path_factory, plain):
    """The synthetic llama with FIM tokens, BOS added, no repo or file-separator tokens."""
    return synth.rewrite_metadata(plain, tmp_path_factory.mktemp("fim") / "fim.gguf", {
        "tokenizer.ggml.fim_pre_token_id": PRE, "tokenizer.ggml.fim_suf_token_id": SUF,
        "tokenizer.ggml.fim_mid_token_id": MID, "tokenizer.ggml.add_bos_token": True})


@pytest.fixture(scope="module")
def fim_repo(tmp_path_factory, fim):
    """... and with the repo-level tokens (Qwen2.5-Coder's <|repo_name|>, <|file_sep|>)."""
    return synth.rewrite_metadata(fim, tmp_path_factory.mktemp("fim") / "repo.gguf", {
        "tokenizer.ggml.fim_rep_token_id": REP, "tokenizer.ggml.fim_sep_token_id": SEP})


def text(m, s):
    return m.tokenizer.encode(s, add_bos=False, parse_special=False)


def test_psm_prompt(fim):
    with Model(fim, n_threads=2) as m:
        assert psm_prompt(m.tokenizer, "x", "def f(", "):\n") == [0, PRE] + text(m, "def f(") + [SUF] + \
            text(m, "):\n") + [MID]


def test_server_prompt_with_repo_tokens_and_extra_files(fim_repo):
    with Model(fim_repo, n_threads=2, n_ctx=512, n_batch=64) as m:
        extra = [{"filename": "a.py", "text": "x = 1\n"}, {"text": "y = 2\n"}]
        got = server_prompt(m.tokenizer, "x", "ab", "cd", prompt="ef", extra=extra, n_batch=64, n_ctx=512,
                            n_predict=16)
        files = [REP] + text(m, "myproject\n") + [SEP] + text(m, "a.py\n") + text(m, "x = 1\n") + \
            [SEP] + text(m, "tmp\n") + text(m, "y = 2\n") + [SEP] + text(m, "filename\n")
        assert got == files + [0, PRE] + text(m, "ab") + text(m, "ef") + [SUF] + text(m, "cd") + [MID]


def test_server_prompt_keeps_what_fits(fim):
    """The prefix's last 3/4 of a batch, the suffix's first quarter less the prompt and 2, the
    extra chunks' end in what the context leaves after a batch and 2 n_predict; without a
    file-separator token a plain-text separator goes before each chunk."""
    with Model(fim, n_threads=2, n_ctx=512, n_batch=64) as m:
        prefix, suffix = "abcdefgh" * 20, "ijklmnop" * 20
        P, S = text(m, prefix), text(m, suffix)
        assert len(P) > 48 and len(S) > 16
        got = server_prompt(m.tokenizer, "x", prefix, suffix, prompt="q", n_batch=64, n_ctx=512, n_predict=16)
        assert got == [0, PRE] + P[-48:] + text(m, "q") + [SUF] + S[:16 - 2 - 1] + [MID]
        chunk = [{"text": "z" * 600}]
        got = server_prompt(m.tokenizer, "x", "a", "b", extra=chunk, n_batch=64, n_ctx=512, n_predict=200)
        everything = text(m, CHUNK_SEPARATOR) + text(m, "z" * 600)
        room = 512 - 64 - 2 * 200
        assert room < len(everything) and got[:room] == everything[-room:] and got[room:room + 2] == [0, PRE]


def test_models_without_fim_tokens_and_bad_extra_are_refused(plain, fim):
    with Model(plain, n_threads=2) as m:
        with pytest.raises(UnsupportedModelError, match="no fill-in-the-middle tokens"):
            m.infill("a", "b")
    with Model(fim, n_threads=2) as m:
        for bad in ("text", [{"text": 3}], [["a"]]):
            with pytest.raises(InvalidArgumentError, match="input_extra"):
                m.infill("a", "b", extra=bad)


def test_infill_generates_from_that_prompt(fim):
    with Model(fim, n_threads=2) as m:
        ids = m.infill_prompt("ab", "cd", max_tokens=8)
        want = m.generate(ids, max_tokens=8, temperature=0)
        got = m.infill("ab", "cd", max_tokens=8, temperature=0)
        assert got.tokens == want.tokens and len(got.tokens) > 0
        assert "".join(m.infill("ab", "cd", max_tokens=8, temperature=0, stream=True)) == want.text


def test_server_infill_and_suffix(fim, plain):
    with Model(fim, n_threads=2) as m:
        want_infill = m.infill("ab", "cd", prompt="e", max_tokens=6, temperature=0).text
        want_psm = m.generate(psm_prompt(m.tokenizer, "x", "ab", "cd"), max_tokens=6, temperature=0).text
        with served(m) as server:
            status, got = call(server.url, "/infill", {"input_prefix": "ab", "input_suffix": "cd", "prompt": "e",
                                                       "n_predict": 6, "temperature": 0})
            assert status == 200 and got["content"] == want_infill
            status, got = call(server.url, "/v1/completions", {"prompt": "ab", "suffix": "cd", "max_tokens": 6,
                                                               "temperature": 0})
            assert status == 200 and got["choices"][0]["text"] == want_psm
            status, got = call(server.url, "/api/generate", {"prompt": "ab", "suffix": "cd", "stream": False,
                                                             "options": {"num_predict": 6, "temperature": 0}})
            assert status == 200 and got["response"] == want_psm
            assert call(server.url, "/infill", {"input_prefix": 3})[0] == 400
    with Model(plain, n_threads=2) as m:
        with served(m) as server:
            status, out = call(server.url, "/infill", {"input_prefix": "a"})
            assert status == 501 and "fill-in-the-middle" in out["error"]["message"]


def test_cli_run_suffix(fim, plain):
    with Model(fim, n_threads=2) as m:
        want = m.generate(psm_prompt(m.tokenizer, "x", "ab", "cd"), max_tokens=6, temperature=0).text
    r = pyllm("run", "-m", fim, "-p", "ab", "--suffix", "cd", "-n", "6", "--temp", "0", "-t", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + ("" if want.endswith("\n") else "\n")
    one_error_line(pyllm("run", "-m", plain, "-p", "ab", "--suffix", "cd", "-n", "2"), "fill-in-the-middle")
    one_error_line(pyllm("run", "-m", fim, "-p", "ab", "--suffix", "cd", "--chat"), "--suffix")
