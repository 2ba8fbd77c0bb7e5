"""What the scripted tests share: a check that says ok or FAIL with what it
held, and the exit status of the lot."""

import sys

failures = 0


def check(cond, what):
    global failures
    print("ok" if cond else "FAIL", what)
    failures += 0 if cond else 1


def finish():
    print("%d failed" % failures if failures else "all passed")
    sys.exit(1 if failures else 0)
