"""Compiling FlashInfer's JIT modules ahead of first use (CUDA only; flashinfer is imported
lazily): the engine gathers every module it will use (`FlashInferPagedAttention.jit_specs`,
`layers.cuda_ops.jit_specs`) and builds them in one parallel ninja run at start."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..startup import run_counting

if TYPE_CHECKING:
    from flashinfer.jit import JitSpec

logger = logging.getLogger(__name__)


def build_jit(specs: Sequence[JitSpec]) -> None:
    """Compile every missing module in one ninja run, so their sources build in parallel
    (on an H200 host: 8 modules in ~125 s; one family at a time, 7 of them took ~235 s),
    then install each as a FlashInfer AOT module (flashinfer/data/aot/NAME/NAME.so). That
    last step is needed: on first use FlashInfer re-runs ninja in the module's own folder,
    whose build log does not know the combined run's outputs, so it would compile again."""
    from flashinfer.jit import build_jit_specs
    from flashinfer.jit import env as jit_env

    unique = {spec.name: spec for spec in specs}
    jit = {name: jit_env.FLASHINFER_JIT_DIR / name / f"{name}.so" for name in unique}
    pending = [path for name, path in jit.items()
               if not (path.exists() or (jit_env.FLASHINFER_AOT_DIR / name / f"{name}.so").exists())]
    run_counting(lambda: build_jit_specs(list(unique.values()), verbose=False), pending,
                 "compiling FlashInfer modules", logger)
    for name in unique:
        built = jit_env.FLASHINFER_JIT_DIR / name / f"{name}.so"
        aot = jit_env.FLASHINFER_AOT_DIR / name / f"{name}.so"
        if built.exists() and not aot.exists():
            try:
                aot.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, aot)
            except OSError:  # a read-only install: FlashInfer rebuilds on first use
                return


def build_jit_optional(specs: Sequence[JitSpec], optional: Sequence[JitSpec]) -> bool:
    """`build_jit` of `specs` and `optional` in one run; if that fails, of `specs` alone (a
    failure there raises). Returns whether `optional` was built: a fast path that cannot
    compile here (another FlashInfer's headers, say) must not stop the engine."""
    if optional:
        try:
            build_jit([*specs, *optional])
            return True
        except RuntimeError as e:
            names = ", ".join(spec.name for spec in optional)
            logger.warning("could not build %s (%s); continuing without", names, str(e)[:500])
    build_jit(specs)
    return False
