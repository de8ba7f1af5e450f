"""`minisgl-router`: the console script. It hands argv to the Rust server.

The only Python work here is resolving the embedded default model when `--model` is not
given: Rust calls `ensure_default_model` back (with the GIL) and serves with it released.
"""

import sys


def main() -> None:
    from minisgl_worker import _router
    from minisgl_worker.default_model import ensure_default_model

    sys.exit(_router.main(sys.argv, sys.executable, ensure_default_model))


if __name__ == "__main__":
    main()
