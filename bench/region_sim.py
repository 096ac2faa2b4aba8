"""A region at scale, simulated: N spokes start one job at the same second through the mesh.

    python -m bench.region_sim [--nodes 16,128,1024] [--replicas 1,3] [--json FILE]
                               [--calibrate MESH_JSON]

No processes: a model of where each block's bytes go and what each hop costs, with the
costs measured on the real system (:data:`MEASURED`, each naming the command that gave
it). For every node count and hub replica count it prints, for a job whose every node
first reads the same first batch and then its own shard of the data set:

* **WAN bytes per region** over the data set (each block crosses once: the owner fetches
  it for the region, single flight);
* **hub egress per replica** (bytes and the share of the replica's NIC it keeps busy);
* **the busiest owner**: blocks it owns, bytes it serves its peers, and its daemon's CPU
  (the owner serves peers from its one daemon process: about one core, at the bulk send
  path's cost per GiB);
* **time to first batch** on every node against one spoke alone (target: ≤ alone + 1 s);
* **what saturates first**: the resource with the largest time, for the first batch and
  for the epoch;
* **the first batch through relays**, as built (:mod:`spoke.mesh.relay`): an owner sends
  a hot block to at most ``2 x 8`` spokes (the first 8 to ask, then ranks 1..8 of the
  rendezvous order, which it sent to it as their relay), every other spoke gets it from
  its parent in a tree of fan-out 8 over that order (:func:`relay_copies`), one level
  after another: a relay serves a block once it holds all of it.

Owners are drawn as rendezvous hashing spreads them — uniformly and independently per
block (Thaler and Ravishankar 1998; :mod:`spoke.mesh.rendezvous`): the real function is
used up to :data:`EXACT_NODES` nodes, a seeded multinomial draw beyond (the same law,
without N hashes per block).

Time of a phase = the largest of its resources' busy times (bytes over bandwidth, CPU
seconds over cores), plus the round trips it waits for — the bottleneck bound of
operational analysis (Denning and Buzen, "The Operational Analysis of Queueing Network
Models", ACM Computing Surveys 10(3), 1978): streams are pipelined, so a phase is as slow
as its busiest resource. ``--calibrate`` checks the model against a ``bench.mesh --json``
run on this machine (all spokes sharing its cores, over ``bench.wan``): the model's pass
time for that run's N, size and link, with every process's CPU on the machine's cores.

Conservation is checked in every row (and by ``tests/bench/test_region_sim.py``): the hub
sends each block once per region, every byte an owner receives from the hub is a byte the
hub sent, and every byte an owner serves is a byte a reader received.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from spoke.mesh.relay import levels, relay_rank
from spoke.mesh.rendezvous import owner, ranked

MiB = 1 << 20
GiB = 1 << 30
EXACT_NODES = 64
"""Up to this many nodes the owners come from the real rendezvous function."""
RELAY_FANOUT = 8
"""Children of one spoke in the relay tree (:data:`spoke.mesh.relay.RELAY_FANOUT`)."""


@dataclass(frozen=True)
class Costs:
    """What each hop costs, as measured (or, where marked, taken from the same code path).

    Attributes:
        hub_cpu_s_per_gib: hub CPU per GiB sent on the bulk channel (``python -m
            bench.ingest --size 1GiB``, bulk rows: 0.50-0.52).
        hub_cpu_s_per_call: hub CPU per block stream (``python -m bench.small_files``,
            cold: 0.56-0.61 ms per file at about 3.5 files a stream, so about 2 ms a call).
        owner_cpu_s_per_gib: an owner's daemon CPU per GiB served to peers (the bulk send
            path, the hub's code; the same figure until the peer bulk port is measured).
        reader_cpu_s_per_gib: a reader's daemon + mount CPU per GiB fetched (``bench.ingest``:
            0.86-0.94 on prewarm).
        owner_cores: cores an owner's serving can use (its one daemon process).
        reader_cores: cores a reader's ingest can use (``--fetch-workers``, up to 8).
        hub_cores: cores of each hub replica.
        hub_nic_bps, node_nic_bps: NIC bandwidth, bytes/s.
        wan_bps: the region's share of the WAN to the hub region, bytes/s.
        wan_rtt_s, lan_rtt_s: round trips, seconds.
    """

    hub_cpu_s_per_gib: float = 0.51
    hub_cpu_s_per_call: float = 0.002
    owner_cpu_s_per_gib: float = 0.51
    reader_cpu_s_per_gib: float = 0.90
    owner_cores: float = 1.0
    reader_cores: float = 8.0
    hub_cores: float = 16.0
    hub_nic_bps: float = 25e9 / 8
    node_nic_bps: float = 100e9 / 8
    wan_bps: float = 100e9 / 8
    wan_rtt_s: float = 0.050
    lan_rtt_s: float = 0.0002


MEASURED = Costs()
"""The figures above; the network is a typical GPU region (25 Gbit/s hub NICs, 100 Gbit/s
node NICs, 100 Gbit/s and 50 ms to the hub region)."""

GRPC_MOUNT_PATH = Costs(
    hub_cpu_s_per_gib=1.62,
    owner_cpu_s_per_gib=1.62,
    reader_cpu_s_per_gib=4.85,
)
"""What ``bench.mesh`` runs: spokes on the hub's and the peers' gRPC streams, reading
multi-block files through the mount (issue 40's table, ``python -m bench.ingest``'s
``cold-grpc`` row before the bulk channel: hub 1.62, daemon 3.59 + mount 1.26 CPU-s per
GiB; an owner serving a peer on gRPC priced as the hub's gRPC send)."""


@dataclass(frozen=True)
class Job:
    """What every node reads: the same first batch, then its own shard."""

    dataset_bytes: int = 1 << 40  # 1 TiB
    block_bytes: int = 4 * MiB
    first_batch_blocks: int = 16  # 64 MiB: a batch of 3D patches across 16 chunk files

    @property
    def blocks(self) -> int:
        """Blocks in the data set."""
        return self.dataset_bytes // self.block_bytes


@dataclass
class Row:
    """One simulated region: ``nodes`` spokes, ``replicas`` hub replicas."""

    nodes: int
    replicas: int
    wan_bytes: int
    wan_ratio: float
    hub_egress_per_replica: float
    hub_nic_busy: float
    busiest_owner_blocks: int
    busiest_owner_serves_bytes: float
    busiest_owner_cpu_s: float
    first_batch_s: float
    alone_first_batch_s: float
    first_batch_bound: str
    relay_first_batch_s: float
    relay_busiest_copies: int
    epoch_s: float
    epoch_bound: str
    checks: dict[str, bool] = field(default_factory=dict)


def owners(nodes: int, blocks: int, seed: int) -> list[int]:
    """How many of ``blocks`` blocks each of ``nodes`` nodes owns."""
    counts = [0] * nodes
    if nodes <= EXACT_NODES:
        names = [f"spoke-{i}" for i in range(nodes)]
        index = {n: i for i, n in enumerate(names)}
        for b in range(blocks):
            counts[index[owner(f"block-{seed}-{b}", names)]] += 1
        return counts
    rng = random.Random(seed)
    for _ in range(blocks):
        counts[rng.randrange(nodes)] += 1
    return counts


def relay_copies(nodes: int, blocks: int, seed: int = 42, d: int = RELAY_FANOUT) -> list[int]:
    """Copies of the first batch each node sends through the relay tree, as built: per
    block, the owner (rank 0) sends to the first ``d`` spokes to ask and to ranks 1..``d``
    (which its hint sent back to it as their relay); each rank ``r`` sends to its children
    in the tree (ranks ``r*d + 1 .. r*d + d``), less those the owner served first. Ranks
    come from the real rendezvous function up to :data:`EXACT_NODES`, a seeded shuffle
    beyond; the first askers are a seeded draw (who asks first is a race)."""
    rng = random.Random(seed)
    names = [f"spoke-{i}" for i in range(nodes)]
    index = {n: i for i, n in enumerate(names)}
    copies = [0] * nodes
    for b in range(blocks):
        if nodes <= EXACT_NODES:
            order = [index[n] for n in ranked(f"block-{seed}-{b}", names)]
        else:
            order = list(range(nodes))
            rng.shuffle(order)
        children = [0] * nodes  # by rank
        for rank in range(1, nodes):
            children[relay_rank(rank, d)] += 1
        deep = list(range(d + 1, nodes))  # ranks whose parent is not the owner
        for rank in rng.sample(deep, min(d, len(deep))):  # asked before it was hot
            children[relay_rank(rank, d)] -= 1
            children[0] += 1
        for rank, count in enumerate(children):
            copies[order[rank]] += count
    return copies


def _phase(busy: dict[str, float], waits: float) -> tuple[float, str]:
    """A phase's time (its busiest resource plus its round trips) and that resource."""
    name = max(busy, key=lambda k: busy[k])
    return busy[name] + waits, name


def simulate(nodes: int, replicas: int, job: Job, costs: Costs, seed: int = 42) -> Row:
    """One region: first batch, then an epoch of shards.

    Raises:
        ValueError: fewer than one node or replica.
    """
    if nodes < 1 or replicas < 1:
        raise ValueError("a region needs a node and a hub replica")
    b = job.block_bytes
    hub_bw = min(costs.wan_bps, costs.hub_nic_bps * replicas)

    # first batch: F blocks, fetched once for the region, each served to every other node
    f = job.first_batch_blocks
    first_owned = owners(nodes, f, seed)
    hot = max(first_owned)
    hub_sends = f * b
    owner_serves = [k * b * (nodes - 1) for k in first_owned]
    first_busy = {
        "WAN / hub NICs": hub_sends / hub_bw,
        "hub CPU": (hub_sends / GiB * costs.hub_cpu_s_per_gib + f * costs.hub_cpu_s_per_call)
        / (costs.hub_cores * replicas),
        "owner NIC": max(owner_serves) / costs.node_nic_bps,
        "owner CPU": max(owner_serves) / GiB * costs.owner_cpu_s_per_gib / costs.owner_cores,
        "reader NIC": f * b / costs.node_nic_bps,
        "reader CPU": f * b / GiB * costs.reader_cpu_s_per_gib / costs.reader_cores,
    }
    first_s, first_bound = _phase(first_busy, costs.wan_rtt_s + costs.lan_rtt_s)
    # the remedy, as built (spoke/mesh/relay.py): the busiest sender (an owner or a relay)
    # sends its copies of the first batch; the deepest spoke waits for its relays one level
    # after another (each level one block's d copies at a sender's rate, store and
    # forward), and asks the owner first (one round trip more for the hint)
    d = RELAY_FANOUT
    sent = relay_copies(nodes, f, seed)
    depth = levels(nodes, d)
    send_s_per_byte = max(
        1 / costs.node_nic_bps, costs.owner_cpu_s_per_gib / GiB / costs.owner_cores
    )
    relay_busy = dict(first_busy)
    relay_busy["owner NIC"] = max(sent) * b / costs.node_nic_bps
    relay_busy["owner CPU"] = max(sent) * b / GiB * costs.owner_cpu_s_per_gib / costs.owner_cores
    hops = max(depth - 1, 0) * min(d, nodes - 1) * b * send_s_per_byte
    relay_s, _ = _phase(relay_busy, costs.wan_rtt_s + (depth + 1) * costs.lan_rtt_s + hops)
    alone_busy = {
        "WAN / hub NICs": hub_sends / min(costs.wan_bps, costs.hub_nic_bps),
        "hub CPU": (hub_sends / GiB * costs.hub_cpu_s_per_gib + f * costs.hub_cpu_s_per_call)
        / costs.hub_cores,
        "reader NIC": f * b / costs.node_nic_bps,
        "reader CPU": f * b / GiB * costs.reader_cpu_s_per_gib / costs.reader_cores,
    }
    alone_s, _ = _phase(alone_busy, costs.wan_rtt_s)

    # epoch: every block read by one node (its shard), fetched once by its owner
    blocks = job.blocks
    owned = owners(nodes, min(blocks, 1 << 18), seed + 1)
    scale = blocks / sum(owned)  # a sample of the blocks, scaled to the data set
    busiest = max(owned) * scale
    serves = busiest * b * (nodes - 1) / nodes  # its blocks read by another node's shard
    received_from_owners = blocks * b * (nodes - 1) / nodes
    epoch_busy = {
        "WAN / hub NICs": blocks * b / hub_bw,
        "hub CPU": (blocks * b / GiB * costs.hub_cpu_s_per_gib + blocks * costs.hub_cpu_s_per_call)
        / (costs.hub_cores * replicas),
        "owner NIC": (busiest * b + serves) / costs.node_nic_bps,
        "owner CPU": serves / GiB * costs.owner_cpu_s_per_gib / costs.owner_cores,
        "reader CPU": blocks / nodes * b / GiB * costs.reader_cpu_s_per_gib / costs.reader_cores,
    }
    epoch_s, epoch_bound = _phase(epoch_busy, costs.wan_rtt_s)

    wan = blocks * b  # single flight: each block once per region (the first batch's too)
    checks = {
        "each block crosses the WAN once": wan == job.dataset_bytes - job.dataset_bytes % b,
        "hub out = owners in": math.isclose(sum(owned) * scale * b, blocks * b),
        "owners out = readers in": math.isclose(
            sum(o * b * (nodes - 1) / nodes for o in owned) * scale, received_from_owners
        ),
        "first batch: owners out = readers in": sum(owner_serves) == f * b * (nodes - 1),
        "first batch through relays: senders out = readers in": sum(sent) == f * (nodes - 1),
    }
    return Row(
        nodes=nodes,
        replicas=replicas,
        wan_bytes=wan,
        wan_ratio=wan / job.dataset_bytes,
        hub_egress_per_replica=wan / replicas,
        hub_nic_busy=(wan / replicas / costs.hub_nic_bps) / epoch_s,
        busiest_owner_blocks=round(busiest),
        busiest_owner_serves_bytes=serves + hot * b * (nodes - 1),
        busiest_owner_cpu_s=(serves + hot * b * (nodes - 1)) / GiB * costs.owner_cpu_s_per_gib,
        first_batch_s=first_s,
        alone_first_batch_s=alone_s,
        first_batch_bound=first_bound,
        relay_first_batch_s=relay_s,
        relay_busiest_copies=max(sent),
        epoch_s=epoch_s,
        epoch_bound=epoch_bound,
        checks=checks,
    )


def calibrate(mesh_json: Path, host_cores: float = 2.0) -> list[dict[str, float]]:
    """The model against a ``bench.mesh --json`` run on this machine: every spoke, owner
    and the hub share ``host_cores``, at :data:`GRPC_MOUNT_PATH`'s costs; the link is the
    run's. Returns per N the measured slowest pass and the model's, seconds."""
    runs = json.loads(mesh_json.read_text())
    out = []
    for run in runs["results"]:
        if not run["mesh"]:
            continue
        n, size = run["spokes"], run["dataset_bytes"]
        link = runs["rate_bps"] / 8  # bits to bytes
        costs = replace(
            GRPC_MOUNT_PATH,
            hub_nic_bps=link,
            wan_bps=link,
            node_nic_bps=10e9,  # loopback
            wan_rtt_s=runs["rtt_s"],
        )
        # everything shares the host: the whole region's CPU over its cores
        cpu = (
            size / GiB * costs.hub_cpu_s_per_gib
            + size * (n - 1) / n / GiB * costs.owner_cpu_s_per_gib * n
            + size / GiB * costs.reader_cpu_s_per_gib * n
        )
        model = max(size / link, cpu / host_cores) + costs.wan_rtt_s
        out.append({"spokes": n, "measured_s": max(run["pass_s"]), "model_s": model})
    return out


def plot(job: Job, path: Path) -> None:
    """Time to first batch against the node count (1 replica): the owners serving every
    node, the relay remedy, and one spoke alone plus the 1 s the target allows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    rows = [simulate(n, 1, job, MEASURED) for n in counts]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(counts, [r.first_batch_s for r in rows], "o-", label="owners serve every node")
    ax.plot(counts, [r.relay_first_batch_s for r in rows], "s--", label="relay tree of 8 (built)")
    ax.plot(counts, [r.alone_first_batch_s + 1 for r in rows], ":", label="one spoke alone + 1 s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes starting together")
    ax.set_ylabel("time to first batch, s")
    ax.set_title(f"first batch of {job.first_batch_blocks} × {job.block_bytes // MiB} MiB blocks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(rows: list[Row]) -> str:
    head = (
        "| nodes | hub replicas | WAN / data set | hub egress per replica | busiest owner "
        f"(blocks, serves, CPU) | first batch (alone) | bound | with relays of {RELAY_FANOUT} "
        "(busiest sender's copies) | epoch | bound |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r.nodes:,} | {r.replicas} | {r.wan_ratio:.2f}× | "
        f"{r.hub_egress_per_replica / GiB:,.0f} GiB ({r.hub_nic_busy:.0%} of its NIC) | "
        f"{r.busiest_owner_blocks:,}, {r.busiest_owner_serves_bytes / GiB:,.1f} GiB, "
        f"{r.busiest_owner_cpu_s:,.0f} CPU-s | {r.first_batch_s:.2f} s "
        f"({r.alone_first_batch_s:.2f} s) | {r.first_batch_bound} | "
        f"{r.relay_first_batch_s:.2f} s ({r.relay_busiest_copies}) | {r.epoch_s:,.0f} s | "
        f"{r.epoch_bound} |"
        for r in rows
    ]
    return head + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write ``--json``); 1 if a conservation check fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="16,128,1024")
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument("--dataset", type=float, default=1.0, help="data set, TiB")
    parser.add_argument("--calibrate", type=Path, help="a bench.mesh --json file")
    parser.add_argument(
        "--host-cores", type=float, default=2.0, help="cores the --calibrate run had"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--plot", type=Path, help="a PNG of the first batch's time against the node count"
    )
    args = parser.parse_args(argv)
    job = Job(dataset_bytes=int(args.dataset * (1 << 40)))
    rows = [
        simulate(int(n), int(r), job, MEASURED)
        for n in args.nodes.split(",")
        for r in args.replicas.split(",")
    ]
    print(_table(rows))
    failed = [f"{r.nodes}/{r.replicas}: {c}" for r in rows for c, ok in r.checks.items() if not ok]
    for line in failed:
        print(f"conservation check failed: {line}", file=sys.stderr)
    report: dict[str, object] = {"costs": asdict(MEASURED), "rows": [asdict(r) for r in rows]}
    if args.calibrate is not None:
        check = calibrate(args.calibrate, args.host_cores)
        report["calibration"] = check
        for c in check:
            ratio = c["model_s"] / c["measured_s"]
            print(
                f"calibration, {c['spokes']:.0f} spokes on this machine: measured "
                f"{c['measured_s']:.2f} s, model {c['model_s']:.2f} s ({ratio:.2f}×)"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    if args.plot is not None:
        plot(job, args.plot)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
