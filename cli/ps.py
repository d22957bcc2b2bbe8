"""`pyllm ps` and `pyllm stop`: ollama's commands for the models a running `pyllm serve` holds.

They ask the server at --host/--port ($PYLLM_HOST/$PYLLM_PORT, as `pyllm serve` reads them) over
its ollama API: GET /api/ps lists the loaded model and when its keep-alive unloads it; a
load request with keep_alive 0 unloads one now (the next request loads it again).
"""
from __future__ import annotations

import datetime
import json
import urllib.error
import urllib.request
from typing import Annotated, Any, Optional

import typer

from pyllm.errors import ServerError

from .common import handle_errors

HostOpt = Annotated[str, typer.Option("--host", envvar="PYLLM_HOST", help="the server's address")]
PortOpt = Annotated[int, typer.Option("--port", envvar="PYLLM_PORT", help="the server's port")]
KeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar="PYLLM_API_KEY",
                                               help="the server's API key, if it asks for one")]


def ask(host: str, port: int, key: Optional[str], path: str, body: Optional[dict] = None) -> Any:
    """The JSON answer of the server at host:port to GET path (or POST body)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host   # listening everywhere: ask here
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise ServerError(f"the server at {url} asks for an API key: give --api-key or $PYLLM_API_KEY") from None
        try:
            message = json.loads(e.read()).get("error")
        except (ValueError, AttributeError):
            message = None
        raise ServerError(f"the server at {url} answered {e.code}: {message or e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ServerError(f"no pyllm server answers at http://{host}:{port} ({getattr(reason, 'strerror', None) or reason}):"
                          f" start one with `pyllm serve`, or say where it is with --host/--port "
                          f"($PYLLM_HOST/$PYLLM_PORT)") from None


def until(expires_at: str) -> str:
    """When a model unloads, as ollama's ps says it."""
    when = datetime.datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    left = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    if when.year >= 2999:
        return "Forever"
    if left < 60:
        return "Less than a minute from now" if left > 0 else "Now"
    minutes = round(left / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''} from now" if minutes < 120 else \
        f"{round(left / 3600)} hours from now"


def ps(host: HostOpt = "127.0.0.1", port: PortOpt = 8080, api_key: KeyOpt = None) -> None:
    """List the models a running server holds (ollama's ps): size, where they run, context, until when."""
    with handle_errors():
        models = ask(host, port, api_key, "/api/ps").get("models", [])
        rows = [("NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL")]
        for m in models:
            size, vram = m.get("size", 0), m.get("size_vram", 0)
            gpu = round(100 * vram / size) if size else 0
            rows.append((m.get("name", ""), f"{size / 1e6:.0f} MB", "100% CPU" if not gpu else
                         f"{gpu}% GPU" if gpu >= 100 else f"{100 - gpu}%/{gpu}% CPU/GPU",
                         str(m.get("context_length", "")), until(m.get("expires_at", "2999-01-01T00:00:00Z"))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("    ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def stop(model: Annotated[str, typer.Argument(help="the model to unload (as `pyllm ps` names it)")],
         host: HostOpt = "127.0.0.1", port: PortOpt = 8080, api_key: KeyOpt = None) -> None:
    """Unload a model from a running server now (ollama's stop); the next request loads it again."""
    with handle_errors():
        loaded = [m.get("name") for m in ask(host, port, api_key, "/api/ps").get("models", [])]
        if model not in loaded:
            raise ServerError(f"{model} is not loaded on the server" +
                              (f" (it holds {', '.join(loaded)})" if loaded else " (it holds none)"))
        ask(host, port, api_key, "/api/generate", {"model": model, "keep_alive": 0, "stream": False})
