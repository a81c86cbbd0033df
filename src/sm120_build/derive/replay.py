"""Replay what sglang asks FlashInfer and its own jit_kernel for, for one served configuration,
on the CPU. Run as a script, by the Python of an environment that holds sglang's
dependencies, with the patched sglang and FlashInfer trees first on sys.path:

    python replay.py '{"model": DIR, "server_args": {...}, "arch": [12, 0]}'

It prints one JSON object: the server arguments sglang resolved, every FlashInfer JIT
generator call and sglang JIT loader call the replay reached, with its arguments, where the
generator is defined and where sglang asked for it, and the Triton kernels and DeepGEMM
functions it reached.

What runs is sglang's own code: ServerArgs' resolution (__post_init__), ModelConfig, the
quantization config of the model, the model's constructor (on the meta device: shapes
only), ModelRunner's KV-cache dtype and memory-pool setup and its attention-backend choice,
the backend's plan calls for decode and extend batches (and, with speculative decoding, the
verify step over a draft tree), the KV pool's store, the model's RoPE and QK-norm calls, each
kind of linear layer's quantization method, the first MoE block and the fused allreduce.
What stands in for what this machine lacks, and nothing else:

- the GPU: torch and FlashInfer are told of a device of the requested compute capability
  with 96 GB (an RTX PRO 6000); tensors the code puts on it or pins live in host memory,
  Tensor.cuda() keeps a tensor where it is, CUDA streams and events are inert, and ops sglang
  registers for the GPU run on host tensors too; a libcuda.so.1 that reports no device lets
  sgl_kernel's extension load (derive/__init__.py);
- the process groups: rank 0 of a tensor-parallel group of the requested size;
- the KV-cache capacity: 256 tokens, since only shapes and dtypes choose kernels;
- compilation and kernel launches: FlashInfer's generators (flashinfer...gen_*_module) and
  sglang's JIT loaders (sglang.jit_kernel..._jit_*_module) record their call instead of
  compiling, and return modules whose functions do nothing; Triton launches are recorded
  and do nothing; DeepGEMM's calls are recorded, then run (both compile on the node at first
  use, outside any wheel: FIRST_USE). A step that fails past a recorded request (a stand-in
  returned nothing, or the step needs a real device) is reported on stderr and the replay
  goes on; one that fails before any request is UNREACHED, and fails the configuration;
- the arch check: each FlashInfer generator the replay records is also called, as the build
  will call it (it makes the module's spec and sources, nothing compiles); one that raises
  for this arch is UNAVAILABLE, and the configuration is not servable on it.

This file imports nothing of sm120_build: it runs in another Python.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import json
import sys
import traceback
import types
from types import SimpleNamespace
from typing import Any

REQUESTED: dict[str, dict[str, Any]] = {}
# FlashInfer generator calls that raise for the configuration's arch (FlashInfer's own arch
# filters, such as get_nvcc_flags_list(supported_major_versions=[10])): sglang asks for a
# module no build can make for this GPU, so the configuration is not servable there.
UNAVAILABLE: dict[str, dict[str, Any]] = {}
_GENERATING: list[str] = []  # the generator call being made for real, if any
# Steps that raised before asking for any kernel: what they would have asked for is unknown,
# so the configuration's profile cannot be called complete (derive/__init__.py fails it).
UNREACHED: list[dict[str, str]] = []
_ASKED = [0]  # kernel requests so far (modules, Triton launches, DeepGEMM calls)
# The package of sglang's own JIT kernels, whose _jit_*_module loaders call load_jit:
# sglang.jit_kernel up to 0.5.10, sglang.kernels from 0.5.11 (_kernels_package finds it).
_SGLANG_KERNELS = "sglang.jit_kernel"


def _kernels_package() -> str:
    """Where this sglang's load_jit lives, as the package of its kernels: the first two
    parts of its module's name."""
    for candidate in ("sglang.jit_kernel.utils", "sglang.kernels.jit.utils.compile.loader"):
        try:
            module = importlib.import_module(candidate)
        except ImportError:
            continue
        if hasattr(module, "load_jit"):
            return ".".join(module.load_jit.__module__.split(".")[:2])
    raise RuntimeError("this sglang has no load_jit where the replay knows to look")


@contextlib.contextmanager
def _step(name: str) -> Any:
    """One step of the replay. Past its first kernel request, an error is the stand-ins'
    (a stand-in kernel returned nothing; the step needs a real device): it is reported on
    stderr and the replay goes on. Before any request, the step never reached its kernels:
    recorded in UNREACHED, with where it stopped."""
    asked = _ASKED[0]
    try:
        yield
    except Exception as exc:
        print(f"{name}: {exc!r}", file=sys.stderr)
        traceback.print_exc(limit=-8)  # where it stopped, for whoever reads stderr
        # An op of sgl_kernel's with no meta kernel: the step reached a prebuilt kernel,
        # which nothing compiles on the node.
        prebuilt = "sgl_kernel::" in str(exc)
        if _ASKED[0] == asked and not prebuilt:
            frames = traceback.extract_tb(exc.__traceback__)
            where = _where(frames[-1].filename, frames[-1].lineno or 0) if frames else "?"
            UNREACHED.append({"step": name, "error": f"{type(exc).__name__}: {exc}", "at": where})


# What compiles on the node at first use outside FlashInfer's and sglang's JIT, which no
# wheel of ours can carry: Triton kernels (Triton's own JIT and ptxas) and DeepGEMM's ops
# (DeepGEMM's JIT, with nvcc or NVRTC).
FIRST_USE: dict[str, dict[str, Any]] = {}
_REAL: dict[str, Any] = {}  # originals replaced, kept to find their other references


def _virtual_gpu(arch: tuple[int, int]) -> None:
    import torch

    class Properties:
        name = "virtual SM{}{} (sm120-build derive)".format(*arch)
        major, minor = arch
        total_memory = 96 * 2**30
        multi_processor_count = 188
        is_integrated = False  # a discrete GPU: its free memory is mem_get_info's
        # Shared memory per SM and per block (opt-in), which FlashInfer's MLA plan checks
        # its tiles against: CUDA's table of compute capabilities (12.x: 100 KB and 99 KB;
        # 9.0 and 10.x: 228 KB and 227 KB).
        shared_memory_per_multiprocessor = (100 if arch[0] == 12 else 228) * 1024
        shared_memory_per_block_optin = (99 if arch[0] == 12 else 227) * 1024

    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: arch
    torch.cuda.device_count = lambda: 8
    torch.cuda.get_device_name = lambda device=None: Properties.name
    torch.cuda.get_device_properties = lambda device=None: Properties()
    torch.cuda.mem_get_info = lambda device=None: (95 * 2**30, 96 * 2**30)
    torch.cuda.current_device = lambda: 0
    torch.cuda.set_device = lambda device: None
    # `with torch.cuda.device(tensor.device)`: the tensors are the host's or meta
    torch.cuda.device = lambda device: contextlib.nullcontext()

    class Stream:  # streams and events the constructors make for overlap; never waited on here
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    torch.cuda.Stream = Stream
    torch.cuda.Event = Stream

    class NoDevice(ValueError):
        """What needs the device itself: cuDNN's plan for mm_fp4's backend check. FlashInfer's
        automatic backend choice skips a backend whose check raises a ValueError
        (flashinfer/utils.py:1088) and loads the module of every other suitable one
        (gemm/gemm_base.py:2945), so the others are still recorded."""

    def current_stream(device: Any = None) -> Any:
        raise NoDevice("the replay has no device")

    torch.cuda.current_stream = current_stream

    def on_host(factory: Any) -> Any:
        @functools.wraps(factory)
        def make(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            if str(kwargs.get("device")).startswith("cuda"):
                # As if no device were given: the ambient one decides, the meta device
                # inside the model's constructor (weights stay shapes), the host elsewhere.
                del kwargs["device"]
            made = factory(*args, **kwargs)
            if factory.__name__.startswith("empty") and made.device.type == "cpu":
                # What a stand-in kernel never fills (the KV index arrays Triton computes)
                # holds zeros, valid indices, not whatever the memory held before.
                made.zero_()
            return made

        return make

    # torch.device("meta") as a context sets the device of the factories it knows, a set it
    # builds from torch.empty & co. at first use: build it now, from the real ones, or it
    # would hold these wrappers, miss the real factories they call, and every weight would
    # land on the host.
    import torch.utils._device

    torch.utils._device._device_constructors()
    for name in ("empty", "zeros", "ones", "full", "arange", "tensor", "empty_like", "zeros_like"):
        setattr(torch, name, on_host(getattr(torch, name)))

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    to_device = torch.Tensor.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:  # .to("cuda"): stays where it is
        args = tuple(a for a in args if not str(a).startswith("cuda"))
        if str(kwargs.get("device")).startswith("cuda"):
            del kwargs["device"]
        if not args and not set(kwargs) - {"non_blocking", "copy"}:
            return self
        return to_device(self, *args, **kwargs)

    torch.Tensor.to = to

    # Custom ops registered for the GPU (sglang's jit_kernel wrappers) run on host tensors too:
    # their implementation asks for the JIT module first, which is what is recorded. On the
    # meta device they run their implementation too, not their shape function, so that the
    # kernels behind them (the Triton fused MoE) are seen.
    register, register_fake = torch.library.Library.impl, torch.library.Library._register_fake
    implementations: dict[str, Any] = {}

    def impl(
        self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *args: Any, **kwargs: Any
    ) -> Any:
        result = register(self, op_name, fn, dispatch_key, *args, **kwargs)
        if dispatch_key == "CUDA" and self.ns == "sglang":
            register(self, op_name, fn, "CPU", *args, **kwargs)
            implementations[op_name] = fn
        return result

    def fake(self: Any, op_name: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.ns == "sglang":
            fn = implementations.get(op_name, fn)
        return register_fake(self, op_name, fn, *args, **kwargs)

    torch.library.Library.impl = impl
    torch.library.Library._register_fake = fake


# sgl_kernel ops that write into tensors their caller allocated and return nothing, with no
# meta kernel: on the meta device they do nothing, which is all a meta kernel of theirs
# could do (the MoE's routing, its token sort and its activation).
_OUTPUT_ONLY_OPS = ("topk_softmax", "moe_align_block_size", "silu_and_mul")
_LIBRARIES: list[Any] = []  # an op's registration lives as long as its Library object


def _meta_kernels_for_output_only_ops() -> None:
    import torch

    library = torch.library.Library("sgl_kernel", "IMPL")
    for op in _OUTPUT_ONLY_OPS:
        library.impl(op, lambda *args, **kwargs: None, "Meta")
    _LIBRARIES.append(library)


def _where(path: str, line: int) -> str:
    """A source location relative to the sglang or FlashInfer package root."""
    path = path.replace("\\", "/")
    for root in ("/sglang/", "/flashinfer/", "/deep_gemm/"):
        if root in path:
            return f"{root.strip('/')}/{path.rsplit(root, 1)[1]}:{line}"
    return f"{path}:{line}"


def _site(frame: inspect.FrameInfo) -> str:
    return f"{_where(frame.filename, frame.lineno)} {frame.function}"


def _callers() -> list[str]:
    """Where the module was asked for: the innermost frame of sglang's serving code, and the
    innermost of the library function that asked (FlashInfer's, or sglang's jit_kernel)."""
    stack = [frame for frame in inspect.stack()[2:] if frame.filename != __file__]
    serving = [f for f in stack if "/sglang/srt/" in f.filename]
    library = [
        f
        for f in stack
        if ("/flashinfer/" in f.filename and "/flashinfer/jit/" not in f.filename)
        or (
            any(f"/{part}/" in f.filename for part in _SGLANG_KERNELS.replace(".", "/").split())
            and not f.filename.endswith("/utils.py")
            and "/utils/" not in f.filename
        )
    ]
    return [_site(frames[0]) for frames in (serving, library) if frames]


def _first_use(name: str, defined_at: str) -> None:
    _ASKED[0] += 1
    entry = FIRST_USE.setdefault(name, {"name": name, "defined_at": defined_at, "loaded_by": []})
    for site in _callers()[:1]:  # sglang's frame; the library's frames are Triton's or DeepGEMM's
        if site not in entry["loaded_by"]:
            entry["loaded_by"].append(site)


def _argument(value: Any) -> str:
    import torch

    return str(value) if isinstance(value, torch.dtype) else repr(value)


class _Module:
    """A loaded module whose every function does nothing; its plan is an empty one, which
    the wrappers' run() only checks is there (flashinfer/prefill.py, decode.py). A call of
    one reaches a kernel, and counts as a request: FlashInfer caches a loaded module, so a
    step that runs one an earlier step loaded asks the generator for nothing."""

    def __getattr__(self, name: str) -> Any:
        def function(*args: Any, **kwargs: Any) -> Any:
            _ASKED[0] += 1
            if name == "plan_with_staged_workspace_bytes":  # 0.7's MLA plan: (plan, bytes)
                return [], 0
            return [] if name == "plan" else None

        return function


class _Spec:
    def build_and_load(self) -> _Module:
        return _Module()

    def get_library_path(self) -> str:
        return "/nonexistent"


def _recorder(function: Any, result: Any, generate: bool) -> Any:
    """`function` recorded instead of compiled; with `generate`, also called, as the build
    will call it (it only makes the module's spec and sources), to see that it can be made
    for this arch."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _GENERATING:  # a generator the probed one calls: part of it, not sglang's request
            return inspect.unwrap(function)(*args, **kwargs)
        arguments = [_argument(v) for v in args] + [
            f"{k}={_argument(v)}" for k, v in kwargs.items()
        ]
        text = f"{function.__module__}:{function.__name__}({', '.join(arguments)})"
        original = inspect.unwrap(function)
        source = inspect.getsourcefile(original) or "?"
        line = inspect.getsourcelines(original)[1]
        _ASKED[0] += 1
        new = text not in REQUESTED
        entry = REQUESTED.setdefault(
            text, {"call": text, "defined_at": _where(source, line), "loaded_by": []}
        )
        for site in _callers():
            if site not in entry["loaded_by"]:
                entry["loaded_by"].append(site)
        if generate and new:
            _GENERATING.append(text)
            try:
                original(*args, **kwargs)
            except Exception as exc:
                UNAVAILABLE[text] = {**entry, "reason": f"{type(exc).__name__}: {exc}"}
            finally:
                _GENERATING.pop()
        if text in UNAVAILABLE:
            UNAVAILABLE[text]["loaded_by"] = entry["loaded_by"]
        return result()

    vars(call)["_sm120_recorder"] = True
    return call


def _intercept(prefix: str, wanted: Any, result: Any, generate: bool = False) -> None:
    """Replace every function of modules under `prefix` that `wanted` picks, wherever it was
    imported to, by a recorder."""
    originals = {}
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix) and module is not None:
            for attribute, value in vars(module).items():
                if (
                    callable(value)
                    and (getattr(value, "__module__", None) or "").startswith(prefix)
                    and wanted(attribute, value)
                    and not getattr(value, "_sm120_recorder", False)
                ):
                    originals[id(value)] = value
    wrapped = {key: _recorder(function, result, generate) for key, function in originals.items()}
    for name, module in list(sys.modules.items()):
        if (name.startswith("flashinfer") or name.startswith("sglang")) and module is not None:
            for attribute, value in list(vars(module).items()):
                if id(value) in wrapped:
                    setattr(module, attribute, wrapped[id(value)])


def _intercept_compilation(arch: tuple[int, int]) -> None:
    """FlashInfer's generators and sglang's JIT loaders, and FlashInfer's question for a
    tensor's compute capability, in every module imported so far (again after the model's
    constructor has imported its layers)."""
    import flashinfer.utils

    real = _REAL.setdefault("capability", flashinfer.utils.get_compute_capability)
    capability = lambda device=None: arch  # noqa: E731
    for name, module in list(sys.modules.items()):
        if name.startswith("flashinfer") and module is not None:
            # by identity: 0.7 imports it under other names too (_get_compute_capability)
            for attribute, value in list(vars(module).items()):
                if value is real:
                    vars(module)[attribute] = capability
    # gen_*_module* anywhere in FlashInfer (some live beside their ops, as fp4_quantization's;
    # some name their variant last, as gen_gemm_sm120_module_cutlass_fp4); the outermost call
    # is recorded, since a recorder does not call what it replaces.
    _intercept(
        "flashinfer",
        lambda name, value: name.startswith("gen_") and "_module" in name,
        _Spec,
        generate=True,
    )
    _intercept(_SGLANG_KERNELS, lambda name, value: _calls_load_jit(value), _Module)


def _named(function: Any) -> tuple[str, str]:
    """A Python function's module-qualified name and where it is defined."""
    original = inspect.unwrap(function) if callable(function) else function
    name = f"{getattr(original, '__module__', '?')}.{getattr(original, '__qualname__', '?')}"
    try:
        source = inspect.getsourcefile(original) or "?"
        return name, _where(source, inspect.getsourcelines(original)[1])
    except (TypeError, OSError):
        return name, "?"


def _record_torch_compile() -> None:
    """torch.compile'd functions compile at their first call on the node (Dynamo, Inductor,
    Triton): each one sglang calls is recorded with where, then runs as it would have. Made
    before sglang is imported: its decorators run at import."""
    import torch

    real = torch.compile

    def compile(model: Any = None, **options: Any) -> Any:
        if model is None:  # @torch.compile(...)
            return lambda function: compile(function, **options)
        compiled = real(model, **options)
        if isinstance(model, torch.nn.Module) or not callable(model):
            return compiled
        name, defined_at = _named(model)

        @functools.wraps(model)
        def call(*args: Any, **kwargs: Any) -> Any:
            _first_use(f"torch.compile {name}", defined_at)
            return compiled(*args, **kwargs)

        return call

    torch.compile = compile


def _record_kernel_dsls() -> None:
    """CuTe DSL's and TileLang's JIT, where sglang's kernels use them (0.5.2x): a kernel
    they would compile at first use is recorded, with where, and nothing is compiled (the
    compiled kernel stands in as a function that does nothing). Only what sglang imported
    can be called."""
    compiler = sys.modules.get("cutlass.base_dsl.compiler")
    if compiler is not None and hasattr(compiler, "CompileCallable"):

        def cute_compile(self: Any, function: Any, *args: Any, **kwargs: Any) -> Any:
            name, defined_at = _named(function)
            _first_use(f"cute_dsl {name}", defined_at)
            return lambda *args, **kwargs: None

        compiler.CompileCallable.__call__ = cute_compile
    jit = sys.modules.get("tilelang.jit")
    if jit is not None and hasattr(jit, "JITImpl"):

        def tilelang_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            name, defined_at = _named(getattr(self.func, "orig_func", self.func))
            _first_use(f"tilelang {name}", defined_at)
            return lambda *args, **kwargs: None

        jit.JITImpl.__call__ = tilelang_call


def _calls_load_jit(function: Any) -> bool:
    """Whether a function of sglang's kernels is a loader: its own code (or a function
    nested in it) calls load_jit. 0.5.9's all follow the _jit_*_module naming; 0.5.2x has
    others too (ops/activation/activation.py activation_module, ...)."""
    try:
        function = inspect.unwrap(function)
    except ValueError:  # an object that names itself as what it wraps: no function
        return False
    codes = [getattr(function, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        if "load_jit" in code.co_names:
            return True
        codes += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return False


def _import_kernel_modules() -> None:
    """Every module of sglang's kernels package, so that each loader is replaced before
    anything imports it lazily; one that cannot be imported here (another platform's) is
    left out, and neither can sglang import it on the node."""
    import pkgutil

    package = importlib.import_module(_SGLANG_KERNELS)
    for found in pkgutil.walk_packages(package.__path__, f"{_SGLANG_KERNELS}."):
        with contextlib.suppress(Exception):
            importlib.import_module(found.name)


def _load_jit_outside_a_loader(*args: Any, **kwargs: Any) -> Any:
    """What load_jit becomes: every loader is recorded instead of called, so a call that
    reaches it came another way, and what it would compile is not in the profile."""
    frames = [frame for frame in inspect.stack()[1:] if "sglang" in frame.filename]
    where = _site(frames[0]) if frames else "?"
    UNREACHED.append(
        {
            "step": "sglang kernel",
            "error": f"load_jit{args!r} was called other than by a loader the replay knows",
            "at": where,
        }
    )
    raise RuntimeError("load_jit reached outside a recorded loader")


def _recording_first_use(name: str, function: Any, module: Any) -> Any:
    if inspect.isfunction(function):
        source = inspect.getsourcefile(function) or "?"
        defined_at = _where(source, function.__code__.co_firstlineno)
    else:  # an op of its extension, bound in this module
        defined_at = _where(getattr(module, "__file__", None) or "?", 1)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        _first_use(name, defined_at)
        return function(*args, **kwargs)

    return call


class _Group:
    """Rank 0 of a process group of `size` ranks, as the code asks about it."""

    def __init__(self, size: int) -> None:
        self.world_size, self.rank_in_group, self.rank = size, 0, 0
        self.ranks = list(range(size))
        self.is_first_rank, self.is_last_rank = True, size == 1
        self.first_rank, self.last_rank = 0, size - 1
        self.local_rank, self.device_group, self.cpu_group = 0, None, None


def main() -> None:
    request = json.loads(sys.argv[1])
    arch = tuple(request["arch"])
    _virtual_gpu(arch)
    _record_torch_compile()
    import sglang.srt.server_args as server_args
    import sglang.srt.utils.common as common

    common.get_nvgpu_memory_capacity = lambda: 97887.0  # MiB, as nvidia-smi reports
    server_args.get_device_memory_capacity = lambda device=None: 97887.0
    global _SGLANG_KERNELS
    _SGLANG_KERNELS = _kernels_package()
    _import_kernel_modules()
    _record_kernel_dsls()
    for name, module in list(sys.modules.items()):
        if name.startswith(_SGLANG_KERNELS) and module is not None and "load_jit" in vars(module):
            vars(module)["load_jit"] = _load_jit_outside_a_loader
    import sglang.srt.configs.load_config
    import sglang.srt.distributed.parallel_state as parallel_state
    import sglang.srt.layers.attention.flashinfer_backend
    import sglang.srt.layers.attention.flashinfer_mla_backend
    import sglang.srt.layers.radix_attention
    import sglang.srt.model_executor.forward_batch_info
    import sglang.srt.model_executor.model_runner
    import sglang.srt.model_loader.loader
    import sglang.srt.speculative.spec_info  # noqa: F401 (all imported before the interception)
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.scheduler import Scheduler

    _intercept_compilation(arch)
    _meta_kernels_for_output_only_ops()

    # sglang's Triton kernels (the KV index arrays, the KV pool's copy warm-up, MoE): they
    # compute values, which choose no module, and Triton's launcher needs a driver.
    # `kernel[grid](...)` is recorded and does nothing, autotuned kernels included (both are
    # KernelInterfaces, wrapping the Python function as .fn).
    import triton.runtime.jit

    def launch(kernel: Any, grid: Any) -> Any:
        function = kernel
        while hasattr(function, "fn"):
            function = function.fn
        source = inspect.getsourcefile(function) or "?"
        _first_use(
            f"triton {function.__module__}.{function.__name__}",
            _where(source, inspect.getsourcelines(function)[1]),
        )
        return lambda *args, **kwargs: None

    triton.runtime.jit.KernelInterface.__getitem__ = launch
    # DeepGEMM's functions, in each of its modules: recorded, then run (without a device they
    # fail, as a step that needs one does).
    for name, module in list(sys.modules.items()):
        # (only modules: some releases put other objects in sys.modules under its name)
        if name.split(".")[0] == "deep_gemm" and isinstance(module, types.ModuleType):
            for attribute, value in list(vars(module).items()):
                owner = getattr(value, "__module__", None) or ""
                # Python functions, and the C++ ops it registers (torch._ops.deep_gemm)
                if attribute == "set_pdl":
                    # A setting for the device (programmatic dependent launch), which
                    # sglang's runner makes at start-up (deep_gemm_wrapper/entrypoint.py
                    # update_deep_gemm_config): it compiles nothing, and needs a device.
                    vars(module)[attribute] = lambda enable: None
                elif callable(value) and "deep_gemm" in owner.split("."):
                    where = f"deep_gemm {name}.{attribute}"
                    vars(module)[attribute] = _recording_first_use(where, value, module)

    tp = int(request["server_args"].get("tp_size", 1))
    groups = {
        **dict.fromkeys(("_TP", "_ATTN_TP", "_MOE_TP"), _Group(tp)),
        **dict.fromkeys(("_PP", "_MOE_EP", "_ATTN_CP", "_MOE_DP"), _Group(1)),
    }
    for group, handle in groups.items():
        setattr(parallel_state, group, handle)

    args = server_args.ServerArgs(
        model_path=request["model"], skip_tokenizer_init=True, **request["server_args"]
    )
    server_args.set_global_server_args_for_scheduler(args)  # as the scheduler process does
    if importlib.util.find_spec("sglang.srt.runtime_context") is not None:
        # From 0.5.2x the process's configuration and its place in the parallel topology
        # live in a runtime context that the scheduler process publishes first
        # (managers/scheduler.py run_scheduler_process): rank 0 of the configured group.
        from sglang.srt import runtime_context

        runtime_context.publish(
            args,
            role="scheduler",
            ranks=runtime_context.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0),
        )
        # The group handles too, which distributed initialisation records there
        # (parallel_state.py get_tp_group: get_parallel().tp_group, _TP -> tp_group).
        runtime_context.get_parallel().override_permanently(
            **{f"{group.strip('_').lower()}_group": handle for group, handle in groups.items()}
        )
    model_config = ModelConfig.from_server_args(args)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algorithm = SpeculativeAlgorithm.from_string(args.speculative_algorithm)
    # (a plug-in algorithm sglang 0.5.2x registers may have no is_eagle: not the family)
    if not algorithm.is_none() and not getattr(algorithm, "is_eagle", lambda: False)():
        # The replay follows EAGLE's draft tree and verify step (_verify_drafts); another
        # algorithm's kernels would go unrecorded, and the profile would look complete.
        eagle = [a.name for a in SpeculativeAlgorithm if a.is_eagle()]
        raise SystemExit(
            f"speculative_algorithm {args.speculative_algorithm}: the "
            f"replay follows only the EAGLE family's draft tree and verify step "
            f"({', '.join(eagle)}, and what sglang resolves to them, such as NEXTN)"
        )
    # The MoE runner and FP8/FP4 GEMM backends, as the scheduler process sets them before
    # it builds the model (managers/scheduler.py:503 init_moe_gemm_config).
    Scheduler.init_moe_gemm_config(SimpleNamespace(server_args=args, model_config=model_config))
    from sglang.srt.layers.dp_attention import initialize_dp_attention

    # As ModelRunner.init_torch_distributed does (0.5.11 dropped the model config argument).
    taken = len(inspect.signature(initialize_dp_attention).parameters)
    initialize_dp_attention(*(args, model_config)[:taken])
    runner, backend = _replay_model(args, model_config, tp, arch, draft=False)
    if not runner.spec_algorithm.is_none() and args.speculative_draft_model_path:
        # The draft model's own worker (speculative/eagle_worker.py: a TpModelWorker with
        # is_draft_worker=True): its config, dtype and quantization, its attention backend
        # (speculative_draft_attention_backend when set), its layers.
        draft_config = ModelConfig.from_server_args(
            args, model_path=args.speculative_draft_model_path, is_draft_model=True
        )
        _replay_model(args, draft_config, tp, arch, draft=True)
    resolved = {
        name: str(getattr(args, name))
        for name in (
            "attention_backend",
            "kv_cache_dtype",
            "moe_runner_backend",
            "enable_flashinfer_allreduce_fusion",
            "speculative_algorithm",
            "quantization",
            "tp_size",
        )
    }
    resolved["kv_cache_torch_dtype"] = str(runner.kv_cache_dtype)
    resolved["model_quantization"] = str(model_config.quantization)
    resolved["attention_backend_class"] = type(backend).__name__
    print(
        json.dumps(
            {
                "resolved": resolved,
                "requested": list(REQUESTED.values()),
                "unavailable": list(UNAVAILABLE.values()),
                "unreached": UNREACHED,
                "first_use": list(FIRST_USE.values()),
            }
        )
    )


def _replay_model(args: Any, model_config: Any, tp: int, arch: Any, draft: bool) -> Any:
    """One model's part of the replay (the target's, or the speculative draft's): its
    constructor on the meta device, its ModelRunner's KV pool and attention backend, the
    backend's plans and forward, its layers, first MoE block and fused allreduce; the
    target's verify step over a draft tree. Returns the runner and its backend."""
    import torch
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    load_config = LoadConfig(load_format=args.load_format)
    quant_config = _get_quantization_config(model_config, load_config)
    # As sglang's loader builds it (model_loader/loader.py): in the model's dtype, where
    # parameters that take the default dtype (unquantized layers) get it.
    with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
        model = _initialize_model(model_config, load_config, quant_config)
    _intercept_compilation(arch)

    if hasattr(ModelRunner, "alloc_memory_pool"):  # 0.5.2x
        runner, backend = _runner_with_pools(args, model_config, model, draft)
    else:
        runner, backend = _runner_of_0_5_9(args, model_config, model, tp, draft)

    def batch(mode: Any, prefix: int) -> Any:
        lengths = torch.tensor([prefix + 5, prefix + 7], dtype=torch.int64)
        forward = ForwardBatch(
            forward_mode=mode,
            batch_size=2,
            input_ids=torch.zeros(12, dtype=torch.int64),
            req_pool_indices=torch.tensor([0, 1], dtype=torch.int64),
            seq_lens=lengths,
            out_cache_loc=torch.zeros(12, dtype=torch.int64),
            seq_lens_sum=int(lengths.sum()),
        )
        forward.seq_lens_cpu = lengths.clone()
        if mode.is_extend():
            forward.extend_prefix_lens = torch.tensor([prefix, prefix], dtype=torch.int64)
            forward.extend_prefix_lens_cpu = [prefix, prefix]
            forward.extend_seq_lens = torch.tensor([5, 7], dtype=torch.int64)
            forward.extend_seq_lens_cpu = [5, 7]
            forward.extend_num_tokens = 12
        return forward

    attention = next(m for m in model.modules() if isinstance(m, RadixAttention))
    for mode, prefix in (
        (ForwardMode.DECODE, 16),
        (ForwardMode.EXTEND, 0),
        (ForwardMode.EXTEND, 16),
    ):
        forward = batch(mode, prefix)
        backend.init_forward_metadata(forward)
        _attend(runner, backend, attention, forward, torch)
    if not draft and not runner.spec_algorithm.is_none():
        _verify_drafts(runner, backend, attention, batch(ForwardMode.DECODE, 16), torch)

    _exercise_layers(runner, model, attention, torch)
    _route_and_run_experts(runner, model, torch)
    _fuse_allreduce(runner, model, tp, torch)
    return runner, backend


def _runner_of_0_5_9(args: Any, model_config: Any, model: Any, tp: int, draft: bool) -> Any:
    """Up to 0.5.10: ModelRunner without its model loading and process groups, its own
    attributes (model_runner.py:300-340, 515-522), then its own methods; its KV pool sized
    from a stand-in profile of the GPU's memory (256 tokens). The runner and its backend."""
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = ModelRunner.__new__(ModelRunner)
    runner.server_args, runner.model_config, runner.model = args, model_config, model
    runner.dtype, runner.device, runner.gpu_id = model_config.dtype, "cpu", 0
    runner.tp_size, runner.tp_rank, runner.pp_size, runner.pp_rank, runner.dp_size = tp, 0, 1, 0, 1
    runner.page_size, runner.is_draft_worker, runner.init_new_workspace = (
        args.page_size,
        draft,
        False,
    )
    runner.is_hybrid_swa = model_config.is_hybrid_swa
    runner.is_hybrid_swa_compress = model_config.is_hybrid_swa_compress
    runner.spec_algorithm = SpeculativeAlgorithm.from_string(args.speculative_algorithm)
    runner.use_mla_backend = model_config.attention_arch == AttentionArch.MLA
    runner.attention_chunk_size = model_config.attention_chunk_size
    runner.sliding_window_size = None
    if hasattr(model, "get_attention_sliding_window_size"):
        runner.sliding_window_size = model.get_attention_sliding_window_size()
    runner.req_to_token_pool, runner.token_to_kv_pool_allocator = None, None
    runner.start_layer = getattr(model, "start_layer", 0)
    runner.end_layer = getattr(model, "end_layer", model_config.num_hidden_layers)
    runner.num_effective_layers = runner.end_layer - runner.start_layer
    runner.profile_max_num_token = lambda total_gpu_memory: 256
    runner.configure_kv_cache_dtype()
    runner.init_memory_pool(96 * 2**30)
    return runner, runner._get_attention_backend()


def _runner_with_pools(args: Any, model_config: Any, model: Any, draft: bool) -> Any:
    """From 0.5.2x: sglang's own ModelRunner.__init__, with the weights not loaded (its
    loader gives back the model built on the meta device) and the device not measured; then
    what the scheduler does next (managers/scheduler.py init_memory_pools ->
    alloc_memory_pool, init_all_attention_backends). The KV pool is sized from a profile of
    the GPU's free memory: 64 MiB here, a few hundred tokens, which chooses no kernel.
    The runner and its backend."""
    from sglang.srt import runtime_context
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor import model_runner

    def init_torch_distributed(runner: Any) -> None:  # model_runner.py init_torch_distributed
        runner.pre_model_load_memory = 0
        runner.pp_group = runtime_context.get_parallel().pp_group

    loaded = SimpleNamespace(
        loader=None, model=model, startup_weight_load=None, remote_instance_weight_info=None
    )
    vars(model_runner).update(
        load_model_with_memory_saver=lambda **kwargs: loaded,
        # The ranks' barrier after loading (torch.distributed's): this is the only rank.
        dist_barrier_after_load=lambda **kwargs: None,
    )
    model_runner.ModelRunner.init_torch_distributed = init_torch_distributed
    KVCacheConfigurator._profile_available_bytes = lambda self, pre_model_load_memory: 64 << 20
    runner = model_runner.ModelRunner(
        model_config=model_config,
        mem_fraction_static=runtime_context.get_schedule().mem_fraction_static,
        gpu_id=0,
        nccl_port=0,
        server_args=args,
        is_draft_worker=draft,
    )
    runner.alloc_memory_pool()
    runner.init_attention_backends()
    return runner, runner.attn_backend


def _attend(runner: Any, backend: Any, layer: Any, forward: Any, torch: Any) -> None:
    """The backend's forward for the batch it has just planned, as RadixAttention.forward
    calls it (layers/radix_attention.py), on zeros: what it asks for beyond its plans, such
    as merge_state for an extend over a cached prefix (flashinfer_backend.py:853)."""
    tokens = forward.extend_num_tokens if forward.forward_mode.is_extend() else forward.batch_size
    q = torch.zeros(tokens, layer.tp_q_head_num * layer.qk_head_dim, dtype=runner.dtype)
    k = torch.zeros(tokens, layer.tp_k_head_num, layer.qk_head_dim, dtype=runner.dtype)
    v = torch.zeros(tokens, layer.tp_v_head_num, layer.v_head_dim, dtype=runner.dtype)
    forward.token_to_kv_pool = runner.token_to_kv_pool
    with _step(f"attention {forward.forward_mode.name}"):
        backend.forward(q, k, v, layer, forward, save_kv_cache=False)


def _verify_drafts(runner: Any, backend: Any, layer: Any, decoded: Any, torch: Any) -> None:
    """Speculative decoding's verify step (EAGLE; NEXTN and MTP resolve to it): the target
    model attends over each request's draft tokens under the draft tree's mask. The tree is
    built by sglang's own build_tree_kernel_efficient (eagle_utils.py:47) with its sgl_kernel
    op stood in (it fills the mask's values; sglang's code makes the mask tensor), wrapped in
    an EagleVerifyInput as eagle_worker.py:598 does, then planned by the target's backend
    (TARGET_VERIFY, flashinfer_backend.py:453) and run. `decoded` is a batch between steps:
    its seq_lens hold no draft token."""
    import sglang.srt.speculative.eagle_utils as eagle_utils
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    resolved = runner.server_args
    if importlib.util.find_spec("sglang.srt.runtime_context") is not None:
        # 0.5.2x resolves the draft tree's sizes into the runtime context, not the arguments
        from sglang.srt.runtime_context import get_spec

        resolved = get_spec()
    steps, topk, drafts = (
        resolved.speculative_num_steps,
        resolved.speculative_eagle_topk,
        resolved.speculative_num_draft_tokens,
    )
    size = decoded.batch_size
    vars(eagle_utils)["sgl_build_tree_kernel_efficient"] = lambda *args: None
    tree_mask, positions, index, next_token, next_sibling, tokens = (
        eagle_utils.build_tree_kernel_efficient(
            torch.zeros(size, dtype=torch.int64),  # verified_id
            torch.zeros(size, topk * (steps - 1) + 1, dtype=torch.int64),  # parent_list
            torch.zeros(size, drafts - 1, dtype=torch.int64),  # top_scores_index
            torch.zeros(size, drafts - 1, dtype=torch.int64),  # draft tokens
            decoded.seq_lens,
            decoded.seq_lens_sum,
            topk,
            steps,
            drafts,
        )
    )
    # 0.5.2x spells the retrieve_* fields so (speculative/eagle_info.py); 0.5.9 retrive_*
    spelled = (
        "retrieve"
        if "retrieve_index" in inspect.signature(EagleVerifyInput).parameters
        else "retrive"
    )
    decoded.spec_info = EagleVerifyInput(
        draft_token=tokens,
        custom_mask=tree_mask,
        positions=positions,
        **{
            f"{spelled}_index": index,
            f"{spelled}_next_token": next_token,
            f"{spelled}_next_sibling": next_sibling,
            f"{spelled}_cum_len": None,
        },
        spec_steps=steps,
        topk=topk,
        draft_token_num=drafts,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=decoded.seq_lens_sum,
        seq_lens_cpu=decoded.seq_lens_cpu,
    )
    decoded.forward_mode = ForwardMode.TARGET_VERIFY
    decoded.input_ids, decoded.positions = tokens, positions
    decoded.out_cache_loc = torch.zeros(size * drafts, dtype=torch.int64)
    decoded.extend_num_tokens = size * drafts
    backend.init_forward_metadata(decoded)
    _attend(runner, backend, layer, decoded, torch)


def _exercise_layers(runner: Any, model: Any, attention: Any, torch: Any) -> None:
    """The model's own layers, called the way its forward calls them: the KV store of the
    first attention layer, each rotary embedding, each attention's QK-norm, and each kind of
    linear layer's quantization method (weights on the meta device, input on the host)."""
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding
    from sglang.srt.models.utils import apply_qk_norm

    pool = runner.token_to_kv_pool
    if hasattr(pool, "k_buffer"):  # MHA pools; an MLA pool stores through FlashInfer's MLA path
        heads, dim = attention.tp_k_head_num, attention.qk_head_dim
        k = torch.zeros(2, heads, dim, dtype=runner.dtype)
        v = torch.zeros(2, heads, attention.v_head_dim, dtype=runner.dtype)
        # The store op has no CPU kernel: it fails after its loader call is recorded.
        with contextlib.suppress(NotImplementedError):
            pool.set_kv_buffer(attention, torch.tensor([1, 2]), k, v)
    seen: set[int] = set()
    methods: set[type] = set()
    for module in model.modules():
        if isinstance(module, RotaryEmbedding) and id(module) not in seen:
            seen.add(id(module))
            head = module.head_size
            cache = module.cos_sin_cache  # built on the meta device: a host copy of its shape
            module.cos_sin_cache = torch.zeros(cache.shape, dtype=cache.dtype)
            positions = torch.tensor([0, 1])
            q = torch.zeros(2, head * 2, dtype=runner.dtype)
            key = torch.zeros(2, head, dtype=runner.dtype)
            with _step(f"rope {type(module).__name__}"):
                module.forward_cuda(positions, q, key)
        method = getattr(module, "quant_method", None)
        if isinstance(module, LinearBase) and method is not None and type(method) not in methods:
            methods.add(type(method))
            with _step(f"linear {type(method).__name__}"):
                width = getattr(module, "input_size_per_partition", None) or module.input_size
                x = torch.zeros(2, width, dtype=runner.dtype)
                _materialize(module, torch)
                method.process_weights_after_loading(module)
                method.apply(module, x)
        q_norm, k_norm = getattr(module, "q_norm", None), getattr(module, "k_norm", None)
        if q_norm is not None and k_norm is not None and hasattr(module, "head_dim"):
            head = module.head_dim
            q = torch.zeros(2, head, dtype=runner.dtype)
            with _step(f"qk-norm {type(module).__name__}"):
                apply_qk_norm(q, q.clone(), q_norm, k_norm, head)


def _materialize(module: Any, torch: Any) -> None:
    """The weights of the one layer a step runs, as zeros on the host: the model is built on
    the meta device (shapes only; a whole model on the host takes tens of GB), but a
    quantization method's post-load processing reads its layer's values (scales, .item()).
    The parameters keep the attributes sglang hung on them (weight loaders, dims)."""
    for name, parameter in list(module.named_parameters(recurse=False)):
        if parameter.is_meta:
            host = torch.nn.Parameter(
                torch.zeros(parameter.shape, dtype=parameter.dtype, device="cpu"),
                requires_grad=False,
            )
            vars(host).update(vars(parameter))
            setattr(module, name, host)
    for name, buffer in list(module.named_buffers(recurse=False)):
        if buffer.is_meta:
            setattr(module, name, torch.zeros(buffer.shape, dtype=buffer.dtype, device="cpu"))


def _route_and_run_experts(runner: Any, model: Any, torch: Any) -> None:
    """The first MoE block, as its forward calls it (models/deepseek_v2.py DeepseekV2MoE,
    models/glm4_moe.py): the router's top-k over the gate's logits, then the experts'
    FusedMoE.forward, whose quantization method picks the kernel (its weights on the host
    for their post-load processing, its inputs on the meta device)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.topk import StandardTopKOutput, TopK

    # torch.compile'd routing helpers run eagerly: compiling fuses, it chooses no kernel.
    torch._dynamo.config.disable = True
    router = next((m for m in model.modules() if isinstance(m, TopK)), None)
    experts = next((m for m in model.modules() if isinstance(m, FusedMoE)), None)
    if router is None or experts is None:
        return
    # On the meta device: sgl_kernel's routing and MoE ops have meta kernels, no CPU ones.
    hidden = torch.zeros(2, experts.hidden_size, dtype=runner.dtype, device="meta")
    # The gate scores the routed experts; the experts' count includes shared ones fused in.
    config = router.topk_config
    # (0.5.2x keeps the count in the config's shared-experts layout, configs/shared_experts.py)
    fused_shared = getattr(config, "num_fused_shared_experts", None)
    if fused_shared is None:
        fused_shared = config.shared_experts.num_fused_shared_experts
    routed_experts = experts.num_experts - fused_shared
    logits = torch.zeros(2, routed_experts, dtype=torch.float32, device="meta")
    bias = router.topk_config.correction_bias  # the gate's, built on the host or on meta
    if bias is not None:
        router.topk_config.correction_bias = torch.zeros_like(bias, device="meta")
    try:
        routed = router.forward_cuda(hidden, logits)
    except Exception as exc:  # a routing kernel with no meta implementation (topk_softmax)
        print(f"moe top-k: {exc!r}", file=sys.stderr)
        # The experts' kernel goes by shapes and dtypes, not by which experts were chosen.
        top_k = router.topk_config.top_k
        routed = StandardTopKOutput(
            torch.zeros(2, top_k, dtype=torch.float32, device="meta"),
            torch.zeros(2, top_k, dtype=torch.int32, device="meta"),
            logits,
        )
    with _step(f"moe experts {type(experts.quant_method).__name__}"):
        _materialize(experts, torch)
        experts.quant_method.process_weights_after_loading(experts)
        experts.forward(hidden, routed)


def _fuse_allreduce(runner: Any, model: Any, tp: int, torch: Any) -> None:
    """The allreduce after attention, fused with the residual add and RMSNorm, where
    sglang's own gate takes it, through the norm's forward_with_allreduce_fusion: up to
    0.5.10 the gate is layers/communicator.py apply_flashinfer_allreduce_fusion, from 0.5.2x
    layer_boundary/residual/add_norm.py flashinfer_ar_fusion_applies. What stands in: the
    ranks' shared workspace, CUDA IPC memory that every rank of a real process group maps,
    counts as made (flashinfer_comm_fusion.py), and this is rank 0."""
    import sglang.srt.layers.flashinfer_comm_fusion as fusion

    tokens = 2
    layer = next((m for m in model.modules() if hasattr(m, "post_attention_layernorm")), None)
    if layer is None or not _allreduce_fusion_gate()(tokens):
        return
    norm = layer.post_attention_layernorm
    if not hasattr(norm, "forward_with_allreduce_fusion"):
        return
    if hasattr(fusion, "_workspace_manager"):  # up to 0.5.10: one workspace
        workspace = fusion._workspace_manager
        workspace.initialized, workspace.world_size, workspace.rank = True, tp, 0
    else:  # 0.5.2x: one per group, and FlashInfer's workspace object picks the backend
        from flashinfer.comm.allreduce import TRTLLMAllReduceFusionWorkspace

        made = TRTLLMAllReduceFusionWorkspace.__new__(TRTLLMAllReduceFusionWorkspace)
        # What its constructor keeps of the IPC workspace it makes (comm/allreduce.py), with
        # the metadata the kernel's launcher checks the batch against (comm/trtllm_ar.py).
        metadata = {
            "tp_rank": 0,
            "tp_size": tp,
            "max_token_num": 2048,
            "hidden_dim": norm.weight.shape[0],
            "use_fp32_lamport": False,
        }
        tensor = torch.zeros(tp, dtype=torch.int64)
        vars(made).update(
            _internal_workspace=([], tensor, metadata),
            world_size=tp,
            rank=0,
            ipc_handles=[],
            workspace_tensor=tensor,
            mem_handles=[],
            metadata=metadata,
            _destroyed=True,  # nothing of the ranks' to release when it goes
        )
        workspace = fusion._get_workspace_manager(True)
        vars(workspace).update(
            initialized=True,
            world_size=tp,
            rank=0,
            group=(None, None),  # the stand-in group's device and host groups
            backend="trtllm",
            workspace=made,
            is_buffer_size_sufficient=lambda **kwargs: True,
        )
    fusion.dist.get_rank = lambda group=None: 0
    norm.weight = torch.nn.Parameter(torch.zeros(norm.weight.shape, dtype=norm.weight.dtype))
    x = torch.zeros(tokens, norm.weight.shape[0], dtype=runner.dtype)
    with _step("allreduce fusion"):
        norm.forward_with_allreduce_fusion(x, x.clone())


def _allreduce_fusion_gate() -> Any:
    """sglang's own test of whether a batch of N tokens takes the fused allreduce."""
    try:
        from sglang.srt.layers.communicator import apply_flashinfer_allreduce_fusion
    except ImportError:  # 0.5.2x
        from sglang.srt.layers.layer_boundary.residual.add_norm import (
            flashinfer_ar_fusion_applies,
        )

        return flashinfer_ar_fusion_applies
    return apply_flashinfer_allreduce_fusion


if __name__ == "__main__":
    main()
