"""Which datasets a pod may mount, decided from what the kubelet vouches for: the pod's
namespace and service account.

The kubelet passes ``csi.storage.k8s.io/pod.namespace`` and
``csi.storage.k8s.io/serviceAccount.name`` with each NodePublishVolume when the CSIDriver
says ``podInfoOnMount: true`` (it does, ``deploy/k8s/base/spoke/csidriver.yaml``), and its
values replace any the pod's author wrote in the volume's attributes (CSI spec, Kubernetes
"CSI Driver Object"). What the pod's author writes — the dataset, the ref — is checked
against the policy; it never decides.

The policy (``strata-csi serve --tenancy FILE``, a YAML mapping, re-read when it changes)
names, per namespace or per ``namespace/serviceaccount``, the dataset globs (fnmatch) its
pods may mount; ``*`` as the key is every namespace:

```yaml
tenant-a: [team-a, "team-a-*"]      # every pod of namespace tenant-a
tenant-b/trainer: [team-b]          # only pods running as service account trainer there
```

A dataset no entry names for the pod is refused (deny by default): an empty or missing
policy publishes nothing. The single-tenant setup is one line, ``"*": ["*"]``. A file that
stops parsing keeps the last good policy (and logs why).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from strata_local.reloading import ReloadingFile, load_yaml

EVERY_NAMESPACE = "*"
"""The key that names every namespace."""


Policy = dict[str, tuple[str, ...]]
"""Key (``NAMESPACE``, ``NAMESPACE/SERVICEACCOUNT`` or ``*``) -> dataset globs."""


class PolicyError(ValueError):
    """A tenancy file that cannot be read or does not parse (the message says where)."""


@dataclass(frozen=True)
class Decision:
    """Whether a pod may mount a dataset, and why (for the refusal and the audit line).

    Attributes:
        allowed: The answer.
        reason: Which entry allowed it, or why nothing did.
    """

    allowed: bool
    reason: str


def parse(text: str, where: str = "the tenancy policy") -> dict[str, tuple[str, ...]]:
    """The policy in ``text``: key (``NAMESPACE``, ``NAMESPACE/SERVICEACCOUNT`` or ``*``) ->
    dataset globs.

    Raises:
        PolicyError: not a mapping of names to lists of strings.
    """
    loaded = load_yaml(text, where, PolicyError)
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise PolicyError(f"{where} must map namespaces to dataset lists")
    policy: dict[str, tuple[str, ...]] = {}
    for key, globs in loaded.items():
        if not isinstance(key, str) or not key or key.count("/") > 1:
            raise PolicyError(f"{where}: {key!r} is not NAMESPACE or NAMESPACE/SERVICEACCOUNT")
        if not isinstance(globs, list) or not all(isinstance(g, str) and g for g in globs):
            raise PolicyError(f"{where}: {key} must list dataset names or globs")
        policy[key] = tuple(globs)
    return policy


class Tenancy:
    """The policy in a file, re-read when the file changes (a ConfigMap update;
    :class:`strata_local.reloading.ReloadingFile`: a change that does not parse keeps the
    last good policy, a removed file allows nothing).

    Args:
        path: The YAML file; None or a missing file is the empty policy (nothing allowed).

    Raises:
        PolicyError: the file exists at start and does not parse.
    """

    def __init__(self, path: Path | None) -> None:
        self._file: ReloadingFile[Policy] = ReloadingFile(path, parse, {})

    @property
    def policy(self) -> dict[str, tuple[str, ...]]:
        """The policy in force now."""
        return self._file.current()

    def decide(self, namespace: str, service_account: str, dataset: str) -> Decision:
        """Whether a pod of ``namespace`` running as ``service_account`` may mount
        ``dataset``."""
        policy = self.policy
        keys = (f"{namespace}/{service_account}", namespace, EVERY_NAMESPACE)
        for key in keys:
            for glob in policy.get(key, ()):
                if fnmatch.fnmatchcase(dataset, glob):
                    return Decision(True, f"{key!r} may mount {glob!r}")
        return Decision(
            False,
            f"no tenancy entry lets namespace {namespace!r} (service account "
            f"{service_account or '?'}) mount dataset {dataset!r}",
        )
