"""runtime.native_stderr_filtered: Ray's one known false-alarm line written by native code straight
to file descriptor 2 is dropped; everything else (Python and native, before and after) passes."""

import subprocess
import sys
import textwrap


def test_the_known_line_is_dropped_and_everything_else_passes_in_order():
    code = textwrap.dedent("""
        import os, sys
        from pipelines.engine.stream import runtime
        os.write(2, b"before\\n")
        with runtime.native_stderr_filtered():
            os.write(2, b"[E core_worker.cc:2465] Actor X has constructor arguments in the object store and max_restarts > 0. See\\n")
            os.write(2, b"a real error line\\npartial ")
            os.write(2, b"line joined\\n")
            print("python stderr", file=sys.stderr)
            os.write(2, b"no newline at the end")
        os.write(2, b"\\nafter\\n")
        print("stdout untouched")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "stdout untouched\n"
    assert "constructor arguments" not in res.stderr
    assert res.stderr.splitlines() == ["before", "a real error line", "partial line joined", "python stderr",
                                       "no newline at the end", "after"]


def test_a_traceback_inside_the_block_is_printed_whole():
    code = textwrap.dedent("""
        from pipelines.engine.stream import runtime
        with runtime.native_stderr_filtered():
            raise RuntimeError("boom inside")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "RuntimeError: boom inside" in res.stderr and "Traceback" in res.stderr
