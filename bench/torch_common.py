"""What the PyTorch benches share: the build they are given, for them and their ranks."""
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def use_build(build, who):
    """The repipe command of `build`; the package of this checkout and the library of that
    build put in the environment, for this process and the ranks it starts. Exits, saying
    what to build, where either is missing."""
    cli = os.path.join(build, "repipe")
    lib = os.path.join(build, "librepipe.so")
    if not (os.path.exists(cli) and os.path.exists(lib)):
        sys.exit("%s: %s or %s is missing: build first (make build)" % (who, cli, lib))
    os.environ["PYTHONPATH"] = os.path.join(ROOT, "python")
    os.environ["REPIPE_LIBRARY"] = lib
    sys.path.insert(0, os.path.join(ROOT, "python"))
    return cli
