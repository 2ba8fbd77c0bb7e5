"""repipe from Python: plan, configure and train through the C library.

A thin layer over librepipe (ctypes, numpy), in the C API's shapes:

    import repipe
    plan = repipe.plan("graph.txt", machines=[8, 2], bandwidth=[4e9, 2e9])
    cfg = repipe.Config.load("examples/fmnist.json")     # or repipe.Config(micro_batch_size=64)
    with repipe.Session(repipe.Model.load("examples/fmnist-mlp.model"), cfg) as s:
        losses = s.run(x, y)                               # numpy arrays, as the C side reads them
        w = s.weights()                                    # {"1.weight": array, ...}

Errors raise repipe.Error with the C side's message. Arrays cross the boundary
without a copy: they must already be C-contiguous float32 (inputs), int32
(labels) and int64 (sample ids); anything else is refused, not converted.

The library is found at $REPIPE_LIBRARY, beside an installed package
(PREFIX/lib), in the build tree (build/), or on the loader's path.
"""
import ctypes
import ctypes.util
import json
import os
import threading

import numpy as np

__all__ = ["Error", "Config", "Model", "Session", "Plan", "plan", "groups", "load_weights",
           "save_weights", "fashion_mnist", "Stream"]


class Error(Exception):
    """A failure the C library reported; the message is its own."""


# ---- the library and the structures Python reads -------------------------------------------

def _find_library():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("REPIPE_LIBRARY"),
                  os.path.join(here, "..", "..", "..", "librepipe.so.0"),  # PREFIX/lib/python3/...
                  os.path.join(here, "..", "..", "build", "librepipe.so.0"),  # the build tree
                  ctypes.util.find_library("repipe")]
    for c in candidates:
        if c and (os.path.exists(c) or c == candidates[-1]):
            return ctypes.CDLL(c)
    raise ImportError("repipe: librepipe.so.0 not found; set REPIPE_LIBRARY or build the library")


_lib = _find_library()
_ERROR_MAX = 1024
_NAME_MAX = 64
_MAX_DIMS = 4


class _Err(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("msg", ctypes.c_char * _ERROR_MAX)]


class _Shape(ctypes.Structure):
    _fields_ = [("ndim", ctypes.c_int), ("dim", ctypes.c_int * _MAX_DIMS)]


class _Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * _NAME_MAX), ("shape", _Shape), ("groups", ctypes.c_int),
                ("data", ctypes.POINTER(ctypes.c_float))]


class _Weights(ctypes.Structure):
    _fields_ = [("num_tensors", ctypes.c_int), ("tensors", ctypes.POINTER(_Tensor))]


class _Result(ctypes.Structure):
    _fields_ = [("ndim", ctypes.c_int), ("dims", ctypes.c_int * 3), ("count", ctypes.c_int),
                ("losses", ctypes.POINTER(ctypes.c_float))]


class _Model(ctypes.Structure):  # the leading fields of rp_model
    _fields_ = [("input", _Shape), ("num_layers", ctypes.c_int), ("layers", ctypes.c_void_p),
                ("num_vars", ctypes.c_int), ("vars", ctypes.c_void_p),
                ("num_params", ctypes.c_size_t), ("num_classes", ctypes.c_int),
                ("num_targets", ctypes.c_int)]


class _Derived(ctypes.Structure):
    _fields_ = [("stages", ctypes.c_int), ("inference_stages", ctypes.c_int),
                ("workers", ctypes.c_int), ("inference_workers", ctypes.c_int),
                ("samples_per_micro_batch", ctypes.c_longlong),
                ("samples_per_update", ctypes.c_longlong),
                ("samples_per_host_call", ctypes.c_longlong),
                ("inference_samples_per_step", ctypes.c_longlong),
                ("inference_samples_per_host_call", ctypes.c_longlong)]


_MAX_LEVELS = 8


class _AutoplanOptions(ctypes.Structure):
    _fields_ = [("num_levels", ctypes.c_int), ("machines", ctypes.c_int * _MAX_LEVELS),
                ("bandwidth", ctypes.c_double * _MAX_LEVELS), ("global_batch", ctypes.c_longlong),
                ("memory_size", ctypes.c_double), ("max_accumulation", ctypes.c_int),
                ("min_micro_batch", ctypes.c_int), ("candidates", ctypes.c_int), ("cores", ctypes.c_int),
                ("latency", ctypes.c_double), ("polling", ctypes.c_bool),
                ("tensor_split", ctypes.c_void_p), ("tensor_degrees", ctypes.c_uint),
                ("pipeline_stages", ctypes.c_int), ("one_worker_a_stage", ctypes.c_bool),
                ("schedules", ctypes.c_uint), ("cuts", ctypes.c_void_p)]


class _Grouping(ctypes.Structure):
    _fields_ = [("replicas", ctypes.c_int), ("group_size", ctypes.c_int), ("stride", ctypes.c_int)]


class _Dataset(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int), ("sample", _Shape), ("x", ctypes.POINTER(ctypes.c_float)),
                ("labels", ctypes.POINTER(ctypes.c_int32)), ("label_count", ctypes.c_int),
                ("num_classes", ctypes.c_int)]


class _Stream(ctypes.Structure):
    _fields_ = [("seed", ctypes.c_uint64), ("n", ctypes.c_int), ("per_update", ctypes.c_int),
                ("cached_epoch", ctypes.c_longlong), ("perm", ctypes.POINTER(ctypes.c_int32)),
                ("sequential", ctypes.c_bool)]


def _sig(name, res, *args):
    f = getattr(_lib, name)
    f.restype, f.argtypes = res, list(args)
    return f


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_E = ctypes.POINTER(_Err)
_c = ctypes.c_char_p
_int, _size, _ll = ctypes.c_int, ctypes.c_size_t, ctypes.c_longlong
_F = ctypes.POINTER(ctypes.c_float)
_I32 = ctypes.POINTER(ctypes.c_int32)
_I64 = ctypes.POINTER(ctypes.c_int64)

_config_size = _sig("rp_config_size", _size)
_config_load_file = _sig("rp_config_load_file", _int, _P, _c, _E)
_config_load_string = _sig("rp_config_load_string", _int, _P, _c, _size, _c, _E)
_config_derive = _sig("rp_config_derive", None, _P, ctypes.POINTER(_Derived))
_config_to_json = _sig("rp_config_to_json", _int, _P, ctypes.POINTER(ctypes.c_void_p), _E)
_config_save_file = _sig("rp_config_save_file", _int, _P, _c, _E)
_config_apply_plan = _sig("rp_config_apply_plan", _int, _P, _c, _size, _c, _E)
_free = ctypes.CDLL(None).free  # the C library's, which allocated what it frees
_free.restype, _free.argtypes = None, [_P]
_model_load = _sig("rp_model_load", _int, _PP, _c, _E)
_model_parse = _sig("rp_model_parse", _int, _PP, _c, _size, _c, _E)
_model_free = _sig("rp_model_free", None, _P)
_session_create = _sig("rp_session_create", _int, _P, _P, _PP, _E)
_session_free = _sig("rp_session_free", None, _P)
_session_per_call = _sig("rp_session_samples_per_call", _ll, _P)
_session_run = _sig("rp_session_run", _int, _P, _F, _I32, _I64, ctypes.POINTER(_Result), _E)
_session_predict = _sig("rp_session_predict", _int, _P, _F, _int, _I32, _E)
_session_get_weights = _sig("rp_session_get_weights", _int, _P, _int,
                            ctypes.POINTER(ctypes.POINTER(_Weights)), _E)
_session_set_weights = _sig("rp_session_set_weights", _int, _P, ctypes.POINTER(_Weights), _int, _E)
_session_loss = _sig("rp_session_loss", _int, _P, _F, _I32, _int,
                     ctypes.POINTER(ctypes.c_double), _E)
_weights_load = _sig("rp_weights_load", _int, ctypes.POINTER(ctypes.POINTER(_Weights)), _c, _E)
_weights_free = _sig("rp_weights_free", None, ctypes.POINTER(_Weights))
_weights_save = _sig("rp_weights_save", _int, ctypes.POINTER(_Weights), _c, _E)
_safetensors_load = _sig("rp_safetensors_load", _int, ctypes.POINTER(ctypes.POINTER(_Weights)),
                         _c, _E)
_safetensors_save = _sig("rp_safetensors_save", _int, ctypes.POINTER(_Weights), _c, _E)
_llama_names_of = _sig("rp_llama_names_of", ctypes.c_bool, ctypes.POINTER(_Weights),
                       ctypes.POINTER(ctypes.c_int))
_llama_import = _sig("rp_llama_import", _int, _P, ctypes.POINTER(_Weights), _int, _c, _F, _E)
_llama_export = _sig("rp_llama_export", _int, _P, _F, _int,
                     ctypes.POINTER(ctypes.POINTER(_Weights)), _E)
_grouping_init = _sig("rp_grouping_init", _int, ctypes.POINTER(_Grouping), _int, _int, _int, _E)
_grouping_popxl = _sig("rp_grouping_popxl", _int, ctypes.POINTER(_Grouping), _int,
                       ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), _E)
_grouping_group_of = _sig("rp_grouping_group_of", _int, ctypes.POINTER(_Grouping), _int)
_profile_read = _sig("rp_profile_read", _int, _PP, _c, _E)
_profile_free = _sig("rp_profile_free", None, _P)
_weights_to_params = _sig("rp_weights_to_params", _int, _P, ctypes.POINTER(_Weights), _int, _F, _E)
_weights_from_params = _sig("rp_weights_from_params", _int, _P, _F,
                            ctypes.POINTER(ctypes.POINTER(_Weights)), _E)
_model_check_tokens = _sig("rp_model_check_tokens", _int, _P, _c, _E)
_model_generate = _sig("rp_model_generate", _int, _P, _F, _I32, _int, _int, ctypes.c_double, _int,
                       ctypes.c_uint64, _E)
_profile_measure = _sig("rp_profile_measure", _int, _P, _int, _int, _PP, _E)
_profile_measure_alone = _sig("rp_profile_measure_alone", _int, _P, _int, _int, _PP, _E)
_profile_write = _sig("rp_profile_write", _int, _P, ctypes.POINTER(ctypes.c_int), _c, _E)
_plan_options_size = _sig("rp_plan_options_size", _size)
_plan_options_default = _sig("rp_plan_options_default", None, _P)
_plan_options_from_json = _sig("rp_plan_options_from_json", _int, _P, _c, _size, _c, _E)
_plan_compute = _sig("rp_plan_compute", _int, _P, _P, _PP, _E)
_plan_to_json = _sig("rp_plan_to_json", _int, _P, _P, ctypes.POINTER(ctypes.c_void_p), _E)
_plan_pipedream_conf = _sig("rp_plan_pipedream_conf", _int, _P, ctypes.POINTER(ctypes.c_void_p), _E)
_plan_free = _sig("rp_plan_free", None, _P)
_profile_micro_batch = _sig("rp_profile_micro_batch", _int, _P)
_autoplan_options_size = _sig("rp_autoplan_options_size", _size)
_autoplan_size = _sig("rp_autoplan_size", _size)
_autoplan_options_default = _sig("rp_autoplan_options_default", None, _P)
_autoplan_compute = _sig("rp_autoplan_compute", _int, _PP, ctypes.POINTER(ctypes.c_double), _int,
                         _P, _P, _P, _P, _E)
_autoplan_to_json = _sig("rp_autoplan_to_json", _int, _P, _ll, _P, _P,
                         ctypes.POINTER(ctypes.c_void_p), _E)
_dataset_load_idx = _sig("rp_dataset_load_idx", _int, ctypes.POINTER(ctypes.POINTER(_Dataset)),
                         _c, ctypes.c_bool, _E)
_dataset_free = _sig("rp_dataset_free", None, ctypes.POINTER(_Dataset))
_stream_init = _sig("rp_stream_init", _int, ctypes.POINTER(_Stream), ctypes.c_uint64, _int, _int, _E)
_stream_free = _sig("rp_stream_free", None, ctypes.POINTER(_Stream))
_stream_update = _sig("rp_stream_update", _int, ctypes.POINTER(_Stream), _ll, _I64, _E)


if ctypes.sizeof(_AutoplanOptions) != _autoplan_options_size():
    raise ImportError("repipe: this package does not match librepipe's rp_autoplan_options")


__version__ = _sig("rp_version", ctypes.c_char_p)().decode()  # the library's


def _check(status, err):
    if status != 0:
        raise Error(err.msg.decode("utf-8", "replace"))


def _take_string(ptr):
    """A malloc'd C string, read and freed."""
    try:
        return ctypes.string_at(ptr.value).decode()
    finally:
        _free(ptr)


def _array(a, dtype, what, shape=None):
    """a as the C side reads it, or Error: the right dtype, C-contiguous, the shape."""
    if not isinstance(a, np.ndarray):
        raise Error("%s: expected a numpy array, got %s" % (what, type(a).__name__))
    if a.dtype != dtype:
        raise Error("%s: dtype %s, expected %s (arrays are not converted)" % (what, a.dtype,
                                                                             np.dtype(dtype)))
    if not a.flags["C_CONTIGUOUS"]:
        raise Error("%s: not C-contiguous (np.ascontiguousarray makes it so)" % what)
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise Error("%s: shape %s, expected %s" % (what, tuple(a.shape), tuple(shape)))
    return a


def _ptr(a, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


# ---- configurations -------------------------------------------------------------------------

class Config:
    """An execution configuration (IPUConfig's vocabulary): Config.load(path) or Config(**keys).
    Its keys read as attributes (cfg.micro_batch_size); cfg.replace(**keys) gives a changed
    copy, validated again; cfg.save(path) writes it for `repipe train --config`."""

    def __init__(self, **keys):
        self._buf = ctypes.create_string_buffer(_config_size())
        text = json.dumps(keys).encode()
        err = _Err()
        _check(_config_load_string(self._buf, text, len(text), b"Config(...)", ctypes.byref(err)),
               err)

    @classmethod
    def load(cls, path):
        c = cls.__new__(cls)
        c._buf = ctypes.create_string_buffer(_config_size())
        err = _Err()
        _check(_config_load_file(c._buf, os.fsencode(path), ctypes.byref(err)), err)
        return c

    @classmethod
    def _of(cls, base):
        """A new configuration from base: None (the defaults), a path, a dict or a Config."""
        if base is None:
            return cls()
        if isinstance(base, dict):
            return cls(**base)
        if isinstance(base, Config):
            c = cls.__new__(cls)
            c._buf = ctypes.create_string_buffer(base._buf.raw, len(base._buf))  # a flat struct
            return c
        return cls.load(base)

    @property
    def derived(self):
        """Workers, samples per micro-batch, update and host call, as `repipe config show`."""
        d = _Derived()
        _config_derive(self._buf, ctypes.byref(d))
        return {name: getattr(d, name) for name, _ in _Derived._fields_}

    def to_dict(self):
        out, err = ctypes.c_void_p(), _Err()
        _check(_config_to_json(self._buf, ctypes.byref(out), ctypes.byref(err)), err)
        return json.loads(_take_string(out))

    def __getattr__(self, key):
        if key.startswith("_"):
            raise AttributeError(key)
        d = self.to_dict()
        if key not in d:
            raise AttributeError("Config has no key %r (docs/configuration.md)" % key)
        return d[key]

    def replace(self, **keys):
        """A copy with these keys changed, through the C side's validation."""
        return Config(**dict(self.to_dict(), **keys))

    def save(self, path):
        err = _Err()
        _check(_config_save_file(self._buf, os.fsencode(path), ctypes.byref(err)), err)
        return path

    def __eq__(self, other):
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return "repipe.Config(%s)" % ", ".join("%s=%r" % kv for kv in self.to_dict().items())


def groups(replicas, group_size=None, stride=None):
    """PopXL's ir.replica_grouping(stride, group_size) on `replicas` replicas: the
    group of each replica, as a list (PopXL's assignment). Not given, the
    stride is 1 and the group size replicas / stride."""
    g, err = _Grouping(), _Err()
    ref = lambda v: None if v is None else ctypes.byref(ctypes.c_int(v))
    _check(_grouping_popxl(ctypes.byref(g), replicas, ref(stride), ref(group_size),
                           ctypes.byref(err)), err)
    return [_grouping_group_of(ctypes.byref(g), r) for r in range(replicas)]


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
               latency=2e-5):
        """The engine objective, as `repipe plan --objective engine --json` gives it: the
        configuration repipe's synchronous pipelines run fastest for global_batch samples per
        update, beside one worker, data parallelism, this plan run synchronously and the
        fastest pipelines under 1f1b and a zero-bubble schedule. Returns {"global_batch",
        "simulated", "best", "single", "data_parallel", "pipedream", "pipeline_1f1b",
        "pipeline_zero_bubble", "tensor_parallel", "pipeline_interleaved"}; each row
        has "found", "workers", "stages", "seconds_per_update", "samples_per_second",
        "worker_bytes" and "config", a Config (base's other keys kept) ready to save and run.

        profile_batch: the micro-batch the profile was measured on (default: the profile's
        own, as repipe.torch.profile writes it, else base's micro_batch_size). global_batch
        defaults to base's samples per update, else profile_batch x the machines.
        min_micro_batch: the smallest micro-batch tried (a model with batchnorm wants its
        statistics over more than a few samples). latency: seconds a message, as
        `repipe plan --latency`."""
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
                    "pipeline_zero_bubble", "tensor_parallel", "pipeline_interleaved"):
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


# ---- models, sessions, weights --------------------------------------------------------------

class Model:
    """A model spec: Model.load(path) or Model.parse(text)."""

    def __init__(self, handle):
        self._h = handle

    @classmethod
    def load(cls, path):
        h, err = ctypes.c_void_p(), _Err()
        _check(_model_load(ctypes.byref(h), os.fsencode(path), ctypes.byref(err)), err)
        return cls(h)

    @classmethod
    def parse(cls, text, name="model"):
        h, err, b = ctypes.c_void_p(), _Err(), text.encode()
        _check(_model_parse(ctypes.byref(h), b, len(b), name.encode(), ctypes.byref(err)), err)
        return cls(h)

    @property
    def _m(self):
        return ctypes.cast(self._h, ctypes.POINTER(_Model)).contents

    @property
    def input_shape(self):
        s = self._m.input
        return tuple(s.dim[i] for i in range(s.ndim))

    @property
    def num_params(self):
        return self._m.num_params

    @property
    def targets(self):
        """Labels per sample: 1, or T for a token model."""
        return self._m.num_targets

    def generate(self, weights, prompt, n=256, temperature=1.0, top_k=40, seed=1):
        """Continues prompt by n tokens drawn from a token model with these weights
        ({name: float32 array}, as Session.weights() or load_weights() give them), as
        `repipe generate` does: scores divided by temperature (0: the most likely token), the
        top_k most likely (0: all), draws from seed's stream. prompt: bytes or str (UTF-8;
        returns bytes) or token ids (returns an int32 array of prompt and continuation)."""
        err = _Err()
        _check(_model_check_tokens(self._h, b"generate", ctypes.byref(err)), err)
        text = isinstance(prompt, (str, bytes))
        ids = np.frombuffer(prompt.encode() if isinstance(prompt, str) else prompt,
                            dtype=np.uint8) if text else _array(prompt, np.int32, "prompt")
        if ids.ndim != 1 or ids.size == 0:
            raise Error("prompt: give at least one token")
        tokens = np.empty(ids.size + n, dtype=np.int32)
        tokens[:ids.size] = ids
        params = self._params(weights)
        _check(_model_generate(self._h, _ptr(params, ctypes.c_float),
                               _ptr(tokens, ctypes.c_int32), ids.size, n, temperature, top_k,
                               seed, ctypes.byref(err)), err)
        if text:
            if tokens.max(initial=0) > 255:
                raise Error("generate: a vocabulary of more than 256 tokens does not give bytes;"
                            " pass the prompt as token ids")
            return tokens.astype(np.uint8).tobytes()
        return tokens

    def _params(self, weights):
        """The flat parameters of {name: array} (each variable present with its shape)."""
        tensors, err = _tensors(weights), _Err()
        w = _Weights(len(tensors), tensors)
        params = np.empty(max(self.num_params, 1), dtype=np.float32)
        _check(_weights_to_params(self._h, ctypes.byref(w), 0, _ptr(params, ctypes.c_float),
                                  ctypes.byref(err)), err)
        return params

    def profile(self, out="graph.txt", micro_batch=64, repeats=20, alone=False):
        """Measures each layer on micro_batch rows (the median of `repeats` runs; inside whole
        passes of the model, or each alone with alone=True) and writes the planner's graph.txt
        to `out`, as `repipe profile` does. Returns the path."""
        p, err = ctypes.c_void_p(), _Err()
        measure = _profile_measure_alone if alone else _profile_measure
        _check(measure(self._h, micro_batch, repeats, ctypes.byref(p), ctypes.byref(err)), err)
        try:
            _check(_profile_write(p, None, os.fsencode(out), ctypes.byref(err)), err)
        finally:
            _profile_free(p)
        return out

    def __del__(self):
        if getattr(self, "_h", None):
            _model_free(self._h)
            self._h = None


def _model_weights(model, params):
    """{name: array} of a model's flat parameters."""
    w, err = ctypes.POINTER(_Weights)(), _Err()
    _check(_weights_from_params(model._h, _ptr(params, ctypes.c_float), ctypes.byref(w),
                                ctypes.byref(err)), err)
    try:
        return _weights_dict(w)
    finally:
        _weights_free(w)


def _weights_dict(w, all_replicas=False):
    """{name: array}: a tensor with several copies (groups, or replicas) gets a leading axis."""
    out = {}
    for i in range(w.contents.num_tensors):
        t = w.contents.tensors[i]
        shape = tuple(t.shape.dim[k] for k in range(t.shape.ndim))
        n = t.groups * int(np.prod(shape))
        a = np.ctypeslib.as_array(t.data, shape=(n,)).copy()
        out[t.name.decode()] = a.reshape(((t.groups,) if t.groups > 1 or all_replicas else ())
                                         + shape)
    return out


def _tensors(weights, shapes=None):
    """{name: float32 array} as rp_tensors that point into the arrays (kept alive by the
    caller's dict). An array with one axis more than its tensor's shape in `shapes` holds a
    copy per group (or replica) along its first axis."""
    arrays = {k: _array(v, np.float32, "weights[%r]" % k) for k, v in weights.items()}
    tensors = (_Tensor * len(arrays))()
    for t, (name, a) in zip(tensors, arrays.items()):
        lead = shapes is not None and name in shapes and a.ndim == len(shapes[name]) + 1
        shape = a.shape[1:] if lead else a.shape
        if len(shape) > _MAX_DIMS:
            raise Error("weights[%r]: %d dimensions, at most %d" % (name, len(shape), _MAX_DIMS))
        t.name = name.encode()
        t.shape.ndim = len(shape)
        for i, d in enumerate(shape):
            t.shape.dim[i] = d
        t.groups = a.shape[0] if lead else 1
        t.data = _ptr(a, ctypes.c_float)
    return tensors


def _tensor_shapes(h):
    """{name: shape} of a session's tensors, without their group axis."""
    w, err = ctypes.POINTER(_Weights)(), _Err()
    _check(_session_get_weights(h, 0, ctypes.byref(w), ctypes.byref(err)), err)
    try:
        return {t.name.decode(): tuple(t.shape.dim[k] for k in range(t.shape.ndim))
                for t in (w.contents.tensors[i] for i in range(w.contents.num_tensors))}
    finally:
        _weights_free(w)


def _mode(mode):
    modes = {"one_per_group": 0, "all_replicas": 1}
    if mode not in modes:
        raise Error("mode %r: expected 'one_per_group' or 'all_replicas'" % (mode,))
    return modes[mode]


def _is_safetensors(path):
    return os.fspath(path).endswith(".safetensors")


def load_weights(path):
    """A weight file (or a checkpoint's weights) as {name: array}; a file whose name ends in
    .safetensors is read as one (F32, F16, BF16 or F64 tensors, as float32, under its own
    names)."""
    w, err = ctypes.POINTER(_Weights)(), _Err()
    load = _safetensors_load if _is_safetensors(path) else _weights_load
    _check(load(ctypes.byref(w), os.fsencode(path), ctypes.byref(err)), err)
    try:
        return _weights_dict(w)
    finally:
        _weights_free(w)


def save_weights(path, weights):
    """Writes {name: float32 array} as a weight file, each array one tensor of its shape
    (written to a temporary file, synced and renamed, as the C side writes them); a name
    ending in .safetensors writes that format (float32, in the dict's order)."""
    tensors = _tensors(weights)
    w, err = _Weights(len(tensors), tensors), _Err()
    save = _safetensors_save if _is_safetensors(path) else _weights_save
    _check(save(ctypes.byref(w), os.fsencode(path), ctypes.byref(err)), err)


_LLAMA_NAMES = {"meta": 0, "hf": 1}


def _llama_names(names):
    if names not in _LLAMA_NAMES:
        raise Error("names %r: expected 'meta' or 'hf'" % (names,))
    return _LLAMA_NAMES[names]


def from_llama(model, state, names=None):
    """repipe's weights ({"0.weight": array, ...}) of a LLaMA-family model from a state_dict
    under Meta's names (names="meta": {"tok_embeddings.weight": array, ...}) or Hugging
    Face's ("hf": {"model.embed_tokens.weight": ...}, each head's Q and K rows in its rotary
    order); None: by the state's embedding. state: as load_weights gives a .safetensors file,
    or numpy arrays of a torch state_dict. Q, K and V are joined into the model's fused rows;
    every tensor must fit, and none may be left over."""
    tensors = _tensors(state)
    w, err = _Weights(len(tensors), tensors), _Err()
    found = ctypes.c_int(0)  # by the embedding the state holds, as the C side tells it
    scheme = (found.value if _llama_names_of(ctypes.byref(w), ctypes.byref(found)) else 0) \
        if names is None else _llama_names(names)
    params = np.zeros(max(model.num_params, 1), np.float32)
    _check(_llama_import(model._h, ctypes.byref(w), scheme, b"state_dict",
                         _ptr(params, ctypes.c_float), ctypes.byref(err)), err)
    return _model_weights(model, params)


def to_llama(model, weights, names="meta"):
    """A LLaMA-family model's weights (repipe's names) under Meta's names ("meta") or Hugging
    Face's ("hf"), in the order of that scheme's state_dict: what from_llama reads."""
    scheme = _llama_names(names)
    params = model._params(weights)
    out, err = ctypes.POINTER(_Weights)(), _Err()
    _check(_llama_export(model._h, _ptr(params, ctypes.c_float), scheme, ctypes.byref(out),
                         ctypes.byref(err)), err)
    try:
        return _weights_dict(out)
    finally:
        _weights_free(out)


class Session:
    """Workers running a model under a configuration, on threads (the local backend).

    A session serves one call at a time: calls from several threads wait their turn (the
    workers are one set), and close() waits for the call under way. After close() every
    call raises Error."""

    def __init__(self, model, config):
        self.model, self.config = model, config  # the C side reads both while it lives
        self._lock = threading.Lock()
        self._h, err = ctypes.c_void_p(), _Err()
        _check(_session_create(model._h, config._buf, ctypes.byref(self._h), ctypes.byref(err)),
               err)
        self.samples_per_call = _session_per_call(self._h)
        self._next_id = 0
        self._shapes = _tensor_shapes(self._h)

    def _rows(self, x, n=None):
        """x as n rows (any number when n is None) of the model's input, float32."""
        x = _array(x, np.float32, "x", None if n is None else (n,) + self.model.input_shape)
        if tuple(x.shape[1:]) != self.model.input_shape:
            raise Error("x: shape %s, expected (n,) + %s" % (tuple(x.shape),
                                                             self.model.input_shape))
        return x

    def _labels(self, y, n):
        """y as the labels of n rows, int32: one each, or T for a token model."""
        T = self.model.targets
        return _array(y, np.int32, "y", (n,) if T == 1 else (n, T))

    def run(self, x, y, ids=None):
        """One host call: x (samples_per_call, *input) float32, y (samples_per_call[, T])
        int32, ids int64 (default: consecutive numbers). Returns the losses."""
        with self._lock:
            self._open()
            n = self.samples_per_call
            x, y = self._rows(x, n), self._labels(y, n)
            if ids is None:
                ids = np.arange(self._next_id, self._next_id + n, dtype=np.int64)
                self._next_id += n
            ids = _array(ids, np.int64, "ids", (n,))
            res, err = _Result(), _Err()
            _check(_session_run(self._h, _ptr(x, ctypes.c_float), _ptr(y, ctypes.c_int32),
                                _ptr(ids, ctypes.c_int64), ctypes.byref(res),
                                ctypes.byref(err)), err)
            dims = tuple(res.dims[i] for i in range(res.ndim))
            return np.ctypeslib.as_array(res.losses, shape=(res.count,)).copy().reshape(dims)

    def predict(self, x):
        """The predicted class of each row of x (n, *input) float32."""
        with self._lock:
            self._open()
            x = self._rows(x)
            pred, err = np.empty(x.shape[0], dtype=np.int32), _Err()
            _check(_session_predict(self._h, _ptr(x, ctypes.c_float), x.shape[0],
                                    _ptr(pred, ctypes.c_int32), ctypes.byref(err)), err)
            return pred

    def loss(self, x, y):
        """The mean loss of rows x with labels y, on replica 0's weights (a validation loss;
        per token for a token model)."""
        with self._lock:
            self._open()
            x = self._rows(x)
            n = x.shape[0]
            y = self._labels(y, n)
            mean, err = ctypes.c_double(), _Err()
            _check(_session_loss(self._h, _ptr(x, ctypes.c_float), _ptr(y, ctypes.c_int32), n,
                                 ctypes.byref(mean), ctypes.byref(err)), err)
            return mean.value

    def weights(self, mode="one_per_group"):
        """{name: array}: in "one_per_group" mode a tensor of a grouping with G > 1 groups has a
        leading dimension G (each group's value); in "all_replicas" mode every tensor has a
        leading dimension R, the replicas in order (PopXL's retrieval modes)."""
        with self._lock:
            self._open()
            m, w, err = _mode(mode), ctypes.POINTER(_Weights)(), _Err()
            _check(_session_get_weights(self._h, m, ctypes.byref(w), ctypes.byref(err)), err)
            try:
                return _weights_dict(w, all_replicas=m == 1)
            finally:
                _weights_free(w)

    def set_weights(self, weights, mode="one_per_group"):
        """Replaces weights from {name: float32 array}: an array of the tensor's own shape sets
        every group (every replica); one with a leading dimension sets each group, or in
        "all_replicas" mode each replica (refused where a group's replicas would differ)."""
        with self._lock:
            self._open()
            m, tensors = _mode(mode), _tensors(weights, self._shapes)
            w, err = _Weights(len(tensors), tensors), _Err()
            _check(_session_set_weights(self._h, ctypes.byref(w), m, ctypes.byref(err)), err)

    def _open(self):
        if not self._h:
            raise Error("the session is closed")

    def close(self):
        """Stops the workers and frees the session, after the call under way if any."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before it
            return
        with lock:
            if self._h:
                _session_free(self._h)
                self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


# ---- data -----------------------------------------------------------------------------------

def fashion_mnist(directory="/usr/share/datasets/fashion-mnist", train=True):
    """IDX images and labels (Debian's dataset-fashion-mnist by default) as (x, y) arrays:
    x float32 (n, 1, 28, 28) scaled to [0, 1], y int32, as `repipe train` reads them."""
    d, err = ctypes.POINTER(_Dataset)(), _Err()
    _check(_dataset_load_idx(ctypes.byref(d), os.fsencode(directory), train, ctypes.byref(err)),
           err)
    try:
        s = d.contents.sample
        shape = tuple(s.dim[i] for i in range(s.ndim))
        n = d.contents.n
        x = np.ctypeslib.as_array(d.contents.x, shape=(n * int(np.prod(shape)),)).copy()
        y = np.ctypeslib.as_array(d.contents.labels, shape=(n,)).copy()
        return x.reshape((n,) + shape), y
    finally:
        _dataset_free(d)


class Stream:
    """`repipe train`'s sample order: epoch e is a permutation fixed by (seed, e); update u
    takes the next per_update samples of its epoch (indices into the dataset)."""

    def __init__(self, seed, n, per_update, sequential=False):
        self._s, err = _Stream(), _Err()
        _check(_stream_init(ctypes.byref(self._s), seed, n, per_update, ctypes.byref(err)), err)
        self._s.sequential = sequential
        self.per_update = per_update
        # the C stream reshuffles its permutation in place when the epoch changes: calls
        # from several threads take turns, or one would read another's half-made epoch
        self._lock = threading.Lock()

    def update(self, u):
        idx, err = np.empty(self.per_update, dtype=np.int64), _Err()
        with self._lock:
            _check(_stream_update(ctypes.byref(self._s), u, _ptr(idx, ctypes.c_int64),
                                  ctypes.byref(err)), err)
        return idx

    def __del__(self):
        if getattr(self, "_s", None) is not None:
            _stream_free(ctypes.byref(self._s))
            self._s = None
