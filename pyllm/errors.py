"""The exceptions pyllm raises: one type per kind of problem.

Each message is one line that says what is wrong and what to do. The CLI
prints it on stderr and exits with code 2 (130 for an interrupt).
"""


class PyllmError(Exception):
    """Base of every error pyllm raises on purpose."""


class ModelFileError(PyllmError):
    """The file is not a usable GGUF model: not GGUF, truncated, corrupt."""


class UnsupportedModelError(PyllmError):
    """A well-formed GGUF file that uses something pyllm does not support
    (architecture, tensor type, GGUF version)."""


class ModelNotFoundError(PyllmError):
    """No model file at the given path or registry name."""


class DownloadError(PyllmError):
    """Fetching a registry model failed (network, checksum)."""


class ContextFullError(PyllmError):
    """The sequence does not fit in the context window."""


class TemplateError(PyllmError):
    """A chat template is invalid or tried something it may not do."""


class InvalidArgumentError(PyllmError, ValueError):
    """A caller passed a bad value (sampling parameter, token id, ...)."""


class BackendError(PyllmError):
    """The native core or a device failed."""


class GrammarError(InvalidArgumentError):
    """A grammar (GBNF) or JSON schema for constrained output is invalid or
    uses something pyllm does not support."""


class ServerError(PyllmError):
    """A pyllm server (`pyllm ps`, `pyllm stop`) could not be reached or refused the request."""
