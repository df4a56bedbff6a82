"""The adapter's C++ parts: one build helper, one policy.

Each part (the op observer, the dtype guard, the float16 gate, the emulated npu device) is a one-file
torch extension whose module name carries a digest of its source and of the torch version
(:func:`~torch_adapter.core.torch_private.extension_name`), so a file found by that name is this
source built for this torch. A part is looked for, in order:

1. **shipped with the package** — ``torch_adapter/_built/``, filled at install by the wheel/editable
   build (``hatch_build.py`` runs ``torch-adapter build --into`` there with the installing
   environment's torch);
2. **in torch's extension cache** — where ``torch-adapter build`` and earlier background builds put it.

The policy when neither has it — never a compile in the user's way:

- a part with a pure-Python stand-in (observer, dtype guard, float16 gate) serves the session with the
  stand-in, which behaves the same and costs what the part's ``fallback`` says (said once, on
  stderr), while :func:`build_in_background` compiles it in a detached, niced process for the next
  session (once per machine, source and torch version: a marker file keeps sessions from starting a
  second; its log is ``<build folder>.log``);
- the emulated device has no stand-in: the program asked for it, so it is compiled then, with a line
  saying so and how long it takes.

``TORCH_ADAPTER_PACKAGED_BUILDS=off`` ignores the shipped builds (tests and benchmarks of a bare
install). ``torch-adapter build`` compiles every part now.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .torch_private import PACKAGED_ENV, packaged_dir

__all__ = ["Part", "PACKAGED_ENV", "packaged_dir", "build_in_background", "build_into", "background_builds",
           "say_once", "stand_in_for"]

STALE_S = 20 * 60  # a build marker older than this belongs to a build that died
_LOCK = threading.Lock()
_SPAWNED: dict[str, subprocess.Popen] = {}  # extension name -> the background build started here
_SAID: set[str] = set()


@dataclass(frozen=True)
class Part:
    """One C++ part: ``key`` (``torch-adapter build --only KEY``), its module-name ``prefix``, its
    ``source`` file, what it is, and what its pure-Python stand-in costs (None: it has none)."""

    key: str
    prefix: str
    source: Path
    what: str
    fallback: str | None

    @property
    def name(self) -> str:
        from .torch_private import extension_name

        return extension_name(self.prefix, self.source)


def say_once(key: str, message: str) -> None:
    """``message`` on stderr, once per process per ``key`` (what the session does instead, and why)."""
    with _LOCK:
        if key in _SAID:
            return
        _SAID.add(key)
    print(message, file=sys.stderr, flush=True)


def _marker(name: str) -> Path:
    from .torch_private import extension_build_dir

    directory = extension_build_dir(name)
    return directory.with_name(directory.name + ".building")


def build_in_background(part: Part) -> str:
    """Start the detached build of ``part`` unless it is built, being built or cannot be; returns
    what happened: ``"built"``, ``"building"``, ``"started"`` or why not (for the session's log)."""
    from .torch_private import can_build_extensions, is_extension_built

    name = part.name
    if is_extension_built(name):
        return "built"
    if not can_build_extensions():
        return "no C++ compiler or no ninja"
    marker = _marker(name)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        if marker.exists() and time.time() - marker.stat().st_mtime > STALE_S:
            marker.unlink(missing_ok=True)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return "building"
    except OSError as exc:  # a read-only or full cache folder, a file in its place: the stand-in serves
        return f"cannot write {marker.parent}: {exc.strerror or exc}"
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    log = open(marker.with_suffix(".log"), "w")  # noqa: SIM115 - the child owns it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MAX_JOBS": "1"}
    code = f"import sys; from {__name__} import _main; sys.exit(_main(sys.argv[1:]))"  # (-m warns: imported by its package)
    try:
        child = subprocess.Popen([sys.executable, "-c", code, part.prefix, str(part.source), str(marker)],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True, close_fds=True)
    except OSError as exc:
        marker.unlink(missing_ok=True)
        return f"cannot start the build: {exc}"
    finally:
        log.close()
    with _LOCK:
        _SPAWNED[name] = child
    return "started"


def stand_in_for(part: Part, serving: str) -> str:
    """Start ``part``'s background build and, while it runs, say once what serves instead (``serving``)
    and what that costs (``part.fallback``); returns what :func:`build_in_background` said."""
    state = build_in_background(part)
    if state in ("started", "building"):
        say_once(part.key, f"torch_adapter: {part.what} is being built in the background for the next session; "
                           f"until then {serving} — {part.fallback}. `torch-adapter build` builds every C++ part now.")
    return state


def background_builds() -> dict[str, subprocess.Popen]:
    """The background builds this process started, by extension name (tests wait on them)."""
    with _LOCK:
        return dict(_SPAWNED)


def build_into(part: Part, folder: Path, *, verbose: bool = False) -> Path:
    """Compile ``part`` (or take it from torch's extension cache) and copy its module into ``folder``
    (the package's ``_built`` at install); returns the file. Raises what the compiler raised."""
    from .torch_private import load_extension

    module = load_extension(part.name, part.source, verbose=verbose)
    built = Path(getattr(module, "__file__", "") or "")
    if not built.is_file():
        raise RuntimeError(f"the build of {part.name} gave a module without a file: {module!r}")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / built.name
    if not (target.exists() and target.resolve() == built.resolve()):
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copy2(built, tmp)
        os.replace(tmp, target)  # atomically: a session importing it meanwhile sees the whole file or none
    for old in folder.glob(f"{part.prefix}_*"):  # builds of an earlier source or torch: never loaded again
        if old.name != target.name and old.suffix == target.suffix:
            old.unlink(missing_ok=True)
    return target


def _main(argv: list[str]) -> int:
    """The background build: ``PREFIX SOURCE MARKER`` (niced; the marker is removed however it ends)."""
    from .torch_private import extension_name, load_extension

    prefix, source, marker = argv[0], Path(argv[1]), Path(argv[2])
    try:
        os.nice(10)  # a background build yields to the session that started it
        name = extension_name(prefix, source)
        load_extension(name, source)
        print(f"{name}: built")
        return 0
    finally:
        marker.unlink(missing_ok=True)
