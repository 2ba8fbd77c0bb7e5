"""The Python package against the command and the C library's rules.

Run by CTest (`python`), with REPIPE_LIBRARY the built library, REPIPE_CLI the
command and REPIPE_SOURCE the repository.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import repipe  # noqa: E402

SRC = os.environ.get("REPIPE_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("REPIPE_CLI", os.path.join(SRC, "build", "repipe"))
FIXTURES = os.path.join(SRC, "tests", "fixtures", "pipedream")
FMNIST = "/usr/share/datasets/fashion-mnist"


class Plans(unittest.TestCase):
    def test_every_fixture_equals_repipe_plan_json(self):
        cases = sorted(glob.glob(os.path.join(FIXTURES, "expected", "*.json")))
        self.assertGreater(len(cases), 5)
        for case in cases:
            with open(case) as f:
                fx = json.load(f)
            o, profile = fx["options"], os.path.join(FIXTURES, fx["profile"])
            argv = [CLI, "plan", "--profile", profile, "--machines"] + \
                [str(m) for m in o["machines"]] + ["--bandwidth"] + \
                [repr(b) for b in o["bandwidths"]] + ["--memory-size", repr(o["memory_size"]),
                                                       "--json", "-"]
            if o["use_memory_constraint"]:
                argv.append("--memory-constraint")
            if o["straight_pipeline"]:
                argv.append("--straight")
            if o["use_fewer_machines"]:
                argv.append("--fewer-machines")
            if o["activation_compression_ratio"] is not None:
                argv += ["--activation-compression", repr(o["activation_compression_ratio"])]
            want = json.loads(subprocess.run(argv, check=True, capture_output=True).stdout)
            got = repipe.plan(profile, o["machines"], o["bandwidths"], o["memory_size"],
                              o["use_memory_constraint"], o["straight_pipeline"],
                              o["use_fewer_machines"], o["activation_compression_ratio"])
            self.assertEqual(got.json, want, os.path.basename(case))
            self.assertIn("stage_to_rank_map", got.pipedream_conf())

    def test_config_and_describe_say_what_the_command_says(self):
        profile = os.path.join(FIXTURES, "profiles", "vgg16", "graph.txt")
        argv = [CLI, "plan", "--profile", profile, "--machines", "8", "2", "--bandwidth",
                "4294967296", "2147483648", "--activation-compression", "1"]
        text = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        want = json.loads(subprocess.run(argv + ["--json", "-"], check=True,
                                         capture_output=True).stdout)["execution_config"]
        p = repipe.plan(profile, [8, 2], [4294967296, 2147483648], activation_compression=1)
        described = p.describe().splitlines()
        stage_lines = [ln.strip() for ln in described if ln.strip().startswith("stage ")]
        self.assertEqual(len(stage_lines), len(want["stage_replication"]))
        for ln in stage_lines:  # each stage's ranks and layers, as `repipe plan` prints them
            self.assertIn(ln, text)
            at = described.index("  " + ln)
            self.assertIn(described[at + 1].strip(), text)
        base = {"micro_batch_size": 16, "gradient_accumulation_steps": 14, "seed": 9}
        cfg = p.config(base)
        for key in want:
            self.assertEqual(getattr(cfg, key), want[key], key)
        self.assertEqual((cfg.micro_batch_size, cfg.seed), (16, 9))  # base's keys stay
        self.assertEqual(cfg.derived["workers"], sum(p.json["stage_to_num_ranks"]))
        with tempfile.TemporaryDirectory() as tmp:  # the command reads what it writes
            path = cfg.save(os.path.join(tmp, "c.json"))
            shown = subprocess.run([CLI, "config", "show", path, "--json"], check=True,
                                   capture_output=True).stdout
            self.assertEqual(json.loads(shown)["training"]["workers"], 16)
            self.assertEqual(repipe.Config.load(path), cfg)
        with self.assertRaisesRegex(repipe.Error, "stage 0 has 7 workers per pipeline but "
                                                  "gradient_accumulation_steps is 4"):
            p.config(dict(base, gradient_accumulation_steps=4))

    def test_engine_objective_equals_the_command(self):
        profile = os.path.join(FIXTURES, "profiles", "vgg16", "graph.txt")
        argv = [CLI, "plan", "--profile", profile, "--machines", "8", "2", "--bandwidth",
                "4294967296", "2147483648", "--activation-compression", "1",
                "--objective", "engine", "--json", "-"]
        p = repipe.plan(profile, [8, 2], [4294967296, 2147483648], activation_compression=1)
        base = {"seed": 4, "micro_batch_size": 32, "gradient_accumulation_steps": 8,
                "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}}
        with tempfile.TemporaryDirectory() as tmp:
            base_path = os.path.join(tmp, "base.json")
            with open(base_path, "w") as f:
                json.dump(base, f)
            cases = [  # devices of several kinds: the second server at half speed, with half
                     # the memory
                     (["--profile-batch", "64", "--global-batch", "1024", "--speed", "1", "0.5",
                       "--memory-size", "16e9", "8e9"],
                      dict(global_batch=1024, profile_batch=64, speed=[1, 0.5],
                           memory=[16e9, 8e9])),
                     (["--profile-batch", "64", "--global-batch", "1024"],
                      dict(global_batch=1024, profile_batch=64)),
                     (["--base-config", base_path], dict(base=base_path))]
            for extra, kwargs in cases:
                out = subprocess.run(argv + extra, check=True, capture_output=True).stdout
                want = json.loads(out)  # standard output is the JSON alone
                if "memory" not in kwargs:  # (several: PipeDream's plan takes the least)
                    self.assertEqual({k: v for k, v in want.items() if k != "engine"}, p.json)
                got = p.engine(**kwargs)
                for row in ("best", "single", "data_parallel", "pipedream", "pipeline_1f1b",
                            "pipeline_zero_bubble", "tensor_parallel", "pipeline_interleaved",
                            "equal_devices"):
                    if got[row]["found"]:
                        got[row]["config"] = got[row]["config"].to_dict()
                self.assertEqual(got, want["engine"], extra)
                self.assertEqual(got["equal_devices"]["found"], "speed" in kwargs, extra)
        with self.assertRaisesRegex(repipe.Error, "speed: 3 positive values"):
            p.engine(global_batch=1024, profile_batch=64, speed=[1, 1, 1])
        self.assertEqual(want["engine"]["best"]["config"]["seed"], 4)  # base's keys stay
        with self.assertRaisesRegex(repipe.Error, "does not say its micro-batch"):
            p.engine(global_batch=1024)
        # numbers that wrapped, looped or passed: refused, or planned in ints
        with self.assertRaisesRegex(repipe.Error, "memory_size must be a number of bytes"):
            p.engine(global_batch=1024, profile_batch=64, memory_size=float("nan"))
        with self.assertRaisesRegex(repipe.Error, "max_accumulation must be at least 1"):
            p.engine(global_batch=1024, profile_batch=64, max_accumulation=0)
        big = p.engine(global_batch=2 ** 31, profile_batch=64)["best"]["config"]
        self.assertEqual(big.micro_batch_size * big.gradient_accumulation_steps
                         * big.replication_factor, 2 ** 31)

    def test_model_profile_is_the_commands(self):
        model_path = os.path.join(SRC, "examples", "fmnist-cnn.model")
        with tempfile.TemporaryDirectory() as tmp:
            ours = repipe.Model.load(model_path).profile(os.path.join(tmp, "py.txt"),
                                                         micro_batch=8, repeats=2)
            theirs = os.path.join(tmp, "cli.txt")
            subprocess.run([CLI, "profile", "--model", model_path, "--micro-batch", "8",
                            "--repeats", "2", "--out", theirs], check=True, capture_output=True)

            def shape(path):  # everything but the times, which are measured anew
                with open(path) as f:
                    return [re.sub(r"(forward|backward(_input|_weight)?)_(compute_)?time=[0-9.]+", "", line)
                            for line in f]
            self.assertEqual(shape(ours), shape(theirs))
            self.assertGreater(len(shape(ours)), 5)
            self.assertEqual(repipe.plan(ours, [2]).engine()["global_batch"], 16)
            # alone=True is `repipe profile --alone`, and says so in the Input's description
            alone = repipe.Model.load(model_path).profile(os.path.join(tmp, "alone.txt"),
                                                          micro_batch=8, repeats=2, alone=True)
            subprocess.run([CLI, "profile", "--model", model_path, "--micro-batch", "8",
                            "--repeats", "2", "--alone", "--out", theirs], check=True,
                           capture_output=True)
            self.assertEqual(shape(alone), shape(theirs))
            self.assertIn("timed_in=layers_alone", shape(alone)[0])
            self.assertIn("timed_in=whole_passes", shape(ours)[0])
        with self.assertRaisesRegex(repipe.Error, "batch and repeats must be >= 1"):
            repipe.Model.load(model_path).profile(os.path.join("nope", "x.txt"), micro_batch=0)

    def test_a_bad_profile_raises_the_c_message(self):
        with self.assertRaisesRegex(repipe.Error, "nope.txt"):
            repipe.plan("nope.txt", [2])


class Configs(unittest.TestCase):
    def test_keys_and_derived(self):
        c = repipe.Config(micro_batch_size=8, gradient_accumulation_steps=3, replication_factor=2,
                          layers_per_stage=[2, -1], stage_replication=[2, 1])
        d = c.derived
        self.assertEqual(d["workers"], 6)
        self.assertEqual(d["samples_per_update"], 48)
        self.assertEqual(c.to_dict()["micro_batch_size"], 8)
        self.assertEqual(repipe.Config.load(os.path.join(SRC, "examples", "fmnist.json"))
                         .derived["workers"], 1)

    def test_keys_as_attributes_and_changed_copies(self):
        c = repipe.Config.load(os.path.join(SRC, "examples", "fmnist-2x2.json"))
        self.assertEqual(c.replication_factor, c.to_dict()["replication_factor"])
        d = c.replace(seed=5)
        self.assertEqual((d.seed, c.seed), (5, c.to_dict()["seed"]))
        self.assertEqual(c.replace(), c)
        self.assertNotEqual(d, c)
        with self.assertRaisesRegex(repipe.Error, "micro_batch_size"):
            c.replace(micro_batch_size=0)
        with self.assertRaisesRegex(AttributeError, "no key 'micro_batch'"):
            c.micro_batch

    def test_errors_carry_the_c_message(self):
        with self.assertRaisesRegex(repipe.Error, "unknown key 'replication_factr' \\(did you "
                                                  "mean 'replication_factor'\\?\\)"):
            repipe.Config(replication_factr=2)
        with self.assertRaisesRegex(repipe.Error, "no.json"):
            repipe.Config.load("no.json")
        with self.assertRaisesRegex(repipe.Error, "unknown layer 'linaer'"):
            repipe.Model.parse("input 4\nlinaer 3\n")

    def test_version_is_the_commands(self):
        out = subprocess.run([CLI, "--version"], check=True, capture_output=True, text=True)
        self.assertIn(repipe.__version__, out.stdout)
        self.assertRegex(repipe.__version__, r"^\d+\.\d+")

    def test_groups(self):
        self.assertEqual(repipe.groups(8, 2, 4), [0, 1, 2, 3, 0, 1, 2, 3])
        self.assertEqual(repipe.groups(4), [0, 0, 0, 0])
        with self.assertRaises(repipe.Error):
            repipe.groups(6, 4)
        # as PopXL: a stride alone groups replicas / stride replicas; 0 is no size
        self.assertEqual(repipe.groups(8, stride=2), [0, 1, 0, 1, 0, 1, 0, 1])
        with self.assertRaises(repipe.Error):
            repipe.groups(8, 0)


@unittest.skipUnless(os.path.exists(os.path.join(FMNIST, "train-labels-idx1-ubyte.gz")) or
                     os.path.exists(os.path.join(FMNIST, "train-labels-idx1-ubyte")),
                     "needs Debian's dataset-fashion-mnist (make test installs it)")
class Training(unittest.TestCase):
    def test_python_training_equals_repipe_train_bit_for_bit(self):
        model_path = os.path.join(SRC, "examples", "fmnist-cnn.model")
        config_path = os.path.join(SRC, "examples", "fmnist-2x2.json")
        updates = 12
        with tempfile.TemporaryDirectory() as tmp:
            saved = os.path.join(tmp, "w.rpw")
            subprocess.run([CLI, "train", "--model", model_path, "--config", config_path,
                            "--updates", str(updates), "--save", saved, "--log-every", "1000"],
                           check=True, capture_output=True)
            want = repipe.load_weights(saved)
        cfg = repipe.Config.load(config_path)
        x, y = repipe.fashion_mnist()
        per_update = cfg.derived["samples_per_update"]
        stream = repipe.Stream(cfg.to_dict()["seed"], len(y), per_update)
        with repipe.Session(repipe.Model.load(model_path), cfg) as s:
            calls = updates * per_update // s.samples_per_call
            for call in range(calls):
                k = s.samples_per_call // per_update
                ids = np.concatenate([stream.update(call * k + i) for i in range(k)])
                s.run(np.ascontiguousarray(x[ids]), np.ascontiguousarray(y[ids]), ids)
            got = s.weights()
        self.assertEqual(sorted(got), sorted(want))
        for name in want:
            self.assertTrue(np.array_equal(got[name], want[name]), name)


class Generation(unittest.TestCase):
    def test_generate_equals_the_command(self):
        fx = os.path.join(SRC, "tests", "fixtures", "llmc")
        model_path = os.path.join(fx, "gpt-l2.model")
        with tempfile.TemporaryDirectory() as tmp:
            w_path = os.path.join(tmp, "l2.rpw")
            subprocess.run([CLI, "weights", "import-llmc", os.path.join(fx, "gpt-l2.bin"),
                            "--model", model_path, "--out", w_path], check=True,
                           capture_output=True)
            weights = repipe.load_weights(w_path)
            model = repipe.Model.load(model_path)
            for args in ((b"And", 40, 1.0, 40, 7), (b"x", 20, 0.0, 0, 1), (b"ab", 30, 0.7, 5, 3)):
                prompt, n, temp, k, seed = args
                want = subprocess.run([CLI, "generate", "--model", model_path, "--load",
                                       w_path, "--prompt", prompt.decode(), "--tokens", str(n),
                                       "--temperature", str(temp), "--top-k", str(k),
                                       "--seed", str(seed)], check=True,
                                      capture_output=True).stdout
                got = model.generate(weights, prompt, n, temp, k, seed)
                self.assertEqual(got, want[:len(got)], args)  # the command adds a newline
                self.assertEqual(len(got), len(prompt) + n)
            ids = model.generate(weights, np.array([65, 110], np.int32), 5, 0.0)
            self.assertEqual(ids.dtype, np.int32)
            self.assertEqual(ids.tobytes()[:8], np.array([65, 110], np.int32).tobytes())
            with self.assertRaisesRegex(repipe.Error, "prompt"):
                model.generate(weights, b"", 5)
            with self.assertRaisesRegex(repipe.Error, "weights"):
                model.generate({}, b"a", 5)
        with self.assertRaisesRegex(repipe.Error, "generate"):
            repipe.Model.parse("input 4\nlinear 3\nsoftmax_cross_entropy\n").generate(
                {}, b"a", 2)


class Safetensors(unittest.TestCase):
    def test_llama_state_dicts_round_trip(self):
        fx = os.path.join(SRC, "tests", "fixtures", "llama")
        model = repipe.Model.load(os.path.join(fx, "tiny.model"))
        state = repipe.load_weights(os.path.join(fx, "tiny.safetensors"))
        self.assertEqual(list(state)[:2], ["tok_embeddings.weight",
                                           "layers.0.attention.wq.weight"])
        ours = repipe.from_llama(model, state)
        wq, wk, wv = (state["layers.0.attention.%s.weight" % k] for k in ("wq", "wk", "wv"))
        np.testing.assert_array_equal(ours["2.weight"], np.concatenate([wq, wk, wv]))
        back = repipe.to_llama(model, ours)
        self.assertEqual(list(back), list(state))
        for k in state:
            np.testing.assert_array_equal(back[k], state[k])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.safetensors")
            repipe.save_weights(path, back)
            with open(path, "rb") as a, open(os.path.join(fx, "tiny.safetensors"), "rb") as b:
                self.assertEqual(a.read(), b.read())
        hf = repipe.load_weights(os.path.join(fx, "tiny_hf.safetensors"))
        for k, v in repipe.from_llama(model, hf).items():  # names="hf", by the embedding
            np.testing.assert_array_equal(v, ours[k])
        self.assertEqual(list(repipe.to_llama(model, ours, names="hf")), list(hf))
        del state["norm.weight"]
        with self.assertRaisesRegex(repipe.Error, "no tensor 'norm.weight'"):
            repipe.from_llama(model, state)


class Arrays(unittest.TestCase):
    def setUp(self):
        self.model = repipe.Model.parse("input 6\nlinear 4\nrelu\nlinear 3\n"
                                        "softmax_cross_entropy\n")
        self.session = repipe.Session(self.model, repipe.Config(micro_batch_size=5))
        self.x = np.random.default_rng(1).random((5, 6), dtype=np.float32)
        self.y = np.array([0, 1, 2, 0, 1], dtype=np.int32)

    def tearDown(self):
        self.session.close()

    def test_runs_and_predicts(self):
        losses = self.session.run(self.x, self.y)
        self.assertEqual(losses.size, 1)
        self.assertTrue(np.isfinite(losses).all())
        self.assertEqual(self.session.predict(self.x).shape, (5,))
        w = self.session.weights()
        self.assertEqual(w["0.weight"].shape, (4, 6))
        w["0.weight"][:] = 0
        self.session.set_weights(w)
        self.assertTrue((self.session.weights()["0.weight"] == 0).all())

    def test_weights_per_group_and_per_replica(self):
        x = np.repeat(self.x, 4, axis=0)
        y = np.repeat(self.y, 4)
        for g, stride in ((2, 1), (2, 2), (1, 1)):
            cfg = repipe.Config(micro_batch_size=5, replication_factor=4,
                                replica_grouping={"group_size": g, "stride": stride})
            members = repipe.groups(4, g, stride)
            with repipe.Session(self.model, cfg) as s:
                G = 4 // g
                w = s.weights()
                self.assertEqual(w["0.weight"].shape, ((G,) if G > 1 else ()) + (4, 6))
                rng = np.random.default_rng(g)
                per_group = {k: rng.random((G,) + v.shape[-v.ndim + (G > 1):],
                                           dtype=np.float32) for k, v in w.items()}
                s.set_weights(per_group)
                every = s.weights("all_replicas")
                for k, v in per_group.items():  # replica r holds its group's value
                    self.assertEqual(every[k].shape, (4,) + v.shape[1:])
                    for r in range(4):
                        self.assertTrue(np.array_equal(every[k][r], v[members[r]]), (k, r))
                if g > 1:
                    with self.assertRaisesRegex(repipe.Error, "all_replicas|identical|group"):
                        s.set_weights(every, mode="all_replicas")
                else:  # a replica per group: each may be written
                    every["0.bias"][3] += 1
                    s.set_weights(every, mode="all_replicas")
                    self.assertTrue(np.array_equal(s.weights()["0.bias"], every["0.bias"]))
                s.run(x, y)  # still trains
        with self.assertRaisesRegex(repipe.Error, "mode 'both'"):
            self.session.weights("both")

    def test_validation_loss(self):
        loss = self.session.loss(self.x, self.y)
        self.assertTrue(np.isfinite(loss))
        self.assertAlmostEqual(loss, float(self.session.run(self.x, self.y).mean()), places=5)
        with self.assertRaisesRegex(repipe.Error, r"y: shape \(4,\)"):
            self.session.loss(self.x, self.y[:4])

    def test_after_close_and_from_threads(self):
        # every call after close() raises (they crashed the process)
        s = repipe.Session(self.model, repipe.Config(micro_batch_size=5))
        s.close()
        s.close()  # twice is fine
        for call in (lambda: s.run(self.x, self.y), lambda: s.predict(self.x),
                     lambda: s.loss(self.x, self.y), lambda: s.weights(),
                     lambda: s.set_weights({})):
            with self.assertRaisesRegex(repipe.Error, "the session is closed"):
                call()
        # one session, four threads: the calls take turns (the threads spun for ever)
        with repipe.Session(self.model, repipe.Config(micro_batch_size=5)) as s:
            def runs():
                for _ in range(5):
                    s.run(self.x, self.y)
                    s.predict(self.x)
            threads = [threading.Thread(target=runs) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            self.assertFalse(any(t.is_alive() for t in threads))
            solo = repipe.Session(self.model, repipe.Config(micro_batch_size=5))
            solo.set_weights(s.weights())
            self.assertTrue(np.isfinite(s.run(self.x, self.y)).all())
            solo.close()
        # close() while another thread runs: that call finishes, the next raises
        s = repipe.Session(self.model, repipe.Config(micro_batch_size=5))
        raised = []
        def keeps_running():
            try:
                for _ in range(100000):
                    s.run(self.x, self.y)
            except repipe.Error as e:
                raised.append(str(e))
        t = threading.Thread(target=keeps_running)
        t.start()
        time.sleep(0.05)
        s.close()
        t.join(60)
        self.assertFalse(t.is_alive())
        self.assertEqual(raised, ["the session is closed"])

    def test_stream_from_threads(self):
        """Two threads on one Stream, each asking for updates of alternate epochs (so that
        each call reshuffles): every list is the one a Stream of its own gives."""
        per, n = 20000, 40000  # 2 updates an epoch: thread k takes epochs k, k + 2, ...
        solo = repipe.Stream(7, n, per)
        want = {u: solo.update(u).tolist() for u in range(0, 240, 2)}
        shared, got, errors = repipe.Stream(7, n, per), {}, []

        def ask(us):
            try:
                for u in us:
                    got[u] = shared.update(u).tolist()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=ask, args=(range(2 * k, 240, 4),)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(sum(got[u] != want[u] for u in want), 0)

    def test_stream_before_the_first_update(self):
        st = repipe.Stream(7, 100, 30)
        self.assertEqual(sorted(st.update(0)), sorted(set(st.update(0))))
        with self.assertRaisesRegex(repipe.Error, "update -1; updates count from 0"):
            st.update(-1)

    def test_wrong_arrays_are_refused_not_crashed_on(self):
        bad = [(self.x.astype(np.float64), self.y, "dtype float64, expected float32"),
               (self.x[:, ::-1], self.y, "not C-contiguous"),
               (self.x[:4], self.y, r"shape \(4, 6\), expected \(5, 6\)"),
               (self.x, self.y.astype(np.int64), "dtype int64, expected int32"),
               (self.x.tolist(), self.y, "expected a numpy array")]
        for x, y, msg in bad:
            with self.assertRaisesRegex(repipe.Error, msg):
                self.session.run(x, y)
        with self.assertRaisesRegex(repipe.Error, "label 7 of row 0 is not a class"):
            self.session.run(self.x, np.array([7, 0, 0, 0, 0], dtype=np.int32))

    def test_a_failed_session_says_so(self):
        """A call that failed part-way (a label that is no class) left its update half done:
        later runs are refused, naming that failure, rather than failing with its message as
        if the new data were bad; predictions still work."""
        with repipe.Session(self.model, repipe.Config(micro_batch_size=5)) as s:
            bad = self.y.copy()
            bad[3] = 10
            with self.assertRaisesRegex(repipe.Error, "label 10 of row 3 is not a class"):
                s.run(self.x, bad)
            for _ in range(2):
                with self.assertRaisesRegex(repipe.Error, r"the session failed in an earlier "
                                            r"call \(.*label 10 of row 3.*\): .*close it"):
                    s.run(self.x, self.y)
            self.assertEqual(s.predict(self.x).shape, (5,))


if __name__ == "__main__":
    unittest.main()
