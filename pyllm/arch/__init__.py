"""Model families: one file each. `load_architecture` picks by general.architecture."""
from __future__ import annotations

from ..errors import UnsupportedModelError
from ..model_file import ModelFile
from .base import Architecture, HParams
from .llama import Llama

ARCHITECTURES: dict[str, type[Architecture]] = {
    "llama": Llama,
}


def load_architecture(mf: ModelFile) -> Architecture:
    arch = mf.architecture
    cls = ARCHITECTURES.get(arch)
    if cls is None:
        raise UnsupportedModelError(
            f"{mf.path}: architecture {arch!r} is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return cls(mf)


__all__ = ["ARCHITECTURES", "Architecture", "HParams", "load_architecture"]
