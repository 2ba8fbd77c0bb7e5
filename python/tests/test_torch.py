"""repipe.torch.profile on models written here (no downloads): a VGG-style chain, a
ResNet-style block with its residual addition, and a transformer that torch.fx cannot trace.
These need PyTorch 2 (make test runs them in the project's environment, scripts/python-env);
under a Python without it they are skipped, saying so."""
import json
import os
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import repipe  # noqa: E402

try:
    import torch
    from torch import nn
    import repipe.torch as rtorch
except ImportError:
    torch = None

NEEDS_TORCH = "needs PyTorch 2 (scripts/python-env's environment), which this Python lacks"


def read_graph(path):
    nodes, edges = {}, []
    with open(path) as f:
        text = f.read().splitlines()
    for line in text:
        if line.startswith("\t"):
            a, b = line.strip().split(" -- ")
            edges.append((a, b))
        else:
            name, desc, rest = line.split(" -- ")
            fields = dict(kv.split("=") for kv in rest.split(", "))
            nodes[name] = (desc, {k: float(v) for k, v in fields.items()})
    return nodes, edges


@unittest.skipUnless(torch is not None, NEEDS_TORCH)
class Profiles(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def profile(self, model, x):
        path = os.path.join(self.tmp.name, "graph.txt")
        rtorch.profile(model, x, repeat=2, out=path)
        return path, read_graph(path)

    def test_vgg_style_chain(self):
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True),
                              nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                              nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Linear(16 * 8 * 8, 10))
        path, (nodes, edges) = self.profile(model, torch.randn(4, 3, 32, 32))
        self.assertTrue(model[1].inplace and model[4].inplace)  # as it was written
        self.assertGreater(nodes["node2"][1]["backward_compute_time"], 0)
        self.assertEqual(len(nodes), 1 + 8)  # the input and every layer
        self.assertEqual(len(edges), 8)      # a chain
        conv = nodes["node1"][1]
        self.assertGreater(conv["forward_compute_time"], 0)
        self.assertGreater(conv["backward_compute_time"], 0)
        self.assertEqual(conv["parameter_size"], (8 * 3 * 9 + 8) * 4)
        self.assertEqual(conv["activation_size"], 4 * 8 * 32 * 32 * 4)
        self.assertEqual(nodes["node8"][1]["activation_size"], 4 * 10 * 4)
        self.assertIn("micro_batch=4", nodes["node0"][0])
        plan = repipe.plan(path, machines=[2])  # the planner reads it
        engine = plan.engine()  # the micro-batch comes from the profile: 4 x 2 machines
        self.assertEqual(engine["global_batch"], 8)
        self.assertTrue(engine["best"]["found"])
        self.assertEqual(sum(engine["best"]["config"].layers_per_stage), 8)

    def test_time_lands_on_the_module_that_spends_it(self):
        class SlowGrad(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                time.sleep(0.03)
                return g

        class SlowBackward(nn.Module):
            def forward(self, x):
                return SlowGrad.apply(x)

        class SlowForward(nn.Module):
            def forward(self, x):
                time.sleep(0.03)
                return x * 2

        class Net(nn.Module):  # one ReLU, called on both sides of the slow backward
            def __init__(self):
                super().__init__()
                self.lin1, self.act, self.slow_bw = nn.Linear(8, 8), nn.ReLU(True), SlowBackward()
                self.slow_fw, self.lin2 = SlowForward(), nn.Linear(8, 2)

            def forward(self, x):
                return self.lin2(self.slow_fw(self.act(self.slow_bw(self.act(self.lin1(x))))))

        model = Net()
        path, (nodes, edges) = self.profile(model, torch.randn(4, 8))
        self.assertEqual([nodes["node%d" % i][0] for i in range(1, 7)],
                         ["lin1: Linear", "act: ReLU", "slow_bw: SlowBackward", "act#1: ReLU",
                          "slow_fw: SlowForward", "lin2: Linear"])
        for i in range(1, 7):
            v = nodes["node%d" % i][1]
            self.assertEqual(v["forward_compute_time"] >= 30, i == 5, (i, v))
            self.assertEqual(v["backward_compute_time"] >= 30, i == 3, (i, v))
        self.assertFalse(any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()))

    def test_torchvision_style_resnet(self):
        class BasicBlock(nn.Module):  # torchvision's, at a small width
            def __init__(self, cin, cout, stride=1):
                super().__init__()
                self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.bn1, self.relu = nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
                self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(cout)
                self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

            def forward(self, x):
                identity = x if self.downsample is None else self.downsample(x)
                out = self.relu(self.bn1(self.conv1(x)))
                out = self.bn2(self.conv2(out))
                out += identity
                return self.relu(out)

        class ResNet(nn.Module):
            def __init__(self, classes=10):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
                self.bn1, self.relu = nn.BatchNorm2d(8), nn.ReLU(inplace=True)
                self.maxpool = nn.MaxPool2d(3, 2, 1)
                self.layer1 = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8))
                self.layer2 = nn.Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16))
                self.avgpool, self.fc = nn.AdaptiveAvgPool2d((1, 1)), nn.Linear(16, classes)

            def forward(self, x):
                x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
                x = self.layer2(self.layer1(x))
                return self.fc(torch.flatten(self.avgpool(x), 1))

        model = ResNet()
        path, (nodes, edges) = self.profile(model, torch.randn(2, 3, 32, 32))
        # a block computes its own residual addition: it is a node, its modules inside it
        self.assertEqual([d for d, _ in nodes.values()][1:],
                         ["conv1: Conv2d", "bn1: BatchNorm2d", "relu: ReLU", "maxpool: MaxPool2d",
                          "layer1.0: BasicBlock", "layer1.1: BasicBlock", "layer2.0: BasicBlock",
                          "layer2.1: BasicBlock", "avgpool: AdaptiveAvgPool2d", "fc: Linear"])
        self.assertEqual(len(edges), 10)  # a chain: torch.flatten joined the head
        self.assertEqual(sum(v["parameter_size"] for _, v in nodes.values()),
                         sum(p.numel() * 4 for p in model.parameters()))
        fc = [v for d, v in nodes.values() if d.startswith("fc")][0]
        self.assertEqual(fc["activation_size"], 2 * 10 * 4)
        self.assertTrue(all(v["forward_compute_time"] > 0 and v["backward_compute_time"] > 0
                            for n, (d, v) in nodes.items() if n != "node0"))
        plan = repipe.plan(path, machines=[2, 2])
        self.assertEqual(sum(plan.json["stage_to_num_ranks"]), 4)

    def test_residual_block_is_a_graph(self):
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1, self.relu = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
                self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
                self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 4)

            def forward(self, x):
                y = self.conv2(self.relu(self.conv1(x)))
                return self.fc(torch.flatten(self.pool(self.relu(x + y)), 1))

        path, (nodes, edges) = self.profile(Block(), torch.randn(2, 8, 16, 16))
        # x + y has no module: it joins the ReLU that reads it, the block's second ReLU call
        names = {n: d for n, (d, _) in nodes.items()}
        relu2 = [n for n, d in names.items() if d == "relu#1: ReLU"][0]
        into = sorted(names[a] for a, b in edges if b == relu2)
        self.assertEqual(into, ["Input0 micro_batch=2", "conv2: Conv2d"])  # shortcut, branch
        self.assertEqual(nodes[relu2][1]["activation_size"], 2 * 8 * 16 * 16 * 4)
        plan = repipe.plan(path, machines=[2])
        self.assertIn("node_stage", plan.json)

    def test_a_module_it_cannot_see_into_is_refused_by_name(self):
        class Branchy(nn.Module):  # data-dependent control flow: torch.export cannot follow it
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(16, 16)

            def forward(self, h):
                return self.lin(h) if h.sum() > -1e9 else h

        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Linear(8, 16)
                self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
                self.odd, self.head = Branchy(), nn.Linear(16, 4)

            def forward(self, x):
                return self.head(self.odd(self.layer(self.emb(x))))

        path = os.path.join(self.tmp.name, "never.txt")
        with self.assertRaisesRegex(ValueError, r"cannot see into module 'odd' \(Branchy\)"):
            rtorch.profile(Tiny(), torch.randn(2, 5, 8), out=path)
        self.assertFalse(os.path.exists(path))
        # a model that fails when called as it is (an input of the wrong width) is not blamed
        # on torch.export or on one of its modules
        with self.assertRaisesRegex(ValueError, r"fails on the example input when called as "
                                    r"it is, not only under torch.export: .*mat1 and mat2"):
            rtorch.profile(Tiny(), torch.randn(2, 5, 7), out=path)
        self.assertFalse(os.path.exists(path))
        model = Tiny()
        model.odd = nn.Identity()  # without it: every parameter in a node, the encoder one
        path, (nodes, _) = self.profile(model, torch.randn(2, 5, 8))
        self.assertIn("layer: TransformerEncoderLayer", [d for d, _ in nodes.values()])
        self.assertEqual(sum(v["parameter_size"] for _, v in nodes.values()),
                         sum(p.numel() * 4 for p in model.parameters()))

    def test_gpts_are_profiled_whole(self):
        """nanoGPT-style GPTs, with F.scaled_dot_product_attention written by hand and with
        nn.MultiheadAttention: every parameter once (the head tied to the embedding), a
        node a block, and the attention's time in the profile."""
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import torch_models
        for mha in (False, True):
            model = torch_models.GPT(mha=mha)
            x, _ = torch_models.gpt_batch(4)
            path, (nodes, edges) = self.profile(model, x)
            unique = {id(p): p.numel() * p.element_size() for p in model.parameters()}
            self.assertEqual(sum(v["parameter_size"] for _, v in nodes.values()),
                             sum(unique.values()), mha)
            self.assertEqual([d for d, _ in nodes.values()][1:],
                             ["wte: Embedding", "wpe: Embedding", "drop: Dropout"]
                             + ["h.%d: Block" % i for i in range(4)]
                             + ["ln_f: LayerNorm", "lm_head: Linear"])
            self.assertEqual(nodes["node9"][1]["parameter_size"], 0)  # the tied head
        # attention that costs more than everything else (384 positions, width 8, a
        # vocabulary of 8): the profile's forward holds it, in the blocks. Read within the one
        # profile (the blocks' share of its forward), not against a second timing that a busy
        # machine could slow apart: without the attention's time the blocks would hold a
        # layernorm and two 8-wide products, less than the embeddings and the head.
        # Each node's least time over three profiles: a busy machine only adds time, to
        # whichever node it strikes (a 3.5 ms embedding beside 1.3 ms blocks, once, under
        # ctest -j2).
        model = torch_models.GPT(vocab=8, seq=384, d=8, heads=1, layers=2)
        x, _ = torch_models.gpt_batch(4, vocab=8, seq=384)
        times = {}
        for _ in range(3):
            path, (nodes, _) = self.profile(model, x)
            for d, v in nodes.values():
                times[d] = min(times.get(d, float("inf")), v["forward_compute_time"])
        blocks = sum(t for d, t in times.items() if d.endswith(": Block"))
        self.assertGreater(blocks, 0.5 * sum(times.values()), times)


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(torch is not None, NEEDS_TORCH)
class Export(unittest.TestCase):
    """repipe.torch.export and load: the exported spec computes what the module computes,
    and what repipe trains goes back into the module."""

    def setUp(self):
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.tmp = tempfile.TemporaryDirectory()
        self.model = os.path.join(self.tmp.name, "m.model")
        self.weights = os.path.join(self.tmp.name, "m.rpw")

    def tearDown(self):
        self.tmp.cleanup()

    def evaluate(self, module, x, y):
        """The mean loss of (x, y) by repipe from the export, and by the module (eval mode:
        batchnorm on its running statistics)."""
        rtorch.export(module, x, model=self.model, weights=self.weights)
        with repipe.Session(repipe.Model.load(self.model),
                            repipe.Config(micro_batch_size=int(x.shape[0]))) as s:
            s.set_weights(repipe.load_weights(self.weights))
            ours = s.loss(np.ascontiguousarray(x.numpy()), y.numpy().astype(np.int32))
        module.eval()
        with torch.no_grad():
            theirs = nn.functional.cross_entropy(module(x), y).item()
        return ours, theirs

    def test_dense_residual_model_with_batchnorm(self):
        class Net(nn.Module):
            def __init__(s):
                super().__init__()
                s.stem = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
                s.a = nn.Conv2d(6, 6, 3, padding=1, groups=3)
                s.bn = nn.BatchNorm2d(6)
                s.b = nn.Conv2d(6, 2, 1)
                s.pool = nn.AvgPool2d(2)
                s.head = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(0.1),
                                       nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 10))

            def forward(s, x):
                x = s.stem(x)
                y = torch.relu(s.bn(s.a(x)) + x)
                z = torch.cat([y, torch.sigmoid(s.b(y)), x], dim=1)
                return s.head(s.pool(z)[:, :8])

        # a slice has no repipe layer: refused with the node's name
        with self.assertRaisesRegex(repipe.Error, "getitem"):
            rtorch.export(Net(), torch.zeros(2, 1, 12, 12), model=self.model, weights=self.weights)

        class Fixed(Net):
            def __init__(s):
                super().__init__()
                s.head[3] = nn.Linear(14 * 4, 16)

            def forward(s, x):
                x = s.stem(x)
                y = torch.relu(s.bn(s.a(x)) + x)
                z = torch.cat([y, torch.sigmoid(s.b(y)), x], dim=1)
                return s.head(s.pool(z))

        net = Fixed()
        net.train()
        with torch.no_grad():  # running statistics away from 0 and 1
            for _ in range(3):
                net(torch.randn(8, 1, 12, 12))
        x, y = torch.randn(6, 1, 12, 12), torch.randint(0, 10, (6,))
        ours, theirs = self.evaluate(net, x, y)
        self.assertAlmostEqual(ours, theirs, delta=1e-5)
        with open(self.model) as f:
            text = f.read()
        self.assertIn("concat < ", text)
        self.assertIn("groups=3", text)
        self.assertIn("batchnorm2d eps=1e-05 momentum=0.1", text)

    def test_a_gated_mlp(self):
        class Gated(nn.Module):  # LLaMA's MLP shape: w2(silu(w1 x) * w3 x), and a residual
            def __init__(s):
                super().__init__()
                s.w1, s.w3, s.w2 = nn.Linear(6, 8, bias=False), nn.Linear(6, 8, bias=False), \
                    nn.Linear(8, 6, bias=False)
                s.act, s.head = nn.SiLU(), nn.Linear(6, 4)

            def forward(s, x):
                return s.head(x + s.w2(s.act(s.w1(x)) * s.w3(x)))

        x, y = torch.randn(5, 6), torch.randint(0, 4, (5,))
        ours, theirs = self.evaluate(Gated(), x, y)
        self.assertAlmostEqual(ours, theirs, delta=1e-5)
        with open(self.model) as f:
            self.assertIn("= mul < ", f.read())

    def test_gpts_reach_repipes_engine(self):
        """nanoGPT-style GPTs (F.scaled_dot_product_attention, and nn.MultiheadAttention),
        which torch.fx cannot read, export from torch.export's graph as repipe's embedding,
        position_embedding, transformer_block, layernorm and tied head: repipe's loss on the
        export is PyTorch's, and a changed weight file loads back into the module."""
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import torch_models
        for mha in (False, True):
            torch.manual_seed(3)
            net = torch_models.GPT(mha=mha)
            x, y = torch_models.gpt_batch(4, seed=5)
            text = rtorch.export(net, x, model=self.model, weights=self.weights)
            self.assertEqual(text.count("transformer_block heads=4 mlp=4 gelu=erf"), 4, text)
            self.assertIn("position_embedding", text)
            self.assertIn("linear 64 bias=false tie=0", text)
            with repipe.Session(repipe.Model.load(self.model),
                                repipe.Config(micro_batch_size=4)) as s:
                s.set_weights(repipe.load_weights(self.weights))
                ours = s.loss(np.ascontiguousarray(x.numpy().astype(np.float32)),
                              y.numpy().astype(np.int32).reshape(4, -1))
            with torch.no_grad():
                theirs = nn.functional.cross_entropy(net(x), y).item()
            self.assertAlmostEqual(ours, theirs, delta=1e-5 * abs(theirs))
            w = repipe.load_weights(self.weights)
            w["1.weight"] = w["1.weight"] * 0.5  # the positions' table, halved
            repipe.save_weights(self.weights, w)
            rtorch.load(net, self.weights, x)
            self.assertTrue(torch.equal(net.wpe.weight, torch.from_numpy(w["1.weight"])))
        # a post-norm encoder layer is not GPT-2's block: refused with the node's name
        enc = nn.Sequential(nn.Linear(8, 16), nn.TransformerEncoderLayer(16, 2, 32, 0.0,
                                                                        batch_first=True))
        with self.assertRaisesRegex(repipe.Error, r"module '1' \(TransformerEncoderLayer\)"):
            rtorch.export(enc, torch.zeros(2, 5, 8), model=self.model, weights=self.weights)

    def test_refusals_name_the_module(self):
        net = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.LSTM(4, 4))
        with self.assertRaisesRegex(repipe.Error, r"module '2' \(LSTM\): has no repipe layer"):
            rtorch.export(net, torch.zeros(2, 4), model=self.model, weights=self.weights)
        net = nn.Sequential(nn.Conv2d(1, 2, (3, 5)))
        with self.assertRaisesRegex(repipe.Error, r"module '0' \(Conv2d\): kernel"):
            rtorch.export(net, torch.zeros(2, 1, 8, 8), model=self.model, weights=self.weights)
        self.assertFalse(os.path.exists(self.model))

    def test_trained_weights_go_back(self):
        """repipe trains the export 3 updates of 2 micro-batches; load() puts the result into
        the module, where it equals PyTorch's own 3 updates on the same micro-batches, the
        running statistics included."""
        def make():
            torch.manual_seed(1)
            return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                 nn.Linear(8, 3))
        net, ref = make(), make()
        x, y = torch.randn(16, 1, 3, 4), torch.randint(0, 3, (16,))
        rtorch.export(net, x, model=self.model, weights=self.weights)
        cfg = repipe.Config(micro_batch_size=8, gradient_accumulation_steps=2,
                            optimizer={"type": "sgd", "lr": 0.1, "momentum": 0.9})
        with repipe.Session(repipe.Model.load(self.model), cfg) as s:
            s.set_weights(repipe.load_weights(self.weights))
            for _ in range(3):
                s.run(np.ascontiguousarray(x.numpy()), y.numpy().astype(np.int32))
            trained = s.weights()
        repipe.save_weights(self.weights, trained)
        rtorch.load(net, self.weights)
        state = net.state_dict()
        self.assertTrue(np.array_equal(state["2.running_var"].numpy(), trained["2.running_var"]))
        self.assertTrue(np.array_equal(state["4.weight"].numpy(), trained["4.weight"]))
        opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        ref.train()
        for _ in range(3):
            opt.zero_grad()
            for k in (0, 8):
                (nn.functional.cross_entropy(ref(x[k:k + 8]), y[k:k + 8]) / 2).backward()
            opt.step()
        for key, want in ref.state_dict().items():
            if key.endswith("num_batches_tracked"):
                continue
            err = (state[key] - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
            self.assertLess(err, 1e-5, key)


@unittest.skipUnless(torch is not None, NEEDS_TORCH)
class Clocks(unittest.TestCase):
    """The profiler's times come from its clock: here one that stands in for CUDA events —
    its marks are tokens read only after the run synchronises, and time moves only when a
    module says so (a kernel running on the device while the host goes on)."""

    def test_times_are_read_after_the_run_synchronises(self):
        class Events:
            def __init__(s):
                s.now, s.unread, s.syncs = 0.0, [], 0

            def mark(s):
                token = {"t": s.now}
                s.unread.append(token)
                return token

            def sync(s):
                s.syncs += 1
                s.unread.clear()

            def seconds(s, a, b):
                if a in s.unread or b in s.unread:
                    raise AssertionError("an event read before the run synchronised")
                return b["t"] - a["t"]

        clock = Events()

        def backward_takes(seconds):
            """An identity whose backward takes `seconds` on the device."""
            class Timed(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    return x * 1

                @staticmethod
                def backward(ctx, g):
                    clock.now += seconds
                    return g
            return Timed

        Device = backward_takes(2.0)  # 2 s on the device in backward

        class Kernel(nn.Module):  # 3 s on the device in forward, 2 in backward
            def forward(s, x):
                clock.now += 3.0
                return Device.apply(x)

        model = nn.Sequential(nn.Linear(4, 4), Kernel(), nn.Linear(4, 2))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "graph.txt")
            rtorch.profile(model, torch.randn(3, 4), repeat=2, out=path, clock=clock)
            nodes, _ = read_graph(path)
        self.assertEqual(clock.syncs, 3)  # a warm-up and two timed runs
        kernel = [v for d, v in nodes.values() if d == "1: Kernel"]
        self.assertEqual(len(kernel), 1)
        self.assertAlmostEqual(kernel[0]["forward_compute_time"], 3000.0)
        self.assertAlmostEqual(kernel[0]["backward_compute_time"], 2000.0)
        others = [v for d, v in nodes.values() if d.endswith(": Linear")]
        self.assertEqual([o["forward_compute_time"] for o in others], [0.0, 0.0])
        self.assertEqual([o["backward_compute_time"] for o in others], [0.0, 0.0])

        # a loss of 5 s forward and 7 s backward: in the node that makes the output, as the
        # last stage runs it; the kernel's times as they were
        LossBackward = backward_takes(7.0)

        def loss_fn(out, target):
            clock.now += 5.0
            return LossBackward.apply(out - target).pow(2).mean()

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "graph.txt")
            rtorch.profile(model, torch.randn(3, 4), repeat=2, out=path, clock=clock,
                           loss_fn=loss_fn, target=torch.zeros(3, 2))
            nodes, _ = read_graph(path)
        by = {d: v for d, v in nodes.values()}
        self.assertAlmostEqual(by["2: Linear"]["forward_compute_time"], 5000.0)
        self.assertAlmostEqual(by["2: Linear"]["backward_compute_time"], 7000.0)
        self.assertAlmostEqual(by["1: Kernel"]["forward_compute_time"], 3000.0)
        self.assertAlmostEqual(by["1: Kernel"]["backward_compute_time"], 2000.0)
        self.assertEqual(by["0: Linear"]["forward_compute_time"], 0.0)
        with self.assertRaisesRegex(ValueError, "loss_fn and target go together"):
            rtorch.profile(model, torch.randn(3, 4), out=path, loss_fn=loss_fn)

    def test_the_clock_follows_the_device(self):
        self.assertIsInstance(rtorch._clock_for(nn.Linear(2, 2), torch.zeros(1, 2)),
                              rtorch.HostClock)


@unittest.skipUnless(torch is not None, NEEDS_TORCH)
class Calibrate(unittest.TestCase):
    """repipe.calibrate: its fit, and the file it writes as `repipe profile --transformer`
    reads it."""

    def test_the_fit_recovers_the_curve(self):
        from repipe.calibrate import _fit
        points = [(d, 3e11 * d / (d + 80.0)) for d in (32, 64, 256, 1024, 4096)]
        peak, half = _fit(points)
        self.assertAlmostEqual(peak / 3e11, 1.0, places=9)
        self.assertAlmostEqual(half, 80.0, places=6)
        # rates that fall with size: the best is the peak, reached at once
        self.assertEqual(_fit([(64, 2e11), (128, 1.5e11)]), (2e11, 0.0))

    def test_the_file_is_a_device(self):
        import subprocess
        from repipe.calibrate import calibrate
        cli = os.environ.get("REPIPE_CLI") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "repipe")
        with tempfile.TemporaryDirectory() as tmp:
            dev = os.path.join(tmp, "cpu.json")
            got = calibrate("cpu", torch.float32, out=dev, quick=True, name="this-cpu")
            with open(dev) as f:
                written = json.load(f)
            self.assertNotIn("measured", written)
            self.assertEqual(written["name"], "this-cpu")
            for key in ("peak_flops", "peak_fp32", "memory_bandwidth", "memory_bytes"):
                self.assertGreater(written[key], 0, key)
            self.assertEqual(written["gemm_efficiency"], 1.0)
            self.assertLessEqual(written["attention_efficiency"], 1.0)
            self.assertGreater(got["measured"]["block"]["seconds"], 0)
            out = os.path.join(tmp, "g.txt")
            p = subprocess.run([cli, "profile", "--transformer",
                                "layers=2,hidden=64,heads=4,seq=32,vocab=128,flash=1,dropout=0",
                                "--device", dev, "--precision", "fp32", "--out", out],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("on this-cpu", p.stdout)


@unittest.skipUnless(torch is not None, NEEDS_TORCH)
class PipelineRefusals(unittest.TestCase):
    """What rt.Pipeline does not run says so before it builds anything (one process, a
    world of one)."""

    def test_dualpipe_is_the_engines(self):
        import torch.distributed as dist
        import repipe.torch as rt
        tmp = tempfile.TemporaryDirectory()
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp.name, "rdv"),
                                rank=0, world_size=1)
        try:
            plan = {"layers_per_stage": [-1, -1], "replication_factor": 2,
                    "gradient_accumulation_steps": 2, "schedule": "dualpipe"}
            with self.assertRaisesRegex(repipe.Error, "schedule dualpipe .* runs on repipe's "
                                                      "engine"):
                rt.Pipeline(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), plan,
                            loss_fn=nn.functional.cross_entropy,
                            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
        finally:
            dist.destroy_process_group()
            tmp.cleanup()
