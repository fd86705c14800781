"""The SDK scripts' test runner: every test_ function of a script runs, each even when an
earlier one failed; the last line is "LABEL: N passed, N failed" and the exit status is 1
when anything failed."""

import sys
import traceback


def run_tests(namespace, label):
    tests = [(name, fn) for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    passed = failed = 0
    for name, fn in tests:
        try:
            fn()
            passed += 1
            print(f"ok   {name}")
        except Exception:  # report every failure, run every test
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
    print(f"{label}: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
