"""Created models (ollama's Modelfile, `pyllm create`): a name for a GGUF file and the defaults it runs with.

    FROM smollm2-135m              # a registry name, a created model, or a .gguf path
    PARAMETER temperature 0.3      # the defaults of run and chat (flags given still win)
    PARAMETER stop "<|im_end|>"    # repeatable
    SYSTEM \"\"\"You are Mario from Super Mario Bros.\"\"\"
    MESSAGE user Who are you?      # a conversation the chat starts from
    MESSAGE assistant It's-a me, Mario!
    ADAPTER ./mario-lora.gguf      # a LoRA adapter (llama.cpp's GGUF), repeatable
    TEMPLATE \"\"\"{% for m in messages %}...\"\"\"   # a Jinja chat template instead of the model's
    LICENSE \"\"\"...\"\"\"

Instructions are case-insensitive; a value is the rest of the line, a "quoted"
string, or a \"\"\"block\"\"\" over several lines; # starts a comment line.
ollama's TEMPLATE is a Go template, which pyllm does not run: a TEMPLATE here is
Jinja (the chat templates GGUF files carry); a Go one is left out with a warning,
the model file's own template (which it usually restates) used instead. Paths
are relative to the Modelfile's folder and kept absolute.

`pyllm create NAME -f Modelfile` (or ollama's POST /api/create) checks
everything and keeps the model as models_dir()/created/NAME.json (the Modelfile's
text included, for `pyllm info NAME --modelfile`); `pyllm cp` (/api/copy) copies
one. A model made FROM another created model inherits its parameters, system
prompt, messages, adapters and template, its own coming on top.
"""
from __future__ import annotations

import json
import logging
import re
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import registry
from .errors import InvalidArgumentError, ModelNotFoundError

log = logging.getLogger("pyllm")

# ollama's PARAMETER names pyllm honours, and their types
PARAMETERS: dict[str, type] = {
    "temperature": float, "top_k": int, "top_p": float, "min_p": float, "typical_p": float,
    "repeat_penalty": float, "repeat_last_n": int, "presence_penalty": float, "frequency_penalty": float,
    "seed": int, "num_predict": int, "num_ctx": int, "stop": str, "mirostat": int, "mirostat_eta": float,
    "mirostat_tau": float, "num_thread": int, "num_gpu": int,
}
# ollama's PARAMETERs with no pyllm counterpart: left out with a warning (a misspelt name is an error)
OLLAMA_ONLY = ("num_keep", "penalize_newline", "num_batch", "tfs_z", "main_gpu", "use_mmap", "use_mlock", "numa",
               "low_vram", "f16_kv", "vocab_only", "logits_all", "num_gqa", "rope_frequency_base",
               "rope_frequency_scale")
ROLES = ("user", "assistant")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9._-]+)?")
INSTRUCTIONS = ("from", "parameter", "system", "template", "adapter", "message", "license")


@dataclass
class CreatedModel:
    name: str
    source: str                                   # a registry name, a created model's name, or an absolute path
    parameters: dict[str, Any] = field(default_factory=dict)    # stop: a list
    system: Optional[str] = None
    template: Optional[str] = None
    adapters: list[str] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    license: list[str] = field(default_factory=list)
    modelfile: str = ""


def _values(text: str, where: str) -> list[tuple[int, str, str]]:
    """(line number, instruction, argument text) of each instruction."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line, number = lines[i].strip(), i + 1
        i += 1
        if not line or line.startswith("#"):
            continue
        word, rest = (re.split(r"\s+", line, maxsplit=1) + [""])[:2]
        if word.lower() not in INSTRUCTIONS:
            raise InvalidArgumentError(f"{where}:{number}: unknown instruction {word!r} (a Modelfile has "
                                       f"{', '.join(s.upper() for s in INSTRUCTIONS)})")
        start = rest.find('"""')
        if start >= 0:                                # a block, perhaps over several lines
            head, body = rest[:start], rest[start + 3:]
            while '"""' not in body:
                if i >= len(lines):
                    raise InvalidArgumentError(f'{where}:{number}: the """ block is not closed')
                body += "\n" + lines[i]
                i += 1
            body, _, after = body.partition('"""')
            if after.strip():
                raise InvalidArgumentError(f'{where}:{number}: text after the closing """')
            rest = head + '"""' + body
        out.append((number, word.lower(), rest))
    return out


def _unquote(value: str) -> str:
    """A value as written: a triple-quoted block as it is, a "string" with its JSON backslash
    escapes read, anything else as it is."""
    if value.startswith('"""'):
        return value[3:]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            return str(json.loads(value))
        except ValueError:
            return value[1:-1]
    return value


def parameter_value(key: str, value, at: str):
    """A PARAMETER's value as its type (InvalidArgumentError naming `at` if it is not one)."""
    kind = PARAMETERS.get(key)
    if kind is None:
        raise InvalidArgumentError(f"{at}: unknown parameter {key!r} (pyllm takes {', '.join(sorted(PARAMETERS))})")
    try:
        parsed = kind(value) if value != "" and not isinstance(value, (bool, list, dict)) else None
    except (TypeError, ValueError):
        parsed = None
    if parsed is None:
        raise InvalidArgumentError(f"{at}: {key} needs a {kind.__name__} value, not {value!r}")
    return parsed


def _path(value: str, folder: Path) -> Path:
    path = Path(_unquote(value)).expanduser()
    return path if path.is_absolute() else (folder / path).resolve()


def parse(text: str, name: str, folder: Path, where: str = "Modelfile") -> CreatedModel:
    """A Modelfile's model, checked: every value parsed, every file there."""
    check_name(name)
    model = CreatedModel(name, "", modelfile=text)
    for number, word, rest in _values(text, where):
        at = f"{where}:{number}"
        if not rest and word != "system":
            raise InvalidArgumentError(f"{at}: {word.upper()} needs a value")
        if word == "from":
            if model.source:
                raise InvalidArgumentError(f"{at}: a second FROM")
            model.source = _source(_unquote(rest), folder, at)
        elif word == "parameter":
            key, value = (re.split(r"\s+", rest, maxsplit=1) + [""])[:2]
            key = key.lower()
            if key in OLLAMA_ONLY:
                log.warning("%s: PARAMETER %s (ollama's) has no pyllm counterpart: left out", at, key)
                continue
            parsed = parameter_value(key, _unquote(value.strip()), at)
            if key == "stop":
                model.parameters.setdefault("stop", []).append(parsed)
            else:
                model.parameters[key] = parsed
        elif word == "system":
            model.system = _unquote(rest)
        elif word == "template":
            model.template = _template(_unquote(rest), at)
        elif word == "adapter":
            path = _path(rest, folder)
            if not path.is_file():
                raise InvalidArgumentError(f"{at}: no adapter file at {path}")
            model.adapters.append(str(path))
        elif word == "message":
            role, content = (re.split(r"\s+", rest, maxsplit=1) + [""])[:2]
            if role.lower() not in ROLES:
                also = " (a system prompt is a SYSTEM line)" if role.lower() == "system" else ""
                raise InvalidArgumentError(f"{at}: a MESSAGE's role is user or assistant, not {role!r}{also}")
            model.messages.append({"role": role.lower(), "content": _unquote(content.strip())})
        else:
            model.license.append(_unquote(rest))
    if not model.source:
        raise InvalidArgumentError(f"{where}: no FROM line: name the model this one is made from "
                                   f"(a registry name, a created model, or a .gguf file)")
    return model


def _source(value: str, folder: Path, at: str) -> str:
    if value in registry.MODELS or created_path(value).is_file():
        return value
    path = _path(value, folder)
    if not path.is_file() and path.with_name(path.name + ".gguf").is_file():    # a models folder file by its stem
        path = path.with_name(path.name + ".gguf")
    if not path.is_file():
        raise ModelNotFoundError(f"{at}: FROM {value}: not a registry model (`pyllm list`), a created model, "
                                 f"or a file ({path} does not exist)")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InvalidArgumentError(f"{at}: FROM {path} is not a GGUF file (pyllm runs GGUF models)")
    return str(path)


def _template(text: str, at: str) -> Optional[str]:
    """A Jinja TEMPLATE, checked; None for ollama's Go template (said in a warning: the model
    file's own template is used, which the Go one usually restates)."""
    if "{%" not in text and re.search(r"\{\{-?\s*\.", text):
        log.warning("%s: TEMPLATE holds a Go template (ollama's {{ .Prompt }} form), which pyllm does not run: "
                    "the model file's own chat template is used instead (give a Jinja template to change it)", at)
        return None
    from .chat_template import ChatTemplate
    ChatTemplate.from_source(text)         # a template that does not compile fails now
    return text


def check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise InvalidArgumentError(f"{name!r} cannot name a model: letters, digits, '.', '_', '-' and one "
                                   f"':tag' (e.g. mario or mario:v2)")
    if name in registry.MODELS:
        raise InvalidArgumentError(f"{name} is a registry model's name: choose another")


def created_dir() -> Path:
    return registry.models_dir() / "created"


def created_path(name: str) -> Path:
    return created_dir() / (urllib.parse.quote(name, safe="") + ".json")


def save(model: CreatedModel) -> Path:
    path = created_path(model.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(asdict(model), indent=1, ensure_ascii=False), encoding="utf-8")
    partial.replace(path)
    return path


def load(name: str) -> Optional[CreatedModel]:
    """The created model of that name, or None."""
    path = created_path(name)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return CreatedModel(**data)
    except (ValueError, TypeError) as e:
        raise InvalidArgumentError(f"{path} is damaged ({e}): make the model again with `pyllm create {name}`") \
            from None


def resolved(name: str) -> Optional[CreatedModel]:
    """A created model with what it inherits folded in: source is then a registry name
    or a path; None when no model of that name was created."""
    chain, seen = [], set()
    model = load(name)
    while model is not None:
        if model.name in seen:
            raise InvalidArgumentError(f"created models {' -> '.join(m.name for m in chain)} go round in a circle")
        seen.add(model.name)
        chain.append(model)
        model = load(model.source) if model.source not in registry.MODELS else None
    if not chain:
        return None
    out = CreatedModel(name, chain[-1].source, modelfile=chain[0].modelfile)
    for m in reversed(chain):                      # the base first, each on top of what it was made from
        out.parameters.update(m.parameters)        # (a stop list replaces the one inherited)
        out.system = m.system if m.system is not None else out.system
        out.template = m.template or out.template
        out.adapters = out.adapters + m.adapters
        out.messages = m.messages or out.messages
        out.license = out.license + m.license
    return out


def remove(name: str) -> bool:
    path = created_path(name)
    if not path.is_file():
        return False
    path.unlink()
    return True


def all_created() -> list[CreatedModel]:
    """Every created model, by name."""
    folder = created_dir()
    models = [load(urllib.parse.unquote(p.stem)) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted((m for m in models if m is not None), key=lambda m: m.name)


def source_file(model: CreatedModel) -> Path:
    """The GGUF file a resolved created model runs (a registry model's local path)."""
    if model.source in registry.MODELS:
        return registry.local_path(model.source)
    return Path(model.source)


# the PARAMETERs that are sampling settings (Model's keywords of the same names)
SAMPLING_PARAMETERS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
                       "presence_penalty", "frequency_penalty", "seed", "mirostat", "mirostat_eta", "mirostat_tau")


def request_settings(model: Optional[CreatedModel], sampling: dict, stop: Any, max_tokens: Optional[int],
                     given_max_tokens: bool) -> tuple[dict, Any, Optional[int]]:
    """A server request's sampling keywords, stop list and max_tokens with a created
    model's PARAMETERs under them: each used where the request gives none."""
    if model is None:
        return sampling, stop, max_tokens
    p = model.parameters
    sampling = {**{k: p[k] for k in SAMPLING_PARAMETERS if k in p}, **sampling}
    if stop is None:
        stop = p.get("stop")
    if not given_max_tokens and "num_predict" in p:
        max_tokens = None if p["num_predict"] < 0 else p["num_predict"]
    return sampling, stop, max_tokens


def conversation(model: Optional[CreatedModel], messages: list[dict]) -> list[dict]:
    """A chat request's messages after a created model's: its SYSTEM where the request
    has no system message first, then its MESSAGEs, then the request's."""
    if model is None:
        return messages
    head = messages[:1] if messages and messages[0].get("role") == "system" else []
    if not head and model.system:
        head = [{"role": "system", "content": model.system}]
    return head + list(model.messages) + messages[1 if messages[:1] and messages[0].get("role") == "system" else 0:]


def parameters_text(parameters: dict[str, Any]) -> str:
    """PARAMETER lines' values as ollama's /api/show lists them: "name value" per line."""
    return "\n".join(f"{k} {json.dumps(x) if isinstance(x, str) else x}" for k, v in parameters.items()
                     for x in (v if isinstance(v, list) else [v]))


def modelfile_text(model: CreatedModel) -> str:
    """A Modelfile that makes `model` again (for a model made without one: ollama's /api/create)."""
    def block(text: str) -> str:
        return f'"""{text}"""' if "\n" in text or text != text.strip() or text.startswith('"') else text
    lines = [f"FROM {model.source}"]
    lines += [f"PARAMETER {k} {json.dumps(x) if isinstance(x, str) else x}" for k, v in model.parameters.items()
              for x in (v if isinstance(v, list) else [v])]
    if model.system is not None:
        lines.append(f"SYSTEM {block(model.system)}")
    if model.template is not None:
        lines.append(f'TEMPLATE """{model.template}"""')
    lines += [f"ADAPTER {a}" for a in model.adapters]
    lines += [f"MESSAGE {m['role']} {block(m['content'])}" for m in model.messages]
    lines += [f"LICENSE {block(text)}" for text in model.license]
    return "\n".join(lines) + "\n"


def from_request(name: str, body: dict) -> CreatedModel:
    """ollama's /api/create: a Modelfile's text ("modelfile", the older form; its paths
    absolute), or the fields "from", "system", "template", "parameters", "messages",
    "license". Checked as a Modelfile is."""
    if isinstance(body.get("modelfile"), str):
        return parse(body["modelfile"], name, registry.models_dir(), where="modelfile")
    if body.get("adapters") or body.get("files"):
        raise InvalidArgumentError("adapters and files by blob digest are not supported: give a modelfile with "
                                   "ADAPTER /path/to/adapter.gguf")
    if body.get("quantize"):
        raise InvalidArgumentError("quantize is not supported in /api/create: make the file with `pyllm quantize` "
                                   "and create FROM it")
    source = body.get("from")
    if not isinstance(source, str) or not source:
        raise InvalidArgumentError('/api/create needs "from" (a model this server has) or a "modelfile"')
    model = parse(f"FROM {source}\n", name, registry.models_dir(), where="/api/create")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgumentError("parameters must be an object of name -> value")
    for key, value in parameters.items():
        values = [parameter_value(key, v, "/api/create") for v in (value if isinstance(value, list) else [value])]
        model.parameters[key] = values if key == "stop" else values[-1]
    for key, kind in (("system", str), ("template", str), ("license", (str, list)), ("messages", list)):
        if body.get(key) is not None and not isinstance(body[key], kind):
            raise InvalidArgumentError(f"{key} has the wrong type")
    model.system = body.get("system")
    if body.get("template") is not None:
        model.template = _template(body["template"], "/api/create")
    licenses = body.get("license") or []
    model.license = [licenses] if isinstance(licenses, str) else [str(x) for x in licenses]
    for m in body.get("messages") or []:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise InvalidArgumentError("messages are {role: user or assistant, content: text} objects")
        model.messages.append({"role": m["role"], "content": m["content"]})
    model.modelfile = modelfile_text(model)
    return model


def copy(source: str, destination: str, folder: Optional[Path] = None) -> CreatedModel:
    """`pyllm cp` / ollama's /api/copy: a created model's definition under another name, or
    for a registry model or file (a path relative to folder, default the current one), a
    created model FROM it."""
    check_name(destination)
    made = load(source)
    if made is None:
        made = CreatedModel(destination, _source(source, folder or Path.cwd(), "cp"), modelfile=f"FROM {source}\n")
    model = CreatedModel(**{**asdict(made), "name": destination})
    save(model)
    return model
