"""MLPerf Storage's DLIO (``dlio-benchmark`` 2.0.0): local disk, Strata cold and Strata warm.

    make dlio-deps   # once: .dlio-venv from requirements-dlio.lock, and Debian's Open MPI
    python -m bench.dlio [--dlio .dlio-venv/bin/dlio_benchmark] [--ranks 1,2,4]
        [--files 112] [--record-mib 4] [--epochs 2] [--rtt-ms 50] [--rate 1Gbit]
        [--work DIR] [--json FILE] [--table FILE]
    python -m bench.dlio --emulate [...]   # DLIO's rule without DLIO (bench.dlio_emulate)

Run by hand, not by ``make bench`` or ``make test``: DLIO lives in a virtualenv of its
own, ``.dlio-venv`` (``make dlio-deps``, from the hashed ``requirements-dlio.lock``:
``dlio-benchmark`` 2.0.0 without its declared dependencies — NVIDIA DALI, full
TensorFlow — then mpi4py, hydra-core, omegaconf, h5py, pandas, psutil, PyYAML, Pillow,
``pydftracer==1.0.2``, ``tensorflow-cpu`` — its profiler imports TensorFlow whatever the
framework — and torch's CPU build), with Debian's ``openmpi-bin`` and ``libopenmpi-dev``;
``--dlio`` names its ``dlio_benchmark``. ``--emulate`` runs the same workload through
:mod:`bench.dlio_emulate` instead (no MPI, no DLIO): ranks as processes reading the same
NPZ set, DLIO's compute time per batch (``--compute-scale`` scales it, for a smoke run)
and its rule for AU; the suite runs it on a tiny set (tests/bench/test_dlio.py).

The workload is ``unet3d_h100`` scaled to two cores: ``--files`` NPZ files of
``--record-mib`` MiB (not 168 of ~140 MB), one read thread per rank, ``--epochs`` epochs,
no checkpoint, and the H100 config's own compute time per batch (0.323 s, batch 7), so
DLIO's accelerator utilisation — AU = compute ÷ (compute + I/O wait), its published rule,
target 90 % — means what it means in MLPerf Storage. MPI ranks are the emulated
accelerators (``mpirun --oversubscribe``). The set is generated once on local disk, then
read from there, published to a hub behind :mod:`bench.wan` and read through a spoke's
mount: once cold (empty cache; ``--ranks``' first count) and then warm for every count
(``--local-only``: local disk alone). The page cache is dropped before every run (root;
not with ``--keep-page-cache``). Per run: AU (mean over ranks and epochs, and its standard
deviation), each epoch's AU as rank 0 logs it, I/O MB/s; the AU table (markdown, as
BENCHMARKS.md shows it) is printed and, with ``--table``, written to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import dlio_emulate
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from deploy.local import LocalStack, StackError, drop_page_cache, publish

AU_TARGET = 90.0
"""MLPerf Storage's UNet3D bar: an accelerator counts when its AU is at least this, %."""
DLIO = Path(".dlio-venv/bin/dlio_benchmark")
"""Where ``make dlio-deps`` puts DLIO's command."""
SOURCES = {"local": "local disk", "strata cold": "Strata cold", "strata warm": "Strata warm"}
"""A run's ``source`` and its name in the AU table, in the table's order."""

_AU = re.compile(r"Training Accelerator Utilization \[AU\] \(%\): ([\d.]+) \(([\d.]+)\)")
_IO = re.compile(r"Training I/O Throughput \(MB/second\): ([\d.]+)")
_EPOCH = re.compile(
    r"Epoch (\d+) - Block 1 \[Training\] Accelerator Utilization \[AU\] \(%\): ([\d.]+)"
)


def _workload(ns: argparse.Namespace) -> list[str]:
    record = int(ns.record_mib * 2**20)
    return [
        "workload=unet3d_h100", "++workload.workflow.checkpoint=False",
        f"++workload.dataset.num_files_train={ns.files}",
        f"++workload.dataset.record_length={record}", "++workload.dataset.record_length_stdev=0",
        f"++workload.dataset.record_length_resize={min(record, 2**21)}",
        "++workload.reader.read_threads=1", f"++workload.train.epochs={ns.epochs}",
        f"++workload.reader.batch_size={ns.batch}",
        f"++workload.train.computation_time={dlio_emulate.COMPUTE_S * ns.compute_scale:g}",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    # DLIO's venv, not this one's modules; mpirun as root is refused unless told
    return {**os.environ, "PYTHONPATH": "", "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # fmt: skip


def parse_output(text: str) -> dict[str, Any] | None:
    """DLIO's figures from its log: ``au`` and ``au_sd`` (its ``[METRIC]`` line: mean and
    standard deviation over epochs of the ranks' mean, %), ``epoch_au`` (rank 0's block 1 of
    each epoch, %, in epoch order) and ``io_mb_s``; None when it printed no AU or I/O rate."""
    au, io = _AU.search(text), _IO.search(text)
    if au is None or io is None:
        return None
    epochs = sorted((int(e), float(a)) for e, a in _EPOCH.findall(text))
    return {"au": float(au.group(1)), "au_sd": float(au.group(2)),
            "epoch_au": [a for _, a in epochs], "io_mb_s": float(io.group(1))}  # fmt: skip


def generate(ns: argparse.Namespace, folder: Path, out: Path) -> None:
    """Write the NPZ set into ``folder`` (one rank).

    Raises:
        RuntimeError: DLIO failed.
    """
    cmd = [ns.dlio, *_workload(ns), "++workload.workflow.generate_data=True",
           "++workload.workflow.train=False", f"++workload.dataset.data_folder={folder}",
           f"hydra.run.dir={out}"]  # fmt: skip
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"dlio generate exited {proc.returncode}: {proc.stderr[-500:]}")


def train(
    ns: argparse.Namespace, source: str, folder: Path, ranks: int, out: Path
) -> dict[str, Any]:
    """One emulated training run on ``ranks`` accelerators reading ``folder``.

    Returns:
        ``source``, ``ranks``, ``wall_s``, ``au`` and ``au_sd`` (%, over ranks and
        epochs), ``epoch_au`` (rank 0's per epoch, %), ``io_mb_s``.

    Raises:
        RuntimeError: DLIO failed or printed no AU.
    """
    if not ns.keep_page_cache:
        drop_page_cache(3)
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", ns.dlio, *_workload(ns),
           "++workload.workflow.generate_data=False", "++workload.workflow.train=True",
           f"++workload.dataset.data_folder={folder}", f"hydra.run.dir={out}"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False)
    text = proc.stdout + proc.stderr
    figures = parse_output(text)
    if proc.returncode != 0 or figures is None:
        raise RuntimeError(f"dlio {source} x{ranks} exited {proc.returncode}: {text[-800:]}")
    return {"source": source, "ranks": ranks, "wall_s": round(time.monotonic() - started, 1),
            **figures}  # fmt: skip


def _train_emulated(
    ns: argparse.Namespace, source: str, folder: Path, ranks: int, out: Path
) -> dict[str, Any]:
    if not ns.keep_page_cache:
        drop_page_cache(3)
    return dlio_emulate.train(ns, source, folder, ranks, out)


def au_table(report: dict[str, Any]) -> str:
    """The AU table in markdown, as BENCHMARKS.md shows it: a caption line, one row per run
    (the source named on its first row only), and the accelerators each source keeps at
    AU >= 90 %."""
    lines = [
        f"{report['mode']}; AU = compute / (compute + I/O wait), DLIO's rule",
        "",
        "| source | accelerators | AU % | per epoch % | I/O MB/s |",
        "|---|---|---|---|---|",
    ]
    last = None
    for source, name in SOURCES.items():
        for r in (r for r in report["runs"] if r["source"] == source):
            epochs = ", ".join(f"{a:.1f}" for a in r["epoch_au"])
            au = f"{r['au']:.1f} (± {r['au_sd']:.1f})"
            cells = ["" if name == last else name, str(r["ranks"]), au, epochs]
            cells.append(f"{r['io_mb_s']:.0f}")
            last = name
            lines.append(("| " + " | ".join(cells) + " |").replace("|  |", "| |", 1))
    kept = report["accelerators_at_au_target"]
    ran = [s for s in SOURCES if any(r["source"] == s for r in report["runs"])]
    counts = ", ".join(f"{SOURCES[s]} {kept[s]}" for s in ran)
    lines += ["", f"Accelerators kept at AU >= {AU_TARGET:.0f} %: {counts}"]
    return "\n".join(lines) + "\n"


def run(ns: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Generate, then local, Strata cold and Strata warm; returns the report."""
    data = work / "data"
    if ns.emulate:
        dlio_emulate.generate(data, ns.files, int(ns.record_mib * 2**20))
        train_run = _train_emulated
        mode = "emulated (bench.dlio_emulate)"
    else:
        generate(ns, data, work / "out-generate")
        train_run = train
        mode = "dlio-benchmark 2.0.0"
    compute = dlio_emulate.COMPUTE_S * ns.compute_scale
    mode += (f": unet3d_h100 with {ns.files} files of {ns.record_mib:g} MiB, batch {ns.batch}, "
             f"{compute:g} s compute a batch, {ns.epochs} epochs")  # fmt: skip
    runs = [train_run(ns, "local", data, n, work / f"out-local-{n}") for n in ns.ranks]
    if ns.local_only:
        return _report(mode, runs, None, 0)
    version = publish(work / "hub", "unet3d", data)
    link = LinkSpec(rtt_s=ns.rtt_ms / 1000.0, rate_bps=ns.rate)
    with LocalStack() as stack:
        hub = stack.start_hub(work / "hub")
        with WanProxy(parse_hostport(hub), link) as wan:
            stack.start_spoke(wan.address, work / "cache", work / "mnt", "4GiB")
            folder = work / "mnt" / "unet3d" / version
            runs.append(train_run(ns, "strata cold", folder, ns.ranks[0], work / "out-cold"))
            time.sleep(ns.settle_s)  # the background fill ends the snapshot
            for n in ns.ranks:
                runs.append(train_run(ns, "strata warm", folder, n, work / f"out-warm-{n}"))
            down = wan.stats().down_bytes
    return _report(mode, runs, link.describe(), down)


def _report(mode: str, runs: list[dict[str, Any]], link: str | None, down: int) -> dict[str, Any]:
    kept = {
        source: max((r["ranks"] for r in runs if r["source"] == source and r["au"] >= AU_TARGET),
                    default=0)
        for source in SOURCES
    }  # fmt: skip
    return {"mode": mode, "link": link, "link_down_bytes": down, "runs": runs,
            "accelerators_at_au_target": kept}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints one line per run and the accelerators each source keeps."""
    p = argparse.ArgumentParser(prog="python -m bench.dlio", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--dlio", default=str(DLIO), help="dlio_benchmark of DLIO's own venv")
    p.add_argument("--emulate", action="store_true", help="DLIO's rule without DLIO")
    p.add_argument("--ranks", default="1,2,4", help="emulated accelerators, comma-separated")
    p.add_argument("--files", type=int, default=112)
    p.add_argument("--record-mib", type=float, default=4.0)
    p.add_argument("--batch", type=int, default=dlio_emulate.BATCH)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--read-threads", type=int, default=1, help="per rank (--emulate)")
    p.add_argument(
        "--compute-scale",
        type=float,
        default=1.0,
        help="times unet3d_h100's 0.323 s compute a batch (smoke runs)",
    )
    p.add_argument("--local-only", action="store_true", help="no hub, spoke or mount")
    p.add_argument("--settle-s", type=float, default=5.0, help="between cold and warm")
    p.add_argument("--keep-page-cache", action="store_true")
    p.add_argument("--rtt-ms", type=float, default=50.0)
    p.add_argument("--rate", type=parse_rate, default=parse_rate("1Gbit"))
    p.add_argument("--work", type=Path, default=None, help="kept when given")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--table", type=Path, default=None, help="write the AU table here")
    ns = p.parse_args(argv)
    ns.ranks = [int(n) for n in ns.ranks.split(",") if n.strip()]
    if not ns.emulate and (shutil.which("mpirun") is None or not Path(ns.dlio).exists()):
        print("bench.dlio: needs mpirun and --dlio (make dlio-deps), or --emulate", file=sys.stderr)
        return 2
    work = ns.work or Path(tempfile.mkdtemp(prefix="strata-dlio-"))
    try:
        report = run(ns, work)
    except (RuntimeError, StackError) as exc:
        print(f"bench.dlio: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if ns.work is None:
            shutil.rmtree(work, ignore_errors=True)
    for r in report["runs"]:
        print(json.dumps({k: v for k, v in r.items() if k != "records"}))
    if report["link"] is not None:
        print(f"link {report['link']}: {report['link_down_bytes'] / 1e6:,.0f} MB down")
    table = au_table(report)
    print(table, end="")
    if ns.table is not None:
        ns.table.write_text(table)
    if ns.json is not None:
        ns.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
