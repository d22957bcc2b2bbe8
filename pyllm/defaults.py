"""The run settings pyllm.Model uses unless told otherwise (and `pyllm info` sizes)."""
DEFAULT_MAX_CTX = 4096  # context when none is given: the model's training context, at most this
N_BATCH = 512           # prompt tokens per forward step
BLOCK_SIZE = 32         # tokens per KV-cache block
N_OUT_MAX = 32          # rows of logits one step can return
