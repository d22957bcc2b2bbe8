"""Created models (ollama's Modelfile, `pyllm create`): parsing every instruction
and refusing what is wrong, inheritance, the options a created model sets (only
those not given), and the commands end to end on SmolLM2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer
from typer.testing import CliRunner

from pyllm import created
from pyllm.errors import InvalidArgumentError, ModelNotFoundError, TemplateError

JINJA = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setenv("PYLLM_MODELS", str(folder))
    return folder


@pytest.fixture
def gguf(tmp_path) -> Path:
    path = tmp_path / "base.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def test_every_instruction(gguf, tmp_path, models_dir):
    (tmp_path / "lora.gguf").write_bytes(b"GGUF")
    text = f'''# comment
from {gguf.name}
PARAMETER temperature 0.25
parameter top_k 7
PARAMETER stop "<|im_end|>"
PARAMETER stop User:
PARAMETER num_ctx 1024
SYSTEM """You are
a pirate."""
MESSAGE user Who are you?
MESSAGE assistant """Captain
Byte."""
ADAPTER ./lora.gguf
TEMPLATE """{JINJA}"""
LICENSE MIT
'''
    m = created.parse(text, "pirate:v2", tmp_path)
    assert m.source == str(gguf) and m.adapters == [str(tmp_path / "lora.gguf")]
    assert m.parameters == {"temperature": 0.25, "top_k": 7, "stop": ["<|im_end|>", "User:"], "num_ctx": 1024}
    assert m.system == "You are\na pirate." and m.template == JINJA and m.license == ["MIT"]
    assert m.messages == [{"role": "user", "content": "Who are you?"},
                          {"role": "assistant", "content": "Captain\nByte."}]
    assert created.parse('FROM smollm2-135m\nSYSTEM """one line"""', "x", tmp_path).system == "one line"


@pytest.mark.parametrize("text,error,message", [
    ("PARAMETER temperature 1", InvalidArgumentError, "no FROM line"),
    ("FROM smollm2-135m\nFROM smollm2-135m", InvalidArgumentError, "a second FROM"),
    ("FROM smollm2-135m\nRUN this", InvalidArgumentError, "unknown instruction 'RUN'"),
    ("FROM smollm2-135m\nPARAMETER temprature 1", InvalidArgumentError, "unknown parameter 'temprature'"),
    ("FROM smollm2-135m\nPARAMETER top_k many", InvalidArgumentError, "top_k needs a int value"),
    ("FROM smollm2-135m\nPARAMETER seed", InvalidArgumentError, "seed needs a int value"),
    ('FROM smollm2-135m\nSYSTEM """open', InvalidArgumentError, "not closed"),
    ("FROM smollm2-135m\nMESSAGE system hi", InvalidArgumentError, "a SYSTEM line"),
    ("FROM smollm2-135m\nMESSAGE bot hi", InvalidArgumentError, "user or assistant"),
    ('FROM smollm2-135m\nTEMPLATE """{% for %}"""', TemplateError, "not valid Jinja"),
    ("FROM smollm2-135m\nADAPTER missing.gguf", InvalidArgumentError, "no adapter file"),
    ("FROM nowhere.gguf", ModelNotFoundError, "does not exist"),
    ("FROM Modelfile", InvalidArgumentError, "not a GGUF file"),
])
def test_refused_with_the_line(tmp_path, models_dir, text, error, message):
    (tmp_path / "Modelfile").write_text(text)
    with pytest.raises(error, match=message):
        created.parse(text, "x", tmp_path)


def test_a_go_template_is_left_out_with_a_warning(tmp_path, models_dir, caplog):
    text = 'FROM smollm2-135m\nTEMPLATE """{{- if .System }}{{ .System }}{{ end }}{{ .Prompt }}"""\nSYSTEM hi\n'
    with caplog.at_level("WARNING", logger="pyllm"):
        m = created.parse(text, "x", tmp_path)
    assert m.template is None and m.system == "hi"
    assert any("Go template" in r.getMessage() and "Modelfile:2" in r.getMessage() for r in caplog.records)
    with caplog.at_level("WARNING", logger="pyllm"):     # ollama's parameters pyllm has no use for
        m = created.parse("FROM smollm2-135m\nPARAMETER num_keep 24\nPARAMETER top_k 5\n", "y", tmp_path)
    assert m.parameters == {"top_k": 5} and any("num_keep" in r.getMessage() for r in caplog.records)


def test_names(tmp_path, models_dir):
    for bad in ("", "has space", "a:b:c", "../up", "smollm2-135m"):
        with pytest.raises(InvalidArgumentError):
            created.parse("FROM smollm2-135m", bad, tmp_path)


def test_saved_inherited_listed_removed(gguf, tmp_path, models_dir):
    base = created.parse(f"FROM {gguf}\nPARAMETER temperature 0.5\nPARAMETER stop A\nSYSTEM s1\n"
                           f"MESSAGE user hi", "base", tmp_path)
    created.save(base)
    child = created.parse("FROM base\nPARAMETER top_k 3\nPARAMETER stop B\n", "child:v1", tmp_path)
    assert child.source == "base"
    created.save(child)
    got = created.resolved("child:v1")
    assert got.source == str(gguf) and got.name == "child:v1"
    assert got.parameters == {"temperature": 0.5, "top_k": 3, "stop": ["B"]}   # its own stop list wins
    assert got.system == "s1" and got.messages == [{"role": "user", "content": "hi"}]
    assert got.modelfile.startswith("FROM base")
    assert [m.name for m in created.all_created()] == ["base", "child:v1"]
    assert created.resolved("nothing") is None
    # a circle (made by editing the files) is an error, not a hang
    created.save(created.CreatedModel("base", "child:v1"))
    with pytest.raises(InvalidArgumentError, match="circle"):
        created.resolved("child:v1")
    assert created.remove("child:v1") and not created.remove("child:v1")
    created.created_path("base").write_text("{not json")
    with pytest.raises(InvalidArgumentError, match="damaged"):
        created.load("base")


def test_created_options_are_defaults_only(gguf, tmp_path, models_dir):
    """The wrapper sets the options not given from the created model; those given stay."""
    from pyllm.cli.common import created_messages, with_created_defaults
    created.save(created.parse(f"FROM {gguf}\nPARAMETER temperature 0.1\nPARAMETER num_predict 9\n"
                                   f"PARAMETER num_gpu 0\nPARAMETER stop X\nSYSTEM be brief\nMESSAGE user hi\n"
                                   f"TEMPLATE \"\"\"{JINJA}\"\"\"\n", "brief", tmp_path))
    seen = {}

    def command(model: Annotated[Optional[str], typer.Option("-m")] = None,
                temp: Annotated[float, typer.Option("--temp")] = 0.8,
                n_predict: Annotated[int, typer.Option("-n")] = 128,
                n_gpu_layers: Annotated[str, typer.Option("-ngl")] = "auto",
                stop: Annotated[list[str], typer.Option("--stop")] = [],
                chat: Annotated[bool, typer.Option("--chat")] = False,
                system: Annotated[Optional[str], typer.Option("--system")] = None,
                chat_template: Annotated[Optional[str], typer.Option("--chat-template")] = None,
                lora: Annotated[list[str], typer.Option("--lora")] = []) -> None:
        seen.update(locals(), messages=created_messages())
    app = typer.Typer()
    app.command()(with_created_defaults(command))
    runner = CliRunner()
    assert runner.invoke(app, ["-m", "brief", "--chat"]).exit_code == 0
    assert (seen["temp"], seen["n_predict"], seen["n_gpu_layers"], seen["stop"]) == (0.1, 9, "0", ["X"])
    assert seen["system"] == "be brief" and seen["chat_template"] == JINJA
    assert seen["messages"] == [{"role": "user", "content": "hi"}]
    assert runner.invoke(app, ["-m", "brief", "--temp", "0.8", "-n", "2", "--system", "mine"]).exit_code == 0
    assert (seen["temp"], seen["n_predict"], seen["system"]) == (0.8, 2, "mine")
    assert runner.invoke(app, ["-m", "brief"]).exit_code == 0
    assert seen["system"] is None                     # raw completion: no system prompt
    assert runner.invoke(app, ["-m", str(gguf)]).exit_code == 0
    assert (seen["temp"], seen["messages"]) == (0.8, [])


def test_inline_jinja_chat_template():
    from pyllm.cli.options import template_arg
    assert template_arg(JINJA) == JINJA and template_arg("chatml") == "chatml"


def cli(*args, env, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pyllm.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_commands_end_to_end(smollm2_path, tmp_path):
    from pyllm import Model
    env = {**os.environ, "PYLLM_MODELS": str(tmp_path / "models")}
    (tmp_path / "Modelfile").write_text(f'FROM {smollm2_path}\nPARAMETER temperature 0\nPARAMETER num_predict 8\n'
                                        f'SYSTEM """You are a pirate."""\nMESSAGE user Who are you?\n'
                                        f'MESSAGE assistant I be Captain Byte!\n')
    r = cli("create", "pirate", env=env, cwd=tmp_path)
    assert r.returncode == 0 and "created pirate" in r.stderr, r.stderr
    r = cli("run", "-m", "pirate", "--chat", "-p", "Where is your ship?", "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    with Model(smollm2_path) as m:
        want = m.chat([{"role": "system", "content": "You are a pirate."},
                       {"role": "user", "content": "Who are you?"},
                       {"role": "assistant", "content": "I be Captain Byte!"},
                       {"role": "user", "content": "Where is your ship?"}], temperature=0, max_tokens=8)
    assert out["text"] == want.text and out["generated_tokens"] == want.metrics.generated_tokens
    assert out["prompt_tokens"] == want.metrics.prompt_tokens
    r = cli("run", "-m", "pirate", "--chat", "-p", "Where is your ship?", "--json", "-n", "3", env=env)
    assert json.loads(r.stdout)["generated_tokens"] == 3
    r = cli("list", env=env)
    assert "pirate\tcreated\tFROM " + smollm2_path in r.stdout
    r = cli("info", "-m", "pirate", "--modelfile", env=env)
    assert r.stdout == (tmp_path / "Modelfile").read_text()
    lines = cli("info", "-m", "pirate", env=env).stdout.splitlines()
    assert lines[0].split() == ["created", "pirate", "FROM", smollm2_path]
    assert lines[1].split() == ["parameter", "temperature", "0.0"] and "2 messages to start from" in lines[4]
    info = json.loads(cli("info", "-m", "pirate", "--json", env=env).stdout)
    assert info["created"]["parameters"] == {"temperature": 0.0, "num_predict": 8} and info["created"]["messages"] == 2
    (tmp_path / "Bad").write_text("FROM smollm2-135m\nPARAMETER temprature 0.2\n")
    r = cli("create", "bad", "-f", str(tmp_path / "Bad"), env=env)
    assert r.returncode == 2 and f"{tmp_path / 'Bad'}:2: unknown parameter" in r.stderr and "Traceback" not in r.stderr
    r = cli("rm", "pirate", env=env)
    assert r.returncode == 0 and "deleted the created model pirate" in r.stderr
    r = cli("run", "-m", "pirate", "-p", "x", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def post(url: str, path: str, body: dict, method: str = "POST") -> dict:
    import urllib.error
    import urllib.request
    data = json.dumps(body).encode() if method != "GET" else None
    req = urllib.request.Request(url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{path}: {e.code} {e.read()!r}") from None


def test_server_requests_take_a_created_model_s_defaults(smollm2_path, tmp_path, monkeypatch):
    """Named in a request (the server switching to it, its loader given the created model) or
    served with -m: its SYSTEM, MESSAGEs and PARAMETERs under each request's own settings."""
    import threading

    from pyllm import Model
    from pyllm.server import make_server
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path / "models"))
    created.save(created.parse(f"FROM {smollm2_path}\nPARAMETER temperature 0\nPARAMETER num_predict 6\n"
                               f"PARAMETER num_ctx 512\nSYSTEM You are a pirate.\nMESSAGE user Who are you?\n"
                               f"MESSAGE assistant I be Captain Byte!\n", "pirate", tmp_path))
    question = [{"role": "user", "content": "Where is your ship?"}]
    seed = [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Who are you?"},
            {"role": "assistant", "content": "I be Captain Byte!"}]
    loaded = []

    def load(path, made=None):
        loaded.append(made.name if made else None)
        return Model(path, n_ctx=made.parameters["num_ctx"] if made else 256, n_threads=2)
    with load(smollm2_path) as m:
        want = m.chat(seed + question, temperature=0, max_tokens=6).text
        own_system = m.chat([{"role": "system", "content": "Be brief."}] + seed[1:] + question,
                            temperature=0, max_tokens=3).text
        plain = m.chat(question, temperature=0, max_tokens=6).text
    server = make_server(load(smollm2_path), "127.0.0.1", 0, name="smollm2", load=load)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = server.url
        assert "pirate" in {t["name"] for t in post(url, "/api/tags", {}, "GET")["models"]}
        r = post(url, "/v1/chat/completions", {"model": "smollm2", "messages": question, "temperature": 0,
                                               "max_tokens": 6})
        assert r["choices"][0]["message"]["content"] == plain and server.host.created is None
        r = post(url, "/v1/chat/completions", {"model": "pirate", "messages": question})
        assert r["choices"][0]["message"]["content"] == want and loaded[-1] == "pirate"
        assert server.host.model.n_ctx == 512 and server.host.created.name == "pirate"
        r = post(url, "/api/chat", {"model": "pirate", "messages": question, "stream": False})
        assert r["message"]["content"] == want
        r = post(url, "/api/generate", {"model": "pirate", "prompt": question[0]["content"], "stream": False})
        assert r["response"] == want
        r = post(url, "/v1/chat/completions", {"model": "pirate", "max_tokens": 3, "messages": [
            {"role": "system", "content": "Be brief."}] + question})     # the request's own system and length
        assert r["choices"][0]["message"]["content"] == own_system and r["usage"]["completion_tokens"] <= 3
        show = post(url, "/api/show", {"model": "pirate"})
        assert show["system"] == "You are a pirate." and "temperature 0" in show["parameters"]
        assert show["modelfile"].startswith("FROM ")
        post(url, "/api/delete", {"model": "pirate"}, "DELETE")
        assert created.load("pirate") is None and Path(smollm2_path).is_file()
    finally:
        server.shutdown()
        server.server_close()
        server.host.close()


def test_server_create_and_copy(smollm2_path, tmp_path, monkeypatch):
    """ollama's /api/create (a Modelfile's text, or its fields) and /api/copy; pyllm cp."""
    import shutil
    import threading

    from pyllm import Model
    from pyllm.server import make_server
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(smollm2_path, folder / "smol.gguf")
    monkeypatch.setenv("PYLLM_MODELS", str(folder))
    load = lambda path, made=None: Model(path, n_ctx=256, n_threads=2)   # noqa: E731
    server = make_server(load(folder / "smol.gguf"), "127.0.0.1", 0, name="smol", load=load)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = server.url
        assert post(url, "/api/create", {"model": "a", "modelfile": "FROM smol\nPARAMETER top_k 5\nSYSTEM hi\n",
                                         "stream": False}) == {"status": "success"}
        assert created.resolved("a").parameters == {"top_k": 5} and created.resolved("a").system == "hi"
        r = post(url, "/api/create", {"model": "b", "from": "a", "system": "Be brief.", "stream": False,
                                      "parameters": {"temperature": 0.2, "stop": ["X", "Y"]},
                                      "messages": [{"role": "user", "content": "hi"}]})
        assert r == {"status": "success"}
        b = created.resolved("b")
        assert b.source == str(folder / "smol.gguf") and b.system == "Be brief."
        assert b.parameters == {"top_k": 5, "temperature": 0.2, "stop": ["X", "Y"]}
        assert created.parse(b.modelfile, "again", folder).parameters == {"temperature": 0.2, "stop": ["X", "Y"]}
        assert "b" in {t["name"] for t in post(url, "/api/tags", {}, "GET")["models"]}
        assert post(url, "/api/copy", {"source": "b", "destination": "c"}) == {}
        assert created.resolved("c").system == "Be brief."
        post(url, "/api/copy", {"source": "smol", "destination": "d"})
        assert created.resolved("d").source == str(folder / "smol.gguf")
        for body, message in (({"model": "e", "from": "nowhere"}, "not a registry model"),
                              ({"model": "e", "from": "smol", "parameters": {"temprature": 1}}, "unknown parameter"),
                              ({"model": "e", "from": "smol", "quantize": "q4_K_M"}, "quantize is not supported"),
                              ({"model": "smollm2-135m", "from": "smol"}, "is a registry model")):
            with pytest.raises(AssertionError, match=message):
                post(url, "/api/create", body)
        with pytest.raises(AssertionError, match="404"):
            post(url, "/api/copy", {"source": "nothing", "destination": "f"})
    finally:
        server.shutdown()
        server.server_close()
        server.host.close()
    env = {**os.environ, "PYLLM_MODELS": str(folder)}
    r = cli("cp", "c", "g", env=env)
    assert r.returncode == 0 and created.resolved("g").system == "Be brief."
    r = cli("cp", "nothing", "h", env=env)
    assert r.returncode == 2 and "not a registry model" in r.stderr and "Traceback" not in r.stderr


def test_quoted_values_round_trip(gguf, tmp_path, models_dir):
    """A "string" reads its backslash escapes, and a model made without a Modelfile (ollama's
    /api/create fields) writes one that reads back the same, quotes and newlines included."""
    m = created.parse(f'FROM {gguf}\nPARAMETER stop "say \\"hi\\"\\n"\nPARAMETER stop plain\n', "q", tmp_path)
    assert m.parameters["stop"] == ['say "hi"\n', "plain"]
    made = created.from_request("r", {"from": str(gguf), "system": "two\nlines", "parameters": {
        "stop": ['a "b"', "c\\d"], "top_k": 3}, "messages": [{"role": "user", "content": "hi there"}]})
    again = created.parse(made.modelfile, "r2", tmp_path)
    assert (again.parameters, again.system, again.messages) == (made.parameters, made.system, made.messages)
    assert made.parameters == {"stop": ['a "b"', "c\\d"], "top_k": 3}
    with pytest.raises(InvalidArgumentError, match="top_k needs a int"):
        created.from_request("s", {"from": str(gguf), "parameters": {"top_k": [1, 2, "x"]}})
