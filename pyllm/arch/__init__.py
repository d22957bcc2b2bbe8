"""Model families: one file each. `load_architecture` picks by general.architecture."""
from __future__ import annotations

from typing import Optional

from ..errors import InvalidArgumentError, UnsupportedModelError
from ..model_file import ModelFile
from .base import Architecture, HParams
from .afmoe import Afmoe
from .apertus import Apertus
from .bailingmoe2 import BailingMoe2
from .bert import Bert, JinaBertV2, ModernBert, NomicBert, NomicBertMoe
from .bloom import Bloom, Jais, Mpt
from .command_r import Cohere2, CommandR
from .deepseek import BailingMoe, Deepseek
from .deepseek2 import Deepseek2, Mistral4, Plm
from .ernie4_5 import Ernie4_5, Ernie4_5Moe, PaddleOCR
from .exaone import Exaone, Exaone4, ExaoneMoe
from .gemma import Gemma
from .gemma2 import Gemma2
from .gemma3 import Gemma3, GemmaEmbedding
from .gemma3n import Gemma3n
from .gemma4 import Gemma4
from .glm4 import ChatGLM, Glm4, Glm4Moe
from .gpt2 import Gpt2, StarCoder
from .gpt_oss import GptOss
from .gptneox import Falcon, GptNeoX
from .granite import Granite, GraniteHybrid, GraniteMoe, GraniteSwa
from .hunyuan import HunyuanDense, HunyuanMoe, Maincoder
from .lfm2 import Lfm2, Lfm2Moe
from .llama import (Baichuan, InternLM2, Llama, LlamaEmbed, Mistral3, Nanbeige, OpenELM, Qwen, Refact, SeedOss,
                    Xverse)
from .falcon_h1 import FalconH1
from .llama4 import Llama4
from .mamba2 import Jamba, Mamba, Mamba2
from .minicpm import MiniCPM, MiniCPM3
from .minimax import MinimaxM2
from .nemotron import Arcee, Nemotron, NemotronH, NemotronHMoe
from .olmo2 import Olmo, Olmo2, Olmoe
from .phi2 import Phi2
from .phi3 import Phi3
from .qwen2 import Qwen2, Qwen2Moe, Qwen2VL
from .qwen3 import Dots1, Mellum, Qwen3, Qwen3Moe, Qwen3VL, Qwen3VLMoe
from .qwen35 import Qwen35, Qwen35Moe, Qwen3Next
from .rwkv import Arwkv7, Rwkv6, Rwkv6Qwen2, Rwkv7
from .smallthinker import SmallThinker
from .smollm3 import SmolLM3
from .stablelm import Orion, StableLM
from .starcoder2 import CodeShell, Jais2, StarCoder2

ARCHITECTURES: dict[str, type[Architecture]] = {
    "llama": Llama,      # also Mistral 7B and SmolLM2 files
    "bert": Bert,        # sentence encoders: embeddings only
    "nomic-bert": NomicBert,
    "nomic-bert-moe": NomicBertMoe,
    "jina-bert-v2": JinaBertV2,
    "modern-bert": ModernBert,
    "qwen2": Qwen2,
    "qwen3": Qwen3,
    "phi3": Phi3,
    "gemma": Gemma,
    "gemma2": Gemma2,
    "gemma3": Gemma3,
    "gemma-embedding": GemmaEmbedding,   # EmbeddingGemma: embeddings only
    "gemma3n": Gemma3n,
    "gemma4": Gemma4,
    "granite": Granite,
    "smollm3": SmolLM3,
    "olmo2": Olmo2,
    "phi2": Phi2,
    "starcoder2": StarCoder2,
    "stablelm": StableLM,
    "command-r": CommandR,
    "cohere2": Cohere2,
    "ernie4_5": Ernie4_5,
    "exaone": Exaone,
    "exaone4": Exaone4,
    "exaone-moe": ExaoneMoe,
    "mellum": Mellum,
    "qwen3moe": Qwen3Moe,
    "olmoe": Olmoe,
    "granitemoe": GraniteMoe,
    "granite_swa": GraniteSwa,
    "granitehybrid": GraniteHybrid,
    "qwen2moe": Qwen2Moe,
    "gpt-oss": GptOss,
    "glm4": Glm4,
    "nemotron": Nemotron,
    "nemotron_h": NemotronH,
    "nemotron_h_moe": NemotronHMoe,
    "mamba2": Mamba2,
    "falcon-h1": FalconH1,
    "qwen35": Qwen35,
    "qwen35moe": Qwen35Moe,
    "qwen3next": Qwen3Next,
    "arcee": Arcee,
    "gptneox": GptNeoX,
    "falcon": Falcon,
    "lfm2": Lfm2,
    "mistral3": Mistral3,
    "ernie4_5-moe": Ernie4_5Moe,
    "gpt2": Gpt2,
    "starcoder": StarCoder,
    "qwen2vl": Qwen2VL,
    "paddleocr": PaddleOCR,
    "qwen3vl": Qwen3VL,
    "deepseek2": Deepseek2,
    "glm4moe": Glm4Moe,
    "lfm2moe": Lfm2Moe,
    "bailingmoe2": BailingMoe2,
    "hunyuan-dense": HunyuanDense,
    "llama4": Llama4,
    "smallthinker": SmallThinker,
    "dots1": Dots1,
    "afmoe": Afmoe,
    "qwen3vlmoe": Qwen3VLMoe,
    "hunyuan-moe": HunyuanMoe,
    "seed_oss": SeedOss,
    "minimax-m2": MinimaxM2,
    "apertus": Apertus,
    "minicpm": MiniCPM,
    "chatglm": ChatGLM,
    "minicpm3": MiniCPM3,
    "internlm2": InternLM2,
    "xverse": Xverse,
    "orion": Orion,
    "deepseek": Deepseek,
    "bloom": Bloom,
    "mamba": Mamba,
    "jamba": Jamba,
    "mpt": Mpt,
    "jais": Jais,
    "refact": Refact,
    "baichuan": Baichuan,
    "llama-embed": LlamaEmbed,
    "olmo": Olmo,
    "bailingmoe": BailingMoe,
    "openelm": OpenELM,
    "rwkv6": Rwkv6,
    "rwkv6qwen2": Rwkv6Qwen2,
    "rwkv7": Rwkv7,
    "arwkv7": Arwkv7,
    "qwen": Qwen,
    "codeshell": CodeShell,
    "maincoder": Maincoder,
    "jais2": Jais2,
    "nanbeige": Nanbeige,
    "plm": Plm,
    "mistral4": Mistral4,
}


def load_architecture(mf: ModelFile, n_ctx: Optional[int] = None) -> Architecture:
    """The family of mf, its weights checked. n_ctx: the context it will run
    with, when known (Phi-3 picks its RoPE factors by it)."""
    kind = mf.get("general.type")
    if kind == "adapter":
        raise InvalidArgumentError(f"{mf.path} is a LoRA adapter, not a model: apply it to its model "
                                   f"with --lora (Model(..., lora=[...]))")
    if kind == "imatrix":
        raise InvalidArgumentError(f"{mf.path} is an importance matrix, not a model: quantize with it "
                                   f"(pyllm quantize --imatrix)")
    arch = mf.architecture
    if arch == "controlvector":
        raise InvalidArgumentError(f"{mf.path} is a control vector, not a model: add it to its model's "
                                   f"layers with --control-vector (Model(..., control_vectors=[...]))")
    if arch == "clip":
        raise InvalidArgumentError(f"{mf.path} is a multimodal projector (an mmproj file), not a model: give it "
                                   f"with --mmproj beside its language model (Model(..., mmproj=...))")
    cls = ARCHITECTURES.get(arch)
    if cls is None:
        raise UnsupportedModelError(
            f"{mf.path}: architecture {arch!r} is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return cls(mf, n_ctx)


__all__ = ["ARCHITECTURES", "Architecture", "HParams", "load_architecture"]
