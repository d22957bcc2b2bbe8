"""The models a server answers for (pyllm.server).

Given one model (`pyllm serve -m MODEL`, llama-server's way) the server
answers every request with it, whatever model the request names. Given a
loader too (`pyllm serve` without -m, ollama's way), a request may name any
model on disk: a registry model that was pulled, or another .gguf file of
the models folder (`pyllm list`); ollama's ":latest" tag is allowed. One is
loaded at a time: a request for another waits until the requests on the
loaded one are done (new requests for it then wait behind the switch), and
the server loads the model it names in its place. Requests hold a slot of
the loaded model while they run (pyllm.slots).

A created model (`pyllm create`, pyllm.created) is one of the models a request
may name: its file is loaded with its adapters, template and context
(load(path, created)), and `created` holds its defaults while it is the loaded
one (the server puts them under each request's settings).
"""
from __future__ import annotations

import logging
import math
import re
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterator, Optional

from . import created as created_models
from . import registry
from .errors import ModelNotFoundError

log = logging.getLogger("pyllm")

DEFAULT_PARALLEL = 4   # requests at once where steps can batch (llama-server's default number of slots)
DEFAULT_KEEP_ALIVE_S = 300.0   # ollama's: a model unloads five minutes after its last request


def keep_alive_seconds(value) -> float:
    """ollama's keep_alive: seconds as a number, or a duration text ("5m", "1h30m", "45s",
    "0"); negative: for ever (inf)."""
    from .errors import InvalidArgumentError
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        parts = re.findall(r"(\d+(?:\.\d*)?)(ms|h|m|s)?", text.lstrip("+-"))
        if not parts or "".join(n + u for n, u in parts) != text.lstrip("+-"):
            raise InvalidArgumentError(f"keep_alive must be seconds or a duration such as 5m, 1h or 30s, "
                                       f"not {value!r}")
        unit = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "": 1.0}
        seconds = sign * sum(float(n) * unit[u] for n, u in parts)
    else:
        raise InvalidArgumentError(f"keep_alive must be seconds or a duration such as 5m, not {value!r}")
    return math.inf if seconds < 0 else seconds


class ModelHost:
    def __init__(self, model, name: str, parallel: Optional[int] = None,
                 load: Optional[Callable[[Path], object]] = None, keep_alive: Optional[float] = None):
        """parallel: requests at once (None: DEFAULT_PARALLEL where the model's steps can hold
        several sequences, else 1). load(path) -> Model: how to load another model (a created
        model's file: load(path, created)), or None to serve this one only. keep_alive: idle
        seconds before the model unloads (None: 5 minutes with a loader, for ever without)."""
        self.parallel, self.load = parallel, load
        self.keep_alive = (DEFAULT_KEEP_ALIVE_S if load is not None else math.inf) if keep_alive is None \
            else keep_alive
        self._cv = threading.Condition()
        self._users = 0            # requests running on the loaded model
        self._switchers = 0        # requests waiting to load another
        self._switching = False
        self._load_lock = threading.Lock()   # one reload after an unload
        self._timer: Optional[threading.Timer] = None
        self.expires_at = math.inf           # time.monotonic() at which the idle model unloads
        self._install(model, name)
        with self._cv:
            self._idle(self.keep_alive)       # a model nobody asks for unloads too

    def _install(self, model, name: str) -> None:
        self.model, self.name, self.path = model, name, Path(model.path)
        self.created = created_of(name)
        n = self.parallel
        if n is None:
            n = DEFAULT_PARALLEL if model.backend.batches_sequences else 1
        self.slots = model.parallel(n)

    # -- what a request may name -------------------------------------------------------------
    def available(self) -> list[tuple[str, Path]]:
        """(name, file) of every model a request may name, the loaded one first."""
        out = {self.name: self.path}
        if self.load is not None:
            seen = {self.path.resolve()}
            for name, path in registry.installed():
                if path.resolve() not in seen:
                    out[name] = path
                    seen.add(path.resolve())
            folder = registry.models_dir()
            for path in sorted(folder.glob("*.gguf")) if folder.is_dir() else []:
                if path.resolve() not in seen and path.stem not in out:
                    out[path.stem] = path
                    seen.add(path.resolve())
            for made in created_models.all_created():      # another name for a file, with its defaults
                resolved = created_of(made.name)
                path = created_models.source_file(resolved) if resolved is not None else None
                if made.name not in out and path is not None and path.is_file():
                    out[made.name] = path
        return list(out.items())

    def resolve(self, requested: Optional[str]) -> Optional[tuple[str, Path]]:
        """The (name, file) a request's model field asks for, or None for whichever is loaded
        (no name, or any name when the server serves one model)."""
        if not requested or self.load is None:
            return None
        name = requested.removesuffix(":latest")
        if name == self.name:   # the loaded one: no need to look at the folder
            return name, self.path
        available = self.available()
        for n, path in available:
            if n == name:
                return n, path
        raise ModelNotFoundError(f"model {requested!r} not found; this server has "
                                 f"{', '.join(n for n, _ in available)} (fetch a registry model with `pyllm pull NAME`)")

    # -- running a request -------------------------------------------------------------------
    @contextmanager
    def use(self, requested: Optional[str] = None, slot: bool = True,
            keep_alive: Optional[float] = None, slot_id: Optional[int] = None) -> Iterator[object]:
        """The model a request names, loaded (switching to it if need be) and kept until the
        block ends, with a slot of it held for this thread (slot=False: a request that only
        reads about the model); keep_alive: the idle seconds it stays loaded after (None: the
        host's); slot_id: the slot to hold (llama-server's id_slot; None: any)."""
        want = self.resolve(requested)
        with self._cv:
            waiting_to_switch = False   # counted in _switchers
            while True:
                other = want is not None and want[0] != self.name
                if not self._switching and (self._users == 0 if other
                                            else self._switchers - waiting_to_switch == 0):
                    break
                if other != waiting_to_switch:
                    self._switchers += 1 if other else -1
                    waiting_to_switch = other
                self._cv.wait()
            self._switchers -= waiting_to_switch
            if other:
                self._switching = True
            else:
                self._users += 1
        if other:
            loaded = False
            try:
                self._switch(*want)
                loaded = True
            finally:
                with self._cv:
                    self._switching = False
                    self._users += loaded   # in at once: no other switch comes between
                    self._cv.notify_all()
        try:
            self._reload()
            with self.slots.take(slot_id) if slot else nullcontext():
                yield self.model
        finally:
            with self._cv:
                self._users -= 1
                if self._users == 0:
                    self._idle(self.keep_alive if keep_alive is None else keep_alive)
                self._cv.notify_all()

    # -- keep-alive ----------------------------------------------------------------------------
    def _reload(self) -> None:
        """(as a user) loads the model again if an idle timeout unloaded it."""
        with self._load_lock:
            if self.model is None:
                log.info("loading %s again", self.name)
                self._install(self._load(self.name, self.path), self.name)

    def current(self):
        """The model, loaded again if it was unloaded (for requests that only read about it)."""
        if self.model is not None:
            return self.model
        with self.use(None, slot=False) as m:
            return m

    def _idle(self, keep_alive: float) -> None:
        """(under the lock, no user left) the model unloads keep_alive seconds from now."""
        self.expires_at = time.monotonic() + keep_alive
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if math.isfinite(keep_alive) and self.load is not None:
            self._timer = threading.Timer(keep_alive, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        with self._cv:
            if self.model is None or self._users or self._switching or self._switchers \
                    or time.monotonic() < self.expires_at - 1e-3:
                return
            log.info("unloading %s: idle for its keep-alive", self.name)
            self.model.close()
            self.model = self.slots = None
            self.expires_at = math.inf

    def unload(self, wait: float = 2.0) -> bool:
        """Unloads the model now if no request is using it (ollama's keep_alive 0 on a load
        request); False if it is in use or not loaded. Waits up to `wait` seconds for requests
        to end: a client's next request can arrive while the thread that answered its last
        one is still leaving `use`."""
        deadline = time.monotonic() + wait
        with self._cv:
            while self._users and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)
            if self._users or self.model is None or self.load is None:
                return False
            self.expires_at = time.monotonic()
        self._expire()
        return self.model is None

    @contextmanager
    def exclusive(self) -> Iterator[object]:
        """The loaded model with no request running on it (new ones wait, as behind a switch):
        for changes a generation under way must not see (a LoRA adapter's scale)."""
        with self._cv:
            self._switchers += 1
            while self._switching or self._users:
                self._cv.wait()
            self._switchers -= 1
            self._switching = True
        try:
            self._reload()
            yield self.model
        finally:
            with self._cv:
                self._switching = False
                self._cv.notify_all()

    def _switch(self, name: str, path: Path) -> None:
        """Replaces the loaded model by the one at path; if it fails to load, the old one comes back."""
        old_name, old_path = self.name, self.path
        log.info("loading %s in place of %s", name, old_name)
        if self.model is not None:
            self.model.close()
            self.model = None
        try:
            model = self._load(name, path)
        except BaseException:
            self._install(self._load(old_name, old_path), old_name)
            raise
        self._install(model, name)

    def _load(self, name: str, path: Path):
        created = created_of(name)
        return self.load(path) if created is None else self.load(path, created)

    def forget(self) -> None:
        """The unloaded model's file is being deleted: a request that names no model gets the
        default one from now on."""
        with self._cv:
            if self.model is None:
                self.name, self.path = registry.DEFAULT_MODEL, registry.local_path(registry.DEFAULT_MODEL)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.model is not None:
            self.model.close()


def created_of(name: Optional[str]):
    """The created model (with what it inherits) of that name, or None."""
    if not name or name in registry.MODELS or not created_models.NAME.fullmatch(name):
        return None
    return created_models.resolved(name)
