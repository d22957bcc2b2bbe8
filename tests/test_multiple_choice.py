"""Multiple-choice sets as llama-perplexity --multiple-choice scores them
(pyllm/multiple_choice.py): llama.cpp's binary file read with every length checked, the
tasks drawn as llama.cpp draws them, SmolLM2's picks against its own full logits, and the
command line's lines."""
import json
import math

import numpy as np
import pytest

from test_cli import one_error_line, pyllm
from pyllm.errors import InvalidArgumentError
from pyllm.multiple_choice import Task, read_tasks, write_tasks
from pyllm.winogrande import draw

TASKS = [Task("What color is a clear daytime sky?", ["Blue.", "Green.", "Red.", "Black."], [1, 0, 0, 0]),
         Task("How many legs does a cat have?", ["Two.", "Four.", "Eight."], [0, 1, 0]),
         Task("What do bees make?", ["Honey.", "Steel.", "Glass.", "Paper."], [1, 0, 0, 0]),
         Task("Which is a fruit?", ["A hammer.", "An apple."], [0, 1])]


def test_the_file_round_trip_and_draws():
    data = write_tasks(TASKS)
    assert read_tasks(data) == TASKS
    many = [Task(f"q{i}", ["a", "b"], [1, 0]) for i in range(50)]
    picked = read_tasks(write_tasks(many), n_tasks=7)
    assert [t.question for t in picked] == [many[i].question for i in draw(range(50), 7)]
    assert len({t.question for t in picked}) == 7


@pytest.mark.parametrize("damage,message", [
    (lambda d: d[:-3], "inside a number"),             # the last task's second set cut
    (lambda d: d[:-12], "past its end"),               # its labels cut
    (lambda d: (10 ** 6).to_bytes(4, "little") + d[4:], "do not fit"),
    (lambda d: b"", "inside a number"),
])
def test_damaged_files(damage, message):
    with pytest.raises(InvalidArgumentError, match=message):
        read_tasks(damage(write_tasks(TASKS)))
    with pytest.raises(InvalidArgumentError, match="no answer labelled right"):
        read_tasks(write_tasks([Task("q", ["a", "b"], [0, 0])]))
    with pytest.raises(InvalidArgumentError, match="at most 100"):
        read_tasks(write_tasks([Task("q", ["a"] * 101, [1] + [0] * 100)]))


def test_smollm2_picks_and_the_command_line(smollm2_path, tmp_path):
    from pyllm import Model
    data = write_tasks(TASKS)
    with Model(smollm2_path, n_ctx=256) as m:
        result = m.multiple_choice(data)
        for task, pick in zip(TASKS, result.picks):
            seqs = [m.tokenize(task.question + " " + a) for a in task.answers]
            shared = 0
            while all(len(s) > shared for s in seqs) and len({s[shared] for s in seqs}) == 1:
                shared += 1
            scores = []
            for s in seqs:
                rows = m.logits(s).astype(np.float64)
                lp = rows - rows.max(1, keepdims=True)
                lp -= np.log(np.exp(lp).sum(1, keepdims=True))
                scores.append(np.mean([lp[p - 1, s[p]] for p in range(shared, len(s))]))
            assert pick == int(np.argmax(scores))
    right = sum(t.labels[p] == 1 for t, p in zip(TASKS, result.picks))
    assert result.right == right and result.chance == pytest.approx(4 / 13)
    (tmp_path / "mc.bin").write_bytes(data)
    r = pyllm("perplexity", "-m", smollm2_path, "--multiple-choice", "-f", str(tmp_path / "mc.bin"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "task\tacc_norm" and lines[4] == f"4\t{100 * right / 4:.8f}"
    sigma = 100 * math.sqrt(right / 4 * (1 - right / 4) / 3)
    assert lines[-2] == f"Final result: {100 * right / 4:.4f} +/- {sigma:.4f}"
    assert lines[-1].startswith("Random chance: 30.7692 +/- ")
    out = json.loads(pyllm("perplexity", "-m", smollm2_path, "--multiple-choice", "-f", str(tmp_path / "mc.bin"),
                           "--json", "--multiple-choice-tasks", "2").stdout)
    assert out["tasks"] == 2
    (tmp_path / "bad.bin").write_bytes(data[:10])
    one_error_line(pyllm("perplexity", "-m", smollm2_path, "--multiple-choice", "-f", str(tmp_path / "bad.bin")),
                   "not a llama.cpp multiple-choice file")
    one_error_line(pyllm("perplexity", "-m", smollm2_path, "--multiple-choice"), "-f FILE")
