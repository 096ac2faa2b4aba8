"""strata-csi: the CSI node plugin that gives pods a Strata snapshot as a volume.

It owns the CSI Identity and Node services (``service``), who may mount what (``tenancy``:
the namespace's policy; ``hubscope``: a volume's own hub token, asked of the hub over
``hubtls``, the plugin's TLS to the hub),
where targets may be (``targets``: below the kubelet's pods directory, no symlinks),
publishing a version of a dataset at a target path (``volumes``) and the mount table and
mount calls (``mounttable``). It imports ``protocol`` (the CSI and hub messages) and
``strata_local`` and nothing else of Strata: it reaches the spoke only through the
spoke's mount, as any reader does. See csi/DESIGN.md.
"""
