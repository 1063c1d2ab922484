"""The gpumem command: python -m gpumem, and the console command `gpumem`
that pip installs, run the gpumem command line (the Go binary a wheel
carries in gpumem/_bin/) with the same arguments.

    python -m gpumem run --limit 40GiB -- python train.py

The binary finds libgpumem.so and libgpumem_preload.so in the package
directory, .. of its own (gpumem run; cli/run.go), unless GPUMEM_LIBRARY
and GPUMEM_PRELOAD name others."""

import os
import sys


def binary():
    """The path of the gpumem binary inside the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "gpumem")


def main(argv=None):
    """Replaces this process with the gpumem binary; returns 1, with one
    line on stderr, where the package has none (a source tree not built)."""
    args = sys.argv[1:] if argv is None else list(argv)
    path = binary()
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"gpumem: the gpumem command is not in this package ({path} is missing): "
                         "pip install ./python builds it where Go and a C compiler are, "
                         "or install the wheel scripts/wheel.sh builds\n")
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, ["gpumem"] + args)


if __name__ == "__main__":
    sys.exit(main())
