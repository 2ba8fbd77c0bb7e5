"""rt.Pipeline on torch.distributed (gloo): every plan's updates equal the same module trained
in one process on the same micro-batches.

Each launch runs torch_pipeline_run.py on all its ranks, case after case, each rank forked
with the environment torchrun gives one (fork_ranks.py; test_torch_faults.py launches under
torchrun itself); rank 0 trains the reference (the update's micro-batches in turn, gradients
accumulated, one SGD step) and writes both runs' losses and the largest relative difference of
any parameter.
float32 cases are held to 1e-5, float64 ones to 1e-9 (relative, losses and weights).

The ResNet's cases with a replicated stage run in float64: its batchnorm over micro-batches
of 2 makes float32 rounding chaotic (with the gradients summed in another order, [2, 1] at
float32 drifts to 0.3 relative in a batchnorm bias after 10 updates, where float64 stays at
1e-14), so float32 there would test rounding, not the pipeline.

Needs PyTorch 2 (make test runs it in the project's environment, scripts/python-env)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import torch
    import torch.distributed.pipelining  # noqa: F401
    HAVE = True
except ImportError:
    HAVE = False

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.environ.get("REPIPE_CLI") or os.path.join(HERE, "..", "..", "build", "repipe")
NEEDS = "needs PyTorch 2 with torch.distributed.pipelining (make test's environment)"

GPT_11 = {"micro_batch_size": 2, "gradient_accumulation_steps": 4, "layers_per_stage": [4, 5]}


def plan(**keys):
    return dict(GPT_11, **keys)


def launch(world, cases, tmp, warm="warm"):
    """The cases on `world` ranks, forked from one process that imported PyTorch once, ran
    torch_models' `warm` and made and exported the cases' models (fork_ranks.py: the
    environment torchrun gives a rank, without the 3 CPU-seconds of imports and first uses a
    rank, nor an export of each model on each)."""
    out = os.path.join(tmp, "result-%d.json" % world)
    cmd = [sys.executable, os.path.join(HERE, "fork_ranks.py"), "--warm", "torch_models:" + warm,
           "--prepare", "torch_pipeline_run:prepare", "--nproc-per-node", str(world), os.path.join(HERE, "torch_pipeline_run.py"),
           "--out", out]
    for c in cases:
        cmd += ["--case", json.dumps(c)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode:
        raise AssertionError("the launch failed (%d):\n%s" % (p.returncode, p.stderr[-6000:]))
    with open(out) as f:
        return json.load(f)


@unittest.skipUnless(HAVE, NEEDS)
class PipelineEqualsOneProcess(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.profile_and_plan()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def profile_and_plan(cls):
        """The GPT profiled by repipe.torch.profile and planned by repipe plan, as a user
        does: plans for 2 and 4 machines, written by --config-out."""
        import repipe.torch as rt
        import torch_models
        torch.manual_seed(1)
        x, _ = torch_models.gpt_batch(4)
        cls.profile = os.path.join(cls.tmp.name, "gpt.txt")
        rt.profile(torch_models.GPT(), x, out=cls.profile, repeat=2)
        cls.plans = {}
        for m in (2, 4):
            path = os.path.join(cls.tmp.name, "plan%d.json" % m)
            subprocess.run([CLI, "plan", "--profile", cls.profile, "--machines", str(m),
                            "--bandwidth", "1e8", "--global-batch", "32", "--config-out", path],
                           check=True, capture_output=True)
            cls.plans[m] = path

    def check(self, results, name, tol):
        r = results[name]
        self.assertEqual(len(r["losses"]), len(r["ref_losses"]))
        for a, b in zip(r["losses"], r["ref_losses"]):
            self.assertLessEqual(abs(a - b), tol * abs(b), (name, r["losses"], r["ref_losses"]))
        self.assertLessEqual(r["weights_rel"], tol, (name, r["worst"], r["weights_rel"]))
        return r

    def test_two_ranks(self):
        """[1, 1] 1f1b, interleaved 1f1b with 2 chunks a rank, zb-h1, zb-v and DualPipeV
        through PyTorch's CSV runtime, the plan repipe plan chose for 2 machines; both GPTs and the ResNet."""
        mha = {"model": "gpt-mha", "dtype": "float64"}
        cases = [
            {"name": "gpt 1f1b", "model": "gpt", "plan": plan()},
            {"name": "gpt interleaved", "model": "gpt",
             "plan": plan(layers_per_stage=[2, 2, 2, 3], schedule="interleaved-1f1b",
                          virtual_stages=2)},
            {"name": "gpt zb-h1 csv", "model": "gpt", "plan": plan(schedule="zb-h1")},
            {"name": "gpt zb-v csv", "model": "gpt",
             "plan": plan(layers_per_stage=[2, 2, 2, 3], schedule="zb-v")},
            {"name": "gpt dualpipev csv", "model": "gpt",
             "plan": plan(layers_per_stage=[2, 2, 2, 3], schedule="dualpipev")},
            {"name": "gpt repipe's runner", "model": "gpt", "plan": plan(), "runner": "repipe"},
            {"name": "gpt as planned", "model": "gpt", "plan": "file:" + self.plans[2]},
            dict(mha, name="mha 1f1b", plan=plan()),
            dict(mha, name="mha interleaved", plan=plan(layers_per_stage=[2, 2, 2, 3],
                                                        schedule="interleaved-1f1b",
                                                        virtual_stages=2)),
            dict(mha, name="mha zb-h1 csv", plan=plan(schedule="zb-h1")),
            {"name": "resnet 1f1b", "model": "resnet18", "lr": 0.01,
             "plan": plan(layers_per_stage=[6, -1])},
        ]
        res = launch(2, cases, self.tmp.name)
        for c in cases:
            r = self.check(res, c["name"], 1e-9 if c.get("dtype") == "float64" else 1e-5)
            self.assertEqual(r["uniform"], c.get("runner") != "repipe")
        self.assertEqual(res["gpt interleaved"]["stages"], 4)

    def test_replicated_stages(self):
        """[2, 1] and [3, 1] on repipe's runner, 2 x [1, 1] on PyTorch's classes with the
        pipelines' gradients averaged, the plan repipe plan chose for 4 machines."""
        f64 = {"dtype": "float64"}
        r21 = plan(stage_replication=[2, 1])
        r31 = plan(stage_replication=[3, 1], gradient_accumulation_steps=6)
        cases3 = [
            {"name": "gpt [2,1]", "model": "gpt", "plan": r21},
            dict(f64, name="mha [2,1]", model="gpt-mha", plan=r21),
            dict(f64, name="resnet [2,1]", model="resnet18", lr=0.01, updates=4,
                 plan=dict(r21, layers_per_stage=[6, -1])),
            {"name": "skip [2,1]", "model": "skip", "plan": dict(r21, layers_per_stage=[2, 2])},
        ]
        res = launch(3, cases3, self.tmp.name)
        cases4 = [
            {"name": "gpt 2x2", "model": "gpt", "plan": plan(replication_factor=2)},
            {"name": "gpt [3,1]", "model": "gpt", "plan": r31},
            dict(f64, name="mha [3,1]", model="gpt-mha", plan=r31),
            dict(f64, name="resnet [3,1]", model="resnet18", lr=0.01, updates=4,
                 plan=dict(r31, layers_per_stage=[8, -1])),
            {"name": "gpt as planned", "model": "gpt", "plan": "file:" + self.plans[4]},
        ]
        res.update(launch(4, cases4, self.tmp.name))
        for c in cases3 + cases4:
            self.check(res, c["name"], 1e-9 if c.get("dtype") == "float64" else 1e-5)
        self.assertFalse(res["gpt [3,1]"]["uniform"])
        self.assertEqual(res["gpt [3,1]"]["stage_replication"], [3, 1])
        self.assertTrue(res["gpt 2x2"]["uniform"])
        self.assertEqual(res["gpt 2x2"]["replication_factor"], 2)

    def test_planted_faults_are_caught(self):
        """The same [2, 1] layout of a model whose cut crosses two tensors (a residual
        branch), with a fault planted in each run: each moves the weights past the bound.
        Beside them, a pipeline in a group of 2 of the 3 ranks (group=)."""
        base = {"model": "skip", "updates": 4,
                "plan": plan(layers_per_stage=[2, 2], stage_replication=[2, 1])}
        cases = [dict(base, name="clean")] + [
            dict(base, name=m, mutate=m) for m in ("wrong-replica", "no-average",
                                                   "drop-crossing")]
        # and a pipeline in a group smaller than the world (2 of the 3 ranks), on each runner
        cases += [{"name": "in a group", "model": "gpt", "ranks": 2, "updates": 3, "plan": plan()},
                  {"name": "in a group, repipe's runner", "model": "gpt", "ranks": 2,
                   "updates": 3, "runner": "repipe", "plan": plan()}]
        res = launch(3, cases, self.tmp.name)
        self.check(res, "clean", 1e-5)
        self.check(res, "in a group", 1e-5)
        self.check(res, "in a group, repipe's runner", 1e-5)
        for m in ("wrong-replica", "no-average", "drop-crossing"):
            self.assertGreater(res[m]["weights_rel"], 1e-3, m)

    def test_the_seed_layout(self):
        """VGG-16's plan for 2 servers x 8 devices from PipeDream's profile, as repipe plan
        prints it (stage replication [7, 1], twice), on a VGG-16 narrowed 16-fold: 16 ranks,
        3 updates, equal to one process."""
        fixture = os.path.join(HERE, "..", "..", "tests", "fixtures", "pipedream", "profiles",
                               "vgg16", "graph.txt")
        path = os.path.join(self.tmp.name, "vgg.json")
        subprocess.run([CLI, "plan", "--profile", fixture, "--machines", "8", "2",
                        "--bandwidth", "4294967296", "2147483648", "--activation-compression",
                        "1", "--objective", "pipedream", "--profile-batch", "1",
                        "--config-out", path], check=True, capture_output=True)
        with open(path) as f:
            cfg = json.load(f)
        self.assertEqual((cfg["replication_factor"], cfg["stage_replication"]), (2, [7, 1]))
        # PipeDream's VGG-16 has Size and View where torchvision's layout (torch_models.VGG16)
        # has an average pool and a flatten; the cut, after the fourth max-pool, is the same
        self.assertEqual(cfg["layers_per_stage"][0], 24)
        cfg.update(layers_per_stage=[24, -1], micro_batch_size=1, gradient_accumulation_steps=7)
        res = launch(16, [{"name": "vgg", "model": "vgg16", "updates": 3, "lr": 0.01,
                           "plan": cfg}], self.tmp.name)
        r = self.check(res, "vgg", 1e-5)
        self.assertEqual((r["replication_factor"], r["stage_replication"]), (2, [7, 1]))


@unittest.skipUnless(HAVE, NEEDS)
class HuggingFaceModels(unittest.TestCase):
    """transformers' GPT-2, LLaMA and Mistral (grouped-query attention), Qwen2 and BERT, built
    from their config classes and left as they are: profiled to one node a block, planned by
    repipe plan for 4 workers (4 stages), and trained for 5 updates on that plan by both
    runners and on a plan with a replicated stage, equal to one process within 1e-5 in float32
    (SGD with momentum) and 1e-9 in float64 (AdamW).

    float32 runs use SGD: AdamW divides each update by the root of its second moment, so in a
    weight whose exact gradient is zero (attention's key bias: the softmax does not see it)
    it turns summation-order noise into steps of the learning rate's size (BERT's key bias:
    4e-4 apart after 5 updates in float32; 1e-14 in float64). The weights' bound is per
    tensor, against its largest value or 1e-4 of the model's largest where the tensor's is
    smaller (the same key bias holds rounding alone under SGD too)."""

    @classmethod
    def setUpClass(cls):
        import transformers  # noqa: F401 - pinned in python/requirements-torch.txt
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def profile_and_plan(self, name):
        """graph.txt of the model as it is, its nodes' names and parameter bytes checked, and
        the plan repipe plan makes of it for 4 workers in 4 stages."""
        import repipe.torch as rt
        import torch_models
        torch.manual_seed(1)
        module = torch_models.hf(name)
        x, _ = torch_models.hf_batch(2)
        path = os.path.join(self.tmp.name, name + ".txt")
        rt.profile(module, x, out=path, repeat=1)
        with open(path) as f:
            nodes = [ln.split(" -- ") for ln in f if ln.startswith("node")]
        names = [n[1].split(":")[0] for n in nodes[1:]]
        blocks = [n for n in names if n.rsplit(".", 1)[-1].isdigit()]
        # one node a block, in a row; after them the final norm and the head (BERT: its
        # prediction head, which holds its norm), before them the embeddings
        self.assertEqual(len(blocks), 4, names)
        at = names.index(blocks[0])
        self.assertEqual(names[at:at + 4], blocks, names)
        self.assertEqual(len(names) - at - 4, 1 if name == "bert" else 2, names)
        self.assertGreaterEqual(at, 1, names)
        total = sum(float(n[2].split("parameter_size=")[1]) for n in nodes)
        unique = {id(p): p.numel() * p.element_size() for p in module.parameters()}
        self.assertEqual(total, sum(unique.values()), name)
        # among the schedules of one chunk a rank: which one wins turns on the times measured
        # just now, and on a loaded machine interleaved 1F1B's 8 chunks once did
        out = os.path.join(self.tmp.name, name + "-pp4.json")
        subprocess.run([CLI, "plan", "--profile", path, "--machines", "4", "--pp", "4",
                        "--bandwidth", "1e8", "--global-batch", "16",
                        "--schedules", "1f1b,gpipe,zb-h1,zb-h2,zb-auto", "--config-out", out],
                       check=True, capture_output=True)
        with open(out) as f:
            cfg = json.load(f)
        self.assertEqual(len(cfg["layers_per_stage"]), 4)
        return cfg, len(names)

    def test_hugging_face_models(self):
        import torch_models
        cases, planned = [], {}
        for name in torch_models.HF_MODELS:
            cfg, n = self.profile_and_plan(name)
            planned[name] = cfg
            base = {"model": "hf-" + name, "updates": 5, "plan": cfg}
            sgd = dict(base, optimizer="momentum", lr=0.05)
            adamw = dict(base, optimizer="adamw", lr=1e-3, dtype="float64")
            first = n - 2  # a replicated first stage, then the last two nodes one a stage
            cases += [dict(sgd, name=name + " planned"),
                      dict(sgd, name=name + " planned, repipe's runner", runner="repipe"),
                      dict(sgd, name=name + " [2,1,1]",
                           plan=dict(cfg, layers_per_stage=[first, 1, 1],
                                     stage_replication=[2, 1, 1], schedule="1f1b")),
                      dict(adamw, name=name + " planned, float64"),
                      dict(adamw, name=name + " planned, float64, repipe's runner",
                           runner="repipe")]
        res = launch(4, cases, self.tmp.name, warm="warm_hf")
        for c in cases:
            r = res[c["name"]]
            tol = 1e-9 if c.get("dtype") == "float64" else 1e-5
            self.assertEqual(len(r["losses"]), 5)
            for a, b in zip(r["losses"], r["ref_losses"]):
                self.assertLessEqual(abs(a - b), tol * abs(b), (c["name"], r))
            self.assertLessEqual(r["weights_rel"], tol, (c["name"], r["worst"], r["weights_rel"]))
            if c.get("runner") != "repipe" and "[2,1,1]" not in c["name"]:
                self.assertEqual(r["schedule"], c["plan"]["schedule"])
            self.assertEqual(r["uniform"], c.get("runner") != "repipe" and
                             "[2,1,1]" not in c["name"], c["name"])
            self.assertEqual(r["stages"], len(c["plan"]["layers_per_stage"]), c["name"])
        for dtype in ("float32", "float64"):  # what was seen, beside the bounds
            got = [(res[c["name"]]["weights_rel"], c["name"]) for c in cases
                   if c.get("dtype", "float32") == dtype]
            print("%s: largest weight difference %.2g (%s)" % ((dtype,) + max(got)),
                  file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
