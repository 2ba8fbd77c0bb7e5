"""Runs a script on N local ranks as torchrun --standalone does (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set for each; when one rank fails the others
are ended and the launch fails with its code), but each rank is forked from this process
after PyTorch, its pipelining and repipe.torch were imported once here:

    python fork_ranks.py --nproc-per-node 16 [--preload MODULE] [--warm MODULE:FUNCTION]
                         [--prepare MODULE:FUNCTION] SCRIPT ARGS...

Importing them costs each process about 3 CPU-seconds; a test suite that launches 50 ranks
on a 2-core machine spent a third of its time there. --preload imports more modules first;
--warm calls a function that runs what loads more on first use (torch.export's machinery,
transformers' lazy modules), so that each rank starts with it loaded; --prepare calls a
function with the script's arguments (torch_pipeline_run.prepare: the cases' models made and
exported once, not once a rank). Forking is safe at that point because
the imports start no thread (checked below: the launch refuses to fork a process that has
more than one). The tests keep launches under torchrun itself where torchrun's own part is
what they check (a stuck peer ended by it, the teardown at exit)."""
import os
import runpy
import signal
import socket
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads():
    return len(os.listdir("/proc/self/task"))


def main():
    argv = sys.argv[1:]
    n, preload, warm, prepare = 1, [], [], []
    while argv and argv[0].startswith("--"):
        opt, argv = argv[0], argv[1:]
        if opt == "--nproc-per-node":
            n, argv = int(argv[0]), argv[1:]
        elif opt == "--preload":
            preload, argv = preload + [argv[0]], argv[1:]
        elif opt == "--warm":
            warm, argv = warm + [argv[0]], argv[1:]
        elif opt == "--prepare":
            prepare, argv = prepare + [argv[0]], argv[1:]
        else:
            raise SystemExit("fork_ranks.py: unknown option " + opt)
    if not argv:
        raise SystemExit("usage: fork_ranks.py [--nproc-per-node N] [--preload MODULE] "
                         "[--warm MODULE:FUNCTION] [--prepare MODULE:FUNCTION] SCRIPT ...")
    script, args = argv[0], argv[1:]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import torch  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import repipe.torch  # noqa: F401
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    for m in preload:
        __import__(m)
    for w in warm:
        module, _, function = w.partition(":")
        getattr(__import__(module), function)()
    for p in prepare:
        module, _, function = p.partition(":")
        getattr(__import__(module), function)(args)
    if threads() != 1:
        raise SystemExit("fork_ranks.py: %d threads after the imports; forking would copy "
                         "their locks mid-use" % threads())
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0"}
    pids = {}
    for r in range(n):
        pid = os.fork()
        if pid == 0:  # the rank: the script as its __main__, then the interpreter's exit
            os.environ.update(env, RANK=str(r), LOCAL_RANK=str(r))
            sys.argv = [script] + args
            runpy.run_path(script, run_name="__main__")
            sys.exit(0)
        pids[pid] = r
    code = 0
    while pids:
        pid, status = os.wait()
        rank = pids.pop(pid)
        rc = os.waitstatus_to_exitcode(status)
        if rc and not code:
            code = rc if rc > 0 else 128 - rc
            print("fork_ranks.py: rank %d failed (%d); ending the others" % (rank, rc),
                  file=sys.stderr)
            for p in pids:
                os.kill(p, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while pids and time.monotonic() < deadline:
                done, status = os.waitpid(-1, os.WNOHANG)
                if done:
                    pids.pop(done, None)
                else:
                    time.sleep(0.05)
            for p in pids:
                os.kill(p, signal.SIGKILL)
    sys.exit(code)


if __name__ == "__main__":
    main()
