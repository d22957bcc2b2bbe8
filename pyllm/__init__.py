"""pyllm: run GGUF language models locally, CPU first.

    from pyllm import Model
    with Model() as m:                       # the default model, SmolLM2-135M
        print(m.generate("Once upon a time", max_tokens=32).text)
"""
from .errors import (BackendError, ContextFullError, DownloadError, GrammarError, InvalidArgumentError,
                     ModelFileError, ModelNotFoundError, PyllmError, ServerError, TemplateError,
                     UnsupportedModelError)

__version__ = "0.1.0"


def __getattr__(name):
    # Model pulls in the C core; load it on first use so `import pyllm` stays light
    if name == "Model":
        from .api import Model
        return Model
    if name == "ChatSession":
        from .chat import ChatSession
        return ChatSession
    raise AttributeError(name)


__all__ = ["Model", "ChatSession", "PyllmError", "ModelFileError", "UnsupportedModelError", "ModelNotFoundError",
           "DownloadError", "ContextFullError", "TemplateError", "InvalidArgumentError", "GrammarError", "BackendError",
           "ServerError"]
