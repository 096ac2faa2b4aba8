"""What hub and spoke both do on their own machine, written once for both.

Hub and spoke never import each other, so the pieces both need live here:
:mod:`strata_local.audit`, the audit trail in bounded space (JSON lines, rotated by size,
refusals rate-limited), and :mod:`strata_local.ownership`, the checks that a directory is
private to this user (no other user can swap, fill or point it elsewhere), and
:mod:`strata_local.memory`, glibc's malloc arenas limited before a daemon's threads start
and freed pages given back, :mod:`strata_local.mountinfo`, the mount table read as text
(the spoke, the drain and the CSI plugin), and :mod:`strata_local.reloading`, a YAML
settings file re-read when it changes (the CSI plugin's tenancy, the spoke's scoped admin
tokens), and :mod:`strata_local.grpclog`, gRPC's report of a reply to a stream its client
cancelled made one line instead of a traceback (the hub, the spoke's peer port), and
:mod:`strata_local.options`, a command's options declared once as a settings model's fields
and offered as typer flags, variables and a TOML file (``strata-spoke run``, ``strata-hub
serve``), and :mod:`strata_local.slotshare`, which connection a newcomer displaces at a small
HTTP server's connection cap (fair shares by client address: the spoke's admin and metrics
ports, the hub's metrics port), and :mod:`strata_local.doorslots`, who holds a block port's
connection slots (shares by address of those that showed nothing, those that showed a
credential kept: the spoke's peer ports, the hub's bulk port), and
:mod:`strata_local.doorway`, where a port's connections wait in those slots, as bare
sockets, until their first message is whole and, by :mod:`strata_local.handshakes`, their
handshake's turn (a rate the machine affords, in turns round the caller's networks,
:mod:`strata_local.prefixturns`, known addresses first), and
:mod:`strata_local.knownhosts`, who proved a credential from which address lately, kept
in a file across a restart (the hub's data directory), and :mod:`strata_local.door`, a
gRPC port's front door that then relays each connection to gRPC behind it (the spoke's
peer port, the hub's gRPC port), and :mod:`strata_local.streamdoor`, one that begins
TLS, a bounded number of handshakes at once, and hands the connection to an asyncio
stream handler (the bulk ports).
This package imports nothing of Strata (an import-linter contract keeps it so), and its
modules do not import each other, but for the doors, built on the doorway, which keeps its
slots in :mod:`strata_local.doorslots` (counted by address with
:class:`strata_local.slotshare.Holders`, as the admin server's ledger and the stream door's
pending handshakes are) and its handshakes' turns in :mod:`strata_local.handshakes` (whose
known addresses, :mod:`strata_local.knownhosts`, the slots keep, and whose trees of
networks are :mod:`strata_local.prefixturns`).
"""
