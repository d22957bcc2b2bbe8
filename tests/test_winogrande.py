"""Winogrande as llama-perplexity --winogrande scores it (pyllm/winogrande.py): the CSV as
llama.cpp parses it, the tasks drawn as llama.cpp draws them (numpy's own Mersenne Twister
as the witness), each choice's score worked out by hand on stand-in logits, and the
command line on SmolLM2."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from test_cli import one_error_line, pyllm
from test_perplexity import StandIn
from pyllm.errors import InvalidArgumentError
from pyllm.winogrande import Task, choice_scores, draw, mt19937, read_tasks, winogrande

CSV = Path(__file__).resolve().parent / "data" / "winogrande-4-tasks.csv"


def test_the_csv():
    tasks = read_tasks(CSV.read_text())
    assert len(tasks) == 4                                     # the header does not parse: skipped
    t = tasks[1]
    assert (t.first, t.second, t.choices, t.answer) == ("Sarah lent Maria money, because ", " was generous.",
                                                        ("Sarah", "Maria"), 1)
    assert tasks[0].choices == ("trophy", "suitcase") and tasks[0].answer == 2
    with pytest.raises(InvalidArgumentError, match="no Winogrande tasks"):
        read_tasks("a,b,c\nno blank here,x,y,1,2\n")


def test_draws_as_llama_cpp():
    bg = np.random.MT19937()
    bg._legacy_seeding(1)                                    # std::mt19937(1), seeded as C++ seeds it
    witness = bg.random_raw(3000)
    ours = mt19937(1)
    assert all(next(ours) == int(w) for w in witness)
    items = list(range(1267))
    left, want, k = list(range(len(items))), [], 0
    for _ in range(40):                                      # llama.cpp's loop, in float32
        j = int(np.float32(1 / 4294967296) * np.float32(witness[k]) * np.float32(len(left)))
        k += 1
        want.append(items[left[j]])
        left[j] = left[-1]
        left.pop()
    assert draw(items, 40) == want and len(set(want)) == 40


def score_by_hand(task: Task, tokenize) -> tuple[float, float]:
    seqs = [tokenize(task.first + c + task.second) for c in task.choices]
    shared = next(i for i, (a, b) in enumerate(zip(*seqs)) if a != b)
    skip = all(len(s) - shared > 3 for s in seqs)
    out = []
    for seq, choice in zip(seqs, task.choices):
        base = len(tokenize(task.first + choice)) if skip else shared
        last = 1 if len(seq) - base > 1 else 0
        total = 0.0
        for p in range(base, len(seq) - last):
            x = StandIn().row(seq[p - 1], p - 1).astype(np.float64)
            total += x[seq[p]] - x.max() - math.log(sum(math.exp(v - x.max()) for v in x))
        out.append(total / (len(seq) - base - last))
    return out[0], out[1]


def test_choice_scores_by_hand():
    def tokenize(text):
        return [ord(c) % 7 for c in text]                     # a character a token: prefixes stay prefixes
    for task in (Task("the big ", " sat on the long mat today", ("cat", "dog"), 1),    # choices skipped
                 Task("a ", "b", ("xy", "zw"), 2)):                                  # too little after them
        got = choice_scores(StandIn(), tokenize, task)
        np.testing.assert_allclose(got, score_by_hand(task, tokenize), rtol=1e-6)
    result = winogrande(StandIn(), tokenize, [Task("the big ", " sat on the long mat today", ("cat", "dog"), 1)])
    s1, s2 = score_by_hand(Task("the big ", " sat on the long mat today", ("cat", "dog"), 1), tokenize)
    assert result.answers == [1 if s1 > s2 else 2]


def test_smollm2_command_line(smollm2_path):
    r = pyllm("perplexity", "-m", smollm2_path, "--winogrande", "-f", str(CSV))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    rows = [ln.split() for ln in lines[:4]]
    assert [row[0] for row in rows] == ["1", "2", "3", "4"] and [row[5] for row in rows] == ["2", "1", "1", "1"]
    right = sum(row[4] == row[5] for row in rows)
    assert lines[-1] == f"Final Winogrande score(4 tasks): {100 * right / 4:.4f} +/- " \
                        f"{100 * math.sqrt(right / 4 * (1 - right / 4) / 3):.4f}"
    from pyllm import Model
    with Model(smollm2_path, n_ctx=256) as m:
        direct = m.winogrande(CSV.read_text())
    assert [int(row[4]) for row in rows] == direct.answers
    out = json.loads(pyllm("perplexity", "-m", smollm2_path, "--winogrande", "-f", str(CSV), "--json",
                           "--winogrande-tasks", "2").stdout)
    assert out["tasks"] == 2
    one_error_line(pyllm("perplexity", "-m", smollm2_path, "--winogrande", "--hellaswag", "-f", str(CSV)),
                   "one of --hellaswag")
