"""PipeDream's planner from Python: repipe.plan and repipe.Plan."""
import ctypes
import json
import os

from ._lib import (
    Error, _AutoplanOptions, _Err, _PP, _autoplan_compute, _autoplan_options_default,
    _autoplan_size, _autoplan_to_json, _check, _config_apply_plan, _plan_compute,
    _plan_free, _plan_options_default, _plan_options_from_json, _plan_options_size,
    _plan_pipedream_conf, _plan_to_json, _profile_free, _profile_micro_batch,
    _profile_read, _take_string)
from .config import (
    Config)


# ---- planning -------------------------------------------------------------------------------

def _read_graph(path):
    """A graph.txt's node descriptions in node order, and the nodes nothing feeds."""
    desc, fed = {}, set()
    with open(path) as f:
        for line in f:
            if line.startswith("\t"):
                fed.add(line.split(" -- ")[1].strip())
            elif line.strip():
                parts = line.rstrip("\n").split(" -- ")
                desc[parts[0]] = " -- ".join(parts[1:-1])
    return desc, [n for n in desc if n not in fed]


def _runs(ranks):
    """[0, 1, 2, 5] as "0–2 and 5"."""
    runs = []
    for r in sorted(ranks):
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    words = ["%d" % a if a == b else "%d–%d" % (a, b) for a, b in runs]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


class Plan:
    """A plan of PipeDream's objective: .json holds what `repipe plan --json` writes."""

    def __init__(self, text, conf, profile, handles):
        self.json, self._text, self._conf = json.loads(text), text, conf
        self.profile = os.fspath(profile)
        self._graph = _read_graph(self.profile)  # for describe(), read while it is there
        self._prof, self._plan = handles  # freed with the Plan (set last: __init__ then holds)

    def __del__(self):
        if getattr(self, "_plan", None):
            _plan_free(self._plan)
            self._plan = None
        if getattr(self, "_prof", None):
            _profile_free(self._prof)
            self._prof = None

    def engine(self, global_batch=None, base=None, profile_batch=None, memory_size=0,
               max_accumulation=64, cores=0, backend="local", min_micro_batch=1,
               latency=2e-5, speed=None, memory=None):
        """The engine objective, as `repipe plan --objective engine --json` gives it: the
        configuration repipe's synchronous pipelines run fastest for global_batch samples per
        update, beside one worker, data parallelism, this plan run synchronously and the
        fastest pipelines under 1f1b and a zero-bubble schedule. Returns {"global_batch",
        "simulated", "best", "single", "data_parallel", "pipedream", "pipeline_1f1b",
        "pipeline_zero_bubble", "tensor_parallel", "pipeline_interleaved", "equal_devices"};
        each row has "found", "workers", "stages", "seconds_per_update", "samples_per_second",
        "worker_bytes" and "config", a Config (base's other keys kept) ready to save and run.

        profile_batch: the micro-batch the profile was measured on (default: the profile's
        own, as repipe.torch.profile writes it, else base's micro_batch_size). global_batch
        defaults to base's samples per update, else profile_batch x the machines.
        min_micro_batch: the smallest micro-batch tried (a model with batchnorm wants its
        statistics over more than a few samples). latency: seconds a message, as
        `repipe plan --latency`. speed and memory: devices of several kinds, a list with a
        value for every machine (in rank order) or for each machine of the outermost level,
        as `repipe plan --speed` and `--memory-size B1 B2 ...`; "equal_devices" is then the
        best plan for devices taken as equal, run on these."""
        cfg = Config._of(base)
        batch = profile_batch or _profile_micro_batch(self._prof) or (
            cfg.micro_batch_size if base is not None else 0)
        if not batch:
            raise Error("Plan.engine: the profile does not say its micro-batch; give "
                        "profile_batch, or a base whose micro_batch_size it was measured at")
        if backend not in ("local", "mpi"):
            raise Error("Plan.engine: backend %r: expected 'local' or 'mpi'" % (backend,))
        o = self.json["options"]
        opts = _AutoplanOptions()
        _autoplan_options_default(ctypes.byref(opts))
        opts.num_levels = len(o["machines"])
        for i, (m, b) in enumerate(zip(o["machines"], o["bandwidths"])):
            opts.machines[i], opts.bandwidth[i] = m, b
        opts.global_batch = int(global_batch or (cfg.derived["samples_per_update"]
                                                 if base is not None else
                                                 batch * self.json["machines_available"]))
        opts.memory_size = float(memory_size or cfg.device_memory)
        opts.max_accumulation, opts.cores = max_accumulation, cores
        opts.min_micro_batch = min_micro_batch
        opts.polling = backend == "mpi"
        if not latency >= 0:
            raise Error("Plan.engine: latency %r: expected seconds >= 0" % (latency,))
        opts.latency = float(latency)
        machines = 1
        for m in o["machines"]:
            machines *= m
        keep = []  # (the arrays the options point to, alive until the call returns)
        for name, values in (("device_speed", speed), ("device_memory", memory)):
            if values is None:
                continue
            values = [float(v) for v in values]
            outer = o["machines"][-1]
            if len(values) not in (machines, outer) or not all(v > 0 for v in values):
                raise Error("Plan.engine: %s: %d positive values, one for each of the %d "
                            "machines or of the outermost level's %d" %
                            ("speed" if name == "device_speed" else "memory", len(values),
                             machines, outer))
            per = [values[d if len(values) == machines else d // (machines // outer)]
                   for d in range(machines)]
            arr = (ctypes.c_double * machines)(*per)
            keep.append(arr)
            setattr(opts, name, ctypes.cast(arr, ctypes.c_void_p))
        profs = (ctypes.c_void_p * 1)(self._prof)
        batches = (ctypes.c_double * 1)(batch)
        out, err = ctypes.create_string_buffer(_autoplan_size()), _Err()
        _check(_autoplan_compute(ctypes.cast(profs, _PP), batches, 1, cfg._buf, self._plan,
                                 ctypes.byref(opts), out, ctypes.byref(err)), err)
        text = ctypes.c_void_p()
        _check(_autoplan_to_json(out, opts.global_batch, None, None, ctypes.byref(text),
                                 ctypes.byref(err)), err)
        result = json.loads(_take_string(text))
        for row in ("best", "single", "data_parallel", "pipedream", "pipeline_1f1b",
                    "pipeline_zero_bubble", "tensor_parallel", "pipeline_interleaved",
                    "equal_devices"):
            if result[row]["found"]:
                result[row]["config"] = Config(**result[row]["config"])
        return result

    def pipedream_conf(self):
        """PipeDream's hybrid_conf.json, as a dict."""
        return json.loads(self._conf)

    def config(self, base=None):
        """base (None, a path, a dict or a Config) with the plan's replication_factor,
        layers_per_stage and stage_replication: a Config for repipe's engine. The profile must
        be a chain of layers. Its batch keys stay base's; every stage replica must get
        micro-batches, so gradient_accumulation_steps must be a multiple of each stage's
        replication (repipe plan --objective engine chooses a batch as well)."""
        cfg, err, text = Config._of(base), _Err(), self._text.encode()
        _check(_config_apply_plan(cfg._buf, text, len(text), os.fsencode(self.profile),
                                  ctypes.byref(err)), err)
        ga = cfg.gradient_accumulation_steps
        for s, r in enumerate(self.json["execution_config"]["stage_replication"] or []):
            if ga % r:
                raise Error("Plan.config: stage %d has %d workers per pipeline but "
                            "gradient_accumulation_steps is %d; give a base whose "
                            "gradient_accumulation_steps is a multiple of %d, so that each "
                            "stage replica gets micro-batches" % (s, r, ga, r))
        return cfg

    def describe(self):
        """The plan in words: each stage's workers (PipeDream's ranks) and layers, and the
        predicted time per step, as `repipe plan` prints them."""
        j, (desc, sources) = self.json, self._graph
        stages = sorted(j["stage_to_rank_map"], key=int)
        lines = ["%d workers on %s machines (innermost level first), replica-major; PipeDream's"
                 " convert_graph_to_model.py --stage_to_num_ranks_map %s" % (
                     sum(j["stage_to_num_ranks"]), " x ".join(map(str, j["options"]["machines"])),
                     j["pipedream"]["stage_to_num_ranks_map"])]
        for s in stages:
            ranks = j["stage_to_rank_map"][s]
            nodes = sorted((n for n, st in j["node_stage"].items()
                            if st == int(s) and n not in sources), key=lambda n: int(n[4:]))
            lines.append("  stage %s: %d worker%s — rank%s %s" % (
                s, len(ranks), "" if len(ranks) == 1 else "s", "" if len(ranks) == 1 else "s",
                _runs(ranks)))
            if nodes:
                lines.append("    %d layer%s: %s ... %s" % (len(nodes), "" if len(nodes) == 1
                                                            else "s", desc[nodes[0]],
                                                            desc[nodes[-1]]))
        lines.append("predicted time per step: %.6f s; one machine %.6f s; data parallel "
                     "%.6f s; %.2fx one machine, %.2fx data parallel" % (
                         j["pipeline_time"], j["single_stage_time"], j["data_parallel_time"],
                         j["speedup_vs_single"], j["speedup_vs_dp"]))
        return "\n".join(lines)

    def __repr__(self):
        return "<repipe.Plan %s: %s>" % (
            self.profile, ", ".join("%d workers" % n for n in self.json["stage_to_num_ranks"]))


def plan(profile, machines, bandwidth=None, memory_size=16e9, memory_constraint=False,
         straight=False, fewer_machines=False, activation_compression=None):
    """Stages and replication for a profile (PipeDream's graph.txt) on machines (innermost
    level first, with a bandwidth in bytes/s per level): `repipe plan`'s numbers."""
    machines = list(machines)
    bandwidth = list(bandwidth) if bandwidth is not None else [1e9] * len(machines)
    options = json.dumps({"machines": machines, "bandwidths": bandwidth,
                          "memory_size": memory_size, "use_memory_constraint": memory_constraint,
                          "straight_pipeline": straight, "use_fewer_machines": fewer_machines,
                          "activation_compression_ratio": activation_compression}).encode()
    err = _Err()
    opts = ctypes.create_string_buffer(_plan_options_size())
    _plan_options_default(opts)
    _check(_plan_options_from_json(opts, options, len(options), b"plan()", ctypes.byref(err)), err)
    prof, p = ctypes.c_void_p(), ctypes.c_void_p()
    _check(_profile_read(ctypes.byref(prof), os.fsencode(profile), ctypes.byref(err)), err)
    try:
        _check(_plan_compute(prof, opts, ctypes.byref(p), ctypes.byref(err)), err)
        text, conf = ctypes.c_void_p(), ctypes.c_void_p()
        _check(_plan_to_json(p, prof, ctypes.byref(text), ctypes.byref(err)), err)
        text = _take_string(text)
        _check(_plan_pipedream_conf(p, ctypes.byref(conf), ctypes.byref(err)), err)
        return Plan(text, _take_string(conf), profile, (prof.value, p.value))
    except BaseException:
        if p:
            _plan_free(p)
        _profile_free(prof)
        raise
