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
"""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterator, Optional

from . import registry
from .errors import ModelNotFoundError

log = logging.getLogger("pyllm")

DEFAULT_PARALLEL = 4   # requests at once where steps can batch (llama-server's default number of slots)


class ModelHost:
    def __init__(self, model, name: str, parallel: Optional[int] = None,
                 load: Optional[Callable[[Path], object]] = None):
        """parallel: requests at once (None: DEFAULT_PARALLEL where the model's steps can hold
        several sequences, else 1). load(path) -> Model: how to load another model, or None to
        serve this one only."""
        self.parallel, self.load = parallel, load
        self._cv = threading.Condition()
        self._users = 0            # requests running on the loaded model
        self._switchers = 0        # requests waiting to load another
        self._switching = False
        self._install(model, name)

    def _install(self, model, name: str) -> None:
        self.model, self.name = model, name
        n = self.parallel
        if n is None:
            n = DEFAULT_PARALLEL if model.backend.batches_sequences else 1
        self.slots = model.parallel(n)

    # -- what a request may name -------------------------------------------------------------
    def available(self) -> list[tuple[str, Path]]:
        """(name, file) of every model a request may name, the loaded one first."""
        out = {self.name: Path(self.model.path)}
        if self.load is not None:
            seen = {Path(self.model.path).resolve()}
            for name, path in registry.installed():
                if path.resolve() not in seen:
                    out[name] = path
                    seen.add(path.resolve())
            folder = registry.models_dir()
            for path in sorted(folder.glob("*.gguf")) if folder.is_dir() else []:
                if path.resolve() not in seen and path.stem not in out:
                    out[path.stem] = path
                    seen.add(path.resolve())
        return list(out.items())

    def resolve(self, requested: Optional[str]) -> Optional[tuple[str, Path]]:
        """The (name, file) a request's model field asks for, or None for whichever is loaded
        (no name, or any name when the server serves one model)."""
        if not requested or self.load is None:
            return None
        name = requested.removesuffix(":latest")
        if name == self.name:   # the loaded one: no need to look at the folder
            return name, Path(self.model.path)
        available = self.available()
        for n, path in available:
            if n == name:
                return n, path
        raise ModelNotFoundError(f"model {requested!r} not found; this server has "
                                 f"{', '.join(n for n, _ in available)} (fetch a registry model with `pyllm pull NAME`)")

    # -- running a request -------------------------------------------------------------------
    @contextmanager
    def use(self, requested: Optional[str] = None, slot: bool = True) -> Iterator[object]:
        """The model a request names, loaded (switching to it if need be) and kept until the
        block ends, with a slot of it held for this thread (slot=False: a request that only
        reads about the model)."""
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
            with self.slots.take() if slot else nullcontext():
                yield self.model
        finally:
            with self._cv:
                self._users -= 1
                self._cv.notify_all()

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
            yield self.model
        finally:
            with self._cv:
                self._switching = False
                self._cv.notify_all()

    def _switch(self, name: str, path: Path) -> None:
        """Replaces the loaded model by the one at path; if it fails to load, the old one comes back."""
        old_name, old_path = self.name, Path(self.model.path)
        log.info("loading %s in place of %s", name, old_name)
        self.model.close()
        try:
            model = self.load(path)
        except BaseException:
            self._install(self.load(old_path), old_name)
            raise
        self._install(model, name)

    def close(self) -> None:
        self.model.close()
