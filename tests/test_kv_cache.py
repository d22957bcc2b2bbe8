"""Block allocation and prefix reuse of the paged KV cache."""
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
    # diverging at 6, inside the full (hashed, shareable) block [4..7]: recompute from 4
    assert fill(seq, list(range(6)) + [99, 98]) == 4
    assert seq.tokens == list(range(6)) + [99, 98]


def test_at_least_one_token_is_computed():
    pool = BlockPool(8, 4)
    seq = Sequence(pool, 32)
    fill(seq, list(range(8)))
    assert seq.reuse_prefix(list(range(8))) == 4  # the last token must run to give logits


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
