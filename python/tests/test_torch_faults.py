"""rt.Pipeline when a rank goes wrong (torch_faults_run.py under torchrun, 3 gloo ranks of an
MLP cut in three stages, 1f1b): a peer alive but silent ends every other rank within the process
group's timeout, each saying its rank and step; ranks that pass different batches, or fall a
step behind, are refused at that step with the ranks named, not trained on nor left waiting; a
stage that holds no parameters (a lone ReLU) trains as one process does; and state_dict() before
the first step says why it cannot answer yet.

Needs PyTorch 2 (make test runs it in the project's environment, scripts/python-env)."""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

try:
    import torch  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    HAVE = True
except ImportError:
    HAVE = False


def run(cases, tmp, timeout=120):
    """The cases on 3 ranks, one after another in one launch: a stuck peer at the batches'
    check under torchrun itself (which ends the sleeper), the others forked from one process
    that imported PyTorch once (fork_ranks.py, which ends the others as torchrun does when one
    rank fails). Returns the launch, its seconds, and what each rank met in each case."""
    if cases[0] == "stuck":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    else:
        cmd = [sys.executable, os.path.join(HERE, "fork_ranks.py"), "--warm", "torch_models:warm"]
    cmd += ["--nproc-per-node", "3", os.path.join(HERE, "torch_faults_run.py"), ",".join(cases),
            tmp]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    met = {c: {} for c in cases}
    for c in cases:
        for f in glob.glob(os.path.join(tmp, c + ".*.json")):
            with open(f) as h:
                r = json.load(h)
            met[c][r["rank"]] = r
    return p, took, met


@unittest.skipUnless(HAVE, "needs PyTorch 2 with torch.distributed.pipelining")
class Faults(unittest.TestCase):
    # the cases that end with the ranks in step, in one launch (each on a Pipeline of its own)
    TOGETHER = ("early", "relu", "batches", "skipped")

    @classmethod
    def setUpClass(cls):
        cls.together = tempfile.TemporaryDirectory()
        # (past the group's 120 s: where a fault hangs a step, its watchdog ends the launch and
        # each case says what it met)
        cls.launch = run(cls.TOGETHER, cls.together.name, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.together.cleanup()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def case(self, name):
        """What each rank met in one of the cases launched together, all three ranks'."""
        p, took, met = self.launch
        self.assertEqual(sorted(met[name]), [0, 1, 2], p.stderr[-3000:])
        return met[name]

    def test_stuck_peer_ends_the_others(self):
        # the process group's timeout is 8 s: the others end at step 2 within it (and torchrun
        # then ends the sleeper), not after the sleeper's 600 s; where the batches are
        # checked, at the check, with an error a script can catch; inside the step's
        # exchanges (check_batches=False), by ending the process. The bound is the sleeper's
        # 600 s, far off: three ranks' imports of torch under a loaded make test took 68 s
        for case in ("stuck", "stuck-inside"):
            p, took, met = run([case], self.tmp.name)
            met = met[case]
            self.assertNotEqual(p.returncode, 0)
            self.assertLess(took, 180, p.stderr[-2000:])
            for r in (0, 2):
                said = "rt.Pipeline: rank %d (global %d): step 2 did not finish in 8 s" % (r, r)
                if case == "stuck":
                    self.assertIn(said, met[r]["error"])
                else:
                    self.assertIn(said, p.stderr)

    def test_different_batches_are_refused(self):
        met = self.case("batches")
        for r in range(3):
            self.assertEqual(met[r]["losses"], [])
            self.assertIn("step 0: ranks 1 passed a batch that differs from rank 0's",
                          met[r]["error"])

    def test_a_skipped_step_is_refused_not_waited_for(self):
        met = self.case("skipped")
        self.assertIn("the plan's update takes 8 samples", met[1]["caught"])
        for r in range(3):  # step 1: the others at batch 1, rank 1 at batch 2
            self.assertEqual(len(met[r]["losses"]), 1)
            self.assertIn("passed a batch that differs", met[r]["error"])

    def test_a_stage_without_parameters_trains(self):
        r = self.case("relu")[0]
        for a, b in zip(r["losses"], r["ref_losses"]):
            self.assertLessEqual(abs(a - b), 1e-5 * abs(b))
        self.assertLessEqual(r["weights_rel"], 1e-5)

    def test_exit_lets_go_of_the_process_groups(self):
        """At exit rt.Pipeline lets go of its stages and groups and collects them, before the
        interpreter's own last collection, where gloo's loop threads aborted one zb-h2 launch
        in six (tests/torch_teardown_loop.sh launches it 50 times)."""
        import datetime
        import gc
        import weakref
        import torch
        import torch.distributed as dist
        import repipe.torch as rt
        from repipe import torch_pipeline
        store = dist.FileStore(os.path.join(self.tmp.name, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        try:
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
            pipe = rt.Pipeline(m, {"micro_batch_size": 2, "gradient_accumulation_steps": 2},
                               loss_fn=torch.nn.functional.cross_entropy,
                               optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
            pipe.step(torch.randn(4, 4), torch.randint(0, 2, (4,)))
            held = weakref.ref(pipe.runner)
            torch_pipeline._release_all()  # (what atexit runs)
            gc.collect()
            self.assertIsNone(held())
            with self.assertRaisesRegex(Exception, "was closed"):
                pipe.step(torch.randn(4, 4), torch.randint(0, 2, (4,)))
        finally:
            dist.destroy_process_group()

    def test_state_dict_before_the_first_step(self):
        met = self.case("early")
        for r in range(3):
            self.assertIn("no stage is built yet", met[r]["error"])
            self.assertIn("call step() first", met[r]["error"])


if __name__ == "__main__":
    unittest.main()
