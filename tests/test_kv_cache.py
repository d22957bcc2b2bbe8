"""Block allocation and prefix reuse of the paged KV cache; its formats (f16, q8_0) on a real model."""
import json

import pytest

from pyllm.errors import ContextFullError
from pyllm.kv_cache import BlockPool, Sequence


def fill(seq, tokens):
    """What the engine does: reuse, reserve, (compute), commit."""
    reused = seq.reuse_prefix(tokens)
    seq.reserve(len(tokens) - reused)
    seq.commit(tokens[reused:])
    return reused


def test_blocks_follow_positions():
    pool = BlockPool(8, 4)
    seq = Sequence(pool, 32)
    assert fill(seq, list(range(10))) == 0
    assert len(seq) == 10 and len(seq.blocks) == 3
    assert pool.n_used == 3


def test_same_sequence_keeps_its_history():
    pool = BlockPool(8, 4)
    seq = Sequence(pool, 32)
    fill(seq, list(range(10)))
    # the next turn extends the history: all 10 reused, only the new ones computed
    assert fill(seq, list(range(10)) + [50, 51, 52]) == 10
    # diverging at 6, inside the full block [4..7] that only this sequence holds: the block
    # forgets its hash (it is rewritten) and keeps positions 4 and 5
    assert fill(seq, list(range(6)) + [99, 98]) == 6
    assert seq.tokens == list(range(6)) + [99, 98]
    other = Sequence(pool, 32)
    assert fill(other, list(range(8)) + [1]) == 4   # [4..7] is no longer offered


def test_diverging_inside_a_shared_block_recomputes_it():
    pool = BlockPool(8, 4)
    a, b = Sequence(pool, 32), Sequence(pool, 32)
    fill(a, list(range(9)))
    assert fill(b, list(range(9))) == 8
    shared = a.blocks[1]
    assert pool.refs[shared] == 2
    # b diverges at 6, inside the block a also holds: b gives it up and recomputes from 4
    assert fill(b, list(range(6)) + [99]) == 4
    assert b.blocks[1] != shared and pool.refs[shared] == 1
    assert fill(Sequence(pool, 32), list(range(9))) == 8   # a's block is still found


def test_at_least_one_token_is_computed():
    pool = BlockPool(8, 4)
    seq = Sequence(pool, 32)
    fill(seq, list(range(8)))
    assert seq.reuse_prefix(list(range(8))) == 7  # the last token must run to give logits


def test_other_sequence_reuses_full_blocks():
    pool = BlockPool(8, 4)
    a = Sequence(pool, 32)
    fill(a, list(range(11)))          # blocks [0..3], [4..7] full and hashed
    a_blocks = list(a.blocks)
    b = Sequence(pool, 32)
    assert fill(b, list(range(9)) + [7, 7]) == 8
    assert b.blocks[:2] == a_blocks[:2]
    assert pool.refs[a_blocks[0]] == 2
    a.release()
    b.release()
    # released hashed blocks stay cached and are found again
    c = Sequence(pool, 32)
    assert fill(c, list(range(8)) + [1]) == 8


def test_cached_blocks_are_evicted_when_needed():
    pool = BlockPool(4, 4)
    a = Sequence(pool, 16)
    fill(a, list(range(16)))
    a.release()
    b = Sequence(pool, 16)
    fill(b, [100 + i for i in range(16)])  # needs every block: evicts a's
    assert pool.n_used == 4
    assert pool.lookup(b"nothing") is None


def test_context_full():
    pool = BlockPool(8, 4)
    seq = Sequence(pool, 10)
    with pytest.raises(ContextFullError, match="context of 10"):
        fill(seq, list(range(11)))
    pool = BlockPool(2, 4)
    a = Sequence(pool, 100)
    with pytest.raises(ContextFullError, match="KV cache is full"):
        fill(a, list(range(9)))


def test_quantized_caches_save_memory_and_keep_the_text(smollm2_path):
    """Model(cache_type_k/v="q8_0"), llama.cpp's -ctk/-ctv q8_0: 34 bytes per 32 values where f16
    takes 64, in the pools, `pyllm info` and the bench's bytes per token; greedy text where the
    f16 cache's choice is clear stays the same; q4_0: 18 bytes per 32; a format it does not know
    is one clear error."""
    import subprocess
    import sys

    from pyllm import InvalidArgumentError, Model
    from pyllm.bench import decode_bytes_per_token
    from pyllm.info import model_info
    prompt = "The capital of France is"
    with Model(smollm2_path, n_ctx=256) as f16, Model(smollm2_path, n_ctx=256, cache_type_k="q8_0",
                                                      cache_type_v="q8_0") as q8:
        assert q8.backend.kv_bytes * 64 == f16.backend.kv_bytes * 34
        kv_f16 = decode_bytes_per_token(f16, 100) - decode_bytes_per_token(f16, 0)
        assert (decode_bytes_per_token(q8, 100) - decode_bytes_per_token(q8, 0)) * 64 == kv_f16 * 34
        want, got = (m.generate(prompt, max_tokens=12, temperature=0, logprobs=2) for m in (f16, q8))
        for a, b in zip(want.logprobs, got.logprobs):
            if a.top[0][1] - a.top[1][1] < 0.2:     # a near-tie: either may win
                break
            assert a.token == b.token
        assert want.tokens[:3] == got.tokens[:3]
        with Model(smollm2_path, n_ctx=256, cache_type_k="q4_0", cache_type_v="q4_0") as q4:
            assert q4.backend.kv_bytes * 64 == f16.backend.kv_bytes * 18
            assert q4.generate(prompt, max_tokens=3, temperature=0).tokens == want.tokens[:3]
    assert model_info(smollm2_path, n_ctx=256, k_type=8, v_type=8).kv_bytes * 64 == \
        model_info(smollm2_path, n_ctx=256).kv_bytes * 34
    with pytest.raises(InvalidArgumentError, match="cache_type_v must be one of f16, q8_0, q4_0"):
        Model(smollm2_path, n_ctx=64, cache_type_v="q5_1")
    cmd = [sys.executable, "-m", "pyllm.cli.main", "run", "-m", smollm2_path, "-p", prompt, "-n", "12", "--temp", "0",
           "-c", "256", "--json"]
    r = subprocess.run(cmd + ["-ctk", "q8_0", "-ctv", "q8_0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["tokens"] == got.tokens
    r = subprocess.run(cmd + ["--cache-type-k", "q5_1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cache_type_k must be one of f16, q8_0, q4_0" in r.stderr
