"""Regenerate (or check) the committed gRPC modules from the ``.proto`` files.

Usage::

    python -m protocol.gen           # rewrite protocol/**/*_pb2*.py{,i}
    python -m protocol.gen --check   # exit 1 naming stale files if regenerating would change them

The generators are ``grpcio-tools`` and ``mypy-protobuf`` (typed stubs), pinned in
pyproject.toml so that output is reproducible.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = Path(__file__).resolve().parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_files() -> list[Path]:
    """All ``.proto`` files under ``protocol/``, sorted, relative to the repository root."""
    return sorted(p.relative_to(ROOT) for p in PROTO_DIR.rglob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every proto file, writing into ``out_dir``.

    Returns:
        The generated files, relative to ``out_dir``.

    Raises:
        RuntimeError: protoc reported an error.
    """
    import grpc_tools
    from grpc_tools import protoc  # dev dependency; imported lazily

    include = Path(grpc_tools.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent  # mypy-protobuf's plugins live beside python
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *[str(p) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    return sorted(
        p.relative_to(out_dir)
        for p in out_dir.rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    )


def committed() -> set[Path]:
    """Generated files currently in the tree, relative to the repository root."""
    return {
        p.relative_to(ROOT)
        for p in PROTO_DIR.rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m protocol.gen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if generated files are stale")
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        fresh = generate(out)
        stale = [
            str(rel)
            for rel in fresh
            if not (ROOT / rel).is_file() or (ROOT / rel).read_bytes() != (out / rel).read_bytes()
        ]
        extra = sorted(str(p) for p in committed() - set(fresh))
        if ns.check:
            if stale or extra:
                print(
                    "protocol: generated code is stale: "
                    + ", ".join(stale + extra)
                    + " (run: python -m protocol.gen)",
                    file=sys.stderr,
                )
                return 1
            print(f"protocol: {len(fresh)} generated files are fresh")
            return 0
        for rel in fresh:
            (ROOT / rel).write_bytes((out / rel).read_bytes())
        for name in extra:
            (ROOT / name).unlink()
        print(f"protocol: wrote {len(fresh)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
