"""`pyllm chat` driven in a real terminal (a pty), as a person uses it.

A long first turn (a pasted text in a \"\"\" block), a follow-up whose
time to first token must stay close to a fresh short prompt's (the history
comes from the KV cache), /reset, Ctrl-C in the middle of a long reply, a
turn after that, /stats, /exit.
"""
from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.model

STATS = re.compile(r"prompt (\d+) tok \(reused (\d+), computed (\d+)\) · TTFT ([\d.]+) s · (\d+) tok at "
                   r"([\d.]+) tok/s · (\w+)")

PASSAGE = (
    "The history of the bicycle begins in 1817, when Karl Drais built a two-wheeled running machine in "
    "Mannheim. Riders pushed it along with their feet. In the 1860s French makers added pedals to the front "
    "wheel, and the velocipede became a fashion in Paris. The high-wheeler followed: a huge front wheel gave "
    "speed, but falls were dangerous. In 1885 John Kemp Starley built the Rover safety bicycle, with two "
    "wheels of the same size and a chain driving the rear wheel. Pneumatic tyres, made practical by John "
    "Boyd Dunlop in 1888, made riding comfortable, and a bicycle boom swept Europe and America in the 1890s. "
    "Bicycles gave workers cheap transport and gave women a new freedom of movement. In the twentieth century "
    "derailleur gears, lighter steel and later aluminium and carbon frames changed racing, while in cities "
    "such as Amsterdam and Copenhagen the bicycle stayed the everyday way to get around.")


class Terminal:
    def __init__(self, args: list[str], command: str = "chat", history: str = ""):
        self.master, slave = os.openpty()
        env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "TERM": "xterm", "COLUMNS": "200",
               "LINES": "50", "PYLLM_HISTORY": history}   # none kept unless a test asks

        def child_setup():
            os.setsid()
            import fcntl
            import termios
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)     # the pty is the controlling terminal: ^C is SIGINT

        self.proc = subprocess.Popen([sys.executable, "-m", "cli.main", command, *args], cwd=REPO, env=env,
                                     stdin=slave, stdout=slave, stderr=slave, preexec_fn=child_setup,
                                     close_fds=True)
        os.close(slave)
        self.buf = ""

    def read_until(self, pattern: str | re.Pattern, timeout: float = 60.0) -> re.Match:
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.buf)
            if m:
                self.buf = self.buf[m.end():]
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {rx.pattern!r}; screen so far:\n{self.buf[-2000:]}")
            r, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if r:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    data = b""
                if not data and self.proc.poll() is not None:
                    raise AssertionError(f"pyllm chat exited ({self.proc.returncode}) while waiting for "
                                         f"{rx.pattern!r}:\n{self.buf[-2000:]}")
                self.buf += data.decode("utf-8", "replace").replace("\r\n", "\n")

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


FIELDS = ("prompt", "reused", "computed", "ttft", "generated", "tps", "finish")


def reply_stats(t: Terminal, timeout: float = 90.0) -> tuple[str, dict]:
    """Waits for the end of a reply: (the text before its stats line, the stats)."""
    m = t.read_until(STATS, timeout)
    stats = {k: (v if k == "finish" else float(v)) for k, v in zip(FIELDS, m.groups())}
    t.read_until(r">>> ", 30)
    return m.string[:m.start()], stats


@pytest.mark.slow
def test_chat_in_a_terminal(smollm2_path, capsys):
    t = Terminal(["-m", smollm2_path, "--temp", "0", "-n", "48", "--verbose", "-c", "2048"])
    try:
        t.read_until(r"pyllm chat · .*/help for help", 60)
        t.read_until(r">>> ", 30)

        # turn 1: a long pasted text, as a """ block
        t.send('"""\r')
        for line in (PASSAGE[:400], PASSAGE[400:800], PASSAGE[800:] + " Summarize this text in one sentence.",
                     '"""'):
            t.read_until(r"\.\.\. ", 10)
            t.send(line + "\r")
        reply1, s1 = reply_stats(t, 120)
        assert len(reply1.strip()) > 20, reply1
        assert s1["prompt"] > 200 and s1["reused"] == 0

        # turn 2: a short follow-up; the whole history comes from the cache
        question = "Who built the Rover safety bicycle?"
        t.send(question + "\r")
        reply2, s2 = reply_stats(t)
        assert reply2.strip()
        assert s2["reused"] >= s1["prompt"] + s1["generated"] - 1
        assert s2["computed"] <= 30

        # a fresh short prompt for comparison
        t.send("/reset\r")
        t.read_until("conversation cleared", 10)
        t.read_until(r">>> ", 10)
        t.send(question + "\r")
        _, s3 = reply_stats(t)
        ttft1, ttft2, ttft3 = s1["ttft"], s2["ttft"], s3["ttft"]
        # turn 2 computed no more than the fresh prompt holds (which itself reuses the cached
        # template tokens before the question), so its TTFT is about the same, far below
        # turn 1's (which computed the whole passage)
        assert s2["computed"] <= s3["prompt"] and s3["reused"] > 0
        assert ttft2 < 2.0 * ttft3 + 0.15, (ttft2, ttft3)
        assert ttft2 < ttft1

        # Ctrl-C in the middle of a long reply: back at the prompt, nothing lost
        t.send("Write a very long essay about the history of Rome.\r")
        t.read_until(r"history of Rome\.\n", 10)    # the terminal's echo of the message
        t.read_until(r"\w+ \w+ \w+", 60)          # the reply is streaming
        t.send("\x03")
        t.read_until(r"\[stopped\]", 15)
        t.read_until(r">>> ", 15)
        assert t.proc.poll() is None

        # the conversation goes on from the cache after the interruption
        t.send("Thanks!\r")
        _, s5 = reply_stats(t)
        assert s5["reused"] > s3["prompt"] and s5["computed"] <= 30

        t.send("/stats\r")
        t.read_until(r"turns 5 · context \d+/2048 tokens", 10)
        t.read_until(r">>> ", 10)
        t.send("/think on\r")   # SmolLM2's template has no thinking switch: said so
        t.read_until(r"/think on does nothing: this model's chat template has no enable_thinking switch", 10)
        t.read_until(r">>> ", 10)
        t.send("/exit\r")
        assert t.proc.wait(timeout=15) == 0
    finally:
        t.close()
    with capsys.disabled():
        print(f"\n[pty chat] turn 1: prompt {s1['prompt']:.0f} tok, TTFT {ttft1:.3f} s | turn 2: prompt "
              f"{s2['prompt']:.0f} tok, reused {s2['reused']:.0f}, computed {s2['computed']:.0f}, TTFT {ttft2:.3f} s"
              f" | fresh short prompt: {s3['prompt']:.0f} tok, computed {s3['computed']:.0f}, TTFT {ttft3:.3f} s"
              f" | after ^C: reused {s5['reused']:.0f} of {s5['prompt']:.0f}")


def test_run_with_a_model_and_no_prompt_at_a_terminal_chats(smollm2_path):
    """`pyllm run NAME` at a terminal (ollama's way) opens the chat, with run's options given."""
    t = Terminal([smollm2_path, "--temp", "0", "-n", "6"], command="run")
    try:
        t.read_until(r"pyllm chat · .*/help for help", 60)
        t.read_until(r">>> ", 30)
        t.send("Hello\r")
        t.read_until(r"reply cut at 6 tokens", 60)     # -n reached the chat
        t.read_until(r">>> ", 30)
        t.send("\x04")                                 # Ctrl-D leaves
        assert t.proc.wait(timeout=30) == 0
    finally:
        t.close()


def test_the_lines_typed_come_back_in_the_next_session(smollm2_path, tmp_path):
    """The chat keeps the lines typed ($PYLLM_HISTORY here): the up arrow in a new session brings
    back the last one."""
    history = tmp_path / "history"
    t = Terminal(["-m", smollm2_path, "--temp", "0", "-n", "2"], history=str(history))
    try:
        t.read_until(r">>> ", 60)
        t.send("Name a fruit.\r")
        t.read_until(r">>> ", 60)
        t.send("\x04")
        assert t.proc.wait(timeout=30) == 0
    finally:
        t.close()
    assert history.read_text().splitlines()[-1] == "Name a fruit."
    t = Terminal(["-m", smollm2_path, "--temp", "0", "-n", "2"], history=str(history))
    try:
        t.read_until(r">>> ", 60)
        t.buf = ""
        t.send("\x1b[A")                               # the up arrow: the last session's line
        t.read_until(r"Name a fruit\.", 30)
        t.send("\x03")                                 # Ctrl-C clears the line
        t.read_until(r">>> ", 30)
        t.send("\x04")
        assert t.proc.wait(timeout=30) == 0
    finally:
        t.close()


def blocked_signals(pid: int | str, thread: int | str) -> int:
    """The signal mask of one thread of a process (Linux's /proc), as a bit set (bit s - 1: signal s)."""
    for line in Path(f"/proc/{pid}/task/{thread}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads threads' signal masks from Linux's /proc")
def test_ctrl_c_can_only_reach_the_main_thread(smollm2_path):
    """At the prompt every other thread (the core's workers, OpenBLAS's) blocks SIGINT and SIGTERM:
    the kernel gives a process's signal to any thread that takes it, and one taken by a worker
    leaves input() waiting for the next key before the ^C shows."""
    import signal
    t = Terminal(["-m", smollm2_path, "-t", "3"])
    try:
        t.read_until(r">>> ", 60)
        pid = t.proc.pid
        threads = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
        assert len(threads) >= 3                       # the main thread and at least the core's two workers
        assert not blocked_signals(pid, pid) & (1 << (signal.SIGINT - 1))
        for tid in threads:
            if int(tid) != pid:
                mask = blocked_signals(pid, tid)
                assert mask & (1 << (signal.SIGINT - 1)) and mask & (1 << (signal.SIGTERM - 1)), (tid, hex(mask))
        t.send("\x03")
        t.read_until(r"\^C", 30)
        t.read_until(r">>> ", 30)
        t.send("\x04")
        assert t.proc.wait(timeout=30) == 0
    finally:
        t.close()
