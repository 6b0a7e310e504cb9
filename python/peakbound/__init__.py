"""peakbound from Python: plan a run, train one, and the schedules as PyTorch drop-ins.

    import peakbound
    p = peakbound.plan(model="qwen3-30b-a3b", context="128K", devices=8, device_memory="80GiB")
    print(p)                      # the table `peakbound plan` prints
    p.peak_bytes.scheduled        # the fields of `peakbound plan --json`
    p.reach().ratio               # the context reach, scheduled over the baseline

    run = peakbound.Run(steps=20, seq_len=256)   # `peakbound train`'s settings
    for stats in run:             # one dict per step (the metrics file's line)
        print(stats["step"], stats["loss"])
    summary = run.finish()        # planned beside measured peaks, the losses

Every keyword is the CLI flag of the same name ("device_memory" is --device-memory) and
goes through that flag's own parser: a bad value raises peakbound.Error (a ValueError)
with the CLI's one-line message, a value of the wrong type TypeError. `peakbound.torch`
holds the drop-ins (it imports torch; this module does not).
"""

from __future__ import annotations

import json as _json
import numbers as _numbers
import os as _os
import sys as _sys
import tempfile as _tempfile
from typing import Any, Callable, Iterator, Mapping, Optional


def _prefer_blas_kernels() -> None:
    # What the CLI's main() does first (ops::prefer_blas_kernels): Debian's OpenBLAS falls back
    # to its generic kernels on CPUs newer than it knows, several times slower. The CLI then
    # re-executes itself with OPENBLAS_CORETYPE; an interpreter cannot, so the variable is set
    # before the extension loads OpenBLAS, to what kernels/cpu/gemm.cc's blas_core_for picks
    # (python/tests/test_core.py checks the two agree on this machine). A value already set wins.
    if "OPENBLAS_CORETYPE" in _os.environ:
        return
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags: set[str] = set()
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    if avx512 and "avx512_bf16" in flags:
        core = "Cooperlake"
    elif avx512:
        core = "SkylakeX"
    elif {"avx2", "fma"} <= flags:
        core = "Haswell"
    else:
        return
    _os.environ["OPENBLAS_CORETYPE"] = core


def _share_torchs_cuda_libraries() -> None:
    # A build with CUDA links the toolkit's libcudart, libcublas(Lt) and libnccl. A process
    # loads one library per soname: loaded first, ours would be what torch's libtorch_cuda
    # binds to later, and torch's newer NCCL and cuBLAS symbols would be missing from them
    # ("undefined symbol: ncclCommResume" at `import torch`). Where torch's nvidia wheels are
    # installed, theirs are loaded first (what torch itself preloads), without importing
    # torch; the CUDA runtime's minor versions are compatible both ways.
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return
    if spec is None or spec.origin is None:
        return
    import ctypes
    nvidia = _os.path.join(_os.path.dirname(_os.path.dirname(spec.origin)), "nvidia")
    for rel in ("cu13/lib/libcudart.so.13", "cu13/lib/libcublasLt.so.13", "cu13/lib/libcublas.so.13",
                "nccl/lib/libnccl.so.2"):
        path = _os.path.join(nvidia, rel)
        if _os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass


_prefer_blas_kernels()
_share_torchs_cuda_libraries()

from . import _core  # noqa: E402  (after OPENBLAS_CORETYPE)

__version__: str = _core.version()
Error = _core.Error  # the library's one-line errors; a ValueError

__all__ = ["Error", "Plan", "Record", "Run", "plan", "cli_path", "__version__"]


def cli_path() -> str:
    """The `peakbound` executable this package carries (the CLI of the same build)."""
    return _os.path.join(_os.path.dirname(__file__), "bin", "peakbound")


# ---- keyword arguments as the CLI's flags ------------------------------------------------

def _flag_values(where: str, key: str, value: Any) -> list[str]:
    """A keyword argument's value as the command line would give it."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, _numbers.Integral):
        return [str(int(value))]
    if isinstance(value, _numbers.Real):
        return [repr(float(value))]
    if isinstance(value, str):
        return [value]
    if isinstance(value, _os.PathLike):
        return [_os.fspath(value)]
    raise TypeError(f"{where}: {key} must be a str, int, float, bool or path, not {type(value).__name__}")


def _entries(where: str, settings: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """Settings as (flag name without dashes, values): a --config file's entries."""
    for k in ("json", "config"):
        if k in settings:
            raise TypeError(f"{where}: '{k}' is the CLI's flag, not a setting")
    out = []
    for key, value in settings.items():
        if not isinstance(key, str):
            raise TypeError(f"{where}: setting names are strings, not {type(key).__name__}")
        if value is None:  # None: the flag's default
            continue
        if key == "schedules" and isinstance(value, (list, tuple, set, frozenset)):
            value = ",".join(sorted(value) if isinstance(value, (set, frozenset)) else value)
        out.append((key.replace("_", "-"), _flag_values(where, key, value)))
    return out


# ---- plan ----------------------------------------------------------------------------

class Record(Mapping[str, Any]):
    """A JSON object with its keys as attributes too (nested objects are Records)."""

    __slots__ = ("_d",)

    def __init__(self, d: Mapping[str, Any]):
        self._d = dict(d)

    @staticmethod
    def wrap(v: Any) -> Any:
        if isinstance(v, dict):
            return Record(v)
        if isinstance(v, list):
            return [Record.wrap(x) for x in v]
        return v

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not a field: copy, pickle and the like probe these
            raise AttributeError(name)
        try:
            return Record.wrap(self._d[name])
        except KeyError:
            raise AttributeError(f"no field '{name}' (fields: {', '.join(self._d)})") from None

    def __getitem__(self, key: str) -> Any:
        return Record.wrap(self._d[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __dir__(self):
        return list(self._d)

    def to_dict(self) -> dict:
        """A deep copy as plain dicts and lists (json.dumps takes it)."""
        return _json.loads(_json.dumps(self._d))

    def __repr__(self) -> str:
        return f"Record({_json.dumps(self._d)})"


class Plan(Record):
    """`peakbound plan`'s result: the fields of its --json document, str() its table."""

    __slots__ = ("_table", "_settings")

    def __init__(self, document: Mapping[str, Any], table: str, settings: Mapping[str, Any]):
        super().__init__(document)
        self._table = table
        self._settings = dict(settings)

    def __str__(self) -> str:
        return self._table

    def __repr__(self) -> str:
        d = self._d
        fits = "fits" if d["fits"]["scheduled"] else "does not fit"
        return (f"<peakbound.Plan {d['model']} at {d['run']['context']} tokens on {d['layout']['devices']} devices: "
                f"scheduled peak {d['peak_bytes']['scheduled']} B, {fits}>")

    def reach(self) -> Record:
        """The context reach (`plan --reach`): the largest context (tokens) the baseline and
        the schedules fit, and their ratio (None when the baseline fits nothing): the
        document's reach_tokens and reach_ratio. Searched once, on first use."""
        if "reach_tokens" not in self._d:
            again = plan(**{**self._settings, "reach": True})
            self._d["reach_tokens"], self._d["reach_ratio"] = again._d["reach_tokens"], again._d["reach_ratio"]
        return Record({**self._d["reach_tokens"], "ratio": self._d["reach_ratio"]})


def _model_spec(model: Any, keep: list) -> Any:
    """A model given as a dict (a Hugging Face config.json's content) becomes a file."""
    if not isinstance(model, Mapping):
        return model
    d = _tempfile.TemporaryDirectory(prefix="peakbound-model-")
    keep.append(d)
    path = _os.path.join(d.name, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        _json.dump(dict(model), f)
    return path


def plan(model: Any = None, context: Any = None, devices: Optional[int] = None, device_memory: Any = None,
         **flags: Any) -> Plan:
    """Plans per-device memory as `peakbound plan` does and returns its document.

    model: a preset name (`peakbound info`), a Hugging Face config.json (file or folder),
    or that file's content as a dict. context: tokens per sequence (131072, "128K", "1M").
    devices, device_memory ("80GiB"), and any other flag of `peakbound plan` by its name
    with "_" for "-": host_memory, cp, ep, vocab_group, schedules ("all", "none" or a list
    of llep, dtp, sco, adam), precision ("bf16"/"f32"), trainer_defaults, reach, ...
    Defaults are the CLI's."""
    given = {"model": model, "context": context, "devices": devices, "device_memory": device_memory, **flags}
    keep: list = []  # a dict model's temporary config.json, until the plan is made
    document, table = _core.plan(_entries("peakbound.plan", {**given, "model": _model_spec(model, keep)}))
    return Plan(_json.loads(document), table, {k: v for k, v in given.items() if v is not None})


# ---- a training run ------------------------------------------------------------------

class Run:
    """The library's run object (train/run.h) with `peakbound train`'s settings.

        run = peakbound.Run(model="tiny-moe", steps=20, seq_len=256, precision="f32")
        while not run.done: stats = run.step()
        summary = run.finish()

    settings: a dict of train's flags by name ("seq_len", "device_memory", ...), to which
    the keywords add. print: None (silent), True (the CLI's lines to sys.stdout) or a
    callable taking each text. Over mpirun, every rank builds the same Run (collective).
    """

    def __init__(self, settings: Optional[Mapping[str, Any]] = None, *, print: Any = None, **kwargs: Any):
        merged = {**(dict(settings) if settings is not None else {}), **kwargs}
        if print is True:
            def printer(text: str) -> None:
                _sys.stdout.write(text)
                _sys.stdout.flush()
        elif print is None or print is False:
            printer = None
        elif callable(print):
            printer = print
        else:
            raise TypeError("peakbound.Run: print must be None, True or a callable taking a str")
        self.settings = merged
        self._run = _core.Run(_entries("peakbound.Run", merged), printer)
        self.summary: Optional[Record] = None
        self.table: Optional[str] = None  # planned beside measured peaks, after finish()

    @classmethod
    def resume(cls, dir: Any, settings: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> "Run":
        """Continues the run saved in `dir` (a save folder or one step's folder); `steps`
        stays the run's total, as train --resume."""
        return cls(settings, resume=_os.fspath(dir), **kwargs)

    @property
    def done(self) -> bool:
        return self._run.done()

    @property
    def steps_done(self) -> int:
        return self._run.steps_done()

    def step(self) -> dict:
        """The next step; its statistics (the metrics file's line: step, loss, ce, aux, lr,
        grad_norm, tokens_per_second, device_peak_bytes, eval_loss when due, ...)."""
        return _json.loads(self._run.step())

    def __iter__(self) -> Iterator[dict]:
        while not self.done:
            yield self.step()

    def evaluate(self) -> float:
        """The held-out loss of the current parameters (the settings' eval_batches)."""
        return self._run.evaluate()

    def save(self, dir: Any = None) -> str:
        """Saves the last complete step into `dir` (the run's save_dir, or for a run started
        without one, the folder it saves to from now on); returns the checkpoint's folder."""
        self._run.save(None if dir is None else _os.fspath(dir))
        return self._run.last_saved()

    @property
    def last_saved(self) -> str:
        return self._run.last_saved()

    def finish(self) -> Record:
        """After the last step: waits for saves, measures; the summary `train --json`
        prints (planned and measured peaks per component, the losses, tokens/s). The
        table is in .table."""
        document, table = self._run.finish()
        self.summary, self.table = Record(_json.loads(document)), table
        return self.summary

    def close(self) -> None:
        """Frees the run (its device memory, its threads); also on garbage collection."""
        self._run.close()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
