"""`pyllm run` and friends as a shell script uses them: stdout, stderr, exit codes."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import synth

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.model


def pyllm(*args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, input=input,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("using the default model")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_chat_json_from_stdin(smollm2_path):
    r = pyllm("run", "--chat", "--json", "-n", "40", input="Write a haiku\n")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["chat"] is True and out["text"].strip()
    assert out["finish_reason"] in ("stop", "length") and 0 < out["generated_tokens"] <= 40
    assert out["prompt_tokens"] > 10 and out["ttft_s"] > 0 and out["decode_tokens_per_s"] > 0
    assert isinstance(out["seed"], int)
    assert "using the default model, smollm2-135m" in r.stderr       # said on stderr, not stdout


def test_missing_model_is_one_line_and_exit_2():
    one_error_line(pyllm("run", "-p", "x", "-m", "/nonexistent"), "no model file at /nonexistent")
    one_error_line(pyllm("run", "-p", "x", "-m", "no-such-model"), "no model file at no-such-model")


def test_pipe_gets_only_the_text(smollm2_path, tmp_path):
    r = pyllm("run", "-m", smollm2_path, "-p", "The capital of France is", "-n", "8", "--temp", "0")
    j = pyllm("run", "-m", smollm2_path, "-p", "The capital of France is", "-n", "8", "--temp", "0", "--json")
    assert r.returncode == 0 and j.returncode == 0
    text = json.loads(j.stdout)["text"]
    assert r.stdout == text + ("" if text.endswith("\n") else "\n")
    assert "\x1b" not in r.stdout and "Paris" in r.stdout
    assert r.stderr == ""                       # -m given: nothing to say
    (tmp_path / "p.txt").write_text("The capital of France is")
    r = pyllm("run", "-m", smollm2_path, "-f", str(tmp_path / "p.txt"), "--stop", ".", "--temp", "0", "-n", "30")
    assert r.returncode == 0 and r.stdout == " Paris\n"


def test_bad_input_exits_2(smollm2_path, tmp_path):
    one_error_line(pyllm("run", "-m", smollm2_path, "-p", "x", "--top-p", "2"), "top_p must be in [0, 1]")
    one_error_line(pyllm("run", "-m", smollm2_path, "-f", str(tmp_path / "none.txt")), "cannot read the prompt file")
    one_error_line(pyllm("run", "-m", smollm2_path, "-p", "x", "-l", "nonsense"), "--logit-bias")
    one_error_line(pyllm("run", "-m", smollm2_path, "-p", "x", "--system", "s"), "--system needs --chat")
    one_error_line(pyllm("run", "-m", smollm2_path, "--chat", input=""), "the prompt is empty")
    one_error_line(pyllm("run", "-m", smollm2_path, "-p", "x", "--think"), "--think needs --chat")


def test_think_switch(smollm2_path, tmp_path):
    """--think / --no-think set the template's enable_thinking; a template without that
    switch gets a warning (SmolLM2's), one with it renders each way."""
    r = pyllm("run", "-m", smollm2_path, "--chat", "-p", "hi", "-n", "2", "--no-think")
    assert r.returncode == 0 and "--no-think does nothing: this model's chat template has no enable_thinking" \
        in r.stderr
    (tmp_path / "t.jinja").write_text("{{ 'T' if enable_thinking is defined and enable_thinking else 'N' }}:"
                                      "{{ messages[-1].content }}")
    for flag in ("--think", "--no-think"):
        j = pyllm("run", "-m", smollm2_path, "--chat", "-p", "hi", "-n", "1", "--json", "--temp", "0",
                  "--chat-template", str(tmp_path / "t.jinja"), flag)
        assert j.returncode == 0 and "warning" not in j.stderr, j.stderr
    from pyllm import Model
    with Model(smollm2_path, n_ctx=64, chat_template=(tmp_path / "t.jinja").read_text(), think=True) as m:
        assert m.apply_chat_template([{"role": "user", "content": "hi"}]) == "T:hi"
        m.think = False
        assert m.apply_chat_template([{"role": "user", "content": "hi"}]) == "N:hi"
        m.think = None
        assert m.apply_chat_template([{"role": "user", "content": "hi"}]) == "N:hi"
        assert m.chat_template.has_thinking_switch


def test_template_reaching_python_internals_is_refused(smollm2_path, tmp_path):
    from pyllm.model_file import ModelFile

    bad = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    path = synth.write_llama(tmp_path / "evil.gguf", synth.QT.F16, n_embd=64, n_ff=128,
                             tokenizer_from=ModelFile(smollm2_path).metadata,
                             keys={"chat_template": bad})
    one_error_line(pyllm("run", "--chat", "-m", path, "-p", "hi"), "Python internals", "'__subclasses__'")
    r = pyllm("chat", "-m", path, input="hello\n")
    one_error_line(r, "Python internals")
    # raw completion does not use the template: the file still works for that
    r = pyllm("run", "-m", path, "-p", "Hello", "-n", "3", "--temp", "0", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["generated_tokens"] >= 1
    (tmp_path / "t.jinja").write_text("{{ ''|attr('__class__') }}")
    one_error_line(pyllm("run", "--chat", "-m", path, "-p", "hi", "--chat-template", str(tmp_path / "t.jinja")),
                   "Python internals")


def test_ctrl_c_exits_130(smollm2_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "-m", smollm2_path, "-p", "Once upon a time",
                          "-n", "400", "--temp", "0"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    first = p.stdout.read(8)                    # generation has started
    assert first
    p.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    out, errs = p.communicate(timeout=30)
    assert p.returncode == 130 and time.monotonic() - t0 < 5
    assert errs.decode().strip().endswith("interrupted")


def test_list_shows_the_models(smollm2_path):
    r = pyllm("list")
    assert r.returncode == 0
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("smollm2-135m"))
    assert "(default)" in line and "\tdownloaded" in line


def test_run_takes_llama_cpp_s_other_samplers(smollm2_path):
    """--top-nsigma, --xtc-*, --mirostat*: seeded runs repeat; a bad value is one line, exit 2."""
    import subprocess
    import sys
    base = [sys.executable, "-m", "pyllm.cli.main", "run", "-m", smollm2_path, "-p", "Once upon a time", "-n", "12",
            "-s", "3"]
    for flags in (["--mirostat", "2", "--mirostat-ent", "3"], ["--mirostat", "1", "--mirostat-lr", "0.2"],
                  ["--top-nsigma", "1.5", "--xtc-probability", "0.5", "--xtc-threshold", "0.05"]):
        outs = [subprocess.run(base + flags, capture_output=True, text=True, timeout=120) for _ in range(2)]
        assert outs[0].returncode == 0 and outs[0].stdout.strip() and outs[0].stdout == outs[1].stdout, flags
    r = subprocess.run(base + ["--mirostat", "3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "mirostat must be 0 (off), 1 or 2" in r.stderr


def test_run_takes_the_dry_flags(smollm2_path):
    """--dry-*: what Model.generate gives with the same settings; --dry-sequence-breaker replaces the
    defaults ('none': no breakers); a bad value is one line, exit 2."""
    import subprocess
    import sys
    from pyllm import Model
    loop = "one two three: one two three: one two three: one two three:"
    base = [sys.executable, "-m", "pyllm.cli.main", "run", "-m", smollm2_path, "-p", loop, "-n", "12", "--temp", "0",
            "--json"]

    def tokens(*flags):
        r = subprocess.run(base + list(flags), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["tokens"]
    dry = ["--dry-multiplier", "1.5", "--dry-allowed-length", "1"]
    with Model(smollm2_path) as m:
        def want(breakers):
            return m.generate(loop, max_tokens=12, temperature=0, dry_multiplier=1.5, dry_allowed_length=1,
                              dry_sequence_breakers=breakers).tokens
        plain = m.generate(loop, max_tokens=12, temperature=0).tokens
        default, none = want(["\n", ":", '"', "*"]), want([])
    assert len({tuple(plain), tuple(default), tuple(none)}) == 3      # the breaker ":" matters here
    assert tokens(*dry) == default
    assert tokens(*dry, "--dry-sequence-breaker", "none") == none
    assert tokens(*dry, "--dry-sequence-breaker", "x", "--dry-sequence-breaker", "y") == none   # no "x" or "y" here
    assert tokens(*dry, "--dry-sequence-breaker", ":") == default                                # no newline either
    r = subprocess.run(base + ["--dry-penalty-last-n", "-2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "dry_penalty_last_n must be >= -1" in r.stderr


def test_ignore_eos(smollm2_path):
    """--ignore-eos (ignore_eos=True, the server's "ignore_eos"): the end-of-generation tokens get
    -inf, so the text runs on to -n where it would have ended; up to there it is the same."""
    from pyllm import Model
    from pyllm.errors import InvalidArgumentError
    from pyllm.server import sampling_of
    with Model(smollm2_path, n_ctx=256) as m:
        ended = m.generate("Hi", max_tokens=60, temperature=0)
        assert ended.finish_reason == "stop" and len(ended.tokens) < 59   # it ends by itself here
        on = m.generate("Hi", max_tokens=60, temperature=0, ignore_eos=True)
        assert on.finish_reason == "length" and len(on.tokens) == 60
        assert on.tokens[:len(ended.tokens) - 1] == ended.tokens[:-1]
        assert not set(on.tokens) & m.tokenizer.eog_ids
        with pytest.raises(InvalidArgumentError, match="ignore_eos"):
            m.generate("Hi", max_tokens=2, ignore_eos="yes")
    assert sampling_of({"ignore_eos": True, "temperature": 0}) == {"ignore_eos": True, "temperature": 0}
    r = pyllm("run", "-m", smollm2_path, "-p", "Hi", "-n", "60", "--temp", "0", "--ignore-eos", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["tokens"] == on.tokens, r.stderr


def test_tokenize(smollm2_path, gemma3_path):
    """pyllm tokenize prints llama-tokenize's lines (`    ID -> 'PIECE'`) or --ids' list, for the
    ids Model.tokenize gives (special text parsed, BOS as the file says; --no-bos, --no-parse-special)."""
    from pyllm import Model
    text = "Hello <|im_start|>wörld <start_of_turn>"
    for path in (smollm2_path, gemma3_path):
        with Model(path, n_ctx=64) as m:
            want = m.tokenize(text, special=True)
            plain = m.tokenize(text, add_bos=False)
            pieces = [m.tokenizer.token_to_piece(t) for t in want]
        r = subprocess.run([sys.executable, "-m", "cli.main", "tokenize", "-m", path, "-p", text, "--show-count"],
                           cwd=REPO, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout == b"".join(b"%6d -> '%s'\n" % (t, p) for t, p in zip(want, pieces)) + \
            b"Total number of tokens: %d\n" % len(want)
        r = pyllm("tokenize", "-m", path, "--ids", "--no-bos", "--no-parse-special", input=text)
        assert r.returncode == 0 and json.loads(r.stdout) == plain, r.stderr
    assert (want[0] == 2) and (plain[0] != 2)   # Gemma's BOS, and --no-bos
    one_error_line(pyllm("tokenize", "-m", smollm2_path, "-p", "a", "-f", "b"), "not both")


def test_samplers_order(smollm2_path):
    """--samplers / --sampling-seq (the server's "samplers"): the seeded text Model.generate gives
    with that chain; a bad name or both flags is one error line."""
    from pyllm import Model
    from pyllm.server import sampling_of
    prompt, kw = "Once upon a time", dict(max_tokens=12, temperature=1.5, seed=4, min_p=0.1)
    with Model(smollm2_path, n_ctx=128) as m:
        chain = m.generate(prompt, **kw, samplers="min_p;temperature").tokens
        hot_first = m.generate(prompt, **kw, samplers="temperature;min_p").tokens
    assert chain != hot_first
    base = ["run", "-m", smollm2_path, "-p", prompt, "-n", "12", "--temp", "1.5", "-s", "4", "--min-p", "0.1",
            "--json"]
    for flags, want in ((["--samplers", "min_p;temperature"], chain), (["--sampling-seq", "tm"], hot_first)):
        r = pyllm(*base, *flags)
        assert r.returncode == 0 and json.loads(r.stdout)["tokens"] == want, (flags, r.stderr)
    one_error_line(pyllm(*base, "--samplers", "top_q"), "unknown sampler 'top_q'")
    one_error_line(pyllm(*base, "--samplers", "top_k", "--sampling-seq", "k"), "not both")
    assert sampling_of({"samplers": ["top_k", "temperature"]}) == {"samplers": ["top_k", "temperature"]}


def test_escapes(smollm2_path):
    """-p's \\n, \\t, \\xNN ... are the characters (llama.cpp's -e, on by default); --no-escape
    keeps them as typed; other backslashes stay."""
    from cli.common import process_escapes
    from pyllm import Model
    assert process_escapes(r"a\nb\tc\\d \x41 \xe2\x82\xac \q \x4") == "a\nb\tc\\d A \u20ac \\q \\x4"
    assert process_escapes("end\\") == "end\\" and process_escapes(r"\'\"") == "'\""
    typed = r"Line one\nLine two \xe2\x82\xac"
    with Model(smollm2_path, n_ctx=64) as m:
        escaped, raw = len(m.tokenize("Line one\nLine two \u20ac")), len(m.tokenize(typed))
    assert escaped != raw
    for flags, want in (([], escaped), (["--no-escape"], raw)):
        r = pyllm("run", "-m", smollm2_path, "-p", typed, "-n", "1", "--temp", "0", "--json", *flags)
        assert r.returncode == 0 and json.loads(r.stdout)["prompt_tokens"] == want, (flags, r.stderr)


def test_run_verbose_prompt(smollm2_path):
    """--verbose-prompt (llama-cli's): the prompt and each of its tokens on stderr, stdout untouched."""
    r = pyllm("run", "-m", smollm2_path, "-p", "The sky is", "-n", "2", "--temp", "0", "--json", "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    from pyllm import Model
    with Model(smollm2_path) as m:
        ids = m.tokenize("The sky is", special=True)
    assert f"number of tokens in prompt = {len(ids)}" in r.stderr and out["prompt_tokens"] == len(ids)
    lines = [ln.split(" -> ") for ln in r.stderr.splitlines() if " -> " in ln]
    assert [int(i) for i, _ in lines] == ids and lines[1][1] == "' sky'"


def test_run_model_and_prompt_as_arguments(smollm2_path):
    """`pyllm run NAME PROMPT` (ollama's and llama-run's way) is `run -m NAME --chat -p PROMPT`;
    the model or the prompt given twice is an error."""
    args = ["-n", "5", "--temp", "0", "--json"]
    positional = json.loads(pyllm("run", smollm2_path, "What is 2+2?", *args).stdout)
    flags = json.loads(pyllm("run", "-m", smollm2_path, "--chat", "-p", "What is 2+2?", *args).stdout)
    assert positional["chat"] is True and positional["text"] == flags["text"]
    assert positional["prompt_tokens"] == flags["prompt_tokens"]
    piped = pyllm("run", smollm2_path, *args, input="What is 2+2?")   # not a terminal: the prompt from stdin
    assert json.loads(piped.stdout)["text"] == flags["text"]
    one_error_line(pyllm("run", smollm2_path, "hi", "-m", smollm2_path), "the model twice")
    one_error_line(pyllm("run", smollm2_path, "hi", "-p", "there"), "the prompt twice")


def test_chat_set_parameter(smollm2_path):
    """ollama's /set parameter NAME VALUE in pyllm chat: the next reply follows it (greedy and
    capped here), /show parameters lists what differs from the defaults, bad ones are one error."""
    script = ("/show parameters\n/set parameter temperature 0\n/set parameter num_predict 4\n/show parameters\n"
              "Hello\n/set parameter temprature 1\n/set parameter num_ctx 10\n/set parameter top_k x\n"
              "/set system Be brief.\n/system\n")
    r = pyllm("chat", "-m", smollm2_path, input=script)
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert "all at their defaults" in err and "temperature 0.0  num_predict 4" in err
    assert "[reply cut at 4 tokens (-n)]" in err
    from pyllm import Model
    with Model(smollm2_path) as m:
        want = m.chat([{"role": "user", "content": "Hello"}], temperature=0, max_tokens=4).text
    assert want.strip() and want.strip() in r.stdout
    assert "unknown parameter 'temprature'" in err and "num_ctx is set when the chat starts" in err
    assert "top_k needs a int value" in err and "system prompt: 'Be brief.'" in err


def test_chat_ollama_switches(smollm2_path):
    """ollama's other chat commands: /set format json holds the replies to JSON until /set noformat,
    /set verbose and quiet turn the stats line on and off, /show system, template, license, info."""
    script = ("/set format json\nName a color.\n/set noformat\n/set verbose\nHi\n/set quiet\nHi again\n"
              "/set system Be brief.\n/show system\n/show template\n/show license\n/show info\n/set format xml\n")
    r = pyllm("chat", "-m", smollm2_path, "-n", "6", "--temp", "0", input=script)
    assert r.returncode == 0, r.stderr
    from pyllm import Model
    with Model(smollm2_path) as m:
        as_json = m.chat([{"role": "user", "content": "Name a color."}], temperature=0, max_tokens=6, format="json")
        template = m.chat_template.source
    assert as_json.text.strip() and as_json.text.strip() in r.stdout
    assert "replies held to JSON" in r.stderr and "replies free" in r.stderr
    assert len(re.findall(r"prompt \d+ tok \(reused", r.stderr)) == 1   # after "Hi" only
    assert "Be brief." in r.stderr and template.splitlines()[0] in r.stdout and "apache-2.0" in r.stderr
    assert "architecture   llama: 30 layers" in r.stdout
    assert "/set takes parameter NAME VALUE" in r.stderr   # format xml


def test_version():
    from pyllm import __version__
    from pyllm.backend.cpu import kernel_level
    for flag in ("--version", "-v"):
        r = pyllm(flag)
        assert r.returncode == 0 and r.stdout.startswith(f"pyllm {__version__} (CPU kernels {kernel_level()}")


def test_chat_template_kwargs(smollm2_path):
    """--chat-template-kwargs JSON (llama.cpp's): variables the template renders with, on every turn;
    Model(chat_template_kwargs=) the same; a request's own think still wins over enable_thinking."""
    template = "{% for m in messages %}[{{ m.role }}|{{ greeting }}]{{ m.content }}{% endfor %}[assistant]"
    r = pyllm("run", "-m", smollm2_path, "--chat", "-p", "Hi", "-n", "1", "--verbose-prompt", "--chat-template",
              template, "--chat-template-kwargs", '{"greeting": "hello"}')
    assert r.returncode == 0 and "prompt: '[user|hello]Hi[assistant]'" in r.stderr, r.stderr
    one_error_line(pyllm("run", "-m", smollm2_path, "--chat", "-p", "Hi", "--chat-template-kwargs", "[1]"),
                   "takes a JSON object")
    from pyllm import Model
    from pyllm.errors import InvalidArgumentError
    switch = "{% if enable_thinking %}T{% else %}F{% endif %}{{ messages[0].content }}"
    with Model(smollm2_path, chat_template=switch, chat_template_kwargs={"enable_thinking": False}) as m:
        msgs = [{"role": "user", "content": "x"}]
        assert m.apply_chat_template(msgs) == "Fx" and m.apply_chat_template(msgs, think=True) == "Tx"
    with pytest.raises(InvalidArgumentError, match="chat_template_kwargs must map"):
        Model(smollm2_path, chat_template_kwargs=[("a", 1)])


def test_run_verbose_and_hidethinking(smollm2_path, tmp_path):
    """ollama's `run --verbose` (the timings after the reply, on stderr) and `--hidethinking` (the
    model thinks, nothing of it shown): a template that opens the thinking makes SmolLM2 think."""
    (tmp_path / "t.jinja").write_text("{{ messages[-1].content }}<think>")
    base = ("run", "-m", smollm2_path, "--chat", "-p", "Why is the sky blue?", "-n", "6", "--temp", "0",
            "--chat-template", str(tmp_path / "t.jinja"))
    thinking = json.loads(pyllm(*base, "--json").stdout)["thinking"]
    assert len(thinking) > 5
    shown = pyllm(*base)
    assert shown.returncode == 0 and thinking[:10] in shown.stderr
    hidden = pyllm(*base, "--hidethinking", "--verbose")
    assert hidden.returncode == 0 and thinking[:10] not in hidden.stderr and hidden.stdout.strip() == ""
    lines = dict(line.split(":", 1) for line in hidden.stderr.splitlines() if ":" in line)
    assert lines["eval count"].strip() == "6 token(s)"
    assert lines["prompt eval rate"].strip().endswith("tokens/s")
    assert {"total duration", "load duration", "prompt eval count", "eval duration", "eval rate"} <= set(lines)
