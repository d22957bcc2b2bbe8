"""Open and run each GGUF file named on the command line, one line per file:

    try PATH             before the file (so a crash names it)
    ok | error TYPE MSG  it ran, or raised one of pyllm's errors
    BUG TYPE MSG         any other exception, with its traceback on stderr

test_model_file.py runs this in a child process over mutated files: a crash
or a hang shows there as the child's exit status, naming the last file tried.
"""
import sys
import traceback

from pyllm import Model
from pyllm.errors import PyllmError


def main(paths: list[str]) -> None:
    for path in paths:
        print("try", path, flush=True)
        try:
            with Model(path, n_ctx=64) as m:
                m.logits([1, 2, 3])
                m.generate("to", max_tokens=3, temperature=0)
            print("ok", flush=True)
        except PyllmError as e:
            print("error", type(e).__name__, str(e).splitlines()[0][:200], flush=True)
        except Exception as e:  # noqa: BLE001 - reporting is the point
            print("BUG", type(e).__name__, repr(e)[:300], path, flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main(sys.argv[1:])
