"""Media rows: a step's input rows given as embeddings (an image's, from a vision encoder)
instead of looked up by token id, as llama.cpp's llama_batch.embd; and bidirectional steps
(Gemma 3 decodes an image's rows with causal attention off: every row of the step sees
every row of it, plus what is cached before).

A token id -1 - j takes row j of the step's media rows as it is (no embedding scale, no LoRA).
The C core against the numpy reference (pyllm/reference.py), with the tolerances of
test_forward.py: float weights leave only the f16 KV cache's rounding (~1e-4 of the logits'
spread), 8-bit activations about 1%.
"""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

import synth
from test_forward import build, compare
from pyllm._native import ffi, lib
from pyllm.arch import load_architecture
from pyllm.backend.base import Shape
from pyllm.backend.cpu import CpuBackend, HostDevice
from pyllm.backend.placement import DeviceSpec, Hardware, LinkSpec, Planner
from pyllm.backend.sim import SimDevice
from pyllm.backend.split import SplitBackend
from pyllm.batching import StepBatcher, _Step
from pyllm.errors import InvalidArgumentError, UnsupportedModelError
from pyllm.graph import OPF_ACCUMULATE, OPF_MEDIA_ONLY, Graph
from pyllm.lora import graph_pairs, open_adapters
from pyllm.model_file import ModelFile
from pyllm.reference import Reference

TABLE = [3, 0, 5]   # 48 positions, blocks in any order


def media_like(arch, n, seed=7):
    """n random rows of the spread of the model's scaled token embeddings (what the layers expect)"""
    ref = Reference(arch)
    std = float(ref.w(arch.tok_embd).std()) * arch.embed_scale
    return (np.random.default_rng(seed).standard_normal((n, arch.hp.n_embd)) * std).astype(np.float32)


def prompt(n_before, n_media, n_after, seed=1):
    """text ids, then media ids -1..-n_media, then text ids; and where the media rows are"""
    rng = np.random.default_rng(seed)
    tokens = [int(t) for t in rng.integers(0, 512, n_before)] + [-1 - j for j in range(n_media)] + \
        [int(t) for t in rng.integers(0, 512, n_after)]
    return tokens, (n_before, n_before + n_media)


def run_chunks(be, tokens, span, media, bidirectional=False):
    """The text before, the media rows (one step, ids -1.. of its own rows), the text after:
    every row's logits"""
    a, b = span
    out = [be.forward(tokens[:a], 0, TABLE, a).copy(),
           be.forward(tokens[a:b], a, TABLE, b - a, media=media, bidirectional=bidirectional).copy(),
           be.forward(tokens[b:], b, TABLE, len(tokens) - b).copy()]
    return np.concatenate(out)


@pytest.mark.parametrize("qtype", [QT.F32, QT.Q8_0], ids=lambda t: t.name)
def test_llama_media_rows_match_the_reference(tmp_path, qtype):
    arch, be = build(synth.write_llama(tmp_path / "m.gguf", qtype))
    tokens, span = prompt(9, 5, 8)
    media = media_like(arch, 5)
    ref = Reference(arch).forward(tokens, media=media)
    chunked = run_chunks(be, tokens, span, media)
    whole = be.forward(tokens, 0, TABLE, len(tokens), media=media).copy()   # text and media rows in one step
    for out in (chunked, whole):
        rel, agree = compare(out, ref)
        if qtype == QT.F32:
            assert rel < 1e-3 and (out.argmax(1) == ref.argmax(1)).all(), rel
        else:
            assert rel < 0.03 and agree == 1.0, rel
    # the rows are used: other media rows give other logits after them
    other = Reference(arch).forward(tokens, media=media[::-1].copy())
    assert compare(other, ref)[0] > 0.05


def test_deepstack_slices_join_after_the_first_layers(tmp_path):
    """Qwen 3 VL (DeepStack of 2 over 3 layers): a media row [row | slice 1 | slice 2], slice k
    added to the residual after layer k - 1, text rows none; in one step with text rows or in
    chunks, against the reference. Without rope positions M-RoPE is plain NEOX, as for text."""
    arch, be = build(synth.write_qwen3vl(tmp_path / "m.gguf", QT.F32, n_layer=3, keys={"num_deepstack_layers": 2}))
    n = arch.hp.n_embd
    assert arch.deepstack == 2 and sum(op.flags & OPF_MEDIA_ONLY != 0 for op in be.graph.ops) == 2
    tokens, span = prompt(6, 4, 5)
    media = np.concatenate([media_like(arch, 4, seed) for seed in (7, 8, 9)], axis=1)
    ref = Reference(arch).forward(tokens, media=media)
    for out in (run_chunks(be, tokens, span, media), be.forward(tokens, 0, TABLE, len(tokens), media=media).copy()):
        rel, agree = compare(out, ref)
        assert rel < 1e-3 and agree == 1.0, rel
    unstacked = media.copy()
    unstacked[:, n:] = 0
    assert compare(Reference(arch).forward(tokens, media=unstacked), ref)[0] > 0.05   # the slices count
    with pytest.raises(InvalidArgumentError, match=f"media rows are {n} wide; the embedding is {3 * n}"):
        be.forward([1, -1], 0, TABLE, 1, media=media[:, :n].copy())


def test_the_core_checks_deepstack_ops(tmp_path):
    """An EMBED op takes media columns after the first only as DeepStack's (OPF_MEDIA_ONLY, which
    adds, so OPF_ACCUMULATE); a negative column is refused."""
    _, be = build(synth.write_qwen3vl(tmp_path / "m.gguf", QT.F32, n_layer=3, keys={"num_deepstack_layers": 1}))
    i = next(k for k, op in enumerate(be.graph.ops) if op.flags & OPF_MEDIA_ONLY)
    rec = be.ops[i]
    flags = rec.flags

    def check(**fields):
        rec.flags, rec.media_col = flags, be.graph.ops[i].media_col
        for k, v in fields.items():
            setattr(rec, k, v)
        return lib.pyllm_program_check(be.ops + i, 1), ffi.string(lib.pyllm_error()).decode()
    assert check()[0] == 0 and rec.media_col == 256
    for bad in (dict(flags=flags & ~OPF_MEDIA_ONLY), dict(flags=flags & ~OPF_ACCUMULATE), dict(media_col=-1)):
        assert check(**bad) == (1, "op 0 (layer 0): embed: media column %d without OPF_MEDIA_ONLY, or that without "
                                   "OPF_ACCUMULATE" % bad.get("media_col", 256)), bad
    check()


def test_gemma3_bidirectional_media_step_matches_the_reference(tmp_path):
    """Gemma 3 (embedding scale sqrt(n_embd), which media rows skip; sliding windows of 4, so a
    media row sees back as far as its window and ahead to the step's last row); the media step
    crosses a KV block boundary. Causal attention over the same rows gives other logits."""
    arch, be = build(synth.write_gemma3(tmp_path / "g.gguf", QT.F32, window=4))
    assert arch.embed_scale != 1.0
    tokens, span = prompt(13, 6, 7)
    media = media_like(arch, 6)
    ref = Reference(arch).forward(tokens, media=media, bidirectional=[span])
    out = run_chunks(be, tokens, span, media, bidirectional=True)
    rel, _ = compare(out, ref)
    assert rel < 1e-3 and (out.argmax(1) == ref.argmax(1)).all(), rel

    causal_ref = Reference(arch).forward(tokens, media=media)
    causal = run_chunks(be, tokens, span, media, bidirectional=False)
    assert compare(causal, causal_ref)[0] < 1e-3
    a = span[0]
    assert compare(causal[a:], out[a:])[0] > 0.01        # the media rows and what follows see differently
    np.testing.assert_array_equal(causal[:a], out[:a])   # what came before does not


def test_bidirectional_text_step_and_one_row_step(tmp_path):
    """bidirectional without media rows; a one-row bidirectional step is a causal one."""
    arch, be = build(synth.write_gemma3(tmp_path / "g.gguf", QT.F32, window=4))
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, 512, 20)]
    ref = Reference(arch).forward(tokens, bidirectional=[(5, 15)])
    out = np.concatenate([be.forward(tokens[:5], 0, TABLE, 5).copy(),
                          be.forward(tokens[5:15], 5, TABLE, 10, bidirectional=True).copy(),
                          be.forward(tokens[15:], 15, TABLE, 5).copy()])
    assert compare(out, ref)[0] < 1e-3
    be.forward(tokens[:5], 0, TABLE, 1)
    plain = be.forward(tokens[5:6], 5, TABLE, 1).copy()
    np.testing.assert_array_equal(be.forward(tokens[5:6], 5, TABLE, 1, bidirectional=True), plain)


def test_a_step_after_a_media_step_has_no_media(tmp_path):
    """The step record is reused: a plain step after a media step reads no media rows, and its
    negative ids are refused again."""
    arch, be = build(synth.write_llama(tmp_path / "m.gguf", QT.F32))
    tokens, (a, b) = prompt(6, 4, 6)
    media = media_like(arch, 4)
    be.forward(tokens[:a], 0, TABLE, 1)
    be.forward(tokens[a:b], a, TABLE, 1, media=media, bidirectional=True)
    assert be.step.media == ffi.NULL and be.step.n_media == 0 and be.step.bidirectional == 0
    after = be.forward(tokens[b:], b, TABLE, len(tokens) - b).copy()
    ref = Reference(arch).forward(tokens, media=media, bidirectional=[(a, b)])
    assert compare(after, ref[b:])[0] < 1e-3
    with pytest.raises(InvalidArgumentError, match="token id -1 names media row 0; the step has 0"):
        be.forward([-1], len(tokens), TABLE, 1)
    text = tokens[:a]
    assert compare(be.forward(text, 0, TABLE, a).copy(), ref[:a])[0] < 1e-3


def test_media_errors(tmp_path):
    arch, be = build(synth.write_llama(tmp_path / "m.gguf", QT.F32))
    media = media_like(arch, 5)
    with pytest.raises(InvalidArgumentError, match="token id -6 names media row 5; the step has 5"):
        be.forward([1, -1, -6], 0, TABLE, 1, media=media)
    with pytest.raises(InvalidArgumentError, match="token id -3 names media row 2; the step has 0"):
        be.forward([1, -3], 0, TABLE, 1)
    with pytest.raises(InvalidArgumentError, match="media rows are 257 wide; the embedding is 256"):
        be.forward([1, -1], 0, TABLE, 1, media=np.zeros((2, 257), np.float32))
    with pytest.raises(InvalidArgumentError, match=r"a \[rows, width\] array"):
        be.forward([1, -1], 0, TABLE, 1, media=np.zeros(256, np.float32))
    with pytest.raises(InvalidArgumentError, match="-2147483648 names media row 2147483647"):
        be.forward([-2**31], 0, TABLE, 1, media=media)
    # media rows of another dtype, or not C-contiguous, are converted
    other = np.asfortranarray(media.astype(np.float64))
    np.testing.assert_array_equal(be.forward([1, -2], 0, TABLE, 2, media=other).copy(),
                                  be.forward([1, -2], 0, TABLE, 2, media=media).copy())
    # the core itself refuses what Python would not send
    raw = ffi.new("pyllm_step *", {"n_tokens": 3, "n_out": 1, "tokens": be.step.tokens, "pos": be.step.pos,
                                   "block_table": be.step.block_table, "n_table": 3,
                                   "block_size": be.step.block_size, "pool_blocks": be.step.pool_blocks})
    be.tokens[:3] = [1, 2, 3]
    be.table[:3] = TABLE

    def run(**fields):
        for k, v in fields.items():
            setattr(raw, k, v)
        rc = lib.pyllm_run(be.ctx, be.ops, len(be.graph.ops), raw)
        return rc, ffi.string(lib.pyllm_error()).decode()

    be.pos[:3] = [0, 1, 2]
    assert run(bidirectional=1)[0] == 0
    be.pos[:3] = [0, 2, 3]
    assert run(bidirectional=0)[0] == 0   # positions with a gap: fine causally
    assert run(bidirectional=1) == (-1, "a bidirectional step needs consecutive positions (2 after 0)")
    be.pos[:3] = [0, 1, 2]
    rows = np.zeros(3, np.int32)
    assert run(row_table=ffi.from_buffer("int32_t[]", rows)) == (-1, "a bidirectional step of several sequences")
    raw.row_table, raw.bidirectional = ffi.NULL, 0
    assert run(n_media=2, media=ffi.NULL, media_width=256)[0] == -1
    assert run(n_media=-1)[0] == -1
    keep = np.zeros((2, 256), np.float32)
    assert run(n_media=2, media=ffi.from_buffer("float[]", keep), media_width=0)[0] == -1
    assert run(media_width=256)[0] == 0
    # a split backend's host program (CoreProgram.run) reports the core's refusal as the CPU backend does
    from pyllm.backend.base import StepData
    host = HostDevice(2)
    try:
        prog = host.bind(be.graph, [be.program.ranges[0]], be.program.shape)
        step = StepData(np.array([1, 2], np.int32), np.array([0, 5], np.int32), np.array(TABLE, np.int32), 1,
                        bidirectional=True)
        with pytest.raises(InvalidArgumentError, match="bidirectional step needs consecutive positions"):
            prog.run(0, step)
        assert prog.step.bidirectional == 0
        prog.close()
    finally:
        host.close()


def test_media_rows_are_not_adapted_by_a_lora(tmp_path):
    """A LoRA pair on the token embedding adapts the text rows' lookup; a media row is taken as it is
    (the reference replaces the whole adapted row)."""
    path = synth.write_llama(tmp_path / "m.gguf", QT.F16)
    adapter = synth.write_lora(tmp_path / "a.gguf", path, targets=["token_embd.weight"], size=0.5)
    arch = load_architecture(ModelFile(path))
    adapters = open_adapters([adapter], arch.mf)
    try:
        g = Graph(**graph_pairs(adapters))
        arch.build(g)
        be = CpuBackend(g, 2, 64, 64, 8, 16)
        tokens, span = prompt(7, 5, 7)
        media = media_like(arch, 5)
        out = run_chunks(be, tokens, span, media)
        ref = Reference(arch, lora=adapters).forward(tokens, media=media)
        plain = Reference(arch).forward(tokens, media=media)
    finally:
        for a in adapters:
            a.close()
    assert compare(out, ref)[0] < 3e-3, compare(out, ref)[0]
    assert compare(plain, ref)[0] > 0.05   # the adapter matters


def test_per_layer_token_inputs_of_media_rows_are_the_padding_token(tmp_path):
    """Gemma 4's (and 3n's) per-layer inputs are looked up by token id; a media row takes the
    padding token's (row 0), as llama.cpp does, with the media row itself in their projection:
    against the reference, which differs from one where the rows took another token's. A
    Gemma 4 without per-layer inputs takes media rows as any decoder."""
    for per_layer in (32, 0):
        arch, be = build(synth.write_gemma4(tmp_path / f"g4-{per_layer}.gguf", QT.F32, per_layer=per_layer))
        tokens, span = prompt(6, 3, 5)
        media = media_like(arch, 3)
        ref = Reference(arch).forward(tokens, media=media, bidirectional=[span])
        out = run_chunks(be, tokens, span, media, bidirectional=True)
        assert compare(out, ref)[0] < 1e-3
    arch = build(synth.write_gemma4(tmp_path / "g4-32.gguf", QT.F32))[0]
    media = media_like(arch, 3)
    base = Reference(arch).forward(tokens, media=media, bidirectional=[span])
    padded = Reference(arch)
    padded.w(arch.ple_embd)[0] += 1.0      # another padding row: other logits after the image
    assert compare(padded.forward(tokens, media=media, bidirectional=[span]), base)[0] > 0.01


def test_reference_checks_its_arguments(tmp_path):
    arch = load_architecture(ModelFile(synth.write_llama(tmp_path / "m.gguf", QT.F32)))
    ref = Reference(arch)
    with pytest.raises(ValueError, match=r"media rows must be \[rows, 256\]"):
        ref.forward([1, -1])
    with pytest.raises(ValueError, match="names media row 1"):
        ref.forward([1, -2], media=np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError, match="outside the 3 rows"):
        ref.forward([1, 2, 3], bidirectional=[(1, 4)])
    # the same reference runs plain forwards after one with media
    np.testing.assert_array_equal(ref.forward([1, 2, 3]), Reference(arch).forward([1, 2, 3]))


# -- other backends ------------------------------------------------------------------------------------

def split_backend(g, gpu, host, ngl, n_batch=64):
    shape = Shape(n_batch, n_batch, 8, 16)
    hw = Hardware(DeviceSpec("cpu", 50e9, 1e12, 1e-6), DeviceSpec("gpu", 1e12, 1e14, 1e-6, memory=None),
                  LinkSpec(16e9, 16e9, 1e-5))
    plan = Planner(g, hw, shape).plan(ngl)
    return SplitBackend(g, {"cpu": host, "gpu": gpu}, plan.schedules(g), shape, plan.stream_min_batch), plan


def check_split(tmp_path, make_gpu, exact):
    path = synth.write_gemma3(tmp_path / "g.gguf", QT.F32, window=4)
    arch, cpu = build(path)
    g = Graph()
    arch.build(g)
    tokens, span = prompt(13, 6, 7)
    media = media_like(arch, 6)
    want = run_chunks(cpu, tokens, span, media, bidirectional=True)
    host = HostDevice(2)
    gpu = make_gpu(host)
    try:
        # the last layers on the device, the embedding on the host: media rows stay there
        be, plan = split_backend(g, gpu, host, arch.hp.n_layer - 1)
        assert not plan.embed_on_gpu
        got = run_chunks(be, tokens, span, media, bidirectional=True)
        if exact:
            np.testing.assert_array_equal(got, want)
        else:
            assert compare(got, want)[0] < 1e-4
        be.close()
        # everything on the device: a media step is refused before anything runs; a bidirectional
        # step of text runs
        be, plan = split_backend(g, gpu, host, "all")
        assert plan.embed_on_gpu
        with pytest.raises(UnsupportedModelError, match="images need the token embeddings on the CPU"):
            be.forward(tokens[span[0]:span[1]], 0, TABLE, 1, media=media)
        text = [int(t) for t in np.random.default_rng(5).integers(0, 512, 12)]
        got = be.forward(text, 0, TABLE, 12, bidirectional=True).copy()
        ref = cpu.forward(text, 0, TABLE, 12, bidirectional=True).copy()
        if exact:
            np.testing.assert_array_equal(got, ref)
        else:
            assert compare(got, ref)[0] < 1e-4
        be.close()
    finally:
        gpu.close()
        host.close()


def test_split_over_the_sim_device(tmp_path):
    check_split(tmp_path, lambda host: SimDevice(host), exact=True)


def test_split_over_the_cuda_emulator(tmp_path):
    """The GPU's attention runs a bidirectional step (the emulator runs its kernels on the CPU)."""
    from test_cuda import emulator_library
    from pyllm.backend import cuda
    check_split(tmp_path, lambda host: cuda.CudaDevice(0, library=emulator_library()), exact=False)


def test_split_over_a_gpu(tmp_path):
    """The same on a real GPU (skipped without one)."""
    from test_cuda import GPU_OK, WHY
    from pyllm.backend import cuda
    if not GPU_OK:
        pytest.skip(f"no usable GPU: {WHY}")
    check_split(tmp_path, lambda host: cuda.CudaDevice(0), exact=False)


def test_the_batcher_runs_a_media_step_alone(tmp_path):
    arch, be = build(synth.write_llama(tmp_path / "m.gguf", QT.F32))
    b = StepBatcher(be)
    assert b.batching
    media = media_like(arch, 3)
    b._queue = [_Step([-1, -2, -3], 4, [0], 3, media), _Step([7], 9, [1], 1), _Step([8], 3, [2], 1)]
    assert [len(s.tokens) for s in b._take()] == [3]          # the media step alone
    b._queue.insert(1, _Step([5, 6], 0, [3], 2, None, True))
    assert [s.tokens for s in b._take()] == [[7], [8]]        # the bidirectional one left out
    assert [s.tokens for s in b._take()] == [[5, 6]]
    tokens, span = prompt(6, 3, 2)
    be.forward(tokens[:6], 0, TABLE, 1)
    got = b.forward(tokens[6:9], 6, TABLE, 3, media=media)
    be.forward(tokens[:6], 0, TABLE, 1)
    np.testing.assert_array_equal(got, be.forward(tokens[6:9], 6, TABLE, 3, media=media))
