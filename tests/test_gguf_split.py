"""Split models (pyllm/gguf_split.py, ModelFile's shards): a model written as shards in
llama.cpp's gguf-split layout opens from its first shard with the same metadata, tensors and
logits as the one file; merging gives the file back byte for byte; gguf-py's own split writer
(convert_hf_to_gguf's --split-max-tensors) is read too; a missing, foreign or misnamed shard
is a clear error."""
import hashlib
import json
import os
import shutil

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import synth
from pyllm import Model
from pyllm.errors import InvalidArgumentError, ModelFileError, ModelNotFoundError
from pyllm.gguf_split import merge_model, plan_shards, split_model
from pyllm.model_file import ModelFile


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synth.write_model(tmp_path_factory.mktemp("split") / "tiny.gguf", "llama", QT.Q8_0, n_layer=4,
                             n_embd=256, n_ff=512, n_vocab=512)


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_shards_are_planned_in_order_within_their_limits(tiny):
    with ModelFile(tiny) as mf:
        tensors = list(mf.tensors.values())
        by_count = plan_shards(tensors, max_tensors=5)
        n = len(tensors)
        assert [len(s) for s in by_count] == [5] * (n // 5) + ([n % 5] if n % 5 else [])
        limit = max(t.nbytes for t in tensors) + 64
        by_size = plan_shards(tensors, max_bytes=limit)
        assert [t.name for s in by_size for t in s] == [t.name for t in tensors]
        for shard in by_size:
            assert sum((t.nbytes + 31) // 32 * 32 for t in shard) <= limit
        for a, b in zip(by_size, by_size[1:]):   # a shard closes only when the next tensor does not fit
            assert sum((t.nbytes + 31) // 32 * 32 for t in a) + (b[0].nbytes + 31) // 32 * 32 > limit
        assert [len(s) for s in plan_shards(tensors, max_bytes=1)] == [1] * len(tensors)   # too big: alone
        with pytest.raises(InvalidArgumentError, match="how large"):
            plan_shards(tensors)
        with pytest.raises(InvalidArgumentError, match="positive"):
            plan_shards(tensors, max_tensors=0)


def test_a_split_model_reads_as_the_one_file(tiny, tmp_path):
    paths = split_model(tiny, str(tmp_path / "m"), max_tensors=7)
    with ModelFile(tiny) as one:
        n = len(one.tensors)
        assert len(paths) == -(-n // 7) >= 3
        assert paths[0].endswith(f"m-00001-of-{len(paths):05d}.gguf")
        with ModelFile(paths[0]) as split:
            assert split.shards == paths
            assert split.file_size == sum(os.path.getsize(p) for p in paths)
            assert {k: v for k, v in split.metadata.items() if not k.startswith("split.")}.keys() == one.metadata.keys()
            assert split.get("split.count") == len(paths) and split.get("split.tensors.count") == n
            assert list(split.tensors) == list(one.tensors)
            for name, t in one.tensors.items():
                s = split.tensors[name]
                assert (s.type, s.shape) == (t.type, t.shape) and np.array_equal(s.data, t.data), name
    with ModelFile(paths[1], _shard=(1, len(paths))) as second:   # later shards: split keys only, as gguf-split
        assert set(second.metadata) == {"split.no", "split.count", "split.tensors.count"}
        assert len(second.tensors) == 7


def test_merging_gives_the_file_back(tiny, tmp_path):
    paths = split_model(tiny, str(tmp_path / "m"), max_bytes=200_000)
    assert len(paths) > 2
    assert merge_model(paths[0], tmp_path / "merged.gguf") == len(paths)
    assert sha256(tmp_path / "merged.gguf") == sha256(tiny)
    again = split_model(paths[0], str(tmp_path / "again"), max_bytes=200_000)   # a split model splits again
    assert [sha256(p) for p in again] == [sha256(p) for p in paths]
    with pytest.raises(InvalidArgumentError, match="overwrite"):
        merge_model(paths[0], paths[1])
    with pytest.raises(InvalidArgumentError, match="overwrite"):
        split_model(paths[0], str(tmp_path / "m"), max_bytes=200_000)


def test_the_split_model_gives_the_same_logits(smollm2_path, tmp_path):
    paths = split_model(smollm2_path, str(tmp_path / "smol"), max_bytes=40_000_000)
    assert len(paths) >= 2
    ids = [1, 504, 3458, 314, 253, 1345, 28, 8526, 30]
    with Model(smollm2_path, n_ctx=64, n_threads=2) as m:
        want = m.logits(ids)
    with Model(paths[0], n_ctx=64, n_threads=2) as m:
        got = m.logits(ids)
    assert np.array_equal(got, want)


def test_quantize_and_info_take_a_split_model(tmp_path):
    from pyllm.info import model_info
    from pyllm.quantize import quantize_file
    f32 = synth.write_model(tmp_path / "f32.gguf", "llama", QT.F32, n_layer=2, n_embd=256, n_ff=512, n_vocab=512)
    paths = split_model(f32, str(tmp_path / "s"), max_tensors=6)
    quantize_file(paths[0], tmp_path / "q_split.gguf", "Q8_0")
    quantize_file(f32, tmp_path / "q_one.gguf", "Q8_0")
    assert sha256(tmp_path / "q_split.gguf") == sha256(tmp_path / "q_one.gguf")   # one file, no split keys
    assert any(f"split into {len(paths)} shards" in n for n in model_info(paths[0]).notes)
    assert not any("split" in n for n in model_info(f32).notes)


def test_gguf_py_split_writer_is_read(tmp_path):
    """convert_hf_to_gguf.py --split-max-tensors writes shards through gguf.GGUFWriter."""
    rng = np.random.default_rng(0)
    arrays = {f"t{i}": rng.standard_normal((3 + i, 32)).astype(np.float32) for i in range(5)}
    w = gguf.GGUFWriter(tmp_path / "g.gguf", "llama", split_max_tensors=2)
    w.add_block_count(1)
    for name, a in arrays.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    first = tmp_path / "g-00001-of-00003.gguf"
    assert first.exists() and (tmp_path / "g-00003-of-00003.gguf").exists()
    with ModelFile(first) as mf:
        assert mf.architecture == "llama" and len(mf.shards) == 3
        for name, a in arrays.items():
            assert np.array_equal(mf.tensor(name).data.view(np.float32).reshape(a.shape), a)


def test_shard_errors(tiny, tmp_path):
    paths = split_model(tiny, str(tmp_path / "m"), max_tensors=10)
    count = len(paths)
    with pytest.raises(InvalidArgumentError, match=f"shard 2 of {count}.*give the first shard"):
        ModelFile(paths[1])
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(paths[0], renamed)
    with pytest.raises(ModelFileError, match="not named"):
        ModelFile(renamed)
    other = split_model(tiny, str(tmp_path / "o"), max_tensors=5)
    os.replace(paths[-1], tmp_path / "held")
    with pytest.raises(ModelNotFoundError, match=f"shard {count}.*missing"):
        ModelFile(paths[0])
    shutil.copy(other[count - 1], paths[-1])        # a shard of another split (another count) in its place
    with pytest.raises(ModelFileError, match="different splits"):
        ModelFile(paths[0])
    os.replace(tmp_path / "held", paths[-1])
    shutil.copy(paths[1], tmp_path / "held")
    shutil.copy(paths[2], paths[1])                 # same tensors twice (and a shard with the wrong number)
    with pytest.raises(ModelFileError):
        ModelFile(paths[0])


def test_split_and_merge_cli(tiny, tmp_path):
    from test_cli import one_error_line, pyllm
    r = pyllm("split", tiny, str(tmp_path / "c"), "--max-size", "150K")
    assert r.returncode == 0, r.stderr
    shards = sorted(tmp_path.glob("c-*-of-*.gguf"))
    assert len(shards) > 2 and f"[{len(shards)}/{len(shards)}]" in r.stderr and r.stdout == ""
    r = pyllm("run", "-m", str(shards[0]), "-p", "hello", "-n", "3", "--temp", "0", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["generated_tokens"] >= 1, r.stderr
    r = pyllm("split", "--merge", str(shards[0]), str(tmp_path / "whole.gguf"))
    assert r.returncode == 0 and f"{len(shards)} shards merged" in r.stderr, r.stderr
    assert sha256(tmp_path / "whole.gguf") == sha256(tiny)
    one_error_line(pyllm("split", tiny, str(tmp_path / "d")), "--max-size")
    one_error_line(pyllm("run", "-m", str(shards[1]), "-p", "hi", "-n", "1"), "first shard")
