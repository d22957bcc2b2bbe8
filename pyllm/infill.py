"""Fill in the middle (FIM): code between a prefix and a suffix, for models trained with
FIM tokens (Qwen2.5-Coder, CodeGemma, StarCoder 2, DeepSeek-Coder, Codestral ...).

The model reads the text before the cursor and the text after it, each behind its
token, and writes the middle after the middle token; it ends with an end-of-text or
FIM token (the tokenizer's end-of-generation set holds them). Two layouts:

  prefix-suffix-middle (PSM), OpenAI's and ollama's `suffix`:
      [BOS] <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID>

  llama-server's /infill (what llama.vim and llama.vscode send), with files of the
  project ahead of it as context ("extra" chunks), the repo-level pattern of
  Qwen2.5-Coder's paper where the vocabulary has its tokens:
      <FIM_REP>myproject\\n <FIM_SEP>name\\n text ... <FIM_SEP>filename\\n
      [BOS] <FIM_PRE> prefix prompt <FIM_SUF> suffix <FIM_MID>
  The prefix keeps its last 3/4 of a batch of tokens, the suffix its first
  quarter less the prompt; the extra chunks fill what the context leaves after a
  batch and twice n_predict (their ends kept). A vocabulary without a separator
  token gets a plain-text one between chunks.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Optional

from .errors import InvalidArgumentError, UnsupportedModelError

CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"   # between extra chunks where the vocabulary has no <FIM_SEP>


def fim_tokens(tokenizer, model_name: str) -> tuple[int, int, int]:
    """(prefix, suffix, middle) token ids, or UnsupportedModelError."""
    ids = tokenizer.special_ids
    missing = [what for what, key in (("prefix", "fim_pre"), ("suffix", "fim_suf"), ("middle", "fim_mid"))
               if ids.get(key) is None]
    if missing:
        raise UnsupportedModelError(f"{model_name} has no fill-in-the-middle tokens ({', '.join(missing)} missing): "
                                    f"infill needs a code model trained for it, such as Qwen2.5-Coder")
    return ids["fim_pre"], ids["fim_suf"], ids["fim_mid"]


def _text(tokenizer, s: str) -> list[int]:
    return tokenizer.encode(s, add_bos=False, parse_special=False)


def psm_prompt(tokenizer, model_name: str, prefix: str, suffix: str) -> list[int]:
    """[BOS] <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID> (the text taken as it is)."""
    pre, suf, mid = fim_tokens(tokenizer, model_name)
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    return bos + [pre] + _text(tokenizer, prefix) + [suf] + _text(tokenizer, suffix) + [mid]


def check_extra(extra) -> list[Mapping]:
    """input_extra: a list of {"text": ..., "filename": ...} (filename optional)."""
    if extra is None:
        return []
    if not isinstance(extra, list) or not all(
            isinstance(c, Mapping) and isinstance(c.get("text", ""), str) and isinstance(c.get("filename", ""), str)
            for c in extra):
        raise InvalidArgumentError('input_extra must be a list of {"text": ..., "filename": ...} objects')
    return extra


def server_prompt(tokenizer, model_name: str, prefix: str, suffix: str, prompt: str = "",
                  extra: Optional[Iterable[Mapping]] = None, n_batch: int = 512, n_ctx: int = 4096,
                  n_predict: int = -1) -> list[int]:
    """llama-server's /infill prompt (see the module's doc); the prompt's special-token text
    is read as those tokens, the rest as plain text."""
    pre, suf, mid = fim_tokens(tokenizer, model_name)
    ids = tokenizer.special_ids
    rep, sep = ids.get("fim_rep"), ids.get("fim_sep")
    extra_ids: list[int] = []
    if rep is not None:
        extra_ids += [rep] + _text(tokenizer, "myproject\n")
    for chunk in check_extra(extra):
        if sep is not None:
            extra_ids += [sep] + _text(tokenizer, chunk.get("filename", "tmp") + "\n")
        else:
            extra_ids += _text(tokenizer, CHUNK_SEPARATOR)
        extra_ids += _text(tokenizer, chunk.get("text", ""))
    if sep is not None:
        extra_ids += [sep] + _text(tokenizer, "filename\n")

    prompt_ids = tokenizer.encode(prompt, add_bos=False, parse_special=True) if prompt else []
    prefix_ids, suffix_ids = _text(tokenizer, prefix), _text(tokenizer, suffix)
    n_prefix = min(len(prefix_ids), 3 * (n_batch // 4))
    n_suffix = min(len(suffix_ids), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [pre] + prefix_ids[len(prefix_ids) - n_prefix:] + prompt_ids
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        head = [tokenizer.bos_id] + head
    return extra_ids[len(extra_ids) - n_extra:] + head + [suf] + suffix_ids[:n_suffix] + [mid]
