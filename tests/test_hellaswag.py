"""HellaSwag as llama-perplexity --hellaswag scores it (pyllm/hellaswag.py): the file
format, each ending's mean log-probability after the shared prefix worked out by hand on
stand-in logits and on SmolLM2's own logits, the Wilson interval against its textbook
form, and the command line's lines."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from test_cli import one_error_line, pyllm
from test_perplexity import StandIn
from pyllm.errors import InvalidArgumentError
from pyllm.hellaswag import ending_scores, read_tasks, wilson

TASKS = Path(__file__).resolve().parent / "data" / "hellaswag-3-tasks.txt"


def test_the_file_format():
    tasks = read_tasks(TASKS.read_text())
    assert len(tasks) == 3 and [t.gold for t in tasks] == [0, 1, 2]
    assert tasks[1].context.startswith("Riding a bike:") and len(tasks[1].endings) == 4
    for bad, message in (("a\n0\nb\nc\nd\n", "six lines per task"), ("a\n7\nb\nc\nd\ne\n", "0..3, not '7'"),
                         ("", "six lines per task")):
        with pytest.raises(InvalidArgumentError, match=message):
            read_tasks(bad)


def by_hand(stand_in: StandIn, tokens: list[int], shared: int) -> float:
    """Mean of log p(token | the ones before) over tokens[shared:]."""
    total = 0.0
    for p in range(shared, len(tokens)):
        x = stand_in.row(tokens[p - 1], p - 1).astype(np.float64)
        total += x[tokens[p]] - x.max() - math.log(sum(math.exp(v - x.max()) for v in x))
    return total / (len(tokens) - shared)


def test_ending_scores_by_hand():
    endings = [[6, 1, 2, 3, 4], [6, 1, 2, 5], [6, 1, 0, 0, 1, 2], [6, 1, 2]]   # they share [6, 1]
    got = ending_scores(StandIn(), endings)
    want = [by_hand(StandIn(), e, 2) for e in endings]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert ending_scores(StandIn(), [[6, 1], [6, 1, 2]])[0] == -math.inf   # nothing after the shared part
    with pytest.raises(InvalidArgumentError, match="share no first token"):
        ending_scores(StandIn(), [[1, 2], [2, 1]])


@pytest.mark.parametrize("right,n", [(0, 1), (2, 3), (40, 100), (399, 400)])
def test_wilson_interval(right, n):
    p, z = right / n, 1.95996398454
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = wilson(right, n)
    assert lo == pytest.approx(center - half, abs=1e-12) and hi == pytest.approx(center + half, abs=1e-12)


def test_smollm2_picks_and_the_command_line(smollm2_path, tmp_path):
    from pyllm import Model
    text = TASKS.read_text()
    with Model(smollm2_path, n_ctx=256) as m:
        result = m.hellaswag(text)
        for task, pick in zip(read_tasks(text), result.picks):
            seqs = [m.tokenize(task.context + " " + e) for e in task.endings]
            shared = 0
            while all(len(s) > shared for s in seqs) and len({s[shared] for s in seqs}) == 1:
                shared += 1
            scores = []
            for s in seqs:   # from the full logits of each whole sequence
                rows = m.logits(s).astype(np.float64)
                lp = rows - rows.max(1, keepdims=True)
                lp -= np.log(np.exp(lp).sum(1, keepdims=True))
                scores.append(np.mean([lp[p - 1, s[p]] for p in range(shared, len(s))]))
            assert pick == int(np.argmax(scores)), (scores, pick)
    assert result.tasks == 3 and result.right == sum(p == t.gold for p, t in zip(result.picks, read_tasks(text)))
    r = pyllm("perplexity", "-m", smollm2_path, "--hellaswag", "-f", str(TASKS))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "task\tacc_norm\t95% confidence interval" and [ln.split("\t")[0] for ln in lines[1:]] == \
        ["1", "2", "3"]
    assert lines[3].split("\t")[1] == f"{100 * result.acc_norm:3.8f}%"
    out = json.loads(pyllm("perplexity", "-m", smollm2_path, "--hellaswag", "-f", str(TASKS), "--json",
                           "--hellaswag-tasks", "2").stdout)
    assert out["tasks"] == 2 and out["picks"] == result.picks[:2]
    (tmp_path / "five.txt").write_text("a\n0\nb\nc\nd\n")
    one_error_line(pyllm("perplexity", "-m", smollm2_path, "--hellaswag", "-f", str(tmp_path / "five.txt")),
                   "six lines per task")
