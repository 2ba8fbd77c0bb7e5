"""The library (librepipe, found as the package says) and the C structures and functions
the other modules call, with the helpers that turn its statuses into repipe.Error."""
import ctypes
import ctypes.util
import os

import numpy as np


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
                ("profile_tensor", ctypes.c_void_p), ("tensor_parallel", ctypes.c_int),
                ("pipeline_stages", ctypes.c_int), ("one_worker_a_stage", ctypes.c_bool),
                ("no_sharding", ctypes.c_bool), ("no_recompute_by_layer", ctypes.c_bool),
                ("micro_batch", ctypes.c_int),
                ("schedules", ctypes.c_uint), ("cuts", ctypes.c_void_p),
                ("device_speed", ctypes.c_void_p), ("device_memory", ctypes.c_void_p)]


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

# rp_workplan (schedule.h): each worker's operations for one update, as rt.Pipeline's runner
# plays them


class _Op(ctypes.Structure):
    _fields_ = [("kind", _int), ("mb", _int), ("peer", _int), ("slot", _int)]


class _WorkerOps(ctypes.Structure):
    _fields_ = [("stage", _int), ("replica", _int), ("stage_replica", _int),
                ("tensor_rank", _int), ("num_ops", _int), ("ops", ctypes.POINTER(_Op)),
                ("slots", _int)]


class _Workplan(ctypes.Structure):
    _fields_ = [("workers", _int), ("stages", _int), ("w", ctypes.POINTER(_WorkerOps)),
                ("devices", _int), ("dev", _P), ("device_of", _P)]


# rp_op_kind, in schedule.h's order, held against the library's names of them below
(RECV_ACT, FORWARD, SEND_ACT, RECV_GRAD, BACKWARD, SEND_GRAD, WAIT_SENDS, REDUCE, STEP,
 BACKWARD_INPUT, BACKWARD_WEIGHT) = range(11)
_OP_NAMES = ("receive activation", "forward", "send activation", "receive gradient", "backward",
             "send gradient", "wait for sends", "reduce", "step", "backward (input)",
             "backward (weights)")

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
_workplan_build = _sig("rp_workplan_build", _int, _P, ctypes.POINTER(ctypes.POINTER(_Workplan)),
                       _E)
_workplan_check = _sig("rp_workplan_check", _int, ctypes.POINTER(_Workplan), _P, _E)
_workplan_free = _sig("rp_workplan_free", None, ctypes.POINTER(_Workplan))
_op_name = _sig("rp_op_name", ctypes.c_char_p, _int)
_stage_layers = _sig("rp_config_stage_layers", _int, _P, ctypes.c_bool, _int,
                     ctypes.POINTER(_int), _E)
_schedule_csv = _sig("rp_schedule_csv", _int, _P, ctypes.POINTER(ctypes.c_void_p), _E)


if ctypes.sizeof(_AutoplanOptions) != _autoplan_options_size():
    raise ImportError("repipe: this package does not match librepipe's rp_autoplan_options")
if tuple(_op_name(k).decode() for k in range(len(_OP_NAMES) + 1)) != _OP_NAMES + ("?",):
    raise ImportError("repipe: this package's operation kinds do not match librepipe's "
                      "rp_op_kind")


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
